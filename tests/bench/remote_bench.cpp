#include "remote_bench.hpp"

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

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "net/transport.hpp"

extern char** environ;

namespace troupe::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* token_env = "TROUPE_BENCH_REMOTE_TOKEN";
constexpr std::size_t echo_limit = 4096;  // the peer echoes payloads up to this size

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

// The parent's side of the framed workloads: one transport connection to the peer, driven from
// the transport's own callbacks (as an actor would be), the caller waiting for the end only.
struct client {
  explicit client(const std::string& token) {
    net::transport_config cfg;
    cfg.token = token;
    net::transport_handlers h;
    h.on_open = [this](const std::shared_ptr<net::connection>& c) {
      std::lock_guard lock(mutex);
      conn = c;
      changed.notify_all();
    };
    h.on_envelope = [this](const std::shared_ptr<net::connection>&, net::envelope e) { on_reply(std::move(e)); };
    h.on_close = [this](const std::shared_ptr<net::connection>&, const std::string& reason) {
      std::lock_guard lock(mutex);
      closed = reason.empty() ? "closed" : reason;
      changed.notify_all();
    };
    net = std::make_unique<net::transport>(io, cfg, std::move(h));
  }
  ~client() {
    net->close_all("benchmark over");
    work.reset();
    io.stop();
    if (thread.joinable()) thread.join();
    net.reset();
  }
  void start() { thread = std::thread([this] { io.run(); }); }

  bool wait(const std::function<bool()>& done, std::chrono::seconds limit) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, limit, [&] { return done() || !closed.empty(); }) && closed.empty();
  }

  // Runs `total` calls of `payload_bytes` each with at most `window` in flight; returns seconds.
  double calls(std::uint64_t total, std::size_t window, std::size_t payload_bytes) {
    {
      std::lock_guard lock(mutex);
      sent = done = 0;
      this->total = total;
      this->payload_bytes = payload_bytes;
      wrong = false;
    }
    auto t0 = clock_type::now();
    for (std::size_t i = 0; i < window && i < total; ++i) send_next();
    check(wait([&] { return done == this->total; }, 120s), "the peer stopped answering: " + closed);
    auto s = seconds_since(t0);
    check(!wrong, "a reply did not match its call");
    return s;
  }

  void send_next() {
    std::uint64_t id;
    {
      std::lock_guard lock(mutex);
      if (sent == total) return;
      id = ++sent;
    }
    net::envelope e;
    e.kind = net::envelope_kind::call;
    e.target = 1;
    e.method = 1;
    e.request_id = id;
    e.reply_to = 1;
    e.payload.resize(payload_bytes);
    if (payload_bytes >= 8) std::memcpy(e.payload.data(), &id, 8);
    conn->send(std::move(e));
  }

  void on_reply(net::envelope e) {
    bool ok = e.kind == net::envelope_kind::reply && e.request_id != 0;
    if (payload_bytes >= 8 && payload_bytes <= echo_limit) {
      std::uint64_t id = 0;
      ok = ok && e.payload.size() == payload_bytes;
      if (ok) std::memcpy(&id, e.payload.data(), 8);
      ok = ok && id == e.request_id;
    }
    {
      std::lock_guard lock(mutex);
      if (!ok) wrong = true;
      if (++done == total) changed.notify_all();
    }
    send_next();
  }

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<net::transport> net;
  std::thread thread;
  std::mutex mutex;
  std::condition_variable changed;
  std::shared_ptr<net::connection> conn;
  std::string closed;
  std::uint64_t sent = 0, done = 0, total = 0;
  std::size_t payload_bytes = 0;
  bool wrong = false;
};

