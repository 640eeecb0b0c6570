#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include <troupe/actors/actor_system.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::actor_ref;
using troupe::errc;
using troupe::future;
using troupe::test_system;

struct echo {
  int value(int x) { return x; }
};

struct slow {
  int value(int x) {
    std::this_thread::sleep_for(400ms);
    return x;
  }
};

errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e.code_value();
  }
  return errc::ok;
}

TEST(Future, AnAskOvertakenByStopFailsAtOnceWithActorDead) {
  test_system sys;
  auto e = sys.spawn<echo>();
  auto f = e.ask(&echo::value, 1);
  e.stop();
  // stop overtakes the ask: the ask fails at once with actor_dead rather than hanging.
  EXPECT_EQ(code_of([&] { f.get(); }), errc::actor_dead);
}

TEST(Future, ThenOutsideActorsRunsWhenTheReplyArrives) {
  test_system sys;
  auto e = sys.spawn<echo>();
  int got = 0;
  e.ask(&echo::value, 5).then([&](int v) { got = v; });
  EXPECT_EQ(got, 0);
  sys.run_until_idle();
  EXPECT_EQ(got, 5);
}

TEST(Future, ThenWithAnErrorHandlerReceivesTheError) {
  test_system sys;
  struct thrower {
    int boom() { throw std::runtime_error("boom"); }
  };
  auto t = sys.spawn<thrower>();
  std::string error;
  bool value_called = false;
  t.ask(&thrower::boom).then([&](int) { value_called = true; },
                             [&](std::exception_ptr e) {
                               try {
                                 std::rethrow_exception(e);
                               } catch (const std::exception& ex) {
                                 error = ex.what();
                               }
                             });
  sys.run_until_idle();
  EXPECT_FALSE(value_called);
  EXPECT_EQ(error, "boom");
}

struct asker {
  actor_ref<echo> peer;
  int total = 0;
  int callbacks_on_this_actor = 0;
  void start(int n) {
    for (int i = 1; i <= n; ++i)
      peer.ask(&echo::value, i).then([this](int v) {
        total += v;  // runs in this actor's context: no data race
        if (troupe::this_actor::id() == self_id) ++callbacks_on_this_actor;
      });
  }
  troupe::actor_id self_id = 0;
  void remember_id() { self_id = troupe::this_actor::id(); }
  std::pair<int, int> result() const { return {total, callbacks_on_this_actor}; }
};

TEST(Future, ThenInsideAnActorRunsInThatActorsContext) {
  troupe::actor_system sys{{.threads = 2}};
  auto e = sys.spawn<echo>();
  auto a = sys.spawn<asker>(e);
  a.tell(&asker::remember_id);
  a.tell(&asker::start, 1000);
  std::pair<int, int> r;
  for (int i = 0; i < 2000; ++i) {
    r = a.ask(&asker::result).get();
    if (r.second == 1000) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(r.first, 1000 * 1001 / 2);
  EXPECT_EQ(r.second, 1000);
}

TEST(Future, TimeoutFailsAnUnansweredAskOnTheVirtualClock) {
  test_system sys;
  auto e = sys.spawn<echo>();
  auto f = e.ask(&echo::value, 3).timeout(10ms);
  // Not yet run, not yet timed out.
  sys.advance(5ms);
  EXPECT_TRUE(f.ready());  // advance runs the system: the reply came first
  EXPECT_EQ(f.get(), 3);

  auto g = e.ask(&echo::value, 4);
  auto h = std::move(g).timeout(10ms);
  e.stop();  // never answered: actor_dead comes first
  EXPECT_EQ(code_of([&] { h.get(); }), errc::actor_dead);
}

TEST(Future, TimeoutFiresWhenTheActorIsBusy) {
  troupe::actor_system sys{{.threads = 1}};
  auto s = sys.spawn<slow>();
  s.tell(&slow::value, 0);  // keeps the actor busy for 400 ms
  auto f = s.ask(&slow::value, 1).timeout(5ms);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(code_of([&] { f.get(); }), errc::timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 350ms);
}

TEST(Future, GetOnAnActorThreadIsRefusedNotADeadlock) {
  troupe::actor_system sys{{.threads = 2}};
  struct blocker {
    actor_ref<echo> peer;
    int try_blocking() {
      try {
        peer.ask(&echo::value, 1).get();
      } catch (const troupe::error& e) {
        return static_cast<int>(e.code_value());
      }
      return 0;
    }
  };
  auto e = sys.spawn<echo>();
  auto b = sys.spawn<blocker>(e);
  EXPECT_EQ(b.ask(&blocker::try_blocking).get(), static_cast<int>(errc::would_deadlock));
}

TEST(Future, BlockingGetFromManyThreadsSeesEveryReply) {
  troupe::actor_system sys{{.threads = 2}};
  auto e = sys.spawn<echo>();
  std::atomic<long long> sum{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) sum += e.ask(&echo::value, t * 10000 + i).get();
    });
  for (auto& th : threads) th.join();
  long long expected = 0;
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 2000; ++i) expected += t * 10000 + i;
  EXPECT_EQ(sum.load(), expected);
}

