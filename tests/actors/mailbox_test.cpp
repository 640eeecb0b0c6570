#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace {

using troupe::actor_ref;
using troupe::errc;
using troupe::overflow_policy;
using troupe::spawn_options;
using troupe::test_system;

struct sink {
  std::vector<int> got;
  void take(int v) { got.push_back(v); }
  std::size_t count() const { return got.size(); }
  bool in_order_per_sender(int senders) const {
    std::vector<int> last(senders, -1);
    for (int v : got) {
      int s = v / 1'000'000, i = v % 1'000'000;
      if (i != last[s] + 1) return false;
      last[s] = i;
    }
    return true;
  }
};

struct producer {
  actor_ref<sink> to;
  int id;
  int next = 0;
  int total;
  int batch;
  void go() {
    for (int k = 0; k < batch && next < total; ++k) to.tell(&sink::take, id * 1'000'000 + next++);
    if (next < total) troupe::this_actor::self<producer>().tell(&producer::go);
  }
};

// Waits up to 10 s for actor `r` to have handled `n` messages; true once it has.
template <class T>
bool handled(troupe::actor_system& sys, const actor_ref<T>& r, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sys.stats(r).messages < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return sys.stats(r).messages >= n;
}

// A bounded receiver whose method awaits the actor that filled its mailbox: the sender was
// paused until the receiver drained, the receiver waited for the paused sender's answer, and
// neither ran again. An actor is not paused on the mailbox of one that awaits its reply.
struct asks_back;
struct answers {
  actor_ref<asks_back> to;
  int next = 0;
  void connect(actor_ref<asks_back> r) { to = std::move(r); }
  int value() { return ++next; }
  void flood(int n);
};
struct asks_back {
  actor_ref<answers> from;
  int sum = 0, done = 0;
  troupe::task<void> work() {
    sum += co_await from.ask(&answers::value);
    ++done;
  }
  int finished() const { return done; }
  int total() const { return sum; }
};
void answers::flood(int n) {
  for (int i = 0; i < n; ++i) to.tell(&asks_back::work);
}

TEST(Mailbox, AReceiverThatAwaitsItsPausedSenderDoesNotStallForGood) {
  for (int round = 0; round < 20; ++round) {
    troupe::actor_system sys{{.threads = 2}};
    auto a = sys.spawn<answers>();
    auto b = sys.spawn<asks_back>(spawn_options{.mailbox_capacity = 4}, a);
    a.ask(&answers::connect, b).get();
    a.tell(&answers::flood, 40);
    ASSERT_TRUE(handled(sys, b, 40)) << "the receiver stalled in round " << round;
    EXPECT_EQ(b.ask(&asks_back::finished).get(), 40);
    EXPECT_EQ(b.ask(&asks_back::total).get(), 40 * 41 / 2);
  }
}

// The same loop through a third actor: the bounded receiver awaits a relay, the relay awaits
// the sender, and the sender is paused on the receiver's mailbox (or the sender, paused on
// the relay's, is itself paused on the receiver's). The pause that closes the loop is not
// taken, or is released when the await closes it.
struct relay_receiver;
struct relay_sender {
  actor_ref<relay_receiver> to;
  int next = 0;
  void connect(actor_ref<relay_receiver> r) { to = std::move(r); }
  int value() { return ++next; }
  void flood(int n);
};
struct relay {
  actor_ref<relay_sender> from;
  troupe::task<int> value() { co_return co_await from.ask(&relay_sender::value); }
};
struct relay_receiver {
  actor_ref<relay> via;
  int sum = 0, done = 0;
  troupe::task<void> work() {
    sum += co_await via.ask(&relay::value);
    ++done;
  }
  int finished() const { return done; }
  int total() const { return sum; }
};
void relay_sender::flood(int n) {
  for (int i = 0; i < n; ++i) to.tell(&relay_receiver::work);
}

class MailboxLoop : public ::testing::TestWithParam<std::size_t> {};

