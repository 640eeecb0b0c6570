// Stress tests on the real scheduler. Sizes shrink with TROUPE_STRESS_SCALE=small (used under
// ThreadSanitizer, which runs them 5-15x slower).

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace {

using namespace std::chrono_literals;
using troupe::actor_ref;
using troupe::errc;
using troupe::spawn_options;

int scaled(int full, int small) {
  const char* s = std::getenv("TROUPE_STRESS_SCALE");
  return s && std::strcmp(s, "small") == 0 ? small : full;
}

struct ordered_sink {
  std::vector<long long> last;
  long long received = 0;
  long long out_of_order = 0;
  explicit ordered_sink(int senders) : last(senders, -1) {}
  void take(int sender, long long seq) {
    if (seq != last[sender] + 1) ++out_of_order;
    last[sender] = seq;
    ++received;
  }
  std::pair<long long, long long> result() const { return {received, out_of_order}; }
};

struct pump {
  actor_ref<ordered_sink> to;
  int id;
  long long total;
  long long next = 0;
  void go() {
    for (int k = 0; k < 256 && next < total; ++k) to.tell(&ordered_sink::take, id, next++);
    if (next < total) troupe::this_actor::self<pump>().tell(&pump::go);
  }
};

TEST(Stress, TenMillionMessagesArriveCompleteAndInOrderPerSender) {
  troupe::actor_system sys{{.threads = 2}};
  const long long total = scaled(10'000'000, 200'000);
  const int actor_senders = 2, thread_senders = 2, senders = actor_senders + thread_senders;
  const long long each = total / senders;
  auto sink = sys.spawn<ordered_sink>(senders);
  std::vector<actor_ref<pump>> pumps;
  for (int i = 0; i < actor_senders; ++i) pumps.push_back(sys.spawn<pump>(sink, i, each));
  for (auto& p : pumps) p.tell(&pump::go);
  std::vector<std::thread> threads;
  for (int t = 0; t < thread_senders; ++t)
    threads.emplace_back([&, id = actor_senders + t] {
      for (long long i = 0; i < each; ++i) sink.tell(&ordered_sink::take, id, i);
    });
  for (auto& t : threads) t.join();
  std::pair<long long, long long> r;
  for (int i = 0; i < 60'000; ++i) {
    r = sink.ask(&ordered_sink::result).get();
    if (r.first == each * senders) break;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(r.first, each * senders);
  EXPECT_EQ(r.second, 0);
  EXPECT_EQ(sys.dead_letters(), 0u);
}

struct short_lived {
  int value(int x) { return x; }
};

TEST(Stress, ActorsSpawnedAndStoppedWhileMessagesFlyLeaveNothingBehind) {
  troupe::actor_system sys{{.threads = 2}};
  const int n = scaled(100'000, 5'000);
  std::atomic<long long> answered{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&] {
      std::vector<troupe::future<int>> fs;
      std::vector<actor_ref<short_lived>> later;  // stopped only once their replies are in
      for (int i = 0; i < n / 2; ++i) {
        auto a = sys.spawn<short_lived>();
        const bool keep = i % 4 == 0;
        fs.push_back(a.ask(&short_lived::value, i));
        a.tell(&short_lived::value, i);
        if (!keep && i % 2 == 0) a.stop();  // races with the messages above (stop overtakes)
        fs.push_back(a.ask(&short_lived::value, i));
        if (!keep && i % 2 == 1) a.stop();
        if (keep) later.push_back(a);
        if (fs.size() >= 512) {
          for (auto& f : fs) {
            try {
              f.get();
              ++answered;
            } catch (const troupe::error& e) {
              EXPECT_EQ(e.code_value(), errc::actor_dead);
              ++refused;
            }
          }
          fs.clear();
          for (auto& k : later) k.stop();
          later.clear();
        }
      }
      for (auto& f : fs) {
        try {
          f.get();
          ++answered;
        } catch (const troupe::error&) {
          ++refused;
        }
      }
      for (auto& k : later) k.stop();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered + refused, 2LL * n);
  EXPECT_GE(answered.load(), n / 2);  // the kept quarter answers both asks, whatever the timing
  for (int i = 0; i < 5000 && sys.live_actors() != 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(sys.live_actors(), 0u);
}

struct thrower {
  int calls = 0;
  int maybe_throw(int i) {
    ++calls;
    if (i % 2) throw std::runtime_error("odd");
    return i;
  }
  void crash() { throw std::runtime_error("crash"); }
  int count() const { return calls; }
};

TEST(Stress, AnExceptionStormReachesEveryAskerAndLeavesTheActorAlive) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<thrower>();
  const int n = scaled(200'000, 10'000);
  std::atomic<int> values{0}, errors{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&] {
      std::vector<troupe::future<int>> fs;
      for (int i = 0; i < n / 2; ++i) {
        fs.push_back(t.ask(&thrower::maybe_throw, i));
        if (fs.size() == 256 || i == n / 2 - 1) {
          for (auto& f : fs) {
            try {
              f.get();
              ++values;
            } catch (const std::runtime_error&) {
              ++errors;
            }
          }
          fs.clear();
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(values.load(), n / 2);
  EXPECT_EQ(errors.load(), n / 2);
  EXPECT_EQ(t.ask(&thrower::count).get(), n);
}

TEST(Stress, RestartLoopsKeepServingEveryMessage) {
  troupe::actor_system sys{{.threads = 2}};
  auto t = sys.spawn<thrower>(spawn_options{.restart = {.max_restarts = -1}});
  const int n = scaled(50'000, 3'000);
  std::vector<troupe::future<int>> fs;
  for (int i = 0; i < n; ++i) {
    if (i % 10 == 0) t.tell(&thrower::crash);
    fs.push_back(t.ask(&thrower::maybe_throw, 2 * i));
  }
  long long sum = 0;
  for (auto& f : fs) sum += f.get();  // kept across restarts: none lost, none failed
  EXPECT_EQ(sum, static_cast<long long>(n) * (n - 1));
  EXPECT_TRUE(t.alive());
}

struct busy_sink {
  long long n = 0;
  int take(int) {
    ++n;
    return 0;
  }
};

TEST(Stress, ShutdownWithFullMailboxesFailsEveryPendingAsk) {
  std::vector<troupe::future<int>> fs;
  const int actors = 100, per = scaled(2'000, 200);
  {
    troupe::actor_system sys{{.threads = 2}};
    std::vector<actor_ref<busy_sink>> sinks;
    for (int i = 0; i < actors; ++i) sinks.push_back(sys.spawn<busy_sink>());
    for (int k = 0; k < per; ++k)
      for (auto& s : sinks) fs.push_back(s.ask(&busy_sink::take, k));
  }  // the destructor stops everything
  int done = 0, dead = 0;
  for (auto& f : fs) {
    ASSERT_TRUE(f.ready());
    try {
      f.get();
      ++done;
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code_value(), errc::actor_dead);
      ++dead;
    }
  }
  EXPECT_EQ(done + dead, actors * per);
}

TEST(Stress, RefsOutliveTheirSystemSafely) {
  actor_ref<busy_sink> kept;
  {
    troupe::actor_system sys{{.threads = 2}};
    kept = sys.spawn<busy_sink>();
    EXPECT_EQ(kept.ask(&busy_sink::take, 1).get(), 0);
  }
  EXPECT_FALSE(kept.alive());
  kept.tell(&busy_sink::take, 1);  // a dead letter, not a crash
  EXPECT_THROW(kept.ask(&busy_sink::take, 1).get(), troupe::error);
}

struct ping_node {
  actor_ref<ping_node> peer;
  void link(actor_ref<ping_node> p) { peer = std::move(p); }
  troupe::task<long long> volley(int n) {
    long long s = 0;
    for (int i = 0; i < n; ++i) s += co_await peer.ask(&ping_node::echo, i);
    co_return s;
  }
  int echo(int x) { return x; }
};

TEST(Stress, CoroutinePingPongAcrossManyPairs) {
  troupe::actor_system sys{{.threads = 2}};
  const int pairs = 32, n = scaled(5'000, 300);
  std::vector<troupe::future<long long>> fs;
  std::vector<actor_ref<ping_node>> nodes;
  for (int i = 0; i < pairs; ++i) {
    auto a = sys.spawn<ping_node>(), b = sys.spawn<ping_node>();
    a.ask(&ping_node::link, b).get();
    b.ask(&ping_node::link, a).get();
    nodes.push_back(a);
    nodes.push_back(b);
  }
  for (int i = 0; i < pairs; ++i) fs.push_back(nodes[2 * i].ask(&ping_node::volley, n));
  for (auto& f : fs) EXPECT_EQ(f.get(), static_cast<long long>(n) * (n - 1) / 2);
}

}  // namespace

namespace {

// An actor woken by one in a long handler runs on another worker meanwhile, instead of waiting
// for that handler to end in the sender's slot: whether the sender woke it late in the handler
// (a pipeline stage sends its activation after computing and computes on) or first thing.
struct stamp {
  std::atomic<long long>* ran_at;
  void note() {
    ran_at->store(std::chrono::steady_clock::now().time_since_epoch().count());
  }
};

void spin(std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

/// Computes for `before`, wakes `next`, then computes 300 ms more.
struct long_sender {
  actor_ref<stamp> next;
  std::chrono::milliseconds before;
  std::atomic<long long>* done_at;
  void work() {
    spin(before);
    next.tell(&stamp::note);
    spin(300ms);
    done_at->store(std::chrono::steady_clock::now().time_since_epoch().count());
  }
};

void expect_the_woken_actor_runs_meanwhile(troupe::actor_system& sys, std::chrono::milliseconds before) {
  std::atomic<long long> ran_at{0}, done_at{0};
  auto s = sys.spawn<stamp>(&ran_at);
  auto w = sys.spawn<long_sender>(s, before, &done_at);
  w.ask(&long_sender::work).get();
  for (int i = 0; i < 200 && ran_at.load() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_NE(ran_at.load(), 0);
  EXPECT_LT(ran_at.load(), done_at.load())
      << "the woken actor waited for the sender's handler to end (woken after " << before.count() << " ms)";
}

}  // namespace

TEST(Scheduler, AnActorWokenEarlyInALongHandlerRunsElsewhereMeanwhile) {
  troupe::actor_system sys{{.threads = 2}};
  for (int round = 0; round < 3; ++round) {
    expect_the_woken_actor_runs_meanwhile(sys, 0ms);
    std::this_thread::sleep_for(100ms);  // an idle pool: the monitor backs off, and must still see the next
  }
}

TEST(Scheduler, AnActorWokenLateInALongHandlerRunsElsewhereMeanwhile) {
  troupe::actor_system sys{{.threads = 2}};
  expect_the_woken_actor_runs_meanwhile(sys, 2ms);  // well past the slot's limit
}
