// caf_bench: the CAF (C++ Actor Framework 0.17) anchor for `troupe bench actors`.
//
// Runs the same eight actor workloads as troupe's own benchmark (defined in
// tests/bench/actors_bench.cpp) on CAF, so tests/bench/compare.sh can put the
// two side by side. The workloads must stay identical to troupe's: same sizes,
// same message pattern, same metric. Change both sides together or neither.
//
//   caf_bench [--json] [--quick] [--only NAME] [--threads N]
//             [--policy stealing|sharing]
//
// With --json every result is one line:
//   {"suite":"caf","bench":NAME,"metric":METRIC,"value":X,"unit":U}
//
// Each workload runs on a fresh actor system; its start-up and shut-down are
// not timed. fan_in's memory_growth_mb reads the process-wide peak (VmHWM), so
// it is only exact with `--only fan_in`; when all workloads run, fan_in runs
// first for that reason.

#include <caf/all.hpp>
#include <caf/policy/work_sharing.hpp>
#include <caf/policy/work_stealing.hpp>
#include <caf/scheduler/coordinator.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

using go_atom = caf::atom_constant<caf::atom("go")>;
using cont_atom = caf::atom_constant<caf::atom("cont")>;
using set_next_atom = caf::atom_constant<caf::atom("setnext")>;

// -- options ------------------------------------------------------------------

struct options {
  bool json = false;
  bool quick = false;
  std::string only;
  size_t threads = 0;
  std::string policy = "stealing";
};

// -- output and failure -------------------------------------------------------

[[noreturn]] void fail(const std::string& bench, const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "caf_bench: %s: %s\n", bench.c_str(), what.c_str());
  std::fflush(stderr);
  // The actor system may still hold actors that would never finish; leave
  // without running destructors.
  std::_Exit(1);
}

void report(const options& opts, const char* bench, const char* metric,
            double value, const char* unit) {
  if (opts.json) {
    std::printf("{\"suite\":\"caf\",\"bench\":\"%s\",\"metric\":\"%s\","
                "\"value\":%.3f,\"unit\":\"%s\"}\n",
                bench, metric, value, unit);
  } else {
    std::printf("%-14s %-17s %16.3f %s\n", bench, metric, value, unit);
  }
  std::fflush(stdout);
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Waits for a completion signal from the actors; a workload that never
// finishes is a failure, not a hang.
void wait_done(std::future<void>& done, const char* bench) {
  if (done.wait_for(std::chrono::minutes(10)) != std::future_status::ready)
    fail(bench, "did not finish within 10 minutes");
}

// -- /proc/self/status --------------------------------------------------------

// Returns the value of a "Vm...:   N kB" line of /proc/self/status in kB.
int64_t proc_status_kb(const char* key) {
  std::ifstream in{"/proc/self/status"};
  std::string line;
  auto key_len = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, key_len, key) == 0 && line.size() > key_len
        && line[key_len] == ':')
      return std::strtoll(line.c_str() + key_len + 1, nullptr, 10);
  }
  return -1;
}

// -- actor system -------------------------------------------------------------

caf::actor_system_config& configure(caf::actor_system_config& cfg,
                                    const options& opts) {
  cfg.set("scheduler.max-threads",
          static_cast<caf::config_value::integer>(opts.threads));
  cfg.set("scheduler.policy", caf::atom_from_string(opts.policy));
  return cfg;
}

// One actor system per workload, configured from the command line.
struct bench_system {
  caf::actor_system_config cfg;
  caf::actor_system sys;

  explicit bench_system(const options& opts) : sys(configure(cfg, opts)) {
    // Make sure the settings took effect rather than trusting the key names.
    auto& sched = sys.scheduler();
    if (sched.num_workers() != opts.threads)
      fail("config", "scheduler has " + std::to_string(sched.num_workers())
                       + " threads, asked for "
                       + std::to_string(opts.threads));
    bool sharing = dynamic_cast<caf::scheduler::coordinator<
                     caf::policy::work_sharing>*>(&sched)
                   != nullptr;
    bool stealing = dynamic_cast<caf::scheduler::coordinator<
                      caf::policy::work_stealing>*>(&sched)
                    != nullptr;
    if ((opts.policy == "sharing" && !sharing)
        || (opts.policy == "stealing" && !stealing))
      fail("config", "scheduler policy " + opts.policy + " was not applied");
  }

