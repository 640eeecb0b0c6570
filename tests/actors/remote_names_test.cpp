// Cluster-wide names: found from any node, claimed from inside actors with the head's answer, and
// freed when their actor is gone or the name is unregistered on any node.

#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "remote/remote_types.hpp"
#include "remote_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace remote_support;
using remote_test::kv;
using remote_test::worker;

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
  // A name another node's actor holds is refused, and nothing is named here.
  try {
    head.register_name("store", head.spawn<kv>());
    ADD_FAILURE() << "a second actor got the name 'store'";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::name_taken) << e.what();
  }
  auto still = head.lookup<kv>("store");
  ASSERT_TRUE(still);
  EXPECT_TRUE(still->is_remote());
}

/// Claims cluster-wide names from inside an actor.
struct namer {
  /// register_name_async, awaited: "named", or the code it was refused with.
  troupe::task<std::string> claim(std::string name) {
    auto& sys = troupe::this_actor::system();
    std::string answer = "named";
    try {
      co_await sys.register_name_async(name, sys.spawn<kv>());
    } catch (const troupe::error& e) {
      answer = std::string(troupe::make_error_code(e.code_value()).message());
    }
    co_return answer;
  }
  /// register_name, which cannot wait here: a conflict with another node comes back later.
  void claim_blocking(std::string name) {
    auto& sys = troupe::this_actor::system();
    sys.register_name(name, sys.spawn<kv>());
  }
};

TEST(Remote, ActorsGetTheHeadsAnswerToANameAsAFuture) {
  troupe::actor_system head(head_config());
  auto cfg = head_config();
  cfg.node.head = head_of(head);
  troupe::actor_system member(cfg);
  ASSERT_EQ(member.node(), 2u);
  head.register_name("taken", head.spawn<kv>());
  auto n = member.spawn<namer>();
  const std::string taken = troupe::make_error_code(troupe::errc::name_taken).message();
  EXPECT_EQ(n.ask(&namer::claim, std::string("taken")).get(), taken);
  // Refused cluster-wide: the local name the call added is gone too.
  auto found = member.lookup<kv>("taken");
  ASSERT_TRUE(found);
  EXPECT_TRUE(found->is_remote());
  EXPECT_EQ(n.ask(&namer::claim, std::string("free")).get(), "named");
  auto there = head.lookup<kv>("free");
  ASSERT_TRUE(there);
  EXPECT_TRUE(there->is_remote());
  // Outside actors the future is the same answer.
  EXPECT_THROW(member.register_name_async("taken", member.spawn<kv>()).get(), troupe::error);
  EXPECT_NO_THROW(member.register_name_async("free2", member.spawn<kv>()).get());
  // The blocking form inside an actor does not throw for the other node's conflict; the name
  // it added here is removed when the refusal arrives.
  n.ask(&namer::claim_blocking, std::string("taken")).get();
  std::optional<troupe::actor_ref<kv>> after;
  for (auto deadline = clock_type::now() + 5s; clock_type::now() < deadline; std::this_thread::sleep_for(10ms)) {
    after = member.lookup<kv>("taken");
    if (after && after->is_remote()) break;
  }
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->is_remote());
}

/// Polls the head until `name` is unknown there (5 s at most).
bool name_disappears(troupe::actor_system& sys, const std::string& name) {
  for (auto deadline = clock_type::now() + 5s; clock_type::now() < deadline; std::this_thread::sleep_for(10ms))
    if (!sys.lookup<kv>(name)) return true;
  return false;
}

TEST(Remote, NamesOfGoneActorsAndUnregisteredNamesAreFreedClusterWide) {
  troupe::actor_system head(head_config());
  auto cfg = head_config();
  cfg.node.head = head_of(head);
  troupe::actor_system member(cfg);
  ASSERT_EQ(member.node(), 2u);

  // An actor that is gone before it is named: refused where the head can tell at once (its
  // own), otherwise freed as soon as the actor's node answers the head's watch.
  auto on_head = head.spawn<kv>();
  head.register_name("head-kv", on_head);
  auto remote_head_kv = member.lookup<kv>("head-kv");
  ASSERT_TRUE(remote_head_kv && remote_head_kv->is_remote());
  auto down = head.monitor(on_head);
  on_head.stop();
  std::move(down).timeout(5s).get();
  try {
    member.register_name("stale", *remote_head_kv);
    ADD_FAILURE() << "a gone actor got a name";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::actor_dead) << e.what();
  }
  auto on_member = head.spawn_on<kv>(member.node());
  ASSERT_TRUE(on_member.is_remote());
  auto gone = head.monitor(on_member);
  on_member.stop();
  std::move(gone).timeout(5s).get();
  head.register_name("dead", on_member);
  EXPECT_TRUE(name_disappears(head, "dead"));
  EXPECT_NO_THROW(head.register_name("dead", head.spawn<kv>()));
  // Named at once after spawn_on from a third party's view: the head's watch may reach the
  // actor's node before the spawn does, and waits for it instead of freeing the name.
  for (int i = 0; i < 20; ++i) {
    auto fresh = member.spawn_on<kv>(head.node());
    auto fresh_remote = head.spawn_on<kv>(member.node());
    const std::string n = "fresh" + std::to_string(i);
    member.register_name(n, fresh_remote);  // registered by a node that did not spawn it
    std::this_thread::sleep_for(5ms);
    EXPECT_TRUE(head.lookup<kv>(n)) << n;
    (void)fresh;
  }

  // unregister_name on any node frees a cluster-wide name for good.
  head.register_name("u", head.spawn_on<kv>(member.node()));
  ASSERT_TRUE(member.lookup<kv>("u"));
  member.unregister_name("u");
  EXPECT_TRUE(name_disappears(head, "u"));
  EXPECT_NO_THROW(member.register_name("u", member.spawn<kv>()));
  auto now_u = head.lookup<kv>("u");
  ASSERT_TRUE(now_u);
  EXPECT_EQ(now_u->node(), member.node());
  // A name of an actor that cannot travel is the node's own: unregistering it leaves another
  // node's cluster-wide name of the same spelling alone.
  member.register_name("mine", member.spawn<namer>());
  head.register_name("mine", head.spawn<kv>());
  EXPECT_TRUE(member.unregister_name("mine"));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(head.lookup<kv>("mine"));
}

}  // namespace
