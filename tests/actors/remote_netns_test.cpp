// Nodes on separate addresses: network namespaces joined by veth pairs and a bridge (skipped
// without root and `ip netns`). A cut link, a slow link and a killed node, as the network shows them.

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "remote/remote_types.hpp"
#include "remote_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace remote_support;
using remote_test::kv;
using remote_test::worker;

/// Two namespaces (a, b) whose veth pairs join a bridge in this namespace: the head listens on
/// the bridge's address, workers run inside the namespaces on their own addresses. Names and the
/// subnet derive from the process id, so that concurrent test processes do not collide.
class netns_cluster : public ::testing::Test {
protected:
  void SetUp() override {
    auto pid = static_cast<unsigned>(::getpid());
    tag_ = "tr" + std::to_string(pid % 10'000'000);
    subnet_ = "10." + std::to_string(20 + pid % 200) + "." + std::to_string(pid / 200 % 250) + ".";
    if (!sh("ip netns add " + tag_ + "a")) {
      GTEST_SKIP() << "network namespaces are not permitted here (needs root and `ip netns`): "
                      "the cluster tests on separate addresses are skipped";
    }
    made_ = true;
    bool ok = sh("ip netns add " + tag_ + "b") && sh("ip link add " + tag_ + "br type bridge") &&
              sh("ip addr add " + subnet_ + "1/24 dev " + tag_ + "br") && sh("ip link set " + tag_ + "br up");
    for (char n : {'a', 'b'}) {
      std::string ns = tag_ + n, outside = tag_ + n + "0", inside = tag_ + n + "1";
      ok = ok && sh("ip link add " + outside + " type veth peer name " + inside) &&
           sh("ip link set " + inside + " netns " + ns) && sh("ip link set " + outside + " master " + tag_ + "br") &&
           sh("ip link set " + outside + " up") &&
           sh("ip netns exec " + ns + " ip addr add " + address(n) + "/24 dev " + inside) &&
           sh("ip netns exec " + ns + " ip link set " + inside + " up") &&
           sh("ip netns exec " + ns + " ip link set lo up");
    }
    ASSERT_TRUE(ok) << "could not build the namespaces and veth pairs";
  }
  void TearDown() override {
    if (!made_) return;
    sh("ip link del " + tag_ + "a0");
    sh("ip link del " + tag_ + "b0");
    sh("ip link del " + tag_ + "br");
    sh("ip netns del " + tag_ + "a");
    sh("ip netns del " + tag_ + "b");
  }
  std::string address(char n) const { return subnet_ + (n == 'a' ? "2" : "3"); }
  std::string head_address() const { return subnet_ + "1"; }
  /// Where workers join `head` (listening on the bridge).
  std::string join_address(troupe::actor_system& head) const {
    return head_address() + ":" + std::to_string(head.node_port());
  }
  /// A worker node inside namespace `n`.
  std::unique_ptr<child_node> start_worker(char n, const std::string& head) {
    return std::make_unique<child_node>(
        "/usr/sbin/ip", std::vector<std::string>{"netns", "exec", tag_ + n, node_binary(), "--head", head,
                                                  "--listen", address(n) + ":0", "--token", token});
  }
  /// Cuts (or restores) namespace `n`'s link to the bridge: no FIN, no RST, only silence.
  void set_link(char n, bool up) { ASSERT_TRUE(sh("ip link set " + tag_ + n + "0 " + (up ? "up" : "down"))); }

  troupe::system_config head_on_bridge() {
    troupe::system_config cfg{.threads = 2};
    cfg.node.listen = head_address() + ":0";
    cfg.node.token = token;
    return cfg;
  }

  std::string tag_, subnet_;
  bool made_ = false;
};