  // Ends every actor still running; the system's destructor awaits them.
  void shutdown(const std::vector<caf::actor>& actors) {
    for (auto& a : actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sys.await_all_actors_done();
  }
};

// Replies with its argument.
caf::behavior echo_actor() {
  return {[](int x) { return x; }};
}

// Replies with its argument + 1.
caf::behavior increment_actor() {
  return {[](int x) { return x + 1; }};
}

// -- pingpong -----------------------------------------------------------------

class pinger : public caf::event_based_actor {
public:
  pinger(caf::actor_config& cfg, caf::actor ponger, int n,
         std::promise<void>* done, int* received)
    : caf::event_based_actor(cfg),
      ponger_(std::move(ponger)),
      n_(n),
      done_(done),
      received_(received) {
  }

  caf::behavior make_behavior() override {
    next();
    return {[](go_atom) {}};
  }

private:
  void next() {
    request(ponger_, caf::infinite, i_).then([this](int r) {
      if (r != i_)
        fail("pingpong", "wrong reply");
      ++*received_;
      if (++i_ == n_) {
        done_->set_value();
        quit();
      } else {
        next();
      }
    });
  }

  caf::actor ponger_;
  int n_;
  int i_ = 0;
  std::promise<void>* done_;
  int* received_;
};

void bench_pingpong(const options& opts) {
  const int n = opts.quick ? 100'000 : 1'000'000;
  bench_system bs{opts};
  auto b = bs.sys.spawn(echo_actor);
  std::promise<void> done;
  auto fut = done.get_future();
  int received = 0;
  auto start = clock_type::now();
  bs.sys.spawn<pinger>(b, n, &done, &received);
  wait_done(fut, "pingpong");
  auto secs = seconds_since(start);
  bs.shutdown({b});
  if (received != n)
    fail("pingpong", "got " + std::to_string(received) + " replies, expected "
                       + std::to_string(n));
  report(opts, "pingpong", "round_trip_us", secs * 1e6 / n, "us");
}

// -- blocking_call ------------------------------------------------------------

void bench_blocking_call(const options& opts) {
  const int n = opts.quick ? 10'000 : 100'000;
  bench_system bs{opts};
  auto b = bs.sys.spawn(echo_actor);
  int received = 0;
  {
    caf::scoped_actor self{bs.sys};
    auto start = clock_type::now();
    for (int i = 0; i < n; ++i) {
      self->request(b, caf::infinite, i)
        .receive(
          [&](int r) {
            if (r != i)
              fail("blocking_call", "wrong reply");
            ++received;
          },
          [&](caf::error& err) {
            fail("blocking_call", bs.sys.render(err));
          });
    }
    auto secs = seconds_since(start);
    if (received != n)
      fail("blocking_call", "got " + std::to_string(received)
                              + " replies, expected " + std::to_string(n));
    report(opts, "blocking_call", "round_trip_us", secs * 1e6 / n, "us");
  }
  bs.shutdown({b});
}

// -- in_flight ----------------------------------------------------------------

void bench_in_flight(const options& opts) {
  const int n = opts.quick ? 200'000 : 2'000'000;
  const int window = 1000;
  bench_system bs{opts};
  auto b = bs.sys.spawn(increment_actor);
  {
    caf::scoped_actor self{bs.sys};
    int64_t sum = 0;
    int received = 0;
    auto on_reply = [&](int r) {
      sum += r;
      ++received;
    };
    auto start = clock_type::now();
    int sent = 0;
    // A plain send to a handler that returns a value: the reply lands in the
    // sender's mailbox, so any number of calls can be outstanding at once.
    for (; sent < window && sent < n; ++sent)
      self->send(b, sent);
    while (sent < n) {
      self->receive(on_reply);
      self->send(b, sent++);
    }
    while (received < n)
      self->receive(on_reply);
    auto secs = seconds_since(start);
    // Replies are i + 1 for i in [0, n).
    int64_t expected = static_cast<int64_t>(n) * (n + 1) / 2;
    if (sum != expected)
      fail("in_flight", "reply checksum " + std::to_string(sum) + ", expected "
                          + std::to_string(expected));
    report(opts, "in_flight", "calls_per_s", n / secs, "calls/s");
  }
  bs.shutdown({b});
}

// -- fan_in -------------------------------------------------------------------

class fan_in_receiver : public caf::event_based_actor {
public:
  fan_in_receiver(caf::actor_config& cfg, int64_t expected,
                  std::promise<void>* done, int64_t* received)
    : caf::event_based_actor(cfg),
      expected_(expected),
      done_(done),
      received_(received) {
  }