TEST_P(MailboxLoop, AReceiverThatAwaitsItsPausedSenderThroughARelayDoesNotStallForGood) {
  for (int round = 0; round < 20; ++round) {
    troupe::actor_system sys{{.threads = 2}};
    auto a = sys.spawn<relay_sender>();
    auto m = sys.spawn<relay>(spawn_options{.mailbox_capacity = GetParam()}, a);
    auto b = sys.spawn<relay_receiver>(spawn_options{.mailbox_capacity = 4}, m);
    a.ask(&relay_sender::connect, b).get();
    a.tell(&relay_sender::flood, 40);
    ASSERT_TRUE(handled(sys, b, 40)) << "the receiver stalled in round " << round;
    EXPECT_EQ(b.ask(&relay_receiver::finished).get(), 40);
    EXPECT_EQ(b.ask(&relay_receiver::total).get(), 40 * 41 / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(RelayMailbox, MailboxLoop, ::testing::Values(std::size_t{0}, std::size_t{4}),
                         [](const auto& info) { return info.param == 0 ? "Unbounded" : "Bounded"; });

// Two pauses and an await: a floods b (bounded), c floods a (bounded), and b's method awaits
// c. c is paused on a's mailbox, a on b's, and b waits for c's reply.
struct chain_b;
struct chain_a {
  actor_ref<chain_b> to;
  int got = 0;
  void connect(actor_ref<chain_b> r) { to = std::move(r); }
  void take(int) {
    ++got;
    if (got == 1) flood_b();
  }
  void flood_b();
};
struct chain_c {
  actor_ref<chain_a> to;
  int next = 0;
  int value() { return ++next; }
  void flood(int n) {
    for (int i = 0; i < n; ++i) to.tell(&chain_a::take, i);
  }
};
struct chain_b {
  actor_ref<chain_c> from;
  int sum = 0, done = 0;
  troupe::task<void> work() {
    sum += co_await from.ask(&chain_c::value);
    ++done;
  }
  int finished() const { return done; }
};
void chain_a::flood_b() {
  for (int i = 0; i < 40; ++i) to.tell(&chain_b::work);
}

TEST(Mailbox, AnAwaitThroughTwoPausedActorsDoesNotStallForGood) {
  for (int round = 0; round < 20; ++round) {
    troupe::actor_system sys{{.threads = 2}};
    auto a = sys.spawn<chain_a>(spawn_options{.mailbox_capacity = 4});
    auto c = sys.spawn<chain_c>(a);
    auto b = sys.spawn<chain_b>(spawn_options{.mailbox_capacity = 4}, c);
    a.ask(&chain_a::connect, b).get();
    c.tell(&chain_c::flood, 40);
    ASSERT_TRUE(handled(sys, b, 40)) << "b stalled in round " << round;
    ASSERT_TRUE(handled(sys, a, 41)) << "a stalled in round " << round;
    EXPECT_EQ(b.ask(&chain_b::finished).get(), 40);
  }
}

TEST(Mailbox, AFullBoundedMailboxPausesTheSendingActorInsteadOfGrowing) {
  test_system sys;
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 100});
  auto p = sys.spawn<producer>(s, 0, 0, 10'000, 50);
  p.tell(&producer::go);
  std::int64_t peak = 0;
  while (sys.run_one()) peak = std::max(peak, sys.stats(s).mailbox_depth);
  // Capacity plus what one method call sends before the pause takes effect.
  EXPECT_LE(peak, 100 + 50);
  EXPECT_EQ(s.ask(&sink::count).get(), 10'000u);
  EXPECT_TRUE(s.ask(&sink::in_order_per_sender, 1).get());
  EXPECT_EQ(sys.dead_letters(), 0u);
}

TEST(Mailbox, ARejectingMailboxRefusesAndCountsWhatItRefuses) {
  test_system sys;
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 3, .overflow = overflow_policy::reject});
  for (int i = 0; i < 5; ++i) s.tell(&sink::take, i);
  auto refused = s.ask(&sink::count);
  EXPECT_TRUE(refused.ready());
  try {
    refused.get();
    FAIL() << "expected mailbox_full";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), errc::mailbox_full);
  }
  EXPECT_EQ(sys.dead_letters(), 3u);  // two tells and the ask
  sys.run_until_idle();
  EXPECT_EQ(s.ask(&sink::count).get(), 3u);
}

