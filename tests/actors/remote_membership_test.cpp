// The cluster's membership protocol against a peer that speaks it as it likes: joins, hellos,
// member lists, spawns and names are checked; and the status lists every node and its actors.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include "net/transport.hpp"
#include "remote/remote_types.hpp"
#include "remote_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace remote_support;
using remote_test::kv;
using remote_test::worker;

/// A peer that holds the cluster's token and speaks the node protocol as it likes: what a
/// confused or hostile program could send after the handshake.
class rogue_peer {
public:
  // The node's own numbers (net/node_protocol.hpp): control codes and node operations.
  static constexpr std::uint64_t join = 16, hello = 18, members = 19, heartbeat = 20, leave = 22, moved = 23,
                                 lost = 24, relocated = 25;
  static constexpr std::uint64_t down = 21;
  static constexpr std::uint64_t spawn = 1, register_name = 3, watch = 6, node_stats = 7;
  using spawn_tuple = std::tuple<std::string, std::uint64_t, std::uint64_t,
                                 std::tuple<std::uint64_t, std::uint8_t, std::int32_t, std::int64_t, double, std::int64_t, bool, bool, bool>,
                                 std::vector<std::byte>>;
  using name_tuple = std::tuple<std::string, std::uint64_t, std::uint32_t, std::string>;
  using join_tuple = std::tuple<std::string, std::uint16_t, std::vector<std::string>>;  // host, port, labels

  explicit rogue_peer(std::uint16_t port) {
    troupe::net::transport_handlers h;
    h.on_open = [this](const std::shared_ptr<troupe::net::connection>& c) {
      std::lock_guard lock(mu_);
      conn_ = c;
      cv_.notify_all();
    };
    h.on_envelope = [this](const std::shared_ptr<troupe::net::connection>&, troupe::net::envelope e) {
      std::lock_guard lock(mu_);
      got_.push_back(std::move(e));
      cv_.notify_all();
    };
    h.on_close = [this](const std::shared_ptr<troupe::net::connection>&, const std::string& why) {
      std::lock_guard lock(mu_);
      closed_ = why;
      cv_.notify_all();
    };
    troupe::net::transport_config cfg;
    cfg.token = token;
    net_ = std::make_unique<troupe::net::transport>(io_, cfg, std::move(h));
    net_->connect("127.0.0.1", port);
    thread_ = std::thread([this] { io_.run(); });
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, 5s, [&] { return conn_ || !closed_.empty(); }) || !conn_)
      throw std::runtime_error("rogue_peer: no connection (" + closed_ + ")");
  }
  ~rogue_peer() {
    beating_ = false;
    if (beats_.joinable()) beats_.join();
    net_->close_all("done");
    work_.reset();
    io_.stop();
    thread_.join();
  }
  /// To the node itself unless `target` names an actor's wire id.
  void send(troupe::net::envelope_kind kind, std::uint64_t method, std::vector<std::byte> payload = {},
            std::uint64_t request = 0, std::uint64_t target = troupe::net::node_target) {
    troupe::net::envelope e;
    e.kind = kind;
    e.target = kind == troupe::net::envelope_kind::control ? 0 : target;
    e.method = method;
    e.request_id = request;
    e.payload = std::move(payload);
    conn_->send(std::move(e));
  }
  void control(std::uint64_t code, std::vector<std::byte> payload = {}) {
    send(troupe::net::envelope_kind::control, code, std::move(payload));
  }
  /// Why the node closed the connection ("" when it did not within `timeout`).
  std::string closed(std::chrono::milliseconds timeout = 3s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !closed_.empty(); });
    return closed_;
  }
  /// The first envelope that `match` takes, waiting up to `timeout`.
  std::optional<troupe::net::envelope> next(const std::function<bool(const troupe::net::envelope&)>& match,
                                            std::chrono::milliseconds timeout = 3s) {
    std::unique_lock lock(mu_);
    std::optional<troupe::net::envelope> out;
    cv_.wait_for(lock, timeout, [&] {
      for (auto it = got_.begin(); it != got_.end(); ++it)
        if (match(*it)) {
          out = std::move(*it);
          got_.erase(it);
          return true;
        }
      return !closed_.empty();
    });
    return out;
  }
  /// The answer to call `request`.
  std::optional<troupe::net::envelope> answer(std::uint64_t request) {
    return next([request](const troupe::net::envelope& e) {
      return (e.kind == troupe::net::envelope_kind::reply || e.kind == troupe::net::envelope_kind::error) &&
             e.request_id == request;
    });
  }
  /// Joins as a node reachable at 127.0.0.1:`port`; its id.
  troupe::node_id join_as_node(std::uint16_t port = 1) {
    control(join, troupe::encode(join_tuple("127.0.0.1", port, {})));
    auto welcome = next([](const troupe::net::envelope& e) { return e.kind == troupe::net::envelope_kind::control && e.method == 17; });
    if (!welcome) throw std::runtime_error("rogue_peer: no welcome (" + closed_ + ")");
    troupe::byte_reader r(welcome->payload);
    return troupe::codec<std::uint32_t>::decode(r);
  }
  /// Sends heartbeats every 100 ms from now on, as a member does.
  void keep_alive() {
    beating_ = true;
    beats_ = std::thread([this] {
      while (beating_) {
        control(heartbeat, troupe::encode(std::uint64_t{0}));
        std::this_thread::sleep_for(100ms);
      }
    });
  }