// ---- promise ------------------------------------------------------------------------

TEST(Promise, SetOnAnotherThreadCompletesTheFuture) {
  troupe::promise<std::string> p;
  auto f = p.get_future();
  std::thread t([&] { p.set_value("late"); });
  EXPECT_EQ(f.get(), "late");
  t.join();
  EXPECT_FALSE(p.pending());
}

TEST(Promise, AnExceptionOrAnAbandonedPromiseFailsTheFuture) {
  troupe::promise<int> p;
  auto f = p.get_future();
  p.set_exception(std::make_exception_ptr(std::runtime_error("no value")));
  EXPECT_THROW(f.get(), std::runtime_error);

  future<int> orphan;
  {
    troupe::promise<int> q;
    orphan = q.get_future();
  }
  EXPECT_EQ(code_of([&] { orphan.get(); }), errc::broken_promise);

  // Moving a promise over a pending one abandons the pending one.
  troupe::promise<void> a, b;
  auto fa = a.get_future();
  auto fb = b.get_future();
  a = std::move(b);
  EXPECT_EQ(code_of([&] { fa.get(); }), errc::broken_promise);
  a.set_value();
  fb.get();
}

TEST(Promise, SettingTwiceOrTakingTwoFuturesIsAnError) {
  troupe::promise<int> p;
  auto f = p.get_future();
  EXPECT_THROW(p.get_future(), std::logic_error);
  p.set_value(1);
  EXPECT_THROW(p.set_value(2), std::logic_error);
  EXPECT_THROW(p.set_exception(std::make_exception_ptr(std::runtime_error("x"))), std::logic_error);
  EXPECT_THROW(p.get_future(), std::logic_error);
  EXPECT_EQ(f.get(), 1);
}

/// Waits in a coroutine for a value that a later message brings: the pattern of a pipeline
/// stage waiting for its input.
struct mailbox_slot {
  troupe::task<int> wait_for_value() {
    troupe::promise<int> p;
    auto f = p.get_future();
    waiting_ = std::move(p);
    const int v = co_await std::move(f);
    co_return v * 2;
  }
  void put(int v) {
    if (waiting_.pending()) waiting_.set_value(v);
  }
  troupe::promise<int> waiting_;
};

TEST(Promise, AReentrantActorAwaitsAValueThatALaterMessageSets) {
  troupe::actor_system sys{{.threads = 2}};
  auto slot = sys.spawn<mailbox_slot>(troupe::spawn_options{.reentrant = true});
  for (int i = 0; i < 200; ++i) {
    auto f = slot.ask(&mailbox_slot::wait_for_value);
    slot.tell(&mailbox_slot::put, i);
    EXPECT_EQ(f.get(), 2 * i);
  }
}

TEST(Promise, GetOutsideDrivesTheTestSystemThatMadeIt) {
  test_system sys;
  auto slot = sys.spawn<mailbox_slot>(troupe::spawn_options{.reentrant = true});
  auto f = slot.ask(&mailbox_slot::wait_for_value);
  sys.run_until_idle();
  EXPECT_FALSE(f.ready());
  slot.tell(&mailbox_slot::put, 21);
  EXPECT_EQ(f.get(), 42);
}

