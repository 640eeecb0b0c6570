// Supervision: a failed actor is re-created from its constructor arguments as its restart policy
// says, drops the old object's continuations, and takes its children with it.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <troupe/actors/actor_system.hpp>

#include "lifecycle_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace lifecycle_support;
using troupe::actor_ref;
using troupe::down_notice;
using troupe::errc;
using troupe::exit_reason;
using troupe::spawn_options;
using troupe::test_system;

struct flaky {
  static inline int constructed = 0;
  int generation;
  std::string name;
  explicit flaky(std::string n) : generation(++constructed), name(std::move(n)) {}
  void crash() { throw std::runtime_error("crash"); }
  std::string who() const { return name + "#" + std::to_string(generation); }
};

TEST(Supervision, AFailedActorIsRecreatedFromItsConstructorArguments) {
  flaky::constructed = 0;
  test_system sys;
  auto f = sys.spawn<flaky>(spawn_options{.restart = {.max_restarts = 2}}, std::string("w"));
  EXPECT_EQ(f.ask(&flaky::who).get(), "w#1");
  f.tell(&flaky::crash);
  EXPECT_EQ(f.ask(&flaky::who).get(), "w#2");  // the same ref reaches the new instance
  f.tell(&flaky::crash);
  EXPECT_EQ(f.ask(&flaky::who).get(), "w#3");
  auto down = sys.monitor(f);
  f.tell(&flaky::crash);  // the third failure exceeds max_restarts
  EXPECT_EQ(down.get().reason, exit_reason::failed);
  EXPECT_FALSE(f.alive());
  EXPECT_EQ(flaky::constructed, 3);
}

TEST(Supervision, RestartsWaitForTheirBackoffAndKeepQueuedMessages) {
  flaky::constructed = 0;
  test_system sys;
  auto f = sys.spawn<flaky>(
      spawn_options{.restart = {.max_restarts = -1, .backoff = 100ms, .backoff_multiplier = 2.0}},
      std::string("b"));
  f.tell(&flaky::crash);
  auto who = f.ask(&flaky::who);
  sys.run_until_idle();
  EXPECT_FALSE(who.ready());  // waiting for the backoff: the message is kept, not lost
  sys.advance(99ms);
  EXPECT_FALSE(who.ready());
  sys.advance(1ms);
  ASSERT_TRUE(who.ready());
  EXPECT_EQ(who.get(), "b#2");
  f.tell(&flaky::crash);  // the second backoff is twice as long
  auto again = f.ask(&flaky::who);
  sys.advance(199ms);
  EXPECT_FALSE(again.ready());
  sys.advance(1ms);
  EXPECT_EQ(again.get(), "b#3");
}

TEST(Supervision, AnAskedExceptionDoesNotFailTheActorUnlessAskedTo) {
  flaky::constructed = 0;
  test_system sys;
  auto keep = sys.spawn<flaky>(spawn_options{.restart = {.max_restarts = 1}}, std::string("k"));
  EXPECT_THROW(keep.ask(&flaky::crash).get(), std::runtime_error);
  EXPECT_EQ(keep.ask(&flaky::who).get(), "k#1");
  auto strict = sys.spawn<flaky>(
      spawn_options{.restart = {.max_restarts = 1}, .fail_on_ask_exception = true}, std::string("s"));
  EXPECT_THROW(strict.ask(&flaky::crash).get(), std::runtime_error);
  EXPECT_EQ(strict.ask(&flaky::who).get(), "s#3");
}

TEST(Supervision, RestartNeedsCopyableArguments) {
  struct owner {
    explicit owner(std::unique_ptr<int>) {}
  };
  test_system sys;
  EXPECT_THROW(sys.spawn<owner>(spawn_options{.restart = {.max_restarts = 1}}, std::make_unique<int>(1)),
               std::invalid_argument);
  EXPECT_NO_THROW(sys.spawn<owner>(std::make_unique<int>(1)));
}

/// Holds asks unanswered until told to answer them.
struct late_answer {
  std::vector<troupe::promise<int>> held;
  troupe::task<int> answer() {
    held.emplace_back();
    co_return co_await held.back().get_future();
  }
  void release(int v) {
    for (auto& h : held) h.set_value(v);
    held.clear();
  }
};

/// Awaits, in a coroutine, a value that its own promise or another actor's reply brings.
struct awaiter {
  explicit awaiter(actor_ref<late_answer> o) : other(std::move(o)) {}
  troupe::promise<int> p;
  actor_ref<late_answer> other;
  troupe::task<int> wait_own() { co_return co_await p.get_future(); }
  troupe::task<int> wait_other() { co_return co_await other.ask(&late_answer::answer); }
  void boom() { throw std::runtime_error("boom"); }
  int ping() { return 1; }
};

// A restart destroys the coroutines the old object had suspended; a reply that arrives afterwards,
// or the old object's own promise failed as it goes, must not resume them.
TEST(Supervision, ARestartDropsTheContinuationsOfTheOldObject) {
  troupe::actor_system sys{{.threads = 2}};
  auto answers = sys.spawn<late_answer>(spawn_options{.reentrant = true});
  spawn_options o{.reentrant = true};
  o.restart.max_restarts = 5;
  auto a = sys.spawn<awaiter>(o, answers);
  auto own = a.ask(&awaiter::wait_own);
  auto other = a.ask(&awaiter::wait_other);
  ASSERT_EQ(a.ask(&awaiter::ping).get(), 1);  // both are suspended now
  a.tell(&awaiter::boom);
  EXPECT_EQ(a.ask(&awaiter::ping).get(), 1);  // the new object answers
  answers.tell(&late_answer::release, 5);     // the reply reaches the new incarnation
  EXPECT_EQ(a.ask(&awaiter::ping).get(), 1);
  EXPECT_THROW(own.get(), troupe::error);
  EXPECT_THROW(other.get(), troupe::error);
  EXPECT_TRUE(a.alive());
}