struct peer_process {
  pid_t pid = -1;
  ~peer_process() {
    if (pid > 0) {
      // Normally the peer exits when its connections close; do not wait on one that hangs.
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
  static const char* const names[] = {"raw_pingpong", "call_sync", "call_async", "bulk", nullptr};
  return names;
}

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
    peer_process peer;  // declared first: destroyed last, after the connections to it closed
    asio::io_context raw_io;
    tcp::acceptor raw_acceptor(raw_io, {asio::ip::make_address("127.0.0.1"), 0});
    client c(token);
    auto net_port = c.net->listen("127.0.0.1", 0);
    c.start();

    // The peer is this very program, started again with the hidden --peer option; the token
    // travels in its environment, never on its command line.
    std::string self = "/proc/self/exe";
    std::string where = "127.0.0.1:" + std::to_string(raw_acceptor.local_endpoint().port()) + ":" +
                        std::to_string(net_port);
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
    if (posix_spawn(&peer.pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0)
      throw std::runtime_error(std::string("cannot start the peer process: ") + std::strerror(errno));

    // Accept the peer's raw socket with a deadline: a peer that died must not hang the suite.
    tcp::socket raw(raw_io);
    bool accepted = false;
    raw_acceptor.async_accept(raw, [&](boost::system::error_code ec) { accepted = !ec; });
    raw_io.run_for(20s);
    check(accepted, "the peer process did not connect within 20 s");
    raw.set_option(tcp::no_delay(true));
    check(c.wait([&] { return c.conn != nullptr; }, 20s), "the peer did not connect: " + c.closed);

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
      pingpong(rounds / 10);  // warm-up, as for the framed workloads
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
      c.calls(rounds / 10, 1, 16);  // warm-up
      auto s = c.calls(rounds, 1, 16);
      report("call_sync", "round_trips_per_s", rounds / s, "round trips/s");
      report("call_sync", "round_trip_us", s * 1e6 / rounds, "us");
      report("call_sync", "ratio_to_raw", (s * 1e6 / rounds) / raw_us, "x");
    }
    if (wants("call_async")) {
      const std::uint64_t n = opts.quick ? 20'000 : 300'000;
      auto s = c.calls(n, 1000, 16);
      report("call_async", "round_trips_per_s", n / s, "round trips/s");
    }
    if (wants("bulk")) {
      const std::uint64_t n = opts.quick ? 64 : 1024;
      const std::size_t mib = 1u << 20;
      c.calls(4, 4, mib);  // warm-up
      auto s = c.calls(n, 8, mib);
      report("bulk", "MB_per_s", static_cast<double>(n) * mib / 1e6 / s, "MB/s");
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
    std::cerr << "troupe bench remote --peer: expected host:raw_port:net_port, got '" << opts.peer << "'\n";
    return 1;
  }
  try {
    const auto host = opts.peer.substr(0, first);
    const auto raw_port = static_cast<std::uint16_t>(std::stoul(opts.peer.substr(first + 1, second - first - 1)));
    const auto net_port = static_cast<std::uint16_t>(std::stoul(opts.peer.substr(second + 1)));

    std::thread raw_echo([&] {
      asio::io_context io;
      tcp::socket s(io);
      s.connect({asio::ip::make_address(host), raw_port});
      s.set_option(tcp::no_delay(true));
      boost::system::error_code ec;
      for (;;) {
        std::uint64_t x = 0;
        asio::read(s, asio::buffer(&x, 8), ec);
        if (ec) return;
        ++x;
        asio::write(s, asio::buffer(&x, 8), ec);
        if (ec) return;
      }
    });

    asio::io_context io;
    net::transport_config cfg;
    cfg.token = token;
    net::transport_handlers h;
    h.on_envelope = [](const std::shared_ptr<net::connection>& c, net::envelope e) {
      if (e.kind != net::envelope_kind::call) return;
      net::envelope r;
      r.kind = net::envelope_kind::reply;
      r.request_id = e.request_id;
      r.reply_to = e.reply_to;
      if (e.payload.size() <= echo_limit) r.payload = std::move(e.payload);
      c->send(std::move(r));
    };
    h.on_close = [&io](const std::shared_ptr<net::connection>&, const std::string&) { io.stop(); };
    net::transport t(io, cfg, std::move(h));
    t.connect(host, net_port);
    io.run();
    raw_echo.join();
  } catch (const std::exception& e) {
    std::cerr << "troupe bench remote --peer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace troupe::bench