private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io_);
  std::unique_ptr<troupe::net::transport> net_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<troupe::net::connection> conn_;
  std::vector<troupe::net::envelope> got_;
  std::string closed_;
  std::atomic<bool> beating_{false};
  std::thread beats_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The cluster as a status shows it: "1:alive 2:alive 3:LOST".
std::string cluster_summary(troupe::actor_system& head) {
  std::string out;
  for (auto& n : troupe::cluster_status(head_of(head), token))
    out += (out.empty() ? "" : " ") + std::to_string(n.info.id) + ":" + (n.info.alive ? "alive" : "LOST");
  return out;
}

// A connection that has not joined nor said which node it is may ask for the status, and
// nothing else: a member list, a reply or a spawn from it closes it, and the cluster is as it was.
TEST(Remote, APeerThatIsNoMemberMayOnlyJoinOrAskForTheStatus) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_EQ(id, 2u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 2);
  {
    rogue_peer p(head.node_port());
    p.control(rogue_peer::members, troupe::encode(std::vector<std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::byte>>>{}));
    EXPECT_TRUE(contains(p.closed(), "a control envelope on a connection that has not said which node it is")) << p.closed();
  }
  {
    rogue_peer p(head.node_port());
    p.send(troupe::net::envelope_kind::reply, 0, troupe::encode(std::uint64_t{7}), 1);
    EXPECT_TRUE(contains(p.closed(), "a reply envelope on a connection")) << p.closed();
  }
  {
    rogue_peer p(head.node_port());
    p.send(troupe::net::envelope_kind::call, rogue_peer::spawn,
           troupe::encode(rogue_peer::spawn_tuple{"no::such", 0, (std::uint64_t{2} << 40) | 1, {}, {}}), 5);
    EXPECT_TRUE(contains(p.closed(), "a call envelope on a connection")) << p.closed();
  }
  EXPECT_EQ(cluster_summary(head), "1:alive 2:alive");
  EXPECT_EQ(a.ask(&worker::add, 2).get(), 3);
}

// A hello names the node a connection comes from, and shows the key the head gave that node:
// a peer cannot pass for the head, for a member, or for this node, and make it lost.
TEST(Remote, AHelloMustShowTheKeyTheHeadGaveThatNode) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  auto id = w.joined();
  ASSERT_EQ(id, 2u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  ASSERT_EQ(a.ask(&worker::add, 1).get(), 2);
  const std::vector<std::byte> guess(32, std::byte{7});
  for (std::uint32_t who : {1u, 2u}) {
    rogue_peer p(head.node_port());
    p.control(rogue_peer::hello, troupe::encode(std::tuple<std::uint32_t, std::vector<std::byte>>(who, guess)));
    p.control(rogue_peer::lost);
    const auto why = p.closed();
    EXPECT_TRUE(who == 1 ? contains(why, "says it is node 1, which it is not")
                         : contains(why, "says it is node 2 without that node's key")) << why;
  }
  EXPECT_EQ(cluster_summary(head), "1:alive 2:alive");
  EXPECT_EQ(a.ask(&worker::add, 2).get(), 3);
}