  caf::behavior make_behavior() override {
    return {[this](int) {
      if (++*received_ == expected_) {
        done_->set_value();
        quit();
      }
    }};
  }

private:
  int64_t expected_;
  std::promise<void>* done_;
  int64_t* received_;
};

class fan_in_sender : public caf::event_based_actor {
public:
  fan_in_sender(caf::actor_config& cfg, caf::actor receiver, int n)
    : caf::event_based_actor(cfg), receiver_(std::move(receiver)), n_(n) {
  }

  caf::behavior make_behavior() override {
    return {[this](cont_atom) {
      // A batch of 100 messages per invocation, then yield to the scheduler.
      for (int k = 0; k < 100 && sent_ < n_; ++k, ++sent_)
        send(receiver_, sent_);
      if (sent_ < n_)
        send(this, cont_atom::value);
      else
        quit();
    }};
  }

private:
  caf::actor receiver_;
  int n_;
  int sent_ = 0;
};

void bench_fan_in(const options& opts) {
  const int n = opts.quick ? 100'000 : 1'000'000;
  const int senders = 4;
  bench_system bs{opts};
  std::promise<void> done;
  auto fut = done.get_future();
  int64_t received = 0;
  auto receiver = bs.sys.spawn<fan_in_receiver>(int64_t{senders} * n, &done,
                                                &received);
  std::vector<caf::actor> all{receiver};
  for (int s = 0; s < senders; ++s)
    all.push_back(bs.sys.spawn<fan_in_sender>(receiver, n));
  auto rss_before_kb = proc_status_kb("VmRSS");
  auto start = clock_type::now();
  for (int s = 1; s <= senders; ++s)
    caf::anon_send(all[s], cont_atom::value);
  wait_done(fut, "fan_in");
  auto secs = seconds_since(start);
  auto hwm_kb = proc_status_kb("VmHWM");
  bs.shutdown(all);
  if (received != int64_t{senders} * n)
    fail("fan_in", "received " + std::to_string(received) + ", expected "
                     + std::to_string(int64_t{senders} * n));
  if (rss_before_kb < 0 || hwm_kb < 0)
    fail("fan_in", "cannot read VmRSS/VmHWM from /proc/self/status");
  report(opts, "fan_in", "msgs_per_s", double(senders) * n / secs, "msgs/s");
  report(opts, "fan_in", "memory_growth_mb",
         double(hwm_kb - rss_before_kb) / 1024.0, "MB");
}

// -- spawn --------------------------------------------------------------------

std::atomic<int64_t> spawn_workers_exited{0};

class spawn_worker : public caf::event_based_actor {
public:
  using caf::event_based_actor::event_based_actor;

  caf::behavior make_behavior() override {
    return {[](int x) { return x + 1; }};
  }

  void on_exit() override {
    spawn_workers_exited.fetch_add(1, std::memory_order_relaxed);
  }
};

// One driver spawns N workers and sends each one message, an int. The worker
// replies with its argument + 1, which CAF delivers to the driver as an
// ordinary message; on that reply the driver tells the worker to exit. So each
// spawned actor gets one message and sends one reply, then exits. The time is
// taken until every worker has terminated.
void bench_spawn(const options& opts) {
  const int n = opts.quick ? 10'000 : 100'000;
  bench_system bs{opts};
  spawn_workers_exited = 0;
  int replies = 0;
  auto start = clock_type::now();
  bs.sys.spawn([n, &replies](caf::event_based_actor* self) -> caf::behavior {
    for (int i = 0; i < n; ++i)
      self->send(self->spawn<spawn_worker>(), i);
    return {[self, n, &replies](int) {
      auto w = caf::actor_cast<caf::actor>(self->current_sender());
      self->send_exit(w, caf::exit_reason::user_shutdown);
      if (++replies == n)
        self->quit();
    }};
  });
  bs.sys.await_all_actors_done();
  auto secs = seconds_since(start);
  if (replies != n)
    fail("spawn", "got " + std::to_string(replies) + " replies, expected "
                    + std::to_string(n));
  if (spawn_workers_exited != n)
    fail("spawn", std::to_string(spawn_workers_exited.load())
                    + " workers terminated, expected " + std::to_string(n));
  report(opts, "spawn", "actors_per_s", n / secs, "actors/s");
}

// -- idle_actor ---------------------------------------------------------------

std::atomic<int64_t> idle_actors_started{0};

class idle_actor : public caf::event_based_actor {
public:
  using caf::event_based_actor::event_based_actor;

