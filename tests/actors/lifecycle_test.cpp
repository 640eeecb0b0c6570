#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>

#include "system.hpp"  // the watcher list, to see that the gone ones leave it

namespace {

using namespace std::chrono_literals;
using troupe::actor_ref;
using troupe::down_notice;
using troupe::errc;
using troupe::exit_reason;
using troupe::spawn_options;
using troupe::test_system;

struct journal {
  std::vector<std::string> lines;
};

struct hooked {
  std::shared_ptr<journal> j;
  explicit hooked(std::shared_ptr<journal> jj) : j(std::move(jj)) { j->lines.push_back("ctor"); }
  ~hooked() { j->lines.push_back("dtor"); }
  void on_start() { j->lines.push_back("start"); }
  void on_stop() { j->lines.push_back("stop"); }
  void work(int i) { j->lines.push_back("work " + std::to_string(i)); }
  int value() { return 1; }
};

TEST(Lifecycle, HooksRunInOrderAroundTheMessages) {
  test_system sys;
  auto j = std::make_shared<journal>();
  auto h = sys.spawn<hooked>(j);
  h.tell(&hooked::work, 1);
  sys.run_until_idle();
  h.stop();
  sys.run_until_idle();
  EXPECT_EQ(j->lines, (std::vector<std::string>{"ctor", "start", "work 1", "stop", "dtor"}));
  EXPECT_FALSE(h.alive());
  EXPECT_EQ(sys.live_actors(), 0u);
}

TEST(Lifecycle, StopOvertakesQueuedMessagesAndTheirAsksFailAtOnce) {
  test_system sys;
  auto j = std::make_shared<journal>();
  auto h = sys.spawn<hooked>(j);
  std::vector<troupe::future<int>> asks;
  for (int i = 0; i < 5; ++i) asks.push_back(h.ask(&hooked::value));
  h.tell(&hooked::work, 7);
  h.stop();
  sys.run_until_idle();
  for (auto& f : asks) {
    ASSERT_TRUE(f.ready());
    try {
      f.get();
      FAIL() << "expected actor_dead";
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code_value(), errc::actor_dead);
    }
  }
  // The five asks and the tell reached no method: all counted as dead letters.
  EXPECT_EQ(sys.dead_letters(), 6u);
  for (auto& l : j->lines) EXPECT_NE(l, "work 7");
}

TEST(Lifecycle, MessagesToADeadActorAreDeadLetters) {
  test_system sys;
  auto j = std::make_shared<journal>();
  auto h = sys.spawn<hooked>(j);
  h.stop();
  sys.run_until_idle();
  h.tell(&hooked::work, 1);
  auto f = h.ask(&hooked::value);
  EXPECT_TRUE(f.ready());
  EXPECT_THROW(f.get(), troupe::error);
  EXPECT_EQ(sys.dead_letters(), 2u);
}

TEST(Lifecycle, ThisActorStopEndsTheActorAfterTheCurrentMethod) {
  struct quitter {
    int n = 0;
    int quit() {
      troupe::this_actor::stop();
      return ++n;
    }
  };
  test_system sys;
  auto q = sys.spawn<quitter>();
  EXPECT_EQ(q.ask(&quitter::quit).get(), 1);
  auto second = q.ask(&quitter::quit);
  sys.run_until_idle();
  EXPECT_THROW(second.get(), troupe::error);
  EXPECT_FALSE(q.alive());
}

struct watcher {
  std::vector<down_notice> notices;
  template <class T>
  void watch(actor_ref<T> target) {
    troupe::this_actor::monitor(target);
  }
  void on_down(const down_notice& n) { notices.push_back(n); }
  std::vector<down_notice> seen() const { return notices; }
};

struct fragile {
  void crash(std::string why) { throw std::runtime_error(why); }
  int ping() { return 1; }
};

TEST(Monitor, TheWatcherReceivesADownNoticeWithTheReason) {
  test_system sys;
  auto w = sys.spawn<watcher>();
  auto a = sys.spawn<fragile>();
  auto b = sys.spawn<fragile>();
  w.tell(&watcher::watch<fragile>, a);
  w.tell(&watcher::watch<fragile>, b);
  sys.run_until_idle();
  a.stop();
  b.tell(&fragile::crash, std::string("disk on fire"));
  sys.run_until_idle();
  auto seen = w.ask(&watcher::seen).get();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].id, a.id());
  EXPECT_EQ(seen[0].reason, exit_reason::stopped);
  EXPECT_EQ(seen[1].id, b.id());
  EXPECT_EQ(seen[1].reason, exit_reason::failed);
  EXPECT_EQ(seen[1].what, "disk on fire");
}