// A worker takes the member list from the head alone, and a hello shows the key of the node it
// names; one that names a node the head never lists is dropped.
TEST(Remote, AWorkerTakesMembersFromTheHeadAloneAndChecksEachHello) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  ASSERT_EQ(w.joined(), 2u);
  ASSERT_NE(w.port(), 0);
  const std::vector<std::byte> key(32, std::byte{9});
  using hello = std::tuple<std::uint32_t, std::vector<std::byte>>;
  {
    rogue_peer p(w.port());
    p.control(rogue_peer::hello, troupe::encode(hello(1, key)));
    EXPECT_TRUE(contains(p.closed(), "says it is node 1 without that node's key")) << p.closed();
  }
  {
    rogue_peer p(w.port());
    p.control(rogue_peer::hello, troupe::encode(hello(9, key)));
    p.control(rogue_peer::members, troupe::encode(std::vector<std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::byte>>>{}));
    EXPECT_TRUE(contains(p.closed(), "a member list from node 9: only the head sends it")) << p.closed();
  }
  // Where the head re-created a lost node's actors, and that it is done: from the head alone.
  {
    rogue_peer p(w.port());
    p.control(rogue_peer::hello, troupe::encode(hello(11, key)));
    p.control(rogue_peer::moved, troupe::encode(std::tuple<std::uint64_t, std::uint32_t>((std::uint64_t{1} << 40) | 1, 11)));
    EXPECT_TRUE(contains(p.closed(), "a moved notice from node 11: only the head sends it")) << p.closed();
  }
  {
    rogue_peer p(w.port());
    p.control(rogue_peer::hello, troupe::encode(hello(12, key)));
    p.control(rogue_peer::relocated, troupe::encode(std::uint32_t{1}));
    EXPECT_TRUE(contains(p.closed(), "a relocated notice from node 12: only the head sends it")) << p.closed();
  }
  {
    // Alive as far as its heartbeats go, but the head's next list does not have it.
    rogue_peer p(w.port());
    p.control(rogue_peer::hello, troupe::encode(hello(10, key)));
    p.keep_alive();
    EXPECT_FALSE(p.closed(5s).empty());
  }
  auto a = head.spawn_on<worker>(2, std::int64_t{1});
  EXPECT_EQ(a.ask(&worker::add, 1).get(), 2);
  EXPECT_EQ(cluster_summary(head), "1:alive 2:alive");
}

// The head gives each join its own node id once: a second join on the same connection, a join
// whose host is no host and one without a port are refused.
TEST(Remote, AJoinIsOnePerConnectionAndNamesAPlaceToReachTheNode) {
  troupe::actor_system head(head_config());
  {
    rogue_peer p(head.node_port());
    EXPECT_EQ(p.join_as_node(), 2u);
    p.control(rogue_peer::join, troupe::encode(rogue_peer::join_tuple("127.0.0.1", 1, {})));
    EXPECT_TRUE(contains(p.closed(), "a second join on the connection of node 2")) << p.closed();
  }
  for (const auto& [host, port] : {std::pair<std::string, std::uint16_t>{std::string(300, 'h'), 1},
                                   {"host name with spaces", 1}, {"127.0.0.1", 0}}) {
    rogue_peer p(head.node_port());
    p.control(rogue_peer::join, troupe::encode(rogue_peer::join_tuple(host, port, {})));
    EXPECT_TRUE(contains(p.closed(), port == 0 ? "a join without a port" : "whose host is not a host name or an IP address"))
        << p.closed();
  }
  for (const auto& labels : {std::vector<std::string>{"ok", ""}, std::vector<std::string>{"new\nline"},
                             std::vector<std::string>(33, "many")}) {
    rogue_peer p(head.node_port());
    p.control(rogue_peer::join, troupe::encode(rogue_peer::join_tuple("127.0.0.1", 1, labels)));
    EXPECT_TRUE(contains(p.closed(), "a join with bad labels")) << p.closed();
  }
  // Node 2 went with its connection: the status does not wait for it.
  EXPECT_EQ(cluster_summary(head), "1:alive 2:LOST");
}