TEST(Mailbox, SystemMessagesOvertakeNormalOnesAndAreNeverRefused) {
  test_system sys;
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 2, .overflow = overflow_policy::reject});
  s.tell(&sink::take, 1);
  s.tell(&sink::take, 2);
  s.stop();  // the mailbox is full, the stop still gets in, and first
  sys.run_until_idle();
  EXPECT_FALSE(s.alive());
  EXPECT_EQ(sys.dead_letters(), 2u);
}

TEST(Mailbox, AThreadOutsideActorsWaitsForRoomAndLosesNothing) {
  troupe::actor_system sys{{.threads = 2}};
  struct slow_sink {
    long long sum = 0;
    long long n = 0;
    void take(int v) {
      sum += v;
      ++n;
      if (n % 64 == 0) std::this_thread::yield();
    }
    std::pair<long long, long long> result() const { return {n, sum}; }
  };
  auto s = sys.spawn<slow_sink>(spawn_options{.mailbox_capacity = 16});
  std::atomic<std::int64_t> peak{0};
  std::atomic<bool> sending{true};
  std::thread sampler([&] {
    while (sending) {
      auto d = sys.stats(s).mailbox_depth;
      if (d > peak) peak = d;
    }
  });
  const int n = 20'000;
  for (int i = 1; i <= n; ++i) s.tell(&slow_sink::take, i);
  sending = false;
  sampler.join();
  auto r = s.ask(&slow_sink::result).get();
  EXPECT_EQ(r.first, n);
  EXPECT_EQ(r.second, static_cast<long long>(n) * (n + 1) / 2);
  EXPECT_LE(peak.load(), 16 + 1);  // a blocked sender re-checks after each wake
}

// A thread waiting for room gets in once the receiver has taken enough messages, not once it
// has finished its slice (up to `throughput` slow messages).
TEST(Mailbox, AWaitingThreadGetsInAsSoonAsTheMailboxHasDrainedToHalf) {
  struct slow {
    std::atomic<int>* handled;
    void take() {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      handled->fetch_add(1);
    }
  };
  std::atomic<int> handled{0};
  troupe::actor_system sys{{.threads = 1}};
  const int capacity = 40;
  auto s = sys.spawn<slow>(spawn_options{.mailbox_capacity = capacity}, &handled);
  for (int i = 0; i < capacity; ++i) s.tell(&slow::take);
  s.tell(&slow::take);  // waits, if the mailbox is still full, until it has drained to half
  EXPECT_LE(handled.load(), capacity / 2 + 2);
  while (handled.load() < capacity + 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(Mailbox, BoundedFanInOnThreadsKeepsEveryMessageInOrderPerSender) {
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 64});
  const int senders = 4, each = 20'000;
  std::vector<actor_ref<producer>> ps;
  for (int i = 0; i < senders; ++i) ps.push_back(sys.spawn<producer>(s, i, 0, each, 100));
  for (auto& p : ps) p.tell(&producer::go);
  for (int spin = 0; spin < 20'000 && s.ask(&sink::count).get() < senders * each; ++spin)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(s.ask(&sink::count).get(), static_cast<std::size_t>(senders * each));
  EXPECT_TRUE(s.ask(&sink::in_order_per_sender, senders).get());
  EXPECT_EQ(sys.dead_letters(), 0u);
}

struct peer {
  actor_ref<peer> other;
  int handled = 0;
  void set(actor_ref<peer> o) { other = o; }
  void noop() { ++handled; }
  void spray(int n) {
    for (int i = 0; i < n; ++i) other.tell(&peer::noop);
  }
  int count() const { return handled; }
};

TEST(Mailbox, TwoActorsFillingEachOthersMailboxesNeverWaitForEachOtherForGood) {
  // Each would park until the other drains: a cycle. One of them runs on instead.
  troupe::actor_system sys{{.threads = 2}};
  auto a = sys.spawn<peer>(spawn_options{.mailbox_capacity = 4});
  auto b = sys.spawn<peer>(spawn_options{.mailbox_capacity = 4});
  a.ask(&peer::set, b).get();
  b.ask(&peer::set, a).get();
  a.tell(&peer::spray, 100);
  b.tell(&peer::spray, 100);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto count = [](actor_ref<peer>& p) { return p.ask(&peer::count).timeout(std::chrono::seconds(20)).get(); };
  while ((count(a) < 100 || count(b) < 100) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(count(a), 100);
  EXPECT_EQ(count(b), 100);
  EXPECT_EQ(sys.dead_letters(), 0u);
  sys.shutdown();
}

struct held_sink {
  troupe::promise<void> gate;
  troupe::task<void> hold() { co_await gate.get_future(); }  // takes no other message meanwhile
  void noop() {}
};
struct filler {
  actor_ref<held_sink> to;
  void fill(int n) {
    for (int i = 0; i < n; ++i) to.tell(&held_sink::noop);
  }
};

TEST(Mailbox, AStopOvertakesASenderParkedOnAFullMailbox) {
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 2});
  s.tell(&held_sink::hold);
  auto f = sys.spawn<filler>(s);
  f.ask(&filler::fill, 10).get();  // f is parked after this call until s drains, which it never does
  auto down = sys.monitor(f);
  f.stop();
  EXPECT_EQ(std::move(down).timeout(std::chrono::seconds(10)).get().reason, troupe::exit_reason::stopped);
  EXPECT_TRUE(s.alive());
}

