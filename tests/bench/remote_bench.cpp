#include "remote_bench.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "troupe/actors/remote.hpp"

extern char** environ;

namespace troupe::bench {

/// The actor the remote suite calls on the peer node.
struct remote_echo {
  std::uint64_t ping(std::uint64_t x) { return x + 1; }
  std::uint64_t take(std::vector<std::byte> payload) { return payload.size(); }
  void hold(std::int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
};

}  // namespace troupe::bench

TROUPE_REMOTE(troupe::bench::remote_echo, ping, take, hold)

namespace troupe::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* token_env = "TROUPE_BENCH_REMOTE_TOKEN";

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

struct reporter {
  const remote_options& opts;
  std::ostream& out;
  void operator()(const char* bench, const char* metric, double value, const char* unit) const {
    if (opts.json) {
      char num[64];
      std::snprintf(num, sizeof num, "%.3f", value);
      out << "{\"suite\":\"remote\",\"bench\":\"" << bench << "\",\"metric\":\"" << metric
          << "\",\"value\":" << num << ",\"unit\":\"" << unit << "\"}\n";
    } else {
      char line[160];
      std::snprintf(line, sizeof line, "%-14s %-18s %14.3f %s\n", bench, metric, value, unit);
      out << line;
    }
    out.flush();
  }
};

/// A peer node process. It runs until its standard input closes: when this object goes (or
/// the suite's process dies), the pipe closes and the peer leaves.
struct peer_process {
  pid_t pid = -1;
  int stdin_fd = -1;
  ~peer_process() {
    if (stdin_fd >= 0) close(stdin_fd);
    if (pid > 0) {
      // Do not wait on a peer that hangs.
      for (int i = 0; i < 50; ++i) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) return;
        std::this_thread::sleep_for(100ms);
      }
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

std::string random_token() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 32; ++i) t += "0123456789abcdef"[rd() % 16];
  return t;
}

}  // namespace

const char* const* remote_bench_names() {
  static const char* const names[] = {"raw_pingpong", "call_sync", "call_async", "bulk", "remote_spawn",
                                      "failover", nullptr};
  return names;
}

namespace {

/// Starts this program again as a peer node: `troupe bench remote --peer HOST:RAW:HEAD`; the
/// token travels in its environment, never on its command line.
void start_peer(peer_process& peer, const std::string& token, const std::string& where) {
  std::string self = "/proc/self/exe";
  std::vector<std::string> args{"troupe", "bench", "remote", "--peer", where};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings{std::string(token_env) + "=" + token};
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, token_env, std::strlen(token_env)) != 0) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int in[2];
  if (pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("cannot make a pipe for the peer");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  int rc = posix_spawn(&peer.pid, self.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  peer.stdin_fd = in[1];
  if (rc != 0) throw std::runtime_error(std::string("cannot start the peer process: ") + std::strerror(rc));
}

/// Waits until the cluster has `n` live nodes besides the head.
std::vector<node_id> wait_for_nodes(actor_system& sys, std::size_t n, const std::string& token) {
  auto deadline = clock_type::now() + 20s;
  while (clock_type::now() < deadline) {
    std::vector<node_id> ids;
    for (auto& s : cluster_status("127.0.0.1:" + std::to_string(sys.node_port()), token))
      if (s.info.alive && s.info.id != sys.node()) ids.push_back(s.info.id);
    if (ids.size() >= n) return ids;
    std::this_thread::sleep_for(20ms);
  }
  throw std::runtime_error("the peer node did not join within 20 s");
}

/// Runs `total` asks with at most `window` in flight, each started from the previous one's
/// callback; returns seconds.
template <class Ask, class Check>
double pipelined(std::uint64_t total, std::size_t window, Ask ask, Check valid) {
  struct state {
    std::mutex m;
    std::condition_variable cv;
    std::uint64_t sent = 0, done = 0;
    std::string failure;
  };
  auto st = std::make_shared<state>();
  std::function<void()> next = [&, st] {
    {
      std::lock_guard lock(st->m);
      if (st->sent == total) return;
      ++st->sent;
    }
    ask().then(
        [&, st](std::uint64_t v) {
          const bool ok = valid(v);
          // Start the next call before this one counts as done: once done == total the caller
          // returns, and `next`, `ask` and `total` live in its frame.
          if (ok) next();
          std::lock_guard lock(st->m);
          if (!ok) st->failure = "a reply did not match its call";
          if (++st->done == total) st->cv.notify_all();
        },
        [st](std::exception_ptr e) {
          std::lock_guard lock(st->m);
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            st->failure = x.what();
          }
          st->cv.notify_all();
        });
  };
  auto t0 = clock_type::now();
  for (std::size_t i = 0; i < window && i < total; ++i) next();
  std::unique_lock lock(st->m);
  check(st->cv.wait_for(lock, 120s, [&] { return st->done == total || !st->failure.empty(); }),
        "the peer stopped answering");
  check(st->failure.empty(), st->failure);
  return seconds_since(t0);
}

}  // namespace