// A member that does not answer the head's request for its report is shown as the head knows
// it, with why, after node_timeout, instead of failing the whole status; one that answers for
// another node is shown under its own id, host and port.
TEST(Remote, AStatusShowsEveryNodeWhenOneDoesNotAnswerOrLies) {
  auto cfg = head_config();
  cfg.node.node_timeout = 2000ms;  // (the silent one's heartbeats on time, whatever the load)
  troupe::actor_system head(cfg);
  child_node w({"--head", head_of(head), "--token", token});
  ASSERT_EQ(w.joined(), 2u);
  rogue_peer silent(head.node_port()), liar(head.node_port());
  ASSERT_EQ(silent.join_as_node(4001), 3u);
  ASSERT_EQ(liar.join_as_node(4002), 4u);
  silent.keep_alive();
  liar.keep_alive();
  std::atomic<bool> done{false};
  std::thread answers([&] {
    while (!done) {
      if (auto ask = liar.next([](const troupe::net::envelope& e) {
            return e.kind == troupe::net::envelope_kind::call && e.method == rogue_peer::node_stats;
          }, 50ms)) {
        // A node_status (net/status.cpp's codec) that says it is node 1, elsewhere.
        using info = std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::string>>;
        using actor = std::tuple<std::uint64_t, std::string, std::string, std::int64_t, std::uint64_t, double, std::uint64_t,
                                 std::uint32_t>;
        using type_failures = std::tuple<std::string, std::uint64_t, std::uint64_t>;
        using failure = std::tuple<std::uint64_t, std::int64_t, std::uint64_t, std::string, bool, std::uint32_t, std::string>;
        const std::tuple<info, std::uint64_t, std::vector<actor>, std::string, std::vector<type_failures>, std::vector<failure>> s{
            {1, "elsewhere", 4242, true, 999, {"claimed"}}, 0, {}, {}, {{"kv", 3, 1}}, {{1, 5, 7, "kv", true, 3, "boom"}}};
        liar.send(troupe::net::envelope_kind::reply, 0, troupe::encode(s), ask->request_id);
      }
    }
  });
  const auto start = clock_type::now();
  const auto nodes = troupe::cluster_status(head_of(head), token);
  const auto took = clock_type::now() - start;
  done = true;
  answers.join();
  ASSERT_EQ(nodes.size(), 4u);
  EXPECT_TRUE(nodes[1].info.alive && nodes[1].problem.empty()) << nodes[1].problem;
  EXPECT_EQ(nodes[2].info.id, 3u);
  EXPECT_EQ(nodes[2].info.port, 4001);
  EXPECT_EQ(nodes[2].problem, "no answer within 2000 ms");
  EXPECT_EQ(nodes[3].info.id, 4u);
  EXPECT_EQ(nodes[3].info.host, "127.0.0.1");
  EXPECT_EQ(nodes[3].info.port, 4002);
  EXPECT_EQ(nodes[3].info.actors, 999u);  // what it says of its own actors stands
  EXPECT_TRUE(nodes[3].info.labels.empty());  // its labels are what it joined with
  ASSERT_EQ(nodes[3].failures_by_type.size(), 1u);  // and its failures what it says
  EXPECT_EQ(nodes[3].failures_by_type[0].restarts, 3u);
  ASSERT_EQ(nodes[3].recent_failures.size(), 1u);
  EXPECT_EQ(nodes[3].recent_failures[0].what, "boom");
  EXPECT_LT(took, 4500ms);  // (the client waits 5 s)
}

