// bounded: mailboxes with a capacity, and what happens when they are full.
//
// An unbounded mailbox lets a fast producer bury a slow consumer under messages until
// memory runs out. spawn_options{.mailbox_capacity = N} bounds it, and the overflow policy
// says what a sender experiences when it is full:
//
//   overflow_policy::wait (the default): nothing is lost; the sender is slowed down.
//     A thread outside the actors blocks in tell/ask until there is room. An actor is never
//     blocked (that would stall a worker thread): its message is accepted, and after its
//     current method it takes no further message until the receiver has drained to half
//     its capacity. The mailbox can therefore exceed the capacity by what a sender sends
//     in one method call, which is why producers send in batches.
//
//   overflow_policy::reject: the message is refused. An ask fails with
//     troupe::error(errc::mailbox_full); a tell goes to the dead letters, where
//     sys.dead_letters() counts it (and the runtime logs it on stderr).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include <troupe/actors/actor_system.hpp>

namespace {

using namespace std::chrono_literals;

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("check failed: ") + what);
}

// ---- part 1: producer and consumer, overflow_policy::wait --------------------------------

class consumer {
public:
  // The promise is only there so that main can wait for the end.
  consumer(long long expected, std::promise<void>* done) : expected_(expected), done_(done) {}

  void take(long long value) {
    // A little work per message, so that the consumer is the slower side.
    std::uint64_t h = mix_;
    for (int i = 0; i < 64; ++i) h = h * 6364136223846793005ULL + static_cast<std::uint64_t>(value);
    mix_ = h;
    sum_ += value;
    if (++received_ == expected_) done_->set_value();
  }

  long long received() const { return received_; }
  long long sum() const { return sum_; }

private:
  long long expected_;
  std::promise<void>* done_;
  long long received_ = 0;
  long long sum_ = 0;
  std::uint64_t mix_ = 0;
};

class producer {
public:
  producer(troupe::actor_ref<consumer> to, long long total, int batch)
      : to_(std::move(to)), total_(total), batch_(batch) {}

  // Sends one batch, then tells itself to send the next. Returning between batches is what
  // lets the runtime pause this producer while the consumer catches up; a single method
  // sending all 100,000 messages could not be paused and would fill the mailbox far past
  // its capacity.
  void run() {
    for (int i = 0; i < batch_ && next_ < total_; ++i) to_.tell(&consumer::take, next_++);
    if (next_ < total_) troupe::this_actor::self<producer>().tell(&producer::run);
  }

private:
  troupe::actor_ref<consumer> to_;
  long long total_;
  int batch_;
  long long next_ = 0;
};

void part1_wait() {
  std::printf("-- part 1: overflow_policy::wait, 100,000 messages through a 64-slot mailbox\n");
  // Declared before the system, so that it outlives every actor that may touch it.
  std::promise<void> done;
  auto finished = done.get_future();
  troupe::actor_system sys{{.threads = 2}};

  const long long total = 100'000;
  const std::size_t capacity = 64;
  const int batch = 100;

  auto sink = sys.spawn<consumer>(troupe::spawn_options{.mailbox_capacity = capacity}, total,
                                  &done);
  auto source = sys.spawn<producer>(sink, total, batch);

  auto t0 = std::chrono::steady_clock::now();
  source.tell(&producer::run);

  // Watch the consumer's mailbox from outside while it works: stats() may be read from any
  // thread at any time.
  std::int64_t peak = 0;
  long long samples = 0;
  while (finished.wait_for(0s) != std::future_status::ready) {
    peak = std::max(peak, sys.stats(sink).mailbox_depth);
    ++samples;
    if (std::chrono::steady_clock::now() - t0 > 30s) throw std::runtime_error("part 1 hung");
    std::this_thread::sleep_for(20us);
  }
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  long long received = sink.ask(&consumer::received).get();
  long long sum = sink.ask(&consumer::sum).get();
  const long long expected_sum = total * (total - 1) / 2;  // 0 + 1 + ... + (total - 1)
  std::printf("received %lld of %lld messages in %.1f ms, sum %lld (expected %lld)\n", received,
              total, ms, sum, expected_sum);
  std::printf("peak mailbox depth over %lld samples: %lld (bound: capacity %zu + one batch of %d)\n",
              samples, static_cast<long long>(peak), capacity, batch);
  check(received == total && sum == expected_sum, "nothing lost, nothing duplicated");
  check(peak <= static_cast<std::int64_t>(capacity) + batch,
        "the mailbox stays within capacity + one batch");
  check(sys.dead_letters() == 0, "no dead letters under the wait policy");
}

// ---- part 2: overflow_policy::reject ------------------------------------------------------

class slow_consumer {
public:
  // Stands in for slow work. To keep this demo deterministic it waits for main to open a
  // gate instead of sleeping (either way, it holds a worker thread: never do this in real
  // code).
  void busy(std::shared_future<void> gate) { gate.wait(); }
  void take(int /*value*/) { ++received_; }
  int received() const { return received_; }

private:
  int received_ = 0;
};

void part2_reject() {
  std::printf("-- part 2: overflow_policy::reject, a 4-slot mailbox and a stuck consumer\n");
  troupe::actor_system sys{{.threads = 2}};
  auto slow = sys.spawn<slow_consumer>(
      troupe::spawn_options{.mailbox_capacity = 4, .overflow = troupe::overflow_policy::reject});

  // Declared after the system: should anything throw, the promise is destroyed first,
  // which opens the gate, so the system's destructor does not wait for a stuck worker.
  std::promise<void> open_gate;
  slow.tell(&slow_consumer::busy, open_gate.get_future().share());

  // Ten tells while the consumer is busy: the first few fit, the rest are refused. A tell
  // cannot report that (it returns nothing); the dead-letter counter can.
  const auto dead_before = sys.dead_letters();
  const int sent = 10;
  for (int i = 0; i < sent; ++i) slow.tell(&slow_consumer::take, i);
  const auto refused_tells = sys.dead_letters() - dead_before;

  // An ask, by contrast, fails in a way the caller sees.
  bool ask_refused = false;
  try {
    slow.ask(&slow_consumer::received).get();
  } catch (const troupe::error& e) {
    ask_refused = e.code_value() == troupe::errc::mailbox_full;
    std::printf("ask to the full mailbox -> %s\n", e.what());
  }
  const auto refused_total = sys.dead_letters() - dead_before;

  open_gate.set_value();  // the consumer gets going again
  // Asking at once could still find the mailbox full: wait until it has drained. (A real
  // sender to a reject mailbox has the same choice: retry later, or drop the message.)
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (sys.stats(slow).mailbox_depth > 0) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("part 2 hung");
    std::this_thread::sleep_for(100us);
  }
  int received = slow.ask(&slow_consumer::received).get();
  std::printf("tells sent: %d, handled: %d, refused (dead letters): %llu; dead letters in all: "
              "%llu\n",
              sent, received, static_cast<unsigned long long>(refused_tells),
              static_cast<unsigned long long>(refused_total));
  check(ask_refused, "an ask to a full mailbox fails with errc::mailbox_full");
  check(refused_tells > 0, "some tells were refused");
  check(received + static_cast<int>(refused_tells) == sent,
        "every tell was either handled or counted as a dead letter");
  check(refused_total == refused_tells + 1, "the refused ask is a dead letter too");
}

int run() {
  part1_wait();
  part2_reject();
  std::printf("bounded: all checks passed\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bounded: FAILED: %s\n", e.what());
    return 1;
  }
}