  caf::behavior make_behavior() override {
    idle_actors_started.fetch_add(1, std::memory_order_relaxed);
    return {[](int) {}};
  }
};

void bench_idle_actor(const options& opts) {
  const int n = opts.quick ? 100'000 : 1'000'000;
  bench_system bs{opts};
  idle_actors_started = 0;
  std::vector<caf::actor> actors;
  auto rss_before_kb = proc_status_kb("VmRSS");
  actors.reserve(n);
  for (int i = 0; i < n; ++i)
    actors.push_back(bs.sys.spawn<idle_actor>());
  // Spawning schedules each actor's initialization; measure once all of
  // them hold their behavior.
  auto deadline = clock_type::now() + std::chrono::minutes(10);
  while (idle_actors_started.load() < n) {
    if (clock_type::now() > deadline)
      fail("idle_actor", "actors did not start within 10 minutes");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto rss_after_kb = proc_status_kb("VmRSS");
  if (rss_before_kb < 0 || rss_after_kb < 0)
    fail("idle_actor", "cannot read VmRSS from /proc/self/status");
  if (idle_actors_started != n)
    fail("idle_actor", std::to_string(idle_actors_started.load())
                         + " actors started, expected " + std::to_string(n));
  bs.shutdown(actors);
  actors.clear();
  report(opts, "idle_actor", "bytes_per_actor",
         double(rss_after_kb - rss_before_kb) * 1024.0 / n, "bytes");
}

// -- fork_join ----------------------------------------------------------------

class fork_join_master : public caf::event_based_actor {
public:
  fork_join_master(caf::actor_config& cfg, std::vector<caf::actor> workers,
                   int rounds, std::promise<void>* done, int* rounds_done)
    : caf::event_based_actor(cfg),
      workers_(std::move(workers)),
      rounds_(rounds),
      done_(done),
      rounds_done_(rounds_done) {
  }

  caf::behavior make_behavior() override {
    start_round();
    return {[](go_atom) {}};
  }

private:
  void start_round() {
    replies_ = 0;
    for (size_t i = 0; i < workers_.size(); ++i) {
      request(workers_[i], caf::infinite, static_cast<int>(i))
        .then([this](int) {
          if (++replies_ < workers_.size())
            return;
          ++*rounds_done_;
          if (*rounds_done_ == rounds_) {
            done_->set_value();
            quit();
          } else {
            start_round();
          }
        });
    }
  }

  std::vector<caf::actor> workers_;
  int rounds_;
  size_t replies_ = 0;
  std::promise<void>* done_;
  int* rounds_done_;
};

void bench_fork_join(const options& opts) {
  const int rounds = opts.quick ? 100 : 1000;
  const int n_workers = 1000;
  bench_system bs{opts};
  std::vector<caf::actor> workers;
  workers.reserve(n_workers);
  for (int i = 0; i < n_workers; ++i)
    workers.push_back(bs.sys.spawn(echo_actor));
  std::promise<void> done;
  auto fut = done.get_future();
  int rounds_done = 0;
  auto start = clock_type::now();
  bs.sys.spawn<fork_join_master>(workers, rounds, &done, &rounds_done);
  wait_done(fut, "fork_join");
  auto secs = seconds_since(start);
  bs.shutdown(workers);
  if (rounds_done != rounds)
    fail("fork_join", std::to_string(rounds_done) + " rounds, expected "
                        + std::to_string(rounds));
  report(opts, "fork_join", "rounds_per_s", rounds / secs, "rounds/s");
}

// -- thread_ring --------------------------------------------------------------

class ring_node : public caf::event_based_actor {
public:
  ring_node(caf::actor_config& cfg, int index, std::promise<int>* done)
    : caf::event_based_actor(cfg), index_(index), done_(done) {
  }

  caf::behavior make_behavior() override {
    return {
      [this](set_next_atom, caf::actor next) { next_ = std::move(next); },
      [this](int token) {
        if (token > 0)
          send(next_, token - 1);
        else
          done_->set_value(index_);
      },
    };
  }

private:
  int index_;
  std::promise<int>* done_;
  caf::actor next_;
};

void bench_thread_ring(const options& opts) {
  const int hops = opts.quick ? 1'000'000 : 10'000'000;
  const int ring_size = 503;
  bench_system bs{opts};
  std::promise<int> done;
  auto fut = done.get_future();
  std::vector<caf::actor> ring;
  ring.reserve(ring_size);
  for (int i = 0; i < ring_size; ++i)
    ring.push_back(bs.sys.spawn<ring_node>(i, &done));
  {
    caf::scoped_actor self{bs.sys};
    for (int i = 0; i < ring_size; ++i)
      self->request(ring[i], caf::infinite, set_next_atom::value,
                    ring[(i + 1) % ring_size])
        .receive([] {},
                 [&](caf::error& err) {
                   fail("thread_ring", bs.sys.render(err));
                 });
  }
  auto start = clock_type::now();
  caf::anon_send(ring[0], hops);
  if (fut.wait_for(std::chrono::minutes(10)) != std::future_status::ready)
    fail("thread_ring", "did not finish within 10 minutes");
  auto secs = seconds_since(start);
  auto last = fut.get();
  bs.shutdown(ring);
  // Node k receives hops - k, so the token reaches 0 at node hops % size.
  if (last != hops % ring_size)
    fail("thread_ring", "token ended at node " + std::to_string(last)
                          + ", expected " + std::to_string(hops % ring_size));
  report(opts, "thread_ring", "ns_per_hop", secs * 1e9 / hops, "ns");
}

// -- main ---------------------------------------------------------------------

struct workload {
  const char* name;
  void (*run)(const options&);
};

// fan_in first: its memory_growth_mb reads the process-wide peak RSS.
const workload workloads[] = {
  {"fan_in", bench_fan_in},
  {"pingpong", bench_pingpong},
  {"blocking_call", bench_blocking_call},
  {"in_flight", bench_in_flight},
  {"spawn", bench_spawn},
  {"idle_actor", bench_idle_actor},
  {"fork_join", bench_fork_join},
  {"thread_ring", bench_thread_ring},
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: caf_bench [--json] [--quick] [--only NAME] "
               "[--threads N] [--policy stealing|sharing]\n"
               "workloads:");
  for (auto& w : workloads)
    std::fprintf(out, " %s", w.name);
  std::fprintf(out, "\n");
}

[[noreturn]] void bad_usage(const std::string& what) {
  std::fprintf(stderr, "caf_bench: %s\n", what.c_str());
  usage(stderr);
  std::exit(2);
}

options parse_args(int argc, char** argv) {
  options opts;
  auto value_of = [&](int& i) -> std::string {
    if (i + 1 >= argc)
      bad_usage(std::string{"missing value for "} + argv[i]);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json") {
      opts.json = true;
    } else if (arg == "--quick") {
      opts.quick = true;
    } else if (arg == "--only") {
      opts.only = value_of(i);
      bool known = false;
      for (auto& w : workloads)
        known = known || opts.only == w.name;
      if (!known)
        bad_usage("unknown workload: " + opts.only);
    } else if (arg == "--threads") {
      auto text = value_of(i);
      char* end = nullptr;
      auto n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1 || n > 4096)
        bad_usage("--threads needs a positive integer, got: " + text);
      opts.threads = static_cast<size_t>(n);
    } else if (arg == "--policy") {
      opts.policy = value_of(i);
      if (opts.policy != "stealing" && opts.policy != "sharing")
        bad_usage("--policy must be stealing or sharing, got: " + opts.policy);
    } else if (arg == "--help" || arg == "-h") {
      usage(stdout);
      std::exit(0);
    } else {
      bad_usage("unknown flag: " + arg);
    }
  }
  if (opts.threads == 0)
    opts.threads = std::max(1u, std::thread::hardware_concurrency());
  return opts;
}

} // namespace

int main(int argc, char** argv) {
  auto opts = parse_args(argc, argv);
  if (!opts.json)
    std::printf("caf_bench: CAF %d.%d.%d, %zu threads, %s policy%s\n",
                CAF_MAJOR_VERSION, CAF_MINOR_VERSION, CAF_PATCH_VERSION,
                opts.threads, opts.policy.c_str(),
                opts.quick ? ", quick sizes" : "");
  for (auto& w : workloads)
    if (opts.only.empty() || opts.only == w.name)
      w.run(opts);
  return 0;
}
