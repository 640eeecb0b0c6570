// Timers: tell_after and tell_every deliver at their time on the test clock and the real one, stop
// when cancelled or with their actor, and a delay too long for the clock never fires.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

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

}  // namespace