struct promise_setter {
  void set(troupe::promise<int>* p) { p->set_value(7); }
};

TEST(Promise, OfATestSystemIsAwaitedByDrivingItAndANullExceptionIsRefused) {
  test_system sys;
  auto p = sys.make_promise<int>();
  auto f = p.get_future();
  auto a = sys.spawn<promise_setter>();
  a.tell(&promise_setter::set, &p);  // runs only when the system is driven
  EXPECT_EQ(f.get(), 7);
  troupe::promise<int> q;
  EXPECT_THROW(q.set_exception(nullptr), std::invalid_argument);
  EXPECT_TRUE(q.pending());
}

TEST(Promise, ItsFutureOutlivesItsSystem) {
  // Nothing in a system completes a promise at its shutdown, so its future may be waited on
  // after the system is gone: a value set from another thread arrives, a timeout fails with
  // system_shutdown, and a test_system's future, which nothing can drive any more, says so.
  troupe::promise<int> p, q, r, unset;
  future<int> f, g, h, never;
  {
    troupe::actor_system sys{{.threads = 1}};
    p = sys.make_promise<int>();
    f = p.get_future();
    q = sys.make_promise<int>();
    g = q.get_future();
  }
  {
    test_system sys;
    r = sys.make_promise<int>();
    h = r.get_future();
    unset = sys.make_promise<int>();
    never = unset.get_future();
  }
  std::thread setter([&] {
    std::this_thread::sleep_for(5ms);
    p.set_value(5);
  });
  EXPECT_EQ(f.get(), 5);
  setter.join();
  try {
    (void)std::move(g).timeout(1min).get();
    ADD_FAILURE() << "a value from nowhere";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code(), errc::system_shutdown);
  }
  r.set_value(9);
  EXPECT_EQ(h.get(), 9);
  try {
    (void)never.get();
    ADD_FAILURE() << "a value from nowhere";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code(), errc::would_deadlock);
  }
}

TEST(Future, ATimeoutTheTimersNeverFireFailsWithSystemShutdown) {
  // Armed before the shutdown (the timer thread stops with it pending) or after it.
  for (const bool armed_first : {true, false}) {
    troupe::actor_system sys{{.threads = 1}};
    auto p = sys.make_promise<int>();
    auto f = p.get_future();
    troupe::future<int> g;
    if (armed_first) g = std::move(f).timeout(10min);
    sys.shutdown();
    if (!armed_first) g = std::move(f).timeout(10min);
    try {
      (void)std::move(g).get();
      ADD_FAILURE() << "a value from nowhere";
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code(), troupe::errc::system_shutdown) << armed_first;
    }
  }
}

}  // namespace

