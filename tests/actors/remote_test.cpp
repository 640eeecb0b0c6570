// Remote actors between real processes on loopback: this test process is the head, worker
// nodes are remote_test_node processes (tests/actors/remote/).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <gtest/gtest.h>

#include "remote/remote_types.hpp"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using remote_test::kv;
using remote_test::worker;
using clock_type = std::chrono::steady_clock;

constexpr const char* token = "remote-test-secret";

std::string node_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "remote_test_node").string();
}

/// A worker node process; killed when the object goes.
class child_node {
public:
  explicit child_node(std::vector<std::string> args) {
    int out[2], in[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    std::string bin = node_binary();
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
    auto line = first_line();
    auto at = line.find("\"node\":");
    if (at == std::string::npos) return 0;
    return static_cast<troupe::node_id>(std::stoul(line.substr(at + 7)));
  }
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
};

troupe::system_config head_config() {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = token;
  return cfg;
}

std::string head_of(troupe::actor_system& sys) { return "127.0.0.1:" + std::to_string(sys.node_port()); }

std::size_t scaled(std::size_t n) {
  const char* s = std::getenv("TROUPE_STRESS_SCALE");
  return s && std::string(s) == "small" ? n / 20 : n;
}

TEST(Remote, SpawnCallsAndErrorsAcrossProcesses) {
  troupe::actor_system head(head_config());
  ASSERT_EQ(head.node(), 1u);
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_EQ(id, 2u);

  auto a = head.spawn_on<worker>(id, std::int64_t{40});
  EXPECT_TRUE(a.is_remote());
  EXPECT_EQ(a.node(), id);
  EXPECT_EQ(a.ask(&worker::add, 2).get(), 42);
  EXPECT_NE(a.ask(&worker::pid).get(), static_cast<std::int64_t>(::getpid()));
  EXPECT_EQ(a.ask(&worker::twice, 1).get(), 82);  // a coroutine method

  // A method's exception reaches the caller with its message.
  try {
    a.ask(&worker::fail, std::string("boom")).get();
    FAIL() << "no exception";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::remote_exception);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }

  // Payloads small and large (the large one travels as the frame's raw body).
  std::vector<std::byte> small(100, std::byte{7}), large(3 << 20);
  for (std::size_t i = 0; i < large.size(); ++i) large[i] = std::byte(i * 131 % 251);
  EXPECT_EQ(a.ask(&worker::echo, small).get(), small);
  EXPECT_EQ(a.ask(&worker::echo, large).get(), large);

  // A constructor that throws there: calls fail with its message.
  auto bad = head.spawn_on<worker>(id, std::int64_t{-1});
  try {
    bad.ask(&worker::add, 1).get();
    FAIL() << "no exception";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::actor_dead);
    EXPECT_NE(std::string(e.what()).find("negative base"), std::string::npos) << e.what();
  }

  // Stopping a remote actor: later asks fail, a monitor hears of it.
  auto down = head.monitor(a);
  a.stop();
  auto n = std::move(down).timeout(5s).get();
  EXPECT_EQ(n.id, a.id());
  EXPECT_EQ(n.reason, troupe::exit_reason::stopped);
  EXPECT_THROW(a.ask(&worker::add, 1).get(), troupe::error);
}

TEST(Remote, NamedActorsAreFoundFromAnyNode) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token, "--name", "store"});
  ASSERT_NE(w.joined(), 0u);
  std::optional<troupe::actor_ref<kv>> s;
  for (auto deadline = clock_type::now() + 5s; !s && clock_type::now() < deadline;) {
    s = head.lookup<kv>("store");
    if (!s) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->is_remote());
  s->tell(&kv::put, "k", "v");
  EXPECT_EQ(s->ask(&kv::get, "k").get(), std::optional<std::string>("v"));
  EXPECT_EQ(s->ask(&kv::size).get(), 1u);
  EXPECT_FALSE(head.lookup<kv>("nobody"));
  EXPECT_THROW(head.lookup<worker>("store"), troupe::error);  // type mismatch

  // A name registered on the head is found by lookups there too.
  head.register_name("local-store", head.spawn<kv>());
  EXPECT_TRUE(head.lookup<kv>("local-store"));
}

TEST(Remote, OrderPerSenderAndNoLoss) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{0});
  const std::size_t per_sender = scaled(250'000);
  std::vector<std::thread> senders;
  for (std::uint32_t s = 0; s < 4; ++s)
    senders.emplace_back([&, s] {
      for (std::uint64_t i = 0; i < per_sender; ++i) a.tell(&worker::record, s, i);
    });
  for (auto& t : senders) t.join();
  EXPECT_EQ(a.ask(&worker::received).get(), 4 * per_sender);
  EXPECT_EQ(a.ask(&worker::out_of_order).get(), 0u);
}