TEST(Monitor, WatchingAnActorThatIsAlreadyGoneNotifiesAtOnce) {
  test_system sys;
  auto a = sys.spawn<fragile>();
  a.stop();
  sys.run_until_idle();
  auto w = sys.spawn<watcher>();
  w.tell(&watcher::watch<fragile>, a);
  sys.run_until_idle();
  EXPECT_EQ(w.ask(&watcher::seen).get().size(), 1u);
  auto f = sys.monitor(a);
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(f.get().reason, exit_reason::stopped);
}

TEST(Monitor, ADownNoticeForAWatcherThatIsGoneIsNoDeadLetter) {
  test_system sys;
  auto w = sys.spawn<watcher>();
  auto a = sys.spawn<fragile>();
  w.tell(&watcher::watch<fragile>, a);
  sys.run_until_idle();
  w.stop();
  sys.run_until_idle();
  a.stop();
  sys.run_until_idle();
  EXPECT_EQ(sys.dead_letters(), 0u);
  w.tell(&watcher::watch<fragile>, a);  // a message to the dead watcher still is one
  sys.run_until_idle();
  EXPECT_EQ(sys.dead_letters(), 1u);
}

TEST(Monitor, AClassWithoutOnDownCannotMonitor) {
  struct blind {
    void watch(actor_ref<fragile> t) { troupe::this_actor::monitor(t); }
  };
  test_system sys;
  auto a = sys.spawn<fragile>();
  auto b = sys.spawn<blind>();
  EXPECT_THROW(b.ask(&blind::watch, a).get(), std::invalid_argument);
}

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

TEST(Registry, NamedActorsAreFoundByNameAndType) {
  test_system sys;
  auto a = sys.spawn<fragile>();
  sys.register_name("fragile", a);
  auto found = sys.lookup<fragile>("fragile");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->id(), a.id());
  EXPECT_FALSE(sys.lookup<fragile>("nobody").has_value());
  try {
    sys.lookup<watcher>("fragile");
    FAIL() << "expected type_mismatch";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::type_mismatch);
  }
  auto b = sys.spawn<fragile>();
  try {
    sys.register_name("fragile", b);
    FAIL() << "expected name_taken";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::name_taken);
  }
}

TEST(Registry, ANameIsReleasedWhenItsActorDies) {
  test_system sys;
  auto a = sys.spawn<fragile>();
  sys.register_name("svc", a);
  a.stop();
  sys.run_until_idle();
  EXPECT_FALSE(sys.lookup<fragile>("svc").has_value());
  auto b = sys.spawn<fragile>();
  sys.register_name("svc", b);
  EXPECT_EQ(sys.lookup<fragile>("svc")->id(), b.id());
  EXPECT_TRUE(sys.unregister_name("svc"));
  EXPECT_FALSE(sys.lookup<fragile>("svc").has_value());
}

// Whoever hears that an actor is gone finds it gone: not counted live, its name free to take.
TEST(Registry, AMonitorFiresAfterTheActorLeftTheCountAndItsNames) {
  test_system sys;
  auto a = sys.spawn<fragile>();
  auto b = sys.spawn<fragile>();
  sys.register_name("svc", a);
  std::size_t live = 0;
  bool found = true, taken = false;
  sys.monitor(a).then([&](const troupe::down_notice&) {
    live = sys.live_actors();
    found = sys.lookup<fragile>("svc").has_value();
    sys.register_name("svc", b);
    taken = true;
  });
  a.stop();
  sys.run_until_idle();
  EXPECT_EQ(live, 1u);
  EXPECT_FALSE(found);
  ASSERT_TRUE(taken);
  EXPECT_EQ(sys.lookup<fragile>("svc")->id(), b.id());
}

struct ticker {
  int ticks = 0;
  void tick(int by) { ticks += by; }
  int count() const { return ticks; }
};

