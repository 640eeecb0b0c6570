#pragma once
// What the remote tests share: worker node processes (remote_test_node) and their head's
// configuration, waits for lost nodes and re-created actors, and the stress scale.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "remote/remote_types.hpp"

extern char** environ;

namespace remote_support {

using namespace std::chrono_literals;
using remote_test::worker;
using clock_type = std::chrono::steady_clock;

inline constexpr const char* token = "remote-test-secret";

inline std::string node_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "remote_test_node").string();
}

/// A worker node process; killed when the object goes.
class child_node {
public:
  explicit child_node(std::vector<std::string> args) : child_node(node_binary(), std::move(args)) {}
  /// `program args...`, e.g. `ip netns exec NS remote_test_node ...`.
  child_node(std::string program, std::vector<std::string> args) {
    int out[2], in[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    std::string bin = std::move(program);
    std::vector<char*> argv{bin.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start " + bin);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(in[0]);
    out_ = out[0];
    in_ = in[1];
  }
  ~child_node() {
    if (in_ >= 0) close(in_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  /// The first line the node prints ({"node":N,"port":P}), or "" on exit/timeout.
  std::string first_line(std::chrono::milliseconds timeout = 10s) {
    std::string line;
    auto deadline = clock_type::now() + timeout;
    while (clock_type::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char c;
      if (read(out_, &c, 1) != 1) return "";
      if (c == '\n') return line;
      line += c;
    }
    return "";
  }
  troupe::node_id joined() {
    line_ = first_line();
    auto at = line_.find("\"node\":");
    if (at == std::string::npos) return 0;
    return static_cast<troupe::node_id>(std::stoul(line_.substr(at + 7)));
  }
  /// The port it listens on, after joined().
  std::uint16_t port() const {
    auto at = line_.find("\"port\":");
    return at == std::string::npos ? 0 : static_cast<std::uint16_t>(std::stoul(line_.substr(at + 7)));
  }
  void signal(int sig) { kill(pid_, sig); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  int wait_exit() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

private:
  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
  std::string line_;
};

inline troupe::system_config head_config() {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = token;
  return cfg;
}

inline std::string head_of(troupe::actor_system& sys) { return "127.0.0.1:" + std::to_string(sys.node_port()); }

/// Waits for every future and expects each to fail with node_lost.
inline void expect_node_lost(std::vector<troupe::future<void>>& pending) {
  for (auto& f : pending) {
    try {
      f.get();
      ADD_FAILURE() << "an ask to a lost node succeeded";
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code_value(), troupe::errc::node_lost) << e.what();
    }
  }
}

/// `w.add(x)`, asked until it answers (a re-created actor or a redialled connection takes a
/// moment; asks in flight meanwhile fail), for up to 5 s; 0 when it never does.
inline std::int64_t first_answer(const troupe::actor_ref<worker>& w, std::int64_t x) {
  for (auto deadline = clock_type::now() + 5s; clock_type::now() < deadline;) {
    try {
      return w.ask(&worker::add, x).timeout(1s).get();
    } catch (const troupe::error&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  return 0;
}

/// The stress tests' counts: a 20th of them when TROUPE_STRESS_SCALE=small.
inline std::size_t scaled(std::size_t n) {
  const char* s = std::getenv("TROUPE_STRESS_SCALE");
  return s && std::string(s) == "small" ? n / 20 : n;
}

/// Runs a command line; true when it exits with 0.
inline bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

}  // namespace remote_support