TEST(Remote, KilledNodeFailsPendingAsksWithinASecond) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{0});
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 1);
  auto down = head.monitor(a);
  std::vector<troupe::future<void>> pending;
  for (int i = 0; i < 10; ++i) pending.push_back(a.ask(&worker::sleep_ms, 60'000));
  std::this_thread::sleep_for(50ms);
  auto t0 = clock_type::now();
  w.kill9();
  for (auto& f : pending) {
    try {
      f.get();
      FAIL() << "a pending ask succeeded";
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code_value(), troupe::errc::node_lost) << e.what();
    }
  }
  auto waited = clock_type::now() - t0;
  EXPECT_LT(waited, 1s);
  auto n = std::move(down).timeout(2s).get();
  EXPECT_EQ(n.reason, troupe::exit_reason::node_lost);
  EXPECT_FALSE(a.alive());
  EXPECT_THROW(a.ask(&worker::add, 1).get(), troupe::error);
}

TEST(Remote, WrongTokenIsRefused) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", "not-the-token"});
  EXPECT_EQ(w.joined(), 0u);
  EXPECT_EQ(w.wait_exit(), 1);
}

TEST(Remote, HostileBytesCloseOnlyTheirConnection) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 2);
  // Garbage, a huge announced frame and a truncated one, each on its own connection.
  boost::asio::io_context io;
  for (int kind = 0; kind < 3; ++kind) {
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), head.node_port()});
    std::vector<unsigned char> bytes;
    if (kind == 0) bytes.assign(4096, 0xAB);
    if (kind == 1) bytes = {0x54, 0x52, 0x50, 0x31, 1, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    if (kind == 2) bytes = {0x54, 0x52, 0x50};
    boost::system::error_code ec;
    boost::asio::write(s, boost::asio::buffer(bytes), ec);
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(a.ask(&worker::add, 2).get(), 3);
}

TEST(Remote, ClusterStatusListsNodesAndActors) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token, "--name", "store"});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  for (int i = 0; i < 100; ++i) a.tell(&worker::record, 0u, static_cast<std::uint64_t>(i));
  ASSERT_EQ(a.ask(&worker::received).get(), 100u);
  auto nodes = troupe::cluster_status(head_of(head), token);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].info.id, 1u);
  EXPECT_EQ(nodes[1].info.id, id);
  bool found_store = false, found_worker = false;
  for (auto& x : nodes[1].actors) {
    if (x.name == "store") found_store = true;
    if (x.type.find("worker") != std::string::npos && x.messages >= 101) found_worker = true;
  }
  EXPECT_TRUE(found_store);
  EXPECT_TRUE(found_worker);
  EXPECT_THROW(troupe::cluster_status(head_of(head), "wrong-token", 2s), troupe::error);
}

TEST(Remote, BadConfigurationIsAClearError) {
  troupe::system_config cfg{.threads = 1};
  cfg.node.listen = "127.0.0.1";  // no port
  cfg.node.token = token;
  EXPECT_THROW(troupe::actor_system{cfg}, std::invalid_argument);
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token.clear();
  ::unsetenv("TROUPE_CLUSTER_TOKEN");
  EXPECT_THROW(troupe::actor_system{cfg}, std::invalid_argument);
  cfg.node.token = token;
  cfg.node.head = "127.0.0.1:1";  // nobody listens there
  cfg.node.join_timeout = 2000ms;
  EXPECT_THROW(troupe::actor_system{cfg}, troupe::error);
  troupe::actor_system plain({.threads = 1});
  EXPECT_THROW(plain.spawn_on<worker>(2, std::int64_t{1}), std::invalid_argument);
  auto local = plain.spawn_on<worker>(troupe::any_node, std::int64_t{1});
  EXPECT_FALSE(local.is_remote());
  EXPECT_EQ(local.ask(&worker::add, 1).get(), 2);
}

}  // namespace

namespace {

TEST(Remote, AnActorWithARestartPolicyIsRecreatedOnASurvivingNode) {
  troupe::actor_system head(head_config());
  child_node w1({"--head", head_of(head), "--token", token});
  auto doomed = w1.joined();
  child_node w2({"--head", head_of(head), "--token", token});
  auto survivor = w2.joined();
  ASSERT_NE(doomed, 0u);
  ASSERT_NE(survivor, 0u);
  troupe::spawn_options opts;
  opts.restart.max_restarts = 2;
  auto a = head.spawn_on<worker>(doomed, opts, std::int64_t{5});
  auto first_pid = a.ask(&worker::pid).get();
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 6);
  auto other = head.spawn_on<worker>(doomed, std::int64_t{5});  // no restart policy
  ASSERT_EQ(other.ask(&worker::add, 1).get(), 6);
  w1.kill9();
  // The same handle reaches the new instance once it exists (asks in flight when the node
  // died fail; a call is never delivered twice).
  std::int64_t answer = 0;
  for (auto deadline = clock_type::now() + 5s; answer == 0 && clock_type::now() < deadline;) {
    try {
      answer = a.ask(&worker::add, 2).timeout(1s).get();
    } catch (const troupe::error&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  EXPECT_EQ(answer, 7);
  EXPECT_NE(a.node(), doomed);
  EXPECT_TRUE(a.alive());
  EXPECT_NE(a.ask(&worker::pid).get(), first_pid);
  // Without a restart policy the actor is gone with its node.
  EXPECT_THROW(other.ask(&worker::add, 1).timeout(2s).get(), troupe::error);
  EXPECT_FALSE(other.alive());
}

}  // namespace