TEST(Timer, TellAfterDeliversOnceAtItsTime) {
  test_system sys;
  auto t = sys.spawn<ticker>();
  sys.tell_after(50ms, t, &ticker::tick, 1);
  sys.advance(49ms);
  EXPECT_EQ(t.ask(&ticker::count).get(), 0);
  sys.advance(1ms);
  EXPECT_EQ(t.ask(&ticker::count).get(), 1);
  sys.advance(1s);
  EXPECT_EQ(t.ask(&ticker::count).get(), 1);
}

TEST(Timer, TellEveryRepeatsUntilCancelled) {
  test_system sys;
  auto t = sys.spawn<ticker>();
  auto timer = sys.tell_every(10ms, t, &ticker::tick, 2);
  sys.advance(35ms);
  EXPECT_EQ(t.ask(&ticker::count).get(), 6);
  timer.cancel();
  sys.advance(100ms);
  EXPECT_EQ(t.ask(&ticker::count).get(), 6);
  EXPECT_THROW(sys.tell_every(0ms, t, &ticker::tick, 1), std::invalid_argument);
}

TEST(Timer, APeriodicTimerEndsWithItsActor) {
  test_system sys;
  auto t = sys.spawn<ticker>();
  sys.tell_every(10ms, t, &ticker::tick, 1);
  sys.advance(25ms);
  t.stop();
  sys.advance(100ms);
  EXPECT_EQ(sys.dead_letters(), 0u);  // the timer saw the actor gone and stopped sending
}

TEST(Timer, TimersFireOnTheRealClockToo) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<ticker>();
  sys.tell_after(20ms, t, &ticker::tick, 5);
  auto t0 = std::chrono::steady_clock::now();
  while (t.ask(&ticker::count).get() == 0 && std::chrono::steady_clock::now() - t0 < 5s)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(t.ask(&ticker::count).get(), 5);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 19ms);
}

TEST(Stats, CountersShowMessagesDepthAndBusyTime) {
  test_system sys;
  auto t = sys.spawn<ticker>();
  for (int i = 0; i < 10; ++i) t.tell(&ticker::tick, 1);
  auto before = sys.stats(t);
  EXPECT_EQ(before.mailbox_depth, 10);
  sys.run_until_idle();
  auto after = sys.stats(t);
  EXPECT_EQ(after.messages, 10u);
  EXPECT_EQ(after.mailbox_depth, 0);
  EXPECT_GT(after.busy.count(), 0);
  EXPECT_NE(std::string(after.type).find("ticker"), std::string::npos);
  EXPECT_EQ(sys.all_stats().size(), 1u);
}

}  // namespace

namespace {

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

}  // namespace

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

namespace {

struct alignas(64) wide_actor {
  std::array<char, 40> bytes{};
  bool aligned() const { return reinterpret_cast<std::uintptr_t>(this) % 64 == 0; }
  bool arg_aligned(const wide_actor& w) const { return reinterpret_cast<std::uintptr_t>(&w) % 64 == 0; }
};

}  // namespace

TEST(Mailbox, OverAlignedActorsAndArgumentsGetAlignedStorage) {
  troupe::actor_system sys{{.threads = 1}};
  std::vector<actor_ref<wide_actor>> all;
  for (int i = 0; i < 64; ++i) all.push_back(sys.spawn<wide_actor>());
  for (auto& a : all) {
    EXPECT_TRUE(a.ask(&wide_actor::aligned).get());
    EXPECT_TRUE(a.ask(&wide_actor::arg_aligned, wide_actor{}).get());
  }
}

namespace {

struct slow_target {
  void nothing() {}
};

// Suspended in a coroutine when its target stops (so the notice is held), then failed by a
// then() callback without error handler (continuations run while suspended), and restarted.
struct suspended_watcher {
  int downs = 0;
  void watch(actor_ref<slow_target> t) { troupe::this_actor::monitor(t); }
  void arm(troupe::future<int>* trip) { std::move(*trip).then([](int) {}); }
  troupe::task<int> wait(troupe::future<int>* gate, std::atomic<bool>* entered) {
    *entered = true;
    co_return co_await std::move(*gate);
  }
  void on_down(const down_notice&) { ++downs; }
  int seen() const { return downs; }
};

}  // namespace