// A member spawns under wire ids of its own (the head also under a lost node's, re-creating its
// actors), never under one that is taken; and a name goes only to an actor that exists.
TEST(Remote, SpawnsAndNamesFromAMemberAreChecked) {
  troupe::actor_system head(head_config());
  child_node w({"--head", head_of(head), "--token", token});
  ASSERT_EQ(w.joined(), 2u);
  rogue_peer p(head.node_port());
  const auto me = p.join_as_node();
  ASSERT_EQ(me, 3u);
  p.keep_alive();
  auto refused = [&](std::uint64_t method, std::vector<std::byte> payload, std::uint64_t request) {
    p.send(troupe::net::envelope_kind::call, method, std::move(payload), request);
    auto e = p.answer(request);
    return e && e->kind == troupe::net::envelope_kind::error ? e->error_message : std::string("(no refusal)");
  };
  const std::uint64_t others = (std::uint64_t{2} << 40) | 1, mine = (std::uint64_t{3} << 40) | 1;
  EXPECT_TRUE(contains(refused(rogue_peer::spawn, troupe::encode(rogue_peer::spawn_tuple{"no::such", 0, others, {}, {}}), 1),
                       "node 3 spawns under wire id 2199023255553, which is not of its ids"));
  EXPECT_TRUE(contains(refused(rogue_peer::spawn, troupe::encode(rogue_peer::spawn_tuple{"no::such", 0, mine, {}, {}}), 2),
                       "does not know the class 'no::such'"));
  EXPECT_TRUE(contains(refused(rogue_peer::spawn, troupe::encode(rogue_peer::spawn_tuple{"no::such", 0, mine, {}, {}}), 3),
                       "wire id 3298534883329 is taken on node 1 already"));
  EXPECT_TRUE(contains(refused(rogue_peer::register_name, troupe::encode(rogue_peer::name_tuple{"ghost", mine + 1, 1, "t"}), 4),
                       "register_name('ghost'): actor 3298534883330 is gone (or never was)"));
  EXPECT_TRUE(contains(refused(rogue_peer::register_name, troupe::encode(rogue_peer::name_tuple{"", mine, 3, "t"}), 5),
                       "a name must not be empty"));
  EXPECT_FALSE(head.lookup<worker>("ghost"));
  // The status is a call (a tell of it had nobody to answer, and crashed the head).
  p.send(troupe::net::envelope_kind::tell, 8);
  EXPECT_TRUE(contains(p.closed(), "cluster_status is a call, not a tell")) << p.closed();
  EXPECT_EQ(cluster_summary(head).substr(0, 15), "1:alive 2:alive");
}

// A ref can travel faster than the spawn of its actor (on another connection): a call that
// comes first waits for the actor and runs when it comes, in arrival order.
TEST(Remote, ACallThatOvertakesItsActorsSpawnWaitsForItAndHearsWhyItFailed) {
  troupe::actor_system head(head_config());
  rogue_peer p(head.node_port());
  const auto me = p.join_as_node();
  p.keep_alive();
  const std::uint64_t wire = (std::uint64_t{me} << 40) | 1;
  using call = troupe::net::envelope_kind;
  std::uint64_t add = 0;
  for (std::int64_t i = 0; i < 3; ++i)
    p.send(call::call, add, troupe::detail::encode_call<worker>(&worker::add, add, i).flatten(), 10 + static_cast<std::uint64_t>(i), wire);
  p.send(call::call, rogue_peer::spawn,
         troupe::encode(rogue_peer::spawn_tuple{"remote_test::worker", troupe::detail::constructor_key<std::int64_t>(), wire,
                                                {}, troupe::encode(std::tuple<std::int64_t>{40})}),
         1);
  auto spawned = p.answer(1);
  ASSERT_TRUE(spawned);
  EXPECT_EQ(spawned->kind, call::reply) << spawned->error_message;
  for (std::int64_t i = 0; i < 3; ++i) {
    auto sum = p.answer(10 + static_cast<std::uint64_t>(i));
    ASSERT_TRUE(sum);
    ASSERT_EQ(sum->kind, call::reply) << sum->error_message;
    EXPECT_EQ(troupe::decode<std::int64_t>(sum->payload), 40 + i);
  }
  // When the constructor throws, the waiting call and a later watch hear why.
  p.send(call::call, add, troupe::detail::encode_call<worker>(&worker::add, add, std::int64_t{1}).flatten(), 20, wire + 1);
  p.send(call::call, rogue_peer::spawn,
         troupe::encode(rogue_peer::spawn_tuple{"remote_test::worker", troupe::detail::constructor_key<std::int64_t>(), wire + 1,
                                                {}, troupe::encode(std::tuple<std::int64_t>{-1})}),
         2);
  auto refused = p.answer(20);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->kind, call::error);
  EXPECT_NE(refused->error_message.find("worker: a negative base"), std::string::npos) << refused->error_message;
  p.send(call::tell, rogue_peer::watch, troupe::encode(wire + 1));
  auto down = p.next([](const troupe::net::envelope& e) { return e.kind == call::control && e.method == rogue_peer::down; });
  ASSERT_TRUE(down);
  auto [what, reason, why] = troupe::decode<std::tuple<std::uint64_t, std::uint8_t, std::string>>(down->payload);
  EXPECT_EQ(what, wire + 1);
  EXPECT_EQ(reason, static_cast<std::uint8_t>(troupe::exit_reason::failed));
  EXPECT_NE(why.find("worker: a negative base"), std::string::npos) << why;
}