struct ticked {
  int ticks = 0;
  void tick() { ++ticks; }
};

TEST(Mailbox, ATimerNeverWaitsForRoomSoTimeoutsStillFire) {
  // A tick to a full mailbox from the timer thread gets in past the capacity instead of
  // blocking the thread that also fires every timeout.
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 2});
  s.tell(&held_sink::hold);
  auto f = sys.spawn<filler>(s);
  f.tell(&filler::fill, 4);
  auto t = sys.tell_every(std::chrono::milliseconds(1), s, &held_sink::noop);
  auto p = sys.make_promise<int>();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(p.get_future().timeout(std::chrono::milliseconds(100)).get(), troupe::error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  t.cancel();
  sys.shutdown();
}

TEST(Mailbox, ATellToAFullMailboxInATestSystemDrainsItOrSaysItWouldWaitForGood) {
  test_system sys;
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 1});
  for (int i = 0; i < 5; ++i) s.tell(&sink::take, i);  // runs the sink to make room
  sys.run_until_idle();
  EXPECT_EQ(s.ask(&sink::count).get(), 5u);
  auto h = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 1});
  h.tell(&held_sink::hold);
  sys.run_until_idle();
  h.tell(&held_sink::noop);
  try {
    h.tell(&held_sink::noop);
    ADD_FAILURE() << "a tell waited for room that never comes";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code(), errc::would_deadlock);
  }
}

struct answerer {
  int get(int v) { return v; }
};
struct coroutine_filler {
  actor_ref<answerer> src;
  actor_ref<held_sink> to;
  bool reply_first = false;  // wait until each reply is there before awaiting it
  troupe::task<void> run(int n) {
    for (int i = 0; i < n; ++i) {
      auto f = src.ask(&answerer::get, i);
      while (reply_first && !f.ready()) std::this_thread::yield();
      (void)co_await std::move(f);
      to.tell(&held_sink::noop);
    }
  }
};

TEST(Mailbox, RepliesDoNotUnpauseASenderOnlyAStopDoes) {
  // A coroutine paused by a full mailbox stays paused while replies come in: each would
  // otherwise let one more message into the full mailbox.
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 4});
  s.tell(&held_sink::hold);
  auto src = sys.spawn<answerer>();
  auto p = sys.spawn<coroutine_filler>(src, s);
  p.tell(&coroutine_filler::run, 100);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(sys.stats(s).mailbox_depth, 4 + 1);  // one tell past the capacity, then the pause
  auto down = sys.monitor(p);
  p.stop();
  EXPECT_EQ(std::move(down).timeout(std::chrono::seconds(10)).get().reason, troupe::exit_reason::stopped);
}