int run_remote(const remote_options& opts, std::ostream& out) {
  bool known = opts.only.empty();
  for (auto* n = remote_bench_names(); *n; ++n) known = known || opts.only == *n;
  if (!known) {
    std::cerr << "troupe bench remote: no workload named '" << opts.only << "'\n";
    return 2;
  }
  auto wants = [&](const char* name) { return opts.only.empty() || opts.only == name; };
  reporter report{opts, out};
  try {
    const auto token = random_token();
    peer_process peer, doomed;  // declared first: stopped last, after the head
    asio::io_context raw_io;
    tcp::acceptor raw_acceptor(raw_io, {asio::ip::make_address("127.0.0.1"), 0});
    system_config cfg{.threads = 2};
    cfg.node.listen = "127.0.0.1:0";
    cfg.node.token = token;
    actor_system head(cfg);
    auto where = [&](bool raw) {
      return "127.0.0.1:" + std::to_string(raw ? raw_acceptor.local_endpoint().port() : 0) + ":" +
             std::to_string(head.node_port());
    };
    start_peer(peer, token, where(true));

    // Accept the peer's raw socket with a deadline: a peer that died must not hang the suite.
    tcp::socket raw(raw_io);
    bool accepted = false;
    raw_acceptor.async_accept(raw, [&](boost::system::error_code ec) { accepted = !ec; });
    raw_io.run_for(20s);
    check(accepted, "the peer process did not connect within 20 s");
    raw.set_option(tcp::no_delay(true));
    auto peer_node = wait_for_nodes(head, 1, token).front();
    auto echo = head.spawn_on<remote_echo>(peer_node);

    const std::uint64_t rounds = opts.quick ? 2'000 : 20'000;
    double raw_us = 0;
    {
      // Anchor: 8 bytes back and forth over a plain blocking Asio socket, no framing at all.
      std::uint64_t x = 0;
      auto pingpong = [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i) {
          asio::write(raw, asio::buffer(&x, 8));
          std::uint64_t y = 0;
          asio::read(raw, asio::buffer(&y, 8));
          check(y == x + 1, "the raw peer answered the wrong number");
          x = y;
        }
      };
      pingpong(rounds / 10);  // warm-up, as for the actor workloads
      auto t0 = clock_type::now();
      pingpong(rounds);
      auto s = seconds_since(t0);
      raw_us = s * 1e6 / rounds;
      if (wants("raw_pingpong")) {
        report("raw_pingpong", "round_trips_per_s", rounds / s, "round trips/s");
        report("raw_pingpong", "round_trip_us", raw_us, "us");
      }
    }
    raw.close();
    if (wants("call_sync")) {
      // One ask at a time from a thread outside the actors, as a driver program calls.
      auto sync_calls = [&](std::uint64_t n) {
        for (std::uint64_t i = 0; i < n; ++i)
          check(echo.ask(&remote_echo::ping, i).get() == i + 1, "a reply did not match its call");
      };
      sync_calls(rounds / 10);
      auto t0 = clock_type::now();
      sync_calls(rounds);
      auto s = seconds_since(t0);
      report("call_sync", "calls_per_s", rounds / s, "calls/s");
      report("call_sync", "round_trip_us", s * 1e6 / rounds, "us");
      report("call_sync", "ratio_to_raw", (s * 1e6 / rounds) / raw_us, "x");
    }
    if (wants("call_async")) {
      const std::uint64_t n = opts.quick ? 20'000 : 300'000;
      std::atomic<std::uint64_t> seq{0};
      auto s = pipelined(n, 1000, [&] { return echo.ask(&remote_echo::ping, seq.fetch_add(1)); },
                         [](std::uint64_t v) { return v != 0; });
      report("call_async", "calls_per_s", n / s, "calls/s");
    }
    if (wants("bulk")) {
      const std::uint64_t n = opts.quick ? 64 : 1024;
      const std::size_t mib = 1u << 20;
      std::vector<std::byte> payload(mib);
      for (std::size_t i = 0; i < mib; ++i) payload[i] = std::byte(i * 131 % 251);
      auto s = pipelined(n, 8, [&] { return echo.ask(&remote_echo::take, payload); },
                         [&](std::uint64_t v) { return v == mib; });
      report("bulk", "MB_per_s", static_cast<double>(n) * mib / 1e6 / s, "MB/s");
    }
    if (wants("remote_spawn")) {
      const std::size_t n = opts.quick ? 500 : 5'000;
      std::vector<actor_ref<remote_echo>> spawned;
      spawned.reserve(n);
      auto t0 = clock_type::now();
      for (std::size_t i = 0; i < n; ++i) spawned.push_back(head.spawn_on<remote_echo>(peer_node));
      // Creations and calls to one node arrive in order: the last actor's answer means all exist.
      check(spawned.back().ask(&remote_echo::ping, 1).get() == 2, "a spawned actor answered wrong");
      auto s = seconds_since(t0);
      report("remote_spawn", "actors_per_s", n / s, "actors/s");
      for (auto& a : spawned) a.stop();
    }
    if (wants("failover")) {
      // A second node, killed with SIGKILL while 100 asks wait on it.
      start_peer(doomed, token, where(false));
      auto ids = wait_for_nodes(head, 2, token);
      node_id victim = ids.back() == peer_node ? ids.front() : ids.back();
      auto a = head.spawn_on<remote_echo>(victim);
      check(a.ask(&remote_echo::ping, 1).get() == 2, "the doomed node answered wrong");
      std::vector<future<void>> waiting;
      for (int i = 0; i < 100; ++i) waiting.push_back(a.ask(&remote_echo::hold, std::int64_t{60'000}));
      std::this_thread::sleep_for(50ms);
      auto t0 = clock_type::now();
      kill(doomed.pid, SIGKILL);
      for (auto& f : waiting) {
        try {
          f.get();
          throw std::runtime_error("an ask to the killed node succeeded");
        } catch (const error& e) {
          check(e.code_value() == errc::node_lost, std::string("an ask failed otherwise: ") + e.what());
        }
      }
      report("failover", "ms_until_asks_fail", seconds_since(t0) * 1e3, "ms");
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe bench remote: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int run_remote_peer(const remote_options& opts) {
  const char* token = std::getenv(token_env);
  if (token == nullptr || *token == '\0') {
    std::cerr << "troupe bench remote --peer: " << token_env << " is not set\n";
    return 1;
  }
  auto first = opts.peer.find(':'), second = opts.peer.rfind(':');
  if (first == std::string::npos || first == second) {
    std::cerr << "troupe bench remote --peer: expected host:raw_port:head_port, got '" << opts.peer << "'\n";
    return 1;
  }
  std::thread raw_echo;
  try {
    const auto host = opts.peer.substr(0, first);
    const auto raw = std::stoul(opts.peer.substr(first + 1, second - first - 1));
    if (raw > 65535) throw std::invalid_argument("the raw port must be 0-65535");
    const auto raw_port = static_cast<std::uint16_t>(raw);
    const auto head_port = opts.peer.substr(second + 1);

    if (raw_port != 0)
      raw_echo = std::thread([host, raw_port] {
        asio::io_context io;
        tcp::socket s(io);
        boost::system::error_code ec;
        const auto address = asio::ip::make_address(host, ec);
        if (!ec) s.connect({address, raw_port}, ec);
        if (ec) {
          std::cerr << "troupe bench remote --peer: cannot connect the raw echo to " << host << ":" << raw_port << ": "
                    << ec.message() << "\n";
          return;
        }
        s.set_option(tcp::no_delay(true), ec);
        for (;;) {
          std::uint64_t x = 0;
          asio::read(s, asio::buffer(&x, 8), ec);
          if (ec) return;
          ++x;
          asio::write(s, asio::buffer(&x, 8), ec);
          if (ec) return;
        }
      });

    system_config cfg{.threads = 2};
    cfg.node.listen = host + ":0";
    cfg.node.head = host + ":" + head_port;
    cfg.node.token = token;
    {
      actor_system sys(cfg);
      // Runs until the suite closes this process's standard input (or kills it).
      char buf[64];
      while (read(0, buf, sizeof buf) > 0) {
      }
    }
    if (raw_echo.joinable()) raw_echo.join();
  } catch (const std::exception& e) {
    std::cerr << "troupe bench remote --peer: " << e.what() << "\n";
    // The echo may wait on its socket until the suite closes it; this process ends now anyway.
    if (raw_echo.joinable()) raw_echo.detach();
    return 1;
  }
  return 0;
}

}  // namespace troupe::bench

