// caf_remote_bench: the CAF (C++ Actor Framework 0.17) anchor for
// `troupe bench remote`.
//
// Runs the call patterns of troupe's remote suite (tests/bench/remote_bench.cpp)
// between two CAF processes on loopback, over CAF's own network layer (BASP,
// libcaf_io): the parent starts a peer process (this program again, with the
// hidden --peer flag), which publishes an echo actor on a free port; the parent
// connects to it with remote_actor() and calls it. Same sizes, same windows,
// same checks as troupe's suite; change both sides together or neither.
//
//   caf_remote_bench [--json] [--quick] [--only NAME] [--threads N]
//                    [--policy stealing|sharing]
//
// With --json every result is one line:
//   {"suite":"caf_remote","bench":NAME,"metric":METRIC,"value":X,"unit":U}
//
// Workloads:
//   call_sync     one request at a time from a scoped_actor (blocking
//                 request(...).receive(...)), 20 k calls after 2 k of warm-up
//   call_async    an event-based actor keeps 1000 requests in flight, each
//                 reply starting the next, 300 k calls
//   bulk          1 MiB std::vector<char> payloads (CAF writes them as raw
//                 bytes), 8 in flight, 1024 of them; the reply is the size
//   remote_spawn  5 k actors of a registered type spawned on the peer, then one
//                 request to the last one: once with the spawn requests to the
//                 middleman actor all in flight (actors_per_s, as troupe's
//                 spawn_on), once with middleman::remote_spawn, which blocks
//                 until the peer answered (actors_per_s_blocking)
//   failover      a second peer is killed with SIGKILL while 100 requests wait
//                 on its actor; ms until CAF reports the actor down and until
//                 every pending request has failed
//
// Every workload has a deadline; one that passes it is a failure (exit code
// 1), never a hang.

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

using hold_atom = caf::atom_constant<caf::atom("hold")>;
using go_atom = caf::atom_constant<caf::atom("go")>;

// -- options ------------------------------------------------------------------

struct options {
  bool json = false;
  bool quick = false;
  bool peer = false;  // hidden: run as the peer process
  std::string only;
  size_t threads = 0;
  std::string policy = "stealing";
};

// -- output and failure -------------------------------------------------------

[[noreturn]] void fail(const std::string& bench, const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "caf_remote_bench: %s: %s\n", bench.c_str(),
               what.c_str());
  std::fflush(stderr);
  // Actors and the middleman may still wait on a peer that is gone; leave
  // without running destructors. The peers see their stdin close and leave.
  std::_Exit(1);
}

