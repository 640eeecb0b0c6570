// ping_pong: actors that wait for each other without blocking a thread.
//
// A method that returns troupe::task<T> is a coroutine. Inside it, `co_await other.ask(...)`
// suspends the method until the reply arrives, and hands the worker thread back to the
// system in the meantime. The caller of such a method still gets a plain future<T>.
//
//   part 1: two rallies on a system with ONE worker thread: they can only both finish if
//           waiting for a reply does not hold that thread.
//   part 2: non-reentrancy, the default: while a coroutine method is suspended, the actor
//           takes no other message, so its state cannot change under its feet.
//   part 3: reentrant actors: two actors calling back into each other (and what happens
//           when they are not reentrant).

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <troupe/actors/actor_system.hpp>

namespace {

using namespace std::chrono_literals;

// The ponger answers every ball at once. A plain method: it never waits for anything.
class ponger {
public:
  int pong(int ball) {
    ++hits_;
    return ball + 1;
  }
  int hits() const { return hits_; }

private:
  int hits_ = 0;
};

// The pinger plays a whole rally in one coroutine method.
class pinger {
public:
  explicit pinger(troupe::actor_ref<ponger> peer) : peer_(std::move(peer)) {}

  troupe::task<int> rally(int rounds) {
    returned_ = 0;
    int ball = 0;
    for (int i = 0; i < rounds; ++i) {
      // Suspends here: the worker thread goes off to run other actors (the ponger, for one)
      // and this method resumes, on this actor, when the reply is in.
      ball = co_await peer_.ask(&ponger::pong, ball);
      ++returned_;
    }
    co_return ball;
  }

  /// Balls back so far in the current (or last) rally.
  int returned() const { return returned_; }

private:
  troupe::actor_ref<ponger> peer_;
  int returned_ = 0;
};

// A player that returns a volley by asking its peer to return the next one: the two actors
// call into each other, so each must accept its peer's call while its own is suspended.
class player {
public:
  void set_peer(troupe::actor_ref<player> peer) { peer_ = std::move(peer); }

  // Returns how many times the ball was hit from here to the end of the volley.
  troupe::task<int> volley(int remaining) {
    if (remaining == 0) co_return 0;
    ++hits_;
    int rest = co_await peer_.ask(&player::volley, remaining - 1);
    co_return rest + 1;
  }

  int hits() const { return hits_; }

private:
  troupe::actor_ref<player> peer_;
  int hits_ = 0;
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void part1_one_thread() {
  std::printf("-- part 1: two rallies on one worker thread\n");
  troupe::actor_system sys{{.threads = 1}};
  auto table = sys.spawn<ponger>();
  auto alice = sys.spawn<pinger>(table);
  auto bob = sys.spawn<pinger>(table);

  const int rounds = 10'000;
  auto t0 = std::chrono::steady_clock::now();
  // Both rallies are in flight at once. If a co_await parked the only worker thread, the
  // ponger could never run and neither rally would ever finish.
  auto a = alice.ask(&pinger::rally, rounds);
  auto b = bob.ask(&pinger::rally, rounds);
  int a_ball = a.get();
  int b_ball = b.get();
  double ms = ms_since(t0);
  int hits = table.ask(&ponger::hits).get();
  std::printf("alice's ball: %d, bob's ball: %d, ponger hits: %d, in %.1f ms (%.2f us/round trip)\n",
              a_ball, b_ball, hits, ms, ms * 1000.0 / (2.0 * rounds));
  check(a_ball == rounds && b_ball == rounds, "each rally returns its ball count");
  check(hits == 2 * rounds, "the ponger hit every ball");
}

void part2_non_reentrant() {
  std::printf("-- part 2: a suspended method keeps other messages out (the default)\n");
  troupe::actor_system sys{{.threads = 2}};
  auto table = sys.spawn<ponger>();
  auto alice = sys.spawn<pinger>(table);

  const int rounds = 1'000;
  auto rally = alice.ask(&pinger::rally, rounds);
  // Sent while the rally is (most likely) still going. It is not handled in one of the
  // rally's pauses: a non-reentrant actor queues it until the rally method has returned.
  // So within a method, state only changes by that method's own hand, even across a
  // co_await.
  auto returned = alice.ask(&pinger::returned);
  int seen = returned.get();
  rally.get();
  std::printf("returned() asked during the rally saw %d of %d balls: it waited for the rally\n",
              seen, rounds);
  check(seen == rounds, "a non-reentrant actor finishes its method before the next message");

  // With spawn_options{.reentrant = true}, messages are let in while the method waits, so
  // the same question is answered mid-rally (how far along depends on timing; a rally that
  // ended before the question was even sent is tried again).
  auto table2 = sys.spawn<ponger>();
  auto carol = sys.spawn<pinger>(troupe::spawn_options{.reentrant = true}, table2);
  int seen2 = rounds;
  for (int attempt = 0; attempt < 10 && seen2 == rounds; ++attempt) {
    auto rally2 = carol.ask(&pinger::rally, rounds);
    seen2 = carol.ask(&pinger::returned).get();
    rally2.get();
  }
  std::printf("the same on a reentrant actor saw %d of %d balls: it answered mid-rally\n", seen2, rounds);
  check(seen2 < rounds, "a reentrant actor answers while its method waits");
}

void part3_calling_back() {
  std::printf("-- part 3: two actors that call each other back\n");
  troupe::actor_system sys{{.threads = 2}};

  // Non-reentrant (the default): alice.volley awaits bob.volley, which asks alice.volley.
  // That ask waits in alice's mailbox until alice's suspended method returns, which waits
  // for bob: a cycle, the classic deadlock of non-reentrant actors. No thread is blocked,
  // but nothing moves either; a timeout turns it into an error.
  {
    auto alice = sys.spawn<player>();
    auto bob = sys.spawn<player>();
    alice.ask(&player::set_peer, bob).get();
    bob.ask(&player::set_peer, alice).get();
    try {
      alice.ask(&player::volley, 6).timeout(200ms).get();
      check(false, "the non-reentrant volley should have timed out");
    } catch (const troupe::error& e) {
      std::printf("non-reentrant volley: %s (errc::timeout, as expected)\n", e.what());
      check(e.code_value() == troupe::errc::timeout, "a deadlocked cycle times out");
    }
    // Stopping them ends the wait: their suspended methods are destroyed, and bob's call
    // still queued in alice's mailbox is refused (the runtime logs it as a dead letter).
    alice.stop();
    bob.stop();
  }

  // Reentrant: each actor takes its peer's call while its own call waits, and the volley
  // completes. The price: across a co_await, other methods may have changed the state.
  {
    const troupe::spawn_options reentrant{.reentrant = true};
    auto alice = sys.spawn<player>(reentrant);
    auto bob = sys.spawn<player>(reentrant);
    alice.ask(&player::set_peer, bob).get();
    bob.ask(&player::set_peer, alice).get();
    int hits = alice.ask(&player::volley, 6).timeout(5s).get();
    int by_alice = alice.ask(&player::hits).get();
    int by_bob = bob.ask(&player::hits).get();
    std::printf("reentrant volley: %d hits (alice %d, bob %d)\n", hits, by_alice, by_bob);
    check(hits == 6 && by_alice == 3 && by_bob == 3, "the volley went back and forth");
  }
}

int run() {
  part1_one_thread();
  part2_non_reentrant();
  part3_calling_back();
  std::printf("ping_pong: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ping_pong: FAILED: %s\n", e.what());
    return 1;
  }
}