TEST(Mailbox, AnAwaitWhosePauseIsDueSuspendsEvenWhenItsReplyIsThere) {
  // The pause after a tell to a full mailbox takes effect at the sender's next await, whether
  // or not the reply has come by then: how fast the answerer is does not change the bound.
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 4});
  s.tell(&held_sink::hold);
  auto src = sys.spawn<answerer>();
  const auto t0 = std::chrono::steady_clock::now();
  while (sys.stats(s).mailbox_depth != 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // hold is taken: the noops count alone
  auto p = sys.spawn<coroutine_filler>(src, s, true);  // the reply is always there before the await
  p.tell(&coroutine_filler::run, 100);
  while (sys.stats(s).mailbox_depth < 4 + 1 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(sys.stats(s).mailbox_depth, 4 + 1);
  auto down = sys.monitor(p);
  p.stop();
  EXPECT_EQ(std::move(down).timeout(std::chrono::seconds(10)).get().reason, troupe::exit_reason::stopped);
}

TEST(Mailbox, ATestSystemTimerGetsPastACapacityAsTheTimerThreadDoes) {
  test_system sys;
  auto h = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 1});
  h.tell(&held_sink::hold);
  sys.run_until_idle();
  h.tell(&held_sink::noop);
  sys.tell_after(std::chrono::milliseconds(0), h, &held_sink::noop);
  auto t = sys.tell_every(std::chrono::milliseconds(10), h, &held_sink::noop);
  EXPECT_NO_THROW(sys.run_until_idle());
  EXPECT_NO_THROW(sys.advance(std::chrono::milliseconds(35)));
  EXPECT_EQ(sys.stats(h).mailbox_depth, 1 + 1 + 3);
  t.cancel();
}

}  // namespace

namespace {

struct gated {
  int taken = 0;
  void block(std::shared_ptr<std::atomic<bool>> entered, std::shared_ptr<std::atomic<bool>> open) {
    entered->store(true);
    while (!open->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void take() { ++taken; }
  int count() const { return taken; }
};
struct try_sender {
  actor_ref<gated> to;
  std::vector<int> send(int n) {  // {went in, refused}
    std::vector<int> out{0, 0};
    for (int i = 0; i < n; ++i) ++out[to.try_tell(std::chrono::seconds(10), &gated::take) ? 0 : 1];
    return out;
  }
};

TEST(Mailbox, TryTellWaitsForRoomAtMostItsTimeoutAndNeverPausesAnActor) {
  using namespace std::chrono_literals;
  troupe::actor_system sys{{.threads = 2}};
  auto entered = std::make_shared<std::atomic<bool>>(false), open = std::make_shared<std::atomic<bool>>(false);
  auto g = sys.spawn<gated>(spawn_options{.mailbox_capacity = 4});
  g.tell(&gated::block, entered, open);
  for (int i = 0; i < 1000 && !entered->load(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(entered->load());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(g.try_tell(0ms, &gated::take));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(g.try_tell(30ms, &gated::take));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  EXPECT_FALSE(g.try_tell(0ms, &gated::take));
  // An actor gets false at once, whatever its timeout, and is not paused (it answers again).
  auto s = sys.spawn<try_sender>(g);
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s.ask(&try_sender::send, 3).get(), (std::vector<int>{0, 3}));
  EXPECT_EQ(s.ask(&try_sender::send, 0).get(), (std::vector<int>{0, 0}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Room that comes while a thread waits lets its message in.
  std::thread opener([&] {
    std::this_thread::sleep_for(30ms);
    open->store(true);
  });
  EXPECT_TRUE(g.try_tell(10s, &gated::take));
  opener.join();
  EXPECT_TRUE(handled(sys, g, 6));  // block, 4 + 1 takes
  EXPECT_EQ(g.ask(&gated::count).get(), 5);
  EXPECT_TRUE(g.try_tell(std::chrono::nanoseconds::max(), &gated::take));
  EXPECT_EQ(g.ask(&gated::count).get(), 6);
  // Refused messages are no dead letters: the sender knows. Nor is one to a dead actor.
  EXPECT_EQ(sys.dead_letters(), 0u);
  auto down = sys.monitor(g);
  g.stop();
  std::move(down).timeout(10s).get();
  EXPECT_FALSE(g.try_tell(1s, &gated::take));
  EXPECT_EQ(sys.dead_letters(), 0u);
}

// Threads whose waits time out while the receiver drains (a release may take a waiter off
// the list just as its time is up): every message that went in is handled, no other.
TEST(Mailbox, TryTellsThatTimeOutWhileTheMailboxDrainsLoseNothing) {
  troupe::actor_system sys{{.threads = 2}};
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 8});
  std::atomic<std::uint64_t> in{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i)
        if (s.try_tell(std::chrono::microseconds(i % 50), &sink::take, t * 1'000'000 + i)) in.fetch_add(1);
    });
  for (auto& t : senders) t.join();
  EXPECT_TRUE(handled(sys, s, in.load()));
  EXPECT_EQ(s.ask(&sink::count).get(), in.load());
  EXPECT_GT(in.load(), 0u);
  EXPECT_EQ(sys.dead_letters(), 0u);
}

TEST(Mailbox, TryTellToARejectingOrTestSystemMailbox) {
  using namespace std::chrono_literals;
  {
    troupe::actor_system sys{{.threads = 2}};
    auto entered = std::make_shared<std::atomic<bool>>(false), open = std::make_shared<std::atomic<bool>>(false);
    auto g = sys.spawn<gated>(spawn_options{.mailbox_capacity = 1, .overflow = overflow_policy::reject});
    g.tell(&gated::block, entered, open);
    for (int i = 0; i < 1000 && !entered->load(); ++i) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(g.try_tell(1s, &gated::take));
    EXPECT_FALSE(g.try_tell(1s, &gated::take));
    EXPECT_EQ(sys.dead_letters(), 0u);
    open->store(true);
    EXPECT_TRUE(handled(sys, g, 2));
    EXPECT_EQ(g.ask(&gated::count).get(), 1);
  }
  // A test_system runs its actors to make room, and says false where nothing can.
  test_system sys;
  auto s = sys.spawn<sink>(spawn_options{.mailbox_capacity = 1});
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.try_tell(0ms, &sink::take, i));
  sys.run_until_idle();
  EXPECT_EQ(s.ask(&sink::count).get(), 5u);
  auto h = sys.spawn<held_sink>(spawn_options{.mailbox_capacity = 1});
  h.tell(&held_sink::hold);
  sys.run_until_idle();
  EXPECT_TRUE(h.try_tell(1s, &held_sink::noop));
  EXPECT_FALSE(h.try_tell(1s, &held_sink::noop));
}

}  // namespace