void report(const options& opts, const char* bench, const char* metric,
            double value, const char* unit) {
  if (opts.json) {
    std::printf("{\"suite\":\"caf_remote\",\"bench\":\"%s\",\"metric\":\"%s\","
                "\"value\":%.3f,\"unit\":\"%s\"}\n",
                bench, metric, value, unit);
  } else {
    std::printf("%-14s %-18s %14.3f %s\n", bench, metric, value, unit);
  }
  std::fflush(stdout);
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Fails the workload when it has not finished by its deadline. Requests use
// caf::infinite (as the actors anchor does: a timeout per request would add a
// timer to every call), so this is what turns a lost peer into an error.
class watchdog {
public:
  watchdog(const char* bench, std::chrono::seconds limit)
    : thread_([this, bench, limit] {
        std::unique_lock lock{mutex_};
        if (!cv_.wait_for(lock, limit, [this] { return done_; }))
          fail(bench, "did not finish within " + std::to_string(limit.count())
                        + " s");
      }) {
  }
  ~watchdog() {
    {
      std::lock_guard lock{mutex_};
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// -- the actor on the peer ------------------------------------------------------

// The counterpart of troupe's remote_echo: ping, take and hold.
caf::behavior remote_echo() {
  return {
    [](uint64_t x) { return x + 1; },
    [](const std::vector<char>& payload) {
      return static_cast<uint64_t>(payload.size());
    },
    [](hold_atom, int64_t ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    },
  };
}

caf::actor_system_config& configure(caf::actor_system_config& cfg,
                                    const options& opts) {
  cfg.load<caf::io::middleman>();
  cfg.add_actor_type("remote_echo", remote_echo);
  cfg.set("scheduler.max-threads",
          static_cast<caf::config_value::integer>(opts.threads));
  cfg.set("scheduler.policy", caf::atom_from_string(opts.policy));
  return cfg;
}

// The peer: publishes an echo actor on a free loopback port, writes the port
// to stdout, and serves until its stdin closes.
int run_peer(const options& opts) {
  caf::actor_system_config cfg;
  caf::actor_system sys{configure(cfg, opts)};
  auto echo = sys.spawn(remote_echo);
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "caf_remote_bench --peer: cannot publish: %s\n",
                 sys.render(port.error()).c_str());
    return 1;
  }
  std::printf("%u\n", static_cast<unsigned>(*port));
  std::fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0) {
  }
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  // Actors spawned remotely by the parent are still alive; do not wait for them.
  std::_Exit(0);
}

// A peer process. It runs until its stdin closes: when this object goes (or
// the parent dies), the pipe closes and the peer leaves.
struct peer_process {
  pid_t pid = -1;
  int stdin_fd = -1;
  uint16_t port = 0;

  peer_process() = default;
  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;

  ~peer_process() {
    if (stdin_fd >= 0)
      close(stdin_fd);
    if (pid > 0) {
      for (int i = 0; i < 50; ++i) {
        if (waitpid(pid, nullptr, WNOHANG) == pid)
          return;
        std::this_thread::sleep_for(100ms);
      }
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

void start_peer(peer_process& peer, const options& opts) {
  std::vector<std::string> args{"caf_remote_bench", "--peer", "--threads",
                                std::to_string(opts.threads), "--policy",
                                opts.policy};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
    fail("peer", "cannot make pipes for the peer");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  int rc = posix_spawn(&peer.pid, "/proc/self/exe", &fa, nullptr, argv.data(),
                       environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  peer.stdin_fd = in[1];
  if (rc != 0)
    fail("peer", std::string{"cannot start the peer process: "}
                   + std::strerror(rc));
  // Its first line is the port; a peer that died or hangs must not hang us.
  std::string line;
  auto deadline = clock_type::now() + 20s;
  while (line.find('\n') == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - clock_type::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
      fail("peer", "the peer process did not publish within 20 s");
    char buf[64];
    auto n = read(out[0], buf, sizeof buf);
    if (n <= 0)
      fail("peer", "the peer process exited before publishing");
    line.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  auto port = std::strtoul(line.c_str(), nullptr, 10);
  if (port == 0 || port > 65535)
    fail("peer", "the peer process printed no port: " + line);
  peer.port = static_cast<uint16_t>(port);
}

caf::actor connect(caf::actor_system& sys, const peer_process& peer) {
  auto echo = sys.middleman().remote_actor("127.0.0.1", peer.port);
  if (!echo)
    fail("peer", "remote_actor: " + sys.render(echo.error()));
  return *echo;
}

// -- call_sync ----------------------------------------------------------------

void bench_call_sync(const options& opts, caf::actor_system& sys,
                     const caf::actor& echo) {
  const uint64_t rounds = opts.quick ? 2'000 : 20'000;
  watchdog wd{"call_sync", 120s};
  caf::scoped_actor self{sys};
  auto calls = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i)
      self->request(echo, caf::infinite, i)
        .receive(
          [&](uint64_t r) {
            if (r != i + 1)
              fail("call_sync", "a reply did not match its call");
          },
          [&](caf::error& err) { fail("call_sync", sys.render(err)); });
  };
  calls(rounds / 10);  // warm-up, as troupe's suite does
  auto start = clock_type::now();
  calls(rounds);
  auto secs = seconds_since(start);
  report(opts, "call_sync", "calls_per_s", rounds / secs, "calls/s");
  report(opts, "call_sync", "round_trip_us", secs * 1e6 / rounds, "us");
}

// -- call_async and bulk ---------------------------------------------------------

// Keeps `window` requests in flight until `total` have been answered; each
// reply starts the next request. With a payload every request carries it and
// the reply must be its size; without, request i carries i and the reply must
// be i + 1.
class pipelined_driver : public caf::event_based_actor {
public:
  pipelined_driver(caf::actor_config& cfg, caf::actor target, uint64_t total,
                   size_t window, const std::vector<char>* payload,
                   std::promise<std::string>* done)
    : caf::event_based_actor(cfg),
      target_(std::move(target)),
      total_(total),
      window_(window),
      payload_(payload),
      done_(done) {
  }

  caf::behavior make_behavior() override {
    for (size_t i = 0; i < window_; ++i)
      next();
    return {[](go_atom) {}};
  }

private:
  void next() {
    if (sent_ == total_)
      return;
    auto i = sent_++;
    auto on_error = [this](caf::error& err) {
      finish(system().render(err));
    };
    if (payload_ != nullptr) {
      request(target_, caf::infinite, *payload_)
        .then(
          [this](uint64_t r) {
            on_reply(r == payload_->size());
          },
          on_error);
    } else {
      request(target_, caf::infinite, i)
        .then([this, i](uint64_t r) { on_reply(r == i + 1); }, on_error);
    }
  }

  void on_reply(bool valid) {
    if (!valid)
      return finish("a reply did not match its call");
    if (++answered_ == total_)
      return finish("");
    next();
  }

  void finish(std::string failure) {
    if (finished_)
      return;
    finished_ = true;
    done_->set_value(std::move(failure));
    quit();
  }

  caf::actor target_;
  uint64_t total_;
  size_t window_;
  const std::vector<char>* payload_;
  std::promise<std::string>* done_;
  uint64_t sent_ = 0;
  uint64_t answered_ = 0;
  bool finished_ = false;
};

double pipelined(const char* bench, caf::actor_system& sys,
                 const caf::actor& echo, uint64_t total, size_t window,
                 const std::vector<char>* payload) {
  watchdog wd{bench, 120s};
  std::promise<std::string> done;
  auto fut = done.get_future();
  auto start = clock_type::now();
  sys.spawn<pipelined_driver>(echo, total, window, payload, &done);
  auto failure = fut.get();
  auto secs = seconds_since(start);
  if (!failure.empty())
    fail(bench, failure);
  return secs;
}

void bench_call_async(const options& opts, caf::actor_system& sys,
                      const caf::actor& echo) {
  const uint64_t n = opts.quick ? 20'000 : 300'000;
  auto secs = pipelined("call_async", sys, echo, n, 1000, nullptr);
  report(opts, "call_async", "calls_per_s", n / secs, "calls/s");
}

void bench_bulk(const options& opts, caf::actor_system& sys,
                const caf::actor& echo) {
  const uint64_t n = opts.quick ? 64 : 1024;
  const size_t mib = size_t{1} << 20;
  std::vector<char> payload(mib);
  for (size_t i = 0; i < mib; ++i)
    payload[i] = static_cast<char>(i * 131 % 251);
  auto secs = pipelined("bulk", sys, echo, n, 8, &payload);
  report(opts, "bulk", "MB_per_s", static_cast<double>(n) * mib / 1e6 / secs,
         "MB/s");
}

// -- remote_spawn ---------------------------------------------------------------

// Asks the middleman actor for `n` spawns on `nid` without waiting between
// them (troupe's spawn_on returns at once too), then calls the last actor.
class spawn_driver : public caf::event_based_actor {
public:
  spawn_driver(caf::actor_config& cfg, caf::node_id nid, size_t n,
               std::vector<caf::actor>* spawned,
               std::promise<std::string>* done)
    : caf::event_based_actor(cfg),
      nid_(std::move(nid)),
      n_(n),
      spawned_(spawned),
      done_(done) {
  }

  caf::behavior make_behavior() override {
    auto mm = system().middleman().actor_handle();
    for (size_t i = 0; i < n_; ++i)
      request(mm, caf::infinite, caf::spawn_atom::value, nid_,
              std::string{"remote_echo"}, caf::make_message(),
              std::set<std::string>{})
        .then(
          [this](caf::strong_actor_ptr& p) {
            if (!p)
              return finish("the peer spawned no actor");
            spawned_->push_back(caf::actor_cast<caf::actor>(std::move(p)));
            if (spawned_->size() == n_)
              call_last();
          },
          [this](caf::error& err) { finish(system().render(err)); });
    return {[](go_atom) {}};
  }

private:
  void call_last() {
    request(spawned_->back(), caf::infinite, uint64_t{1})
      .then(
        [this](uint64_t r) {
          finish(r == 2 ? "" : "a spawned actor answered wrong");
        },
        [this](caf::error& err) { finish(system().render(err)); });
  }

  void finish(std::string failure) {
    if (finished_)
      return;
    finished_ = true;
    done_->set_value(std::move(failure));
    quit();
  }

  caf::node_id nid_;
  size_t n_;
  std::vector<caf::actor>* spawned_;
  std::promise<std::string>* done_;
  bool finished_ = false;
};

// Two ways to spawn on the peer: middleman::remote_spawn, the documented call,
// which blocks until the peer answered each spawn (actors_per_s_blocking), and
// spawn requests to the middleman actor kept in flight together, as troupe's
// spawn_on does (actors_per_s). Each is followed by one request to the last
// actor, and its actors are stopped after the clock stopped.
void bench_remote_spawn(const options& opts, caf::actor_system& sys,
                        const caf::actor& echo) {
  const size_t n = opts.quick ? 500 : 5'000;
  watchdog wd{"remote_spawn", 300s};
  auto stop_all = [](std::vector<caf::actor>& actors) {
    for (auto& a : actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();
  };
  std::vector<caf::actor> spawned;
  spawned.reserve(n);
  {
    std::promise<std::string> done;
    auto fut = done.get_future();
    auto start = clock_type::now();
    sys.spawn<spawn_driver>(echo.node(), n, &spawned, &done);
    auto failure = fut.get();
    auto secs = seconds_since(start);
    if (!failure.empty())
      fail("remote_spawn", failure);
    if (spawned.size() != n || spawned.back().node() != echo.node())
      fail("remote_spawn", "the actors were not spawned on the peer");
    report(opts, "remote_spawn", "actors_per_s", n / secs, "actors/s");
    stop_all(spawned);
  }
  auto start = clock_type::now();
  for (size_t i = 0; i < n; ++i) {
    auto a = sys.middleman().remote_spawn<caf::actor>(
      echo.node(), "remote_echo", caf::make_message(), 60s);
    if (!a)
      fail("remote_spawn", "remote_spawn: " + sys.render(a.error()));
    spawned.push_back(std::move(*a));
  }
  {
    caf::scoped_actor self{sys};
    self->request(spawned.back(), caf::infinite, uint64_t{1})
      .receive(
        [&](uint64_t r) {
          if (r != 2)
            fail("remote_spawn", "a spawned actor answered wrong");
        },
        [&](caf::error& err) { fail("remote_spawn", sys.render(err)); });
  }
  auto secs = seconds_since(start);
  if (spawned.back().node() != echo.node())
    fail("remote_spawn", "the actors were not spawned on the peer");
  report(opts, "remote_spawn", "actors_per_s_blocking", n / secs, "actors/s");
  stop_all(spawned);
}

// -- failover -------------------------------------------------------------------

// Times, as the driver saw them, of the down message of its monitor on the
// doomed actor and of the last of its pending requests that failed.
struct failover_times {
  clock_type::time_point down;
  clock_type::time_point last_failure;
  int failed = 0;
};

// Sends `n` requests to an actor that sleeps in the first; collects the down
// message and the requests' failures.
class failover_driver : public caf::event_based_actor {
public:
  failover_driver(caf::actor_config& cfg, caf::actor target, int n,
                  std::promise<void>* sent, std::mutex* mutex,
                  failover_times* times)
    : caf::event_based_actor(cfg),
      target_(std::move(target)),
      n_(n),
      sent_(sent),
      mutex_(mutex),
      times_(times) {
  }

  caf::behavior make_behavior() override {
    monitor(target_);
    set_down_handler([this](caf::down_msg&) {
      std::lock_guard lock{*mutex_};
      times_->down = clock_type::now();
    });
    // Requests without a timeout, as everywhere else: the question is whether
    // losing the node ends them.
    for (int i = 0; i < n_; ++i)
      request(target_, caf::infinite, hold_atom::value, int64_t{60'000})
        .then([] { fail("failover", "a request to the killed node succeeded"); },
              [this](caf::error&) {
                std::lock_guard lock{*mutex_};
                times_->last_failure = clock_type::now();
                ++times_->failed;
              });
    sent_->set_value();
    return {[](go_atom) {}};
  }

private:
  caf::actor target_;
  int n_;
  std::promise<void>* sent_;
  std::mutex* mutex_;
  failover_times* times_;
};

// A second peer, killed with SIGKILL while 100 requests wait on its actor (the
// actor sleeps in the first one). troupe's asks fail with node_lost; here the
// time until CAF delivers the down message of a monitor on the actor, and the
// time until every pending request has failed, whatever the error.
void bench_failover(const options& opts, caf::actor_system& sys) {
  const int n = 100;
  watchdog wd{"failover", 120s};
  peer_process doomed;
  start_peer(doomed, opts);
  auto a = connect(sys, doomed);
  {
    caf::scoped_actor self{sys};
    self->request(a, caf::infinite, uint64_t{1})
      .receive(
        [&](uint64_t r) {
          if (r != 2)
            fail("failover", "the doomed peer answered wrong");
        },
        [&](caf::error& err) { fail("failover", sys.render(err)); });
  }
  std::promise<void> sent;
  std::mutex mutex;
  failover_times times;
  auto driver = sys.spawn<failover_driver>(a, n, &sent, &mutex, &times);
  sent.get_future().wait();
  std::this_thread::sleep_for(50ms);
  auto start = clock_type::now();
  kill(doomed.pid, SIGKILL);
  // CAF may leave the requests pending: give them 10 s (2 s with --quick).
  const auto wait = opts.quick ? 2s : 10s;
  auto deadline = start + wait;
  bool down = false;
  int failed = 0;
  while (clock_type::now() < deadline) {
    {
      std::lock_guard lock{mutex};
      down = times.down != clock_type::time_point{};
      failed = times.failed;
    }
    if (down && failed == n)
      break;
    std::this_thread::sleep_for(1ms);
  }
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  std::lock_guard lock{mutex};
  auto ms = [&](clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(t - start).count();
  };
  if (!down)
    fail("failover", "no down message within " + std::to_string(wait.count())
                       + " s of the kill");
  report(opts, "failover", "ms_until_down", ms(times.down), "ms");
  if (times.failed < n) {
    // Not a failure of this program: CAF leaves the requests pending. Say so
    // instead of inventing a number.
    std::fprintf(stderr,
                 "caf_remote_bench: failover: %d of %d pending requests "
                 "failed within %d s of the kill\n",
                 times.failed, n, static_cast<int>(wait.count()));
    return;
  }
  report(opts, "failover", "ms_until_asks_fail", ms(times.last_failure), "ms");
}

// -- main ---------------------------------------------------------------------

const char* const workload_names[] = {"call_sync", "call_async", "bulk",
                                      "remote_spawn", "failover"};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: caf_remote_bench [--json] [--quick] [--only NAME] "
               "[--threads N] [--policy stealing|sharing]\n"
               "workloads:");
  for (auto name : workload_names)
    std::fprintf(out, " %s", name);
  std::fprintf(out, "\n");
}

[[noreturn]] void bad_usage(const std::string& what) {
  std::fprintf(stderr, "caf_remote_bench: %s\n", what.c_str());
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
    } else if (arg == "--peer") {
      opts.peer = true;
    } else if (arg == "--only") {
      opts.only = value_of(i);
      if (std::none_of(std::begin(workload_names), std::end(workload_names),
                       [&](const char* n) { return opts.only == n; }))
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
  // troupe's remote suite runs 2 worker threads on each side.
  if (opts.threads == 0)
    opts.threads = 2;
  return opts;
}

} // namespace

int main(int argc, char** argv) {
  auto opts = parse_args(argc, argv);
  if (opts.peer)
    return run_peer(opts);
  // A peer whose parent died gets EPIPE on nothing (it only reads); the
  // parent must not die of SIGPIPE when a peer goes first.
  signal(SIGPIPE, SIG_IGN);
  if (!opts.json)
    std::printf("caf_remote_bench: CAF %d.%d.%d, %zu threads per process, "
                "%s policy%s\n",
                CAF_MAJOR_VERSION, CAF_MINOR_VERSION, CAF_PATCH_VERSION,
                opts.threads, opts.policy.c_str(),
                opts.quick ? ", quick sizes" : "");
  auto wants = [&](const char* name) {
    return opts.only.empty() || opts.only == name;
  };
  peer_process peer; // declared first: stopped last, after the system
  caf::actor_system_config cfg;
  caf::actor_system sys{configure(cfg, opts)};
  start_peer(peer, opts);
  auto echo = connect(sys, peer);
  if (wants("call_sync"))
    bench_call_sync(opts, sys, echo);
  if (wants("call_async"))
    bench_call_async(opts, sys, echo);
  if (wants("bulk"))
    bench_bulk(opts, sys, echo);
  if (wants("remote_spawn"))
    bench_remote_spawn(opts, sys, echo);
  if (wants("failover"))
    bench_failover(opts, sys);
  std::fflush(stdout);
  // The middleman's shutdown waits on connections to peers that may be gone;
  // the results are out, so leave without it. The peers see stdin close.
  std::_Exit(0);
}
