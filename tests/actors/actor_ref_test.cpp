#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>

namespace {

using troupe::actor_ref;
using troupe::errc;
using troupe::test_system;

class recorder {
public:
  void add(int v) { seen_.push_back(v); }
  std::vector<int> seen() const { return seen_; }
  int twice(int v) const { return 2 * v; }
  std::string greet(const std::string& who) { return "hello " + who; }
  void fail(const std::string& why) { throw std::runtime_error(why); }
  std::size_t count() const { return seen_.size(); }

private:
  std::vector<int> seen_;
};

class counter {
public:
  explicit counter(int start) : value_(start) {}
  int add(int x) { return value_ += x; }

private:
  int value_;
};

TEST(ActorRef, SpawnForwardsConstructorArguments) {
  test_system sys;
  auto c = sys.spawn<counter>(10);
  EXPECT_EQ(c.ask(&counter::add, 5).get(), 15);
}

TEST(ActorRef, TellsAreAppliedInSendOrder) {
  test_system sys;
  auto r = sys.spawn<recorder>();
  for (int i = 0; i < 100; ++i) r.tell(&recorder::add, i);
  sys.run_until_idle();
  auto seen = r.ask(&recorder::seen).get();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
}

TEST(ActorRef, NothingRunsUntilTheTestSystemIsDriven) {
  test_system sys;
  auto r = sys.spawn<recorder>();
  r.tell(&recorder::add, 1);
  EXPECT_EQ(sys.stats(r).messages, 0u);
  EXPECT_EQ(sys.stats(r).mailbox_depth, 1);
  sys.run_until_idle();
  EXPECT_EQ(sys.stats(r).messages, 1u);
  EXPECT_EQ(sys.stats(r).mailbox_depth, 0);
}

TEST(ActorRef, AskReturnsTheMethodsResult) {
  test_system sys;
  auto r = sys.spawn<recorder>();
  auto f = r.ask(&recorder::twice, 21);
  EXPECT_FALSE(f.ready());
  sys.run_until_idle();
  EXPECT_TRUE(f.ready());
  EXPECT_EQ(f.get(), 42);
  EXPECT_EQ(r.ask(&recorder::greet, std::string("troupe")).get(), "hello troupe");
}

TEST(ActorRef, AnExceptionThrownByAMethodReachesTheAsker) {
  test_system sys;
  auto r = sys.spawn<recorder>();
  try {
    r.ask(&recorder::fail, std::string("bad input")).get();
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bad input");
  }
  // The actor keeps its state and goes on.
  r.tell(&recorder::add, 7);
  EXPECT_EQ(r.ask(&recorder::count).get(), 1u);
  EXPECT_TRUE(r.alive());
}

TEST(ActorRef, AcceptsACallableInPlaceOfAMethod) {
  test_system sys;
  auto c = sys.spawn<counter>(1);
  int v = c.ask([](counter& self, int x) { return self.add(x) * 10; }, 2).get();
  EXPECT_EQ(v, 30);
}

TEST(ActorRef, MovesMoveOnlyArgumentsIntoTheActor) {
  struct sink {
    int take(std::unique_ptr<int> p) { return *p; }
  };
  test_system sys;
  auto s = sys.spawn<sink>();
  EXPECT_EQ(s.ask(&sink::take, std::make_unique<int>(9)).get(), 9);
}

TEST(ActorRef, AnEmptyRefRefusesToSend) {
  actor_ref<recorder> r;
  EXPECT_FALSE(r);
  EXPECT_THROW(r.tell(&recorder::add, 1), std::logic_error);
}

TEST(ActorRef, CopiesAddressTheSameActor) {
  test_system sys;
  auto a = sys.spawn<recorder>();
  auto b = a;
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.id(), b.id());
  b.tell(&recorder::add, 1);
  a.tell(&recorder::add, 2);
  EXPECT_EQ(a.ask(&recorder::count).get(), 2u);
  EXPECT_NE(sys.spawn<recorder>().id(), a.id());
}

TEST(ActorRef, AThrowingConstructorThrowsAtSpawn) {
  struct picky {
    explicit picky(int x) {
      if (x < 0) throw std::invalid_argument("negative");
    }
  };
  test_system sys;
  EXPECT_THROW(sys.spawn<picky>(-1), std::invalid_argument);
  EXPECT_EQ(sys.live_actors(), 0u);
  sys.spawn<picky>(1);
  EXPECT_EQ(sys.live_actors(), 1u);
}

TEST(ActorRef, AFutureCanBeConsumedOnlyOnce) {
  test_system sys;
  auto r = sys.spawn<recorder>();
  auto f = r.ask(&recorder::twice, 1);
  EXPECT_EQ(f.get(), 2);
  EXPECT_THROW(f.get(), std::logic_error);
}

struct watcher_of_nobody {
  void on_down(const troupe::down_notice&) {}
  void watch(troupe::actor_ref<watcher_of_nobody> r) { troupe::this_actor::monitor(r); }
};

TEST(ActorRef, AnEmptyRefIsRefusedByEveryCallThatTakesOne) {
  troupe::actor_system sys{{.threads = 1}};
  troupe::actor_ref<watcher_of_nobody> empty;
  EXPECT_THROW(sys.monitor(empty), std::invalid_argument);
  EXPECT_THROW(sys.stats(empty), std::invalid_argument);
  EXPECT_THROW(sys.tell_after(std::chrono::milliseconds(1), empty, &watcher_of_nobody::watch, empty),
               std::invalid_argument);
  auto w = sys.spawn<watcher_of_nobody>();
  EXPECT_THROW(w.ask(&watcher_of_nobody::watch, empty).get(), std::invalid_argument);
  EXPECT_TRUE(w.alive());
}

}  // namespace
