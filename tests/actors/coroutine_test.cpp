#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace {

using troupe::actor_ref;
using troupe::errc;
using troupe::task;
using troupe::test_system;

struct adder {
  int add(int a, int b) { return a + b; }
  int fail() { throw std::runtime_error("adder failed"); }
};

task<int> add_twice(actor_ref<adder> a, int x) {
  int y = co_await a.ask(&adder::add, x, x);
  co_return co_await a.ask(&adder::add, y, y);
}

struct chain {
  actor_ref<adder> a;
  std::vector<int> log;
  task<int> compute(int x) {
    log.push_back(1);
    int r = co_await add_twice(a, x);  // a helper coroutine, awaited like any task
    log.push_back(2);
    co_return r;
  }
  task<int> propagate() { co_return co_await a.ask(&adder::fail); }
  task<void> nothing() { co_return; }
  void note(int v) { log.push_back(v); }
  std::vector<int> seen() const { return log; }
};

TEST(Coroutine, AMethodCanAwaitOtherActorsAndHelperTasks) {
  test_system sys;
  auto a = sys.spawn<adder>();
  auto c = sys.spawn<chain>(a);
  EXPECT_EQ(c.ask(&chain::compute, 3).get(), 12);
  c.ask(&chain::nothing).get();
}

TEST(Coroutine, AnExceptionInsideACoroutineReachesTheAsker) {
  test_system sys;
  auto a = sys.spawn<adder>();
  auto c = sys.spawn<chain>(a);
  EXPECT_THROW(c.ask(&chain::propagate).get(), std::runtime_error);
  EXPECT_TRUE(c.alive());
}

TEST(Coroutine, ASuspendedMethodKeepsOtherMessagesOutByDefault) {
  test_system sys;
  auto a = sys.spawn<adder>();
  auto c = sys.spawn<chain>(a);
  auto f = c.ask(&chain::compute, 1);
  c.tell(&chain::note, 99);  // sent while compute() awaits
  sys.run_until_idle();
  EXPECT_EQ(f.get(), 4);
  EXPECT_EQ(c.ask(&chain::seen).get(), (std::vector<int>{1, 2, 99}));
}

TEST(Coroutine, AReentrantActorTakesMessagesWhileSuspended) {
  test_system sys;
  auto a = sys.spawn<adder>();
  auto c = sys.spawn<chain>(troupe::spawn_options{.reentrant = true}, a);
  auto f = c.ask(&chain::compute, 1);
  c.tell(&chain::note, 99);
  sys.run_until_idle();
  EXPECT_EQ(f.get(), 4);
  EXPECT_EQ(c.ask(&chain::seen).get(), (std::vector<int>{1, 99, 2}));
}

// Two actors that call back into each other: the classic trade-off of non-reentrancy.
struct caller;
struct callee {
  task<int> call_back(actor_ref<caller> c);
};
struct caller {
  actor_ref<callee> peer;
  task<int> go();
  int answer() { return 42; }
};
task<int> callee::call_back(actor_ref<caller> c) { co_return co_await c.ask(&caller::answer); }
task<int> caller::go() { co_return co_await peer.ask(&callee::call_back, troupe::this_actor::self<caller>()); }

TEST(Coroutine, MutualCallbacksDeadlockWithoutReentrancyAndGetSaysSo) {
  test_system sys;
  auto b = sys.spawn<callee>();
  auto a = sys.spawn<caller>(b);
  try {
    a.ask(&caller::go).get();
    FAIL() << "expected would_deadlock";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::would_deadlock);
  }
}

TEST(Coroutine, MutualCallbacksCompleteWithReentrancy) {
  test_system sys;
  auto b = sys.spawn<callee>();
  auto a = sys.spawn<caller>(troupe::spawn_options{.reentrant = true}, b);
  EXPECT_EQ(a.ask(&caller::go).get(), 42);
}

// A million helper tasks that finish at once, awaited in a loop: each returns to the loop
// without a frame left behind. (This file builds at -O0, where GCC makes no tail call of a
// symmetric transfer: it overflowed the worker's stack after about 130,000.)
struct looper {
  task<int> one(int i) { co_return i % 7; }
  task<long> many(int n) {
    long sum = 0;
    for (int i = 0; i < n; ++i) sum += co_await one(i);
    co_return sum;
  }
};

TEST(Coroutine, AMillionHelperTasksThatFinishAtOnceTakeNoStack) {
  troupe::actor_system sys{{.threads = 1}};
  auto a = sys.spawn<looper>();
  long expected = 0;
  for (int i = 0; i < 1'000'000; ++i) expected += i % 7;
  EXPECT_EQ(a.ask(&looper::many, 1'000'000).get(), expected);
}

// An actor that awaits its own ask: not reentrant, it would take the ask only after the
// awaiting method returned. The await fails at once; the actor goes on serving.
struct self_asker {
  int answer() { return 7; }
  task<int> ask_myself() { co_return co_await troupe::this_actor::self<self_asker>().ask(&self_asker::answer); }
};

TEST(Coroutine, AnActorThatAwaitsItsOwnAskGetsWouldDeadlockUnlessReentrant) {
  troupe::actor_system sys{{.threads = 2}};
  auto a = sys.spawn<self_asker>();
  try {
    a.ask(&self_asker::ask_myself).timeout(std::chrono::seconds(10)).get();
    FAIL() << "expected would_deadlock";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::would_deadlock) << e.what();
  }
  EXPECT_EQ(a.ask(&self_asker::answer).get(), 7);
  auto r = sys.spawn<self_asker>(troupe::spawn_options{.reentrant = true});
  EXPECT_EQ(r.ask(&self_asker::ask_myself).timeout(std::chrono::seconds(10)).get(), 7);
}

TEST(Coroutine, StoppingASuspendedActorFailsItsPendingAskWithActorDead) {
  test_system sys;
  auto b = sys.spawn<callee>();
  auto a = sys.spawn<caller>(b);
  auto f = a.ask(&caller::go);
  sys.run_until_idle();  // a is suspended forever (see above)
  EXPECT_FALSE(f.ready());
  a.stop();
  sys.run_until_idle();
  try {
    f.get();
    FAIL() << "expected actor_dead";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::actor_dead);
  }
  EXPECT_FALSE(a.alive());
}

TEST(Coroutine, ACoroutineTellThatThrowsFailsTheActor) {
  struct bad {
    actor_ref<adder> a;
    task<void> run() {
      co_await a.ask(&adder::fail);
    }
  };
  test_system sys;
  auto a = sys.spawn<adder>();
  auto b = sys.spawn<bad>(a);
  auto down = sys.monitor(b);
  b.tell(&bad::run);
  auto n = down.get();
  EXPECT_EQ(n.reason, troupe::exit_reason::failed);
  EXPECT_EQ(n.what, "adder failed");
}

TEST(Coroutine, ManyConcurrentCoroutinesOnTheThreadPoolAllComplete) {
  troupe::actor_system sys{{.threads = 2}};
  auto a = sys.spawn<adder>();
  std::vector<actor_ref<chain>> chains;
  for (int i = 0; i < 50; ++i) chains.push_back(sys.spawn<chain>(a));
  std::vector<troupe::future<int>> fs;
  for (int round = 0; round < 20; ++round)
    for (int i = 0; i < 50; ++i) fs.push_back(chains[i].ask(&chain::compute, i));
  for (std::size_t k = 0; k < fs.size(); ++k) EXPECT_EQ(fs[k].get(), 4 * static_cast<int>(k % 50));
}

}  // namespace
