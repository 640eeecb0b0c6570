// An actor's life from spawn to stop: hooks in order, dead letters, names in the registry, its
// counters, and a system whose actors decide when the program ends.

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

namespace {

using namespace std::chrono_literals;
using namespace lifecycle_support;
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

}  // namespace