namespace {

// A timeout that fires while the ask still waits in the callee's mailbox: the awaiting coroutine
// resumes in its own actor (after the method that actor runs now), and the call itself still runs
// later, its reply discarded.
struct queued_callee {
  std::atomic<int> ran{0};
  void block(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  int work() { return ++ran; }
  int runs() { return ran.load(); }
};

struct timing_out_caller {
  troupe::actor_ref<queued_callee> peer;
  troupe::actor_id resumed_in = 0;
  bool timed_out = false;
  std::atomic<bool> busy_now{false};
  bool overlapped = true;
  void busy(int ms) {
    busy_now = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    busy_now = false;
  }
  troupe::task<int> go() {
    try {
      co_await peer.ask(&queued_callee::work).timeout(std::chrono::milliseconds(20));
    } catch (const troupe::error& e) {
      timed_out = e.code() == troupe::errc::timeout;
    }
    resumed_in = troupe::this_actor::id();
    overlapped = busy_now.load();
    co_return 0;
  }
  std::tuple<troupe::actor_id, bool, bool> seen() const { return {resumed_in, timed_out, overlapped}; }
};

}  // namespace

TEST(Future, ATimeoutWhileTheAskIsStillQueuedResumesTheAskerInItsOwnActor) {
  troupe::actor_system sys{{.threads = 4}};
  auto callee = sys.spawn<queued_callee>();
  auto caller = sys.spawn<timing_out_caller>(troupe::spawn_options{.reentrant = true}, callee);
  callee.tell(&queued_callee::block, 150);  // the ask waits behind this
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto f = caller.ask(&timing_out_caller::go);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  caller.tell(&timing_out_caller::busy, 300);  // busy when the timeout fires and when the callee pops the ask
  EXPECT_EQ(f.get(), 0);
  auto [resumed_in, timed_out, overlapped] = caller.ask(&timing_out_caller::seen).get();
  EXPECT_EQ(resumed_in, caller.id());
  EXPECT_TRUE(timed_out);
  EXPECT_FALSE(overlapped) << "the coroutine ran while its actor ran another method";
  EXPECT_EQ(callee.ask(&queued_callee::runs).get(), 1) << "the timed-out call itself still runs";
}

// ---- when_all / when_any ----------------------------------------------------------------------

namespace {

struct squarer {
  int square(int x) {
    if (x < 0) throw std::invalid_argument("negative");
    return x * x;
  }
  void nothing() {}
};

/// Gathers a fan-out from inside an actor, without blocking a worker.
struct gatherer {
  std::vector<actor_ref<squarer>> workers;
  troupe::task<int> sum_of_squares(int n) {
    std::vector<future<int>> asks;
    for (int i = 0; i < n; ++i) asks.push_back(workers[static_cast<std::size_t>(i) % workers.size()].ask(&squarer::square, i));
    int sum = 0;
    for (int v : co_await troupe::when_all(std::move(asks))) sum += v;
    co_return sum;
  }
};

}  // namespace

TEST(WhenAll, GivesEveryValueInOrderWhateverOrderTheyArriveIn) {
  std::vector<troupe::promise<int>> ps(4);
  std::vector<future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto all = troupe::when_all(std::move(fs));
  for (const auto& f : fs) EXPECT_FALSE(f.valid());  // consumed
  for (int i = 3; i >= 0; --i) {
    EXPECT_FALSE(all.ready());
    ps[static_cast<std::size_t>(i)].set_value(10 * i);
  }
  EXPECT_EQ(all.get(), (std::vector<int>{0, 10, 20, 30}));
  EXPECT_TRUE(troupe::when_all(std::vector<future<int>>{}).get().empty());
}

TEST(WhenAll, FailsWithTheFirstErrorWithoutWaitingForTheRest) {
  std::vector<troupe::promise<std::string>> ps(3);
  std::vector<future<std::string>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto all = troupe::when_all(std::move(fs));
  ps[0].set_value("a");
  ps[2].set_exception(std::make_exception_ptr(std::runtime_error("third")));
  ASSERT_TRUE(all.ready());  // the second never came
  ps[1].set_exception(std::make_exception_ptr(std::runtime_error("second, later")));
  try {
    all.get();
    FAIL() << "expected the third's error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "third");
  }
  // Void futures: done when all are.
  std::vector<troupe::promise<void>> vs(2);
  std::vector<future<void>> vf;
  for (auto& p : vs) vf.push_back(p.get_future());
  auto done = troupe::when_all(std::move(vf));
  vs[1].set_value();
  EXPECT_FALSE(done.ready());
  vs[0].set_value();
  EXPECT_NO_THROW(done.get());
}

TEST(WhenAll, RefusesAConsumedFutureAndConsumesNone) {
  troupe::promise<int> a, b;
  std::vector<future<int>> fs;
  fs.push_back(a.get_future());
  fs.emplace_back();  // never set
  EXPECT_THROW((void)troupe::when_all(std::move(fs)), std::logic_error);
  EXPECT_THROW((void)troupe::when_any(std::vector<future<int>>{}), std::invalid_argument);
  std::vector<future<int>> gs;
  gs.push_back(b.get_future());
  gs.emplace_back();
  EXPECT_THROW((void)troupe::when_any(std::move(gs)), std::logic_error);
}

TEST(WhenAny, TheFirstValueWinsAndErrorsOnlyEndItWhenAllFail) {
  std::vector<troupe::promise<int>> ps(3);
  std::vector<future<int>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  auto first = troupe::when_any(std::move(fs));
  ps[0].set_exception(std::make_exception_ptr(std::runtime_error("down")));  // the race goes on
  EXPECT_FALSE(first.ready());
  ps[2].set_value(7);
  ps[1].set_value(5);  // too late
  EXPECT_EQ(first.get(), (std::pair<std::size_t, int>{2, 7}));

  std::vector<troupe::promise<void>> vs(2);
  std::vector<future<void>> vf;
  for (auto& p : vs) vf.push_back(p.get_future());
  auto none = troupe::when_any(std::move(vf));
  vs[1].set_exception(std::make_exception_ptr(std::runtime_error("second")));
  vs[0].set_exception(std::make_exception_ptr(std::runtime_error("first")));
  try {
    none.get();
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");  // by index, not by arrival
  }
}

TEST(WhenAll, GathersAFanOutInsideAnActorAndOutside) {
  troupe::actor_system sys{{.threads = 2}};
  std::vector<actor_ref<squarer>> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(sys.spawn<squarer>());
  auto g = sys.spawn<gatherer>(gatherer{workers});
  EXPECT_EQ(g.ask(&gatherer::sum_of_squares, 100).get(), 328350);
  // Outside: a method's exception and a dead actor fail the whole.
  std::vector<future<int>> asks;
  asks.push_back(workers[0].ask(&squarer::square, 3));
  asks.push_back(workers[1].ask(&squarer::square, -1));
  EXPECT_THROW(troupe::when_all(std::move(asks)).get(), std::invalid_argument);
  workers[3].stop();
  std::vector<future<int>> race;
  race.push_back(workers[3].ask(&squarer::square, 2));
  race.push_back(workers[2].ask(&squarer::square, 9));
  EXPECT_EQ(troupe::when_any(std::move(race)).get(), (std::pair<std::size_t, int>{1, 81}));
  // A timeout on the combined future.
  auto never = sys.make_promise<int>();
  std::vector<future<int>> slow;
  slow.push_back(never.get_future());
  try {
    troupe::when_all(std::move(slow)).timeout(std::chrono::milliseconds(20)).get();
    FAIL() << "expected a timeout";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::timeout);
  }
}

