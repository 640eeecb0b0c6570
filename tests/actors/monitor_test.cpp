// Monitors: a watcher hears of an actor's end with its reason, also when it watches after the end
// or is itself restarting; watchers that are gone leave the watched actor's list.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>

#include "lifecycle_support.hpp"
#include "system.hpp"  // the watcher list, to see that the gone ones leave it

namespace {

using namespace std::chrono_literals;
using namespace lifecycle_support;
using troupe::actor_ref;
using troupe::down_notice;
using troupe::errc;
using troupe::exit_reason;
using troupe::spawn_options;
using troupe::test_system;

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

}  // namespace