TEST_F(netns_cluster, ACutLinkIsDetectedAsksFailAndRestartableActorsMove) {
  troupe::actor_system head(head_on_bridge());
  const auto head_at = join_address(head);
  auto a = start_worker('a', head_at);
  auto a_id = a->joined();
  auto b = start_worker('b', head_at);
  auto b_id = b->joined();
  ASSERT_NE(a_id, 0u);
  ASSERT_NE(b_id, 0u);

  troupe::spawn_options restartable;
  restartable.restart.max_restarts = 1;
  auto moving = head.spawn_on<worker>(a_id, restartable, std::int64_t{10});
  auto fixed = head.spawn_on<worker>(a_id, std::int64_t{20});
  ASSERT_EQ(moving.ask(&worker::add, 1).get(), 11);
  ASSERT_EQ(fixed.ask(&worker::add, 1).get(), 21);
  auto down = head.monitor(fixed);
  std::vector<troupe::future<void>> waiting;
  for (int i = 0; i < 5; ++i) waiting.push_back(fixed.ask(&worker::sleep_ms, 60'000));

  auto t0 = clock_type::now();
  set_link('a', false);
  expect_node_lost(waiting);
  auto detected = clock_type::now() - t0;
  // Silence is noticed after node_timeout (800 ms) plus at most one heartbeat period (more
  // slack under the sanitizers, which slow every thread down).
  EXPECT_LT(detected, scaled(20) == 1 ? 3000ms : 1500ms);
  EXPECT_GE(detected, 700ms);
  auto n = std::move(down).timeout(2s).get();
  EXPECT_EQ(n.reason, troupe::exit_reason::node_lost);

  // The restartable actor answers again, from another node; the other one is gone.
  auto answer = first_answer(moving, 2);
  EXPECT_EQ(answer, 12);
  EXPECT_NE(moving.node(), a_id);
  EXPECT_THROW(fixed.ask(&worker::add, 1).timeout(2s).get(), troupe::error);

  // The lost node stays lost even when its link returns (a restarted process joins anew).
  set_link('a', true);
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(fixed.alive());
}

TEST_F(netns_cluster, ALargeReplyOverASlowLinkIsNotSilence) {
  // 20 MB at 80 Mbit/s take about 2 s on the wire, far past node_timeout (800 ms), and every
  // heartbeat from that node waits behind them: the bytes arriving must count as hearing it.
  troupe::actor_system head(head_on_bridge());
  const auto head_at = join_address(head);
  auto a = start_worker('a', head_at);
  auto a_id = a->joined();
  ASSERT_NE(a_id, 0u);
  ASSERT_TRUE(sh("ip netns exec " + tag_ + "a tc qdisc add dev " + tag_ + "a1 root tbf rate 80mbit burst 64kb latency 2s"));
  auto w = head.spawn_on<worker>(a_id, std::int64_t{0});
  ASSERT_EQ(w.ask(&worker::add, 1).get(), 1);
  auto t0 = clock_type::now();
  auto reply = w.ask(&worker::bytes, std::uint64_t{20} << 20).timeout(30s).get();
  EXPECT_EQ(reply.size(), std::size_t{20} << 20);
  EXPECT_GT(clock_type::now() - t0, 1s) << "the link was not slow: the test proves nothing";
  EXPECT_EQ(w.ask(&worker::add, 2).get(), 2);
  EXPECT_TRUE(w.alive());
}

TEST_F(netns_cluster, AKilledNodeIsDetectedAndARestartedOneRejoins) {
  troupe::actor_system head(head_on_bridge());
  const auto head_at = join_address(head);
  auto a = start_worker('a', head_at);
  auto a_id = a->joined();
  ASSERT_NE(a_id, 0u);
  auto x = head.spawn_on<worker>(a_id, std::int64_t{1});
  ASSERT_EQ(x.ask(&worker::add, 1).get(), 2);
  auto down = head.monitor(x);
  auto pending = x.ask(&worker::sleep_ms, 60'000);
  auto t0 = clock_type::now();
  a->kill9();
  EXPECT_THROW(pending.get(), troupe::error);
  EXPECT_LT(clock_type::now() - t0, 1000ms);
  EXPECT_EQ(std::move(down).timeout(2s).get().reason, troupe::exit_reason::node_lost);

  // The same machine starts a node again: it joins as a new node and takes work.
  auto again = start_worker('a', head_at);
  auto again_id = again->joined();
  ASSERT_NE(again_id, 0u);
  EXPECT_NE(again_id, a_id);
  auto y = head.spawn_on<worker>(again_id, std::int64_t{5});
  EXPECT_EQ(y.ask(&worker::add, 1).get(), 6);
  auto nodes = troupe::cluster_status(head_at, token);
  bool old_lost = false, new_alive = false;
  for (auto& s : nodes) {
    if (s.info.id == a_id) old_lost = !s.info.alive;
    if (s.info.id == again_id) new_alive = s.info.alive && s.info.host == address('a');
  }
  EXPECT_TRUE(old_lost);
  EXPECT_TRUE(new_alive);
}

}  // namespace