TEST(WhenAll, GetDrivesTheTestSystemOfItsFutures) {
  test_system sys;
  auto w = sys.spawn<squarer>();
  std::vector<future<void>> fs;
  for (int i = 0; i < 3; ++i) fs.push_back(w.ask(&squarer::nothing));
  EXPECT_NO_THROW(troupe::when_all(std::move(fs)).get());
  std::vector<future<int>> gs;
  gs.push_back(w.ask(&squarer::square, 4));
  EXPECT_EQ(troupe::when_any(std::move(gs)).get().second, 16);
}

namespace {
struct self_gatherer {
  troupe::task<int> twice() {
    std::vector<future<int>> asks;
    asks.push_back(troupe::this_actor::self<self_gatherer>().ask(&self_gatherer::one));
    auto all = co_await troupe::when_all(std::move(asks));  // would wait for ever
    co_return all[0] * 2;
  }
  int one() { return 1; }
  troupe::task<int> consumed() {
    future<int> f;
    try {
      co_await std::move(f);
    } catch (const std::logic_error&) {
      co_return -1;
    }
    co_return 0;
  }
};
}  // namespace

// Awaiting a combination that holds the actor's own ask is refused as awaiting the ask itself
// is; awaiting a consumed future is a catchable std::logic_error.
TEST(WhenAll, AnActorAwaitingItsOwnAskThroughWhenAllIsRefused) {
  troupe::actor_system sys{{.threads = 2}};
  auto a = sys.spawn<self_gatherer>();
  try {
    (void)a.ask(&self_gatherer::twice).timeout(std::chrono::seconds(5)).get();
    FAIL() << "expected would_deadlock";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::would_deadlock) << e.what();
  }
  EXPECT_EQ(a.ask(&self_gatherer::one).get(), 1);  // and the actor still answers
  EXPECT_EQ(a.ask(&self_gatherer::consumed).get(), -1);
}