// An error without handler in a then() callback that runs at once (its future was complete) fails
// the actor after the method that registered it, not under it.
struct inline_then_victim {
  std::string name = std::string(100, 'x');
  int step() {
    troupe::promise<int> p;
    auto f = p.get_future();
    p.set_exception(std::make_exception_ptr(std::runtime_error("no value")));
    std::move(f).then([](int) {});  // runs now, with the error
    name += "!";                     // the object is still here
    return static_cast<int>(name.size());
  }
  int ping() { return 1; }
};

TEST(Supervision, AnErrorInAThenCallbackThatRanInlineFailsTheActorAfterItsMethod) {
  troupe::actor_system sys{{.threads = 2}};
  auto v = sys.spawn<inline_then_victim>();
  auto down = sys.monitor(v);
  EXPECT_EQ(v.ask(&inline_then_victim::step).get(), 101);
  auto n = std::move(down).timeout(5s).get();
  EXPECT_EQ(n.reason, exit_reason::failed);
  EXPECT_EQ(n.what, "no value");

  spawn_options o;
  o.restart.max_restarts = 3;
  auto r = sys.spawn<inline_then_victim>(o);
  EXPECT_EQ(r.ask(&inline_then_victim::step).get(), 101);
  EXPECT_EQ(r.ask(&inline_then_victim::step).get(), 101);  // a new object: restarted after the first
  EXPECT_EQ(r.ask(&inline_then_victim::ping).get(), 1);
}

TEST(Supervision, ARefusedPolicyLeavesNothingBehind) {
  // (Under AddressSanitizer the leak check sees a spawn that took a reference and threw.)
  troupe::actor_system sys{{.threads = 1}};
  spawn_options o;
  o.restart.max_restarts = -2;
  EXPECT_THROW(sys.spawn<fragile>(o), std::invalid_argument);
}

// A parent and its children: they go when it stops or restarts; a restart makes new ones.
struct family {
  std::vector<actor_ref<family>> kids;
  int at_start = 0;
  explicit family(int n = 0) : at_start(n) {}
  void on_start() { have(at_start); }
  void have(int n) {
    for (int i = 0; i < n; ++i) kids.push_back(troupe::this_actor::spawn_child<family>());
  }
  actor_ref<family> kid(int i) const { return kids.at(static_cast<std::size_t>(i)); }
  void crash() { throw std::runtime_error("parent failed"); }
  int ping() const { return 1; }
};
struct precocious {
  precocious() { troupe::this_actor::spawn_child<family>(); }
};
struct spawns_precocious {
  void go() { troupe::this_actor::spawn_child<precocious>(); }
};

TEST(Supervision, ChildrenStopWithTheirParentAndARestartMakesNewOnes) {
  test_system sys;
  auto parent = sys.spawn<family>(spawn_options{.restart = {.max_restarts = 1}}, 3);
  sys.run_until_idle();
  auto kid = [&](const actor_ref<family>& of, int i) {
    auto f = of.ask(&family::kid, i);
    sys.run_until_idle();
    return f.get();
  };
  std::vector<actor_ref<family>> k{kid(parent, 0), kid(parent, 1), kid(parent, 2)};
  k[0].tell(&family::have, 2);  // grandchildren
  sys.run_until_idle();
  auto g = kid(k[0], 1);
  // A child that ends leaves the others and the parent alone.
  k[2].stop();
  sys.run_until_idle();
  EXPECT_TRUE(parent.alive());
  EXPECT_TRUE(k[1].alive());
  // A restart stops them, down to the grandchildren; the new object (on_start) makes three more.
  std::vector<troupe::future<down_notice>> downs;
  for (auto& c : {k[0], k[1], g}) downs.push_back(sys.monitor(c));
  parent.tell(&family::crash);
  sys.run_until_idle();
  EXPECT_TRUE(parent.alive());
  for (auto& d : downs) {
    ASSERT_TRUE(d.ready());
    EXPECT_EQ(d.get().reason, exit_reason::stopped);
  }
  EXPECT_EQ(sys.live_actors(), 4u);
  std::vector<actor_ref<family>> again{kid(parent, 0), kid(parent, 1), kid(parent, 2)};
  for (auto& c : again) EXPECT_TRUE(c.alive());
  // The final failure ends them too.
  parent.tell(&family::crash);
  sys.run_until_idle();
  EXPECT_FALSE(parent.alive());
  EXPECT_EQ(sys.live_actors(), 0u);
  // A constructor runs as its spawner: spawn_child there would give the child to the wrong
  // parent, and throws.
  auto s = sys.spawn<spawns_precocious>();
  auto refused = s.ask(&spawns_precocious::go);
  sys.run_until_idle();
  EXPECT_THROW(refused.get(), std::logic_error);
}

TEST(Supervision, SpawnChildIsForActorsAndAStoppedParentTakesItsChildrenWithIt) {
  EXPECT_THROW(troupe::this_actor::spawn_child<family>(), std::logic_error);
  troupe::actor_system sys{{.threads = 2}};
  auto parent = sys.spawn<family>();
  parent.tell(&family::have, 100);
  auto last = parent.ask(&family::kid, 99).get();
  EXPECT_EQ(last.ask(&family::ping).get(), 1);
  auto gone = sys.monitor(last);
  parent.stop();
  EXPECT_EQ(std::move(gone).timeout(5s).get().reason, exit_reason::stopped);
  sys.await_all_actors_done();
}

}  // namespace
