// The actors benchmark suite: eight workloads that an actor runtime is commonly judged by.
// Sizes (full / --quick) and definitions are shared with tests/bench/caf/caf_bench.cpp.

#include "actors_bench.hpp"

#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace troupe::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// A field of /proc/self/status in bytes (VmRSS, VmHWM).
long long proc_status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == std::string(field) + ":") {
      long long kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, key);
  }
  return 0;
}

void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

struct reporter {
  const options& opts;
  std::ostream& out;
  void operator()(const char* bench, const char* metric, double value, const char* unit) const {
    if (opts.json) {
      char num[64];
      std::snprintf(num, sizeof num, "%.3f", value);
      out << "{\"suite\":\"actors\",\"bench\":\"" << bench << "\",\"metric\":\"" << metric
          << "\",\"value\":" << num << ",\"unit\":\"" << unit << "\"}\n";
    } else {
      char line[160];
      std::snprintf(line, sizeof line, "%-14s %-18s %14.3f %s\n", bench, metric, value, unit);
      out << line;
    }
    out.flush();
  }
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

// ---- pingpong / blocking_call / in_flight ------------------------------------------------

struct ponger {
  int pong(int x) { return x + 1; }
};

struct pinger {
  actor_ref<ponger> peer;
  task<int> run(int n) {
    int x = 0;
    for (int i = 0; i < n; ++i) x = co_await peer.ask(&ponger::pong, x);
    co_return x;
  }
};

void pingpong(const options& o, const reporter& report) {
  const int n = o.quick ? 100'000 : 1'000'000;
  actor_system sys{{.threads = o.threads}};
  auto b = sys.spawn<ponger>();
  auto a = sys.spawn<pinger>(b);
  auto t0 = clock_type::now();
  int r = a.ask(&pinger::run, n).get();
  double s = seconds_since(t0);
  check(r == n, "pingpong: wrong result");
  report("pingpong", "round_trip_us", s * 1e6 / n, "us");
}

void blocking_call(const options& o, const reporter& report) {
  const int n = o.quick ? 10'000 : 100'000;
  actor_system sys{{.threads = o.threads}};
  auto b = sys.spawn<ponger>();
  auto t0 = clock_type::now();
  long long sum = 0;
  for (int i = 0; i < n; ++i) sum += b.ask(&ponger::pong, i).get();
  double s = seconds_since(t0);
  check(sum == static_cast<long long>(n) * (n + 1) / 2, "blocking_call: wrong result");
  report("blocking_call", "round_trip_us", s * 1e6 / n, "us");
}

void in_flight(const options& o, const reporter& report) {
  const int n = o.quick ? 200'000 : 2'000'000;
  const int window = 1000;
  actor_system sys{{.threads = o.threads}};
  auto b = sys.spawn<ponger>();
  std::deque<future<int>> pending;
  auto t0 = clock_type::now();
  long long sum = 0;
  int sent = 0;
  for (; sent < window && sent < n; ++sent) pending.push_back(b.ask(&ponger::pong, sent));
  while (!pending.empty()) {
    sum += pending.front().get();
    pending.pop_front();
    if (sent < n) pending.push_back(b.ask(&ponger::pong, sent++));
  }
  double s = seconds_since(t0);
  check(sum == static_cast<long long>(n) * (n + 1) / 2, "in_flight: wrong result");
  report("in_flight", "calls_per_s", n / s, "calls/s");
}

// ---- fan_in -----------------------------------------------------------------------------

struct fan_receiver {
  long long expected;
  std::promise<long long>* done;
  long long count = 0;
  long long sum = 0;
  void take(int v) {
    sum += v;
    if (++count == expected) done->set_value(sum);
  }
};

struct fan_sender {
  actor_ref<fan_receiver> to;
  int remaining;
  void go() {
    for (int k = 0; k < 100 && remaining > 0; ++k, --remaining) to.tell(&fan_receiver::take, 1);
    if (remaining > 0) this_actor::self<fan_sender>().tell(&fan_sender::go);
  }
};

void fan_in(const options& o, const reporter& report) {
  const int per_sender = o.quick ? 100'000 : 1'000'000;
  const int senders = 4;
  actor_system sys{{.threads = o.threads}};
  std::promise<long long> done;
  auto result = done.get_future();
  auto rx = sys.spawn<fan_receiver>(spawn_options{.mailbox_capacity = 1024},
                                    static_cast<long long>(per_sender) * senders, &done);
  std::vector<actor_ref<fan_sender>> tx;
  for (int i = 0; i < senders; ++i) tx.push_back(sys.spawn<fan_sender>(rx, per_sender));
  reset_peak_rss();
  const long long rss0 = proc_status_bytes("VmRSS");
  auto t0 = clock_type::now();
  for (auto& t : tx) t.tell(&fan_sender::go);
  long long sum = result.get();
  double s = seconds_since(t0);
  const long long peak = proc_status_bytes("VmHWM");
  check(sum == static_cast<long long>(per_sender) * senders, "fan_in: messages lost");
  report("fan_in", "msgs_per_s", per_sender * static_cast<double>(senders) / s, "msgs/s");
  report("fan_in", "memory_growth_mb", static_cast<double>(peak - rss0) / (1024.0 * 1024.0), "MB");
}

// ---- spawn ------------------------------------------------------------------------------

struct spawned {
  int work(int x) { return x + 1; }
};

struct spawner {
  int n;
  std::promise<void>* done;
  int replies = 0;
  void go() {
    auto& sys = this_actor::system();
    for (int i = 0; i < n; ++i) {
      auto w = sys.spawn<spawned>();
      w.ask(&spawned::work, i).then([this, w](int) {
        w.stop();
        if (++replies == n) done->set_value();
      });
    }
  }
};

void spawn(const options& o, const reporter& report) {
  const int n = o.quick ? 10'000 : 100'000;
  actor_system sys{{.threads = o.threads}};
  std::promise<void> done;
  auto finished = done.get_future();
  auto d = sys.spawn<spawner>(n, &done);
  const auto base = sys.live_actors();
  auto t0 = clock_type::now();
  d.tell(&spawner::go);
  finished.get();
  while (sys.live_actors() > base) std::this_thread::sleep_for(std::chrono::microseconds(50));
  double s = seconds_since(t0);
  report("spawn", "actors_per_s", n / s, "actors/s");
}

// ---- idle_actor -------------------------------------------------------------------------

struct empty_actor {};

void idle_actor(const options& o, const reporter& report) {
  const int n = o.quick ? 100'000 : 1'000'000;
  actor_system sys{{.threads = o.threads}};
  std::vector<actor_ref<empty_actor>> refs;
  refs.reserve(n);
  const long long rss0 = proc_status_bytes("VmRSS");
  for (int i = 0; i < n; ++i) refs.push_back(sys.spawn<empty_actor>());
  const long long rss1 = proc_status_bytes("VmRSS");
  check(sys.live_actors() == static_cast<std::size_t>(n), "idle_actor: wrong count");
  report("idle_actor", "bytes_per_actor", static_cast<double>(rss1 - rss0) / n, "bytes");
}

// ---- fork_join --------------------------------------------------------------------------

struct fj_worker {
  int work(int x) { return x; }
};

struct fj_master {
  std::vector<actor_ref<fj_worker>> workers;
  task<long long> run(int rounds) {
    long long total = 0;
    std::vector<future<int>> replies;
    replies.reserve(workers.size());
    for (int r = 0; r < rounds; ++r) {
      replies.clear();
      for (auto& w : workers) replies.push_back(w.ask(&fj_worker::work, 1));
      for (auto& f : replies) total += co_await std::move(f);
    }
    co_return total;
  }
};

void fork_join(const options& o, const reporter& report) {
  const int rounds = o.quick ? 100 : 1000;
  const int width = 1000;
  actor_system sys{{.threads = o.threads}};
  std::vector<actor_ref<fj_worker>> workers;
  for (int i = 0; i < width; ++i) workers.push_back(sys.spawn<fj_worker>());
  auto m = sys.spawn<fj_master>(workers);
  auto t0 = clock_type::now();
  long long total = m.ask(&fj_master::run, rounds).get();
  double s = seconds_since(t0);
  check(total == static_cast<long long>(rounds) * width, "fork_join: wrong result");
  report("fork_join", "rounds_per_s", rounds / s, "rounds/s");
}

// ---- thread_ring ------------------------------------------------------------------------

struct ring_node {
  std::promise<void>* done;
  actor_ref<ring_node> next;
  void link(actor_ref<ring_node> n) { next = std::move(n); }
  void token(int t) {
    if (t == 0) {
      done->set_value();
      return;
    }
    next.tell(&ring_node::token, t - 1);
  }
};

void thread_ring(const options& o, const reporter& report) {
  const int hops = o.quick ? 1'000'000 : 10'000'000;
  const int size = 503;
  actor_system sys{{.threads = o.threads}};
  std::promise<void> done;
  auto finished = done.get_future();
  std::vector<actor_ref<ring_node>> nodes;
  for (int i = 0; i < size; ++i) nodes.push_back(sys.spawn<ring_node>(&done));
  for (int i = 0; i < size; ++i) nodes[i].ask(&ring_node::link, nodes[(i + 1) % size]).get();
  auto t0 = clock_type::now();
  nodes[0].tell(&ring_node::token, hops);
  finished.get();
  double s = seconds_since(t0);
  report("thread_ring", "ns_per_hop", s * 1e9 / hops, "ns");
}

struct workload {
  const char* name;
  void (*run)(const options&, const reporter&);
};

const workload workloads[] = {
    {"fan_in", fan_in},          {"pingpong", pingpong},   {"blocking_call", blocking_call},
    {"in_flight", in_flight},    {"spawn", spawn},         {"idle_actor", idle_actor},
    {"fork_join", fork_join},    {"thread_ring", thread_ring},
};

const char* const names[] = {"fan_in",    "pingpong",   "blocking_call", "in_flight", "spawn",
                             "idle_actor", "fork_join", "thread_ring",   nullptr};

}  // namespace

const char* const* actor_bench_names() { return names; }

int run_actors(const options& opts, std::ostream& out) {
  reporter report{opts, out};
  bool found = opts.only.empty();
  for (const auto& w : workloads) {
    if (!opts.only.empty() && opts.only != w.name) continue;
    found = true;
    try {
      w.run(opts, report);
    } catch (const std::exception& e) {
      std::cerr << "troupe bench actors: " << w.name << " failed: " << e.what() << "\n";
      return 1;
    }
  }
  if (!found) {
    std::cerr << "troupe bench actors: no workload named '" << opts.only << "'\n";
    return 2;
  }
  return 0;
}

}  // namespace troupe::bench