TEST(Monitor, ANoticeHeldWhileSuspendedReachesTheRestartedActor) {
  troupe::actor_system sys{{.threads = 2}};
  auto target = sys.spawn<slow_target>();
  spawn_options o;
  o.restart.max_restarts = 2;
  auto w = sys.spawn<suspended_watcher>(o);
  troupe::promise<int> gate, trip;
  auto gate_f = gate.get_future();
  auto trip_f = trip.get_future();
  std::atomic<bool> entered{false};
  w.tell(&suspended_watcher::watch, target);
  w.tell(&suspended_watcher::arm, &trip_f);
  auto pending = w.ask(&suspended_watcher::wait, &gate_f, &entered);
  while (!entered) std::this_thread::sleep_for(1ms);
  target.stop();
  std::this_thread::sleep_for(50ms);  // the notice arrives and is held
  trip.set_exception(std::make_exception_ptr(std::runtime_error("trip")));
  EXPECT_THROW(pending.get(), troupe::error);  // the coroutine went with the old object
  int seen = 0;
  for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
    seen = w.ask(&suspended_watcher::seen).get();
    if (seen != 0) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(seen, 1);
  EXPECT_TRUE(w.alive());
}

TEST(Monitor, WatchersThatAreGoneAreForgottenAsTheListGrows) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<slow_target>();
  for (int i = 0; i < 2000; ++i) {
    auto w = sys.spawn<watcher>();
    w.tell(&watcher::watch<slow_target>, t);
    (void)sys.monitor(t);  // a monitor whose future is dropped at once
    w.stop();
    std::move(sys.monitor(w)).get();
  }
  auto c = t.cell();
  std::size_t listed = 0;
  {
    troupe::detail::flag_guard g(troupe::detail::system_access::lock(*c));
    listed = troupe::detail::system_access::extras(*c).watchers.size();
  }
  EXPECT_LT(listed, 64u) << "4000 watchers came and went";
  auto last = sys.spawn<watcher>();
  last.tell(&watcher::watch<slow_target>, t);
  std::this_thread::sleep_for(20ms);
  auto f = sys.monitor(t);
  t.stop();
  EXPECT_EQ(std::move(f).get().reason, exit_reason::stopped);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(last.ask(&watcher::seen).get().size(), 1u);
}

// A monitor consumed by then() gives its future's reference up: pruning took it for a dropped
// one once the target had 16 watchers, and its callback got system_shutdown while the target
// lived (and never the down notice).
TEST(Monitor, AMonitorConsumedByThenIsKeptWhenTheListIsPruned) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<slow_target>();
  std::atomic<int> notices{0}, errors{0};
  for (int i = 0; i < 40; ++i)
    sys.monitor(t).then([&](const troupe::down_notice&) { ++notices; }, [&](std::exception_ptr) { ++errors; });
  (void)sys.monitor(t);  // dropped at once: may be pruned
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(errors.load(), 0);
  t.stop();
  for (int i = 0; i < 200 && notices.load() < 40; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(notices.load(), 40);
  EXPECT_EQ(errors.load(), 0);
}

TEST(Lifecycle, StoppingTwiceLosesNothingAndCountsNoDeadLetter) {
  test_system sys;
  auto a = sys.spawn<fragile>();
  a.stop();
  a.stop();
  sys.run_until_idle();
  EXPECT_EQ(sys.dead_letters(), 0u);
  a.tell(&fragile::ping);  // a real message to the dead actor still counts
  sys.run_until_idle();
  EXPECT_EQ(sys.dead_letters(), 1u);
}

namespace {

struct other_system_receiver {
  void take(int) { std::this_thread::sleep_for(1ms); }
};

struct other_system_sender {
  std::set<std::thread::id> threads;
  void flood(actor_ref<other_system_receiver> r, int n) {
    threads.insert(std::this_thread::get_id());
    for (int i = 0; i < n; ++i) r.tell(&other_system_receiver::take, i);
  }
  std::set<std::thread::id> ran_on() const { return threads; }
};

struct thread_probe {
  std::thread::id where() const { return std::this_thread::get_id(); }
};

}  // namespace