namespace {

using namespace std::chrono_literals;

struct alignas(64) wide_actor {
  std::array<char, 40> bytes{};
  bool aligned() const { return reinterpret_cast<std::uintptr_t>(this) % 64 == 0; }
  bool arg_aligned(const wide_actor& w) const { return reinterpret_cast<std::uintptr_t>(&w) % 64 == 0; }
};

TEST(Mailbox, OverAlignedActorsAndArgumentsGetAlignedStorage) {
  troupe::actor_system sys{{.threads = 1}};
  std::vector<actor_ref<wide_actor>> all;
  for (int i = 0; i < 64; ++i) all.push_back(sys.spawn<wide_actor>());
  for (auto& a : all) {
    EXPECT_TRUE(a.ask(&wide_actor::aligned).get());
    EXPECT_TRUE(a.ask(&wide_actor::arg_aligned, wide_actor{}).get());
  }
}

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

}  // namespace

// Messages made and freed after a thread's pool cache is gone (a thread_local destructor that
// runs later, a static actor_system stopping its actors at exit) come from plain new and delete.
TEST(MessagePool, AllocatesAfterItsThreadsCacheIsGone) {
  struct late {
    bool ok = false;
    ~late() {
      void* a = troupe::detail::pool_allocate(64);
      void* b = troupe::detail::pool_allocate(64);
      std::memset(a, 1, 64);
      std::memset(b, 2, 64);
      troupe::detail::pool_free(a, 64);
      troupe::detail::pool_free(b, 64);
      troupe::detail::pool_free(troupe::detail::pool_allocate(48), 48);
    }
  };
  std::thread([] {
    thread_local late l;  // made before the cache, so destroyed after it
    l.ok = true;
    for (int i = 0; i < 200; ++i) troupe::detail::pool_free(troupe::detail::pool_allocate(64), 64);
  }).join();
  SUCCEED();
}