// Calls and watches from a third node that wait for an actor whose spawner leaves before the
// spawn arrives hear at once that it will never be made (not "no such actor" 10 s later).
TEST(Remote, WhatWaitsForAnActorHearsWhenItsSpawnerLeavesFirst) {
  troupe::actor_system head(head_config());
  rogue_peer spawner(head.node_port()), third(head.node_port());
  const auto s = spawner.join_as_node();
  third.join_as_node();
  spawner.keep_alive();
  third.keep_alive();
  const std::uint64_t wire = (std::uint64_t{s} << 40) | 3;
  using call = troupe::net::envelope_kind;
  std::uint64_t add = 0;
  third.send(call::call, add, troupe::detail::encode_call<worker>(&worker::add, add, std::int64_t{1}).flatten(), 7, wire);
  third.send(call::tell, rogue_peer::watch, troupe::encode(wire));
  std::this_thread::sleep_for(200ms);  // both are held by the head by now
  const auto t0 = std::chrono::steady_clock::now();
  spawner.control(rogue_peer::leave);
  auto refused = third.answer(7);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->kind, call::error);
  EXPECT_TRUE(contains(refused->error_message, "node " + std::to_string(s))) << refused->error_message;
  auto down = third.next([](const troupe::net::envelope& e) { return e.kind == call::control && e.method == rogue_peer::down; });
  ASSERT_TRUE(down);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  auto [what, reason, why] = troupe::decode<std::tuple<std::uint64_t, std::uint8_t, std::string>>(down->payload);
  EXPECT_EQ(what, wire);
  EXPECT_EQ(reason, static_cast<std::uint8_t>(troupe::exit_reason::stopped));
  EXPECT_TRUE(contains(why, "never made: node " + std::to_string(s) + ", which was spawning it, left")) << why;
}

TEST(Remote, ClusterStatusListsNodesAndActors) {
  auto cfg = head_config();
  cfg.node.labels = {"head"};
  troupe::actor_system head(cfg);
  child_node w({"--head", head_of(head), "--token", token, "--name", "store", "--label", "worker", "--label", "zone=b"});
  auto id = w.joined();
  ASSERT_NE(id, 0u);
  auto a = head.spawn_on<worker>(id, std::int64_t{1});
  for (int i = 0; i < 100; ++i) a.tell(&worker::record, 0u, static_cast<std::uint64_t>(i));
  ASSERT_EQ(a.ask(&worker::received).get(), 100u);
  // Named by the head, held by the worker: the worker does not know the name, the head does.
  head.register_name("counter", a);
  // An actor's counters are written when its slice ends, just after the reply left: a status
  // may be a moment behind, so ask again until it shows the 101 messages (or give up).
  bool found_store = false, found_worker = false;
  for (int attempt = 0; attempt < 50 && !(found_store && found_worker); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(20ms);
    auto nodes = troupe::cluster_status(head_of(head), token);
    ASSERT_EQ(nodes.size(), 2u);
    EXPECT_EQ(nodes[0].info.id, 1u);
    EXPECT_EQ(nodes[0].info.labels, std::vector<std::string>{"head"});
    EXPECT_EQ(nodes[1].info.id, id);
    EXPECT_EQ(nodes[1].info.labels, (std::vector<std::string>{"worker", "zone=b"}));
    for (auto& x : nodes[1].actors) {
      if (x.name == "store") found_store = true;
      if (x.type.find("worker") != std::string::npos && x.messages >= 101) {
        found_worker = true;
        EXPECT_EQ(x.name, "counter");
        EXPECT_EQ(x.wire >> 40, 1u);  // spawned by node 1 under one of its wire ids
      }
    }
  }
  EXPECT_TRUE(found_store);
  EXPECT_TRUE(found_worker);
  EXPECT_THROW(troupe::cluster_status(head_of(head), "wrong-token", 2s), troupe::error);
}

}  // namespace