TEST(Mailbox, AnActorSendingToAFullMailboxOfAnotherSystemStaysOnItsOwnWorkers) {
  troupe::actor_system x{{.threads = 1}};
  troupe::actor_system y{{.threads = 1}};
  auto probe = x.spawn<thread_probe>();
  const auto x_worker = probe.ask(&thread_probe::where).get();
  auto r = y.spawn<other_system_receiver>(spawn_options{.mailbox_capacity = 4});
  auto s = x.spawn<other_system_sender>();
  for (int i = 0; i < 5; ++i) s.tell(&other_system_sender::flood, r, 8);
  auto threads = s.ask(&other_system_sender::ran_on).get();
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(*threads.begin(), x_worker);
}

TEST(Supervision, ARefusedPolicyLeavesNothingBehind) {
  // (Under AddressSanitizer the leak check sees a spawn that took a reference and threw.)
  troupe::actor_system sys{{.threads = 1}};
  spawn_options o;
  o.restart.max_restarts = -2;
  EXPECT_THROW(sys.spawn<fragile>(o), std::invalid_argument);
}

TEST(Timer, TellAfterMovesAMoveOnlyArgumentIntoItsMessage) {
  struct keeper {
    int got = 0;
    void take(std::unique_ptr<int> p) { got = *p; }
    int value() const { return got; }
  };
  test_system sys;
  auto k = sys.spawn<keeper>();
  sys.tell_after(10ms, k, &keeper::take, std::make_unique<int>(42));
  sys.advance(10ms);
  EXPECT_EQ(k.ask(&keeper::value).get(), 42);
}

TEST(System, RefusesMoreWorkerThreadsThanItsLimit) {
  EXPECT_THROW(troupe::actor_system({.threads = troupe::system_config::max_threads + 1}), std::invalid_argument);
}

// A program whose actors decide when it ends: one of them stops them all, the main thread waits.
struct ender {
  std::shared_ptr<std::atomic<int>> stops;
  explicit ender(std::shared_ptr<std::atomic<int>> s) : stops(std::move(s)) {}
  void on_stop() { stops->fetch_add(1); }
  void end_all() { troupe::this_actor::system().stop_all_actors(); }
  void end_self() { troupe::this_actor::stop(); }
  void slow(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  int value() const { return 7; }
  bool await_inside() { return troupe::this_actor::system().await_all_actors_done(1ms); }
};

TEST(System, AnActorEndsTheProgramAndTheMainThreadWaitsForIt) {
  troupe::actor_system sys{{.threads = 2}};
  auto stops = std::make_shared<std::atomic<int>>(0);
  std::vector<actor_ref<ender>> all;
  for (int i = 0; i < 10; ++i) all.push_back(sys.spawn<ender>(stops));
  EXPECT_FALSE(sys.await_all_actors_done(20ms));
  // Waiting from inside an actor would wait for itself.
  EXPECT_THROW(all[0].ask(&ender::await_inside).get(), std::logic_error);
  all[1].tell(&ender::slow, 50);
  auto queued = all[1].ask(&ender::value);  // behind the slow one: fails when the stop comes
  all[0].tell(&ender::end_all);
  sys.await_all_actors_done();
  EXPECT_EQ(sys.live_actors(), 0u);
  EXPECT_EQ(stops->load(), 10);
  try {
    queued.get();
    ADD_FAILURE() << "an ask queued behind the stop was answered";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::actor_dead);
  }
  // The system is still up, and waits again for actors that stop themselves.
  auto a = sys.spawn<ender>(stops);
  auto b = sys.spawn<ender>(stops);
  EXPECT_EQ(a.ask(&ender::value).get(), 7);
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    a.tell(&ender::end_self);
    b.tell(&ender::end_self);
  });
  EXPECT_TRUE(sys.await_all_actors_done(5000ms));
  late.join();
  EXPECT_EQ(stops->load(), 12);
}

// Actors that keep spawning cannot outlive stop_all_actors(): spawns are refused until the last
// actor is gone, and work again then. A wait too long for the clock has no limit.
struct breeder {
  void breed() {
    troupe::this_actor::system().spawn<breeder>().tell(&breeder::breed);
    troupe::this_actor::self<breeder>().tell(&breeder::breed);
  }
};

TEST(System, StopAllActorsOutrunsActorsThatKeepSpawning) {
  troupe::actor_system sys{{.threads = 2}};
  sys.spawn<breeder>().tell(&breeder::breed);
  while (sys.live_actors() < 1000) std::this_thread::yield();
  sys.stop_all_actors();
  EXPECT_TRUE(sys.await_all_actors_done(10'000ms)) << sys.live_actors() << " actors left";
  auto stops = std::make_shared<std::atomic<int>>(0);
  auto a = sys.spawn<ender>(stops);
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    a.tell(&ender::end_self);
  });
  EXPECT_TRUE(sys.await_all_actors_done(std::chrono::milliseconds::max()));
  late.join();
  EXPECT_EQ(stops->load(), 1);
}

TEST(System, ATestSystemRunsUntilItsActorsAreDoneOrSaysWhyNot) {
  test_system sys;
  auto stops = std::make_shared<std::atomic<int>>(0);
  auto a = sys.spawn<ender>(stops);
  auto b = sys.spawn<ender>(stops);
  EXPECT_FALSE(sys.await_all_actors_done(1ms));
  EXPECT_THROW(sys.await_all_actors_done(), std::logic_error);
  a.tell(&ender::end_self);
  b.tell(&ender::end_all);
  sys.await_all_actors_done();
  EXPECT_EQ(stops->load(), 2);
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

// ---- monitors across a restart, late monitors, far timers --------------------------------------

namespace {

struct quiet_target {
  void noop() {}
};

/// Monitors its target from its first incarnation only; counts the notices any incarnation hears.
struct restarting_watcher {
  troupe::actor_ref<quiet_target> target;
  std::shared_ptr<std::atomic<int>> starts, downs;
  void on_start() {
    if (++*starts == 1) troupe::this_actor::monitor(target);
  }
  void on_down(const troupe::down_notice&) { ++*downs; }
  void boom() { throw std::runtime_error("boom"); }
  int ping() { return 1; }
};

struct failing_once {
  void boom() { throw std::runtime_error("disk on fire"); }
};

}  // namespace

// A notice that comes while the watcher waits to restart reaches the next incarnation.
TEST(Monitor, ANoticeDuringARestartReachesTheNextIncarnation) {
  test_system sys;
  auto t = sys.spawn<quiet_target>();
  auto starts = std::make_shared<std::atomic<int>>(0), downs = std::make_shared<std::atomic<int>>(0);
  auto w = sys.spawn<restarting_watcher>(
      troupe::spawn_options{.restart = {.max_restarts = 3, .backoff = std::chrono::milliseconds(100)}},
      restarting_watcher{t, starts, downs});
  sys.run_until_idle();
  w.tell(&restarting_watcher::boom);
  sys.run_until_idle();  // waiting out the backoff
  t.stop();
  sys.run_until_idle();
  sys.advance(std::chrono::milliseconds(200));
  EXPECT_EQ(w.ask(&restarting_watcher::ping).get(), 1);
  EXPECT_EQ(starts->load(), 2);
  EXPECT_EQ(downs->load(), 1);
}

// A monitor set after an actor failed still hears why, whether or not anything watched it before.
TEST(Monitor, AMonitorSetAfterAFailureHearsItsMessage) {
  test_system sys;
  auto a = sys.spawn<failing_once>();
  a.tell(&failing_once::boom);
  sys.run_until_idle();
  auto late = sys.monitor(a).get();
  EXPECT_EQ(late.reason, exit_reason::failed);
  EXPECT_EQ(late.what, "disk on fire");
}

// A delay too long for the clock is never, not at once (timers and ask timeouts alike).
TEST(Timer, ADelayTooLongForTheClockNeverFires) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<ticker>();
  sys.tell_after(std::chrono::nanoseconds::max(), t, &ticker::tick, 1);
  auto slow = t.ask(&ticker::count).timeout(std::chrono::nanoseconds::max());
  EXPECT_EQ(slow.get(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(t.ask(&ticker::count).get(), 0);
  test_system virt;
  auto v = virt.spawn<ticker>();
  virt.tell_after(std::chrono::nanoseconds::max(), v, &ticker::tick, 1);
  virt.advance(std::chrono::hours(24 * 365));
  EXPECT_EQ(v.ask(&ticker::count).get(), 0);
}
