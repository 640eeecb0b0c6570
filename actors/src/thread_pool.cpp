// The work-stealing scheduler behind actor_system.
//
// Each worker has a LIFO slot and a local FIFO queue; threads outside the pool push to a
// global queue. An actor that a worker wakes up (by sending it a message) goes to that
// worker's LIFO slot and runs next on the same thread while its data is hot: a request and
// its reply ping-pong on one core without waking anybody. Other workers do not steal from
// the slot, so filling it wakes nobody; only work that others can take (a displaced slot
// occupant, a second runnable actor, the global queue) wakes an idle worker, and only when
// no worker is already searching for work.
//
// Except behind a long slice: an actor woken by one that has already run for a while (a
// pipeline stage that computed for milliseconds and then sent its activation) would wait in
// the slot until the sender's slice ends, with idle workers about. Past `long_slice` the
// woken actor goes to the local queue instead, where an idle worker is woken to take it (when
// none is idle it merely waits in the queue rather than the slot; locality matters little
// after a slice that long); a searcher that finds work and leaves more behind wakes the next.
//
// The other way round, an actor that sends first and then computes for long: its worker's
// slot holds the woken actor for the whole slice. A monitor thread (Go's sysmon does the
// same for its run-next slot) looks every millisecond while any worker runs a slice and, when
// some worker is idle, moves an occupant that has waited longer than `long_slice` to the global
// queue, which wakes one. Slots their owners empty in time are left alone (but for a rare race
// that moves a fresh occupant: it still runs exactly once), so the ping-pong above keeps its
// core; while no slice runs the monitor backs off to 50 looks a second.
//
// Idle protocol. A worker without work first spins for a while as the one "searching"
// worker (at most half of the pool searches), then parks on its futex after announcing
// itself in the idle list and re-checking every queue. A producer publishes its work
// first and then reads `sleeping_`/`searching_`; both sides use sequentially consistent
// operations, so either the producer sees the sleeper or the sleeper sees the work.

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cycle_clock.hpp"
#include "sync.hpp"
#include "system.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {
namespace {

/// A growable ring of cells, guarded by its owner's spinlock.
class ring {
public:
  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }
  void push_back(cell_base* c) {
    if (count_ == buf_.size()) grow();
    buf_[(head_ + count_) & (buf_.size() - 1)] = c;
    ++count_;
  }
  cell_base* pop_front() noexcept {
    cell_base* c = buf_[head_];
    head_ = (head_ + 1) & (buf_.size() - 1);
    --count_;
    return c;
  }

private:
  void grow() {
    std::vector<cell_base*> next(buf_.empty() ? 256 : buf_.size() * 2);
    for (std::size_t i = 0; i < count_; ++i) next[i] = buf_[(head_ + i) & (buf_.size() - 1)];
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<cell_base*> buf_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

class thread_pool;

// One cache line for what the owner writes as it runs, one for the queue that thieves lock and
// searchers poll, one for the futex word that producers write to wake it.
struct alignas(64) worker {
  thread_pool* pool = nullptr;
  unsigned index = 0;
  unsigned lifo_streak = 0;
  // The slot: the owner fills and empties it; the monitor may take a stale occupant, so both
  // sides empty it by exchange and exactly one of them gets the occupant.
  std::atomic<cell_base*> lifo{nullptr};
  std::atomic<std::uint64_t> lifo_since{0};  // cycle_clock ticks when it was last filled
  // cycle_clock ticks when the running slice began, 0 between slices (the monitor reads it).
  std::atomic<std::uint64_t> slice_start{0};
  unsigned tick = 0;
  std::uint64_t rng = 0;
  alignas(64) spinlock qlock;
  ring queue;
  std::atomic<std::size_t> qsize{0};
  alignas(64) std::atomic<std::uint32_t> parked{0};
  std::thread thread;
};

thread_local worker* tls_worker = nullptr;

constexpr unsigned max_lifo_streak = 16;
constexpr unsigned global_check_interval = 61;
constexpr int spin_rounds = 4000;
constexpr std::chrono::microseconds long_slice{50};
constexpr std::chrono::microseconds monitor_busy_interval{1000};  // per 64 workers
constexpr std::chrono::microseconds monitor_idle_interval{20'000};

class thread_pool final : public scheduler {
public:
  thread_pool(system_impl& sys, unsigned threads, unsigned throughput)
      : sys_(sys), throughput_(throughput) {
    // Half the workers may spin looking for work, but never more than half the cores: with more
    // workers than cores (4096 on 2), spinning searchers only take the cores from those with work.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    max_searching_ = std::max(1u, std::min(threads, cores) / 2);
    for (unsigned i = 0; i < threads; ++i) {
      auto w = std::make_unique<worker>();
      w->pool = this;
      w->index = i;
      w->rng = 0x9e3779b97f4a7c15ull * (i + 1);
      workers_.push_back(std::move(w));
    }
    try {
      for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
    } catch (const std::system_error& e) {
      stop();  // joins the workers already started
      throw std::runtime_error("cannot start " + std::to_string(threads) + " worker threads: " + e.what());
    }
    if (threads > 1) {
      try {
        monitor_ = std::thread([this] { watch(); });
      } catch (const std::system_error& e) {  // the pool works without it, only less promptly
        log().warn("troupe: the scheduler runs without its slot monitor (cannot start a thread: {})", e.what());
      }
    }
  }

  ~thread_pool() override { stop(); }

  void schedule(cell_base* c) noexcept override {
    if (stopped_.load(std::memory_order_acquire)) {
      run_inline(c);
      return;
    }
    worker* w = tls_worker;
    if (w != nullptr && w->pool == this) {
      const std::uint64_t now = cycle_clock::now();
      if (now - w->slice_start.load(std::memory_order_relaxed) > long_slice_ticks_) {
        push_local(*w, c);
        notify_if_needed();
        return;
      }
      w->lifo_since.store(now, std::memory_order_relaxed);
      if (w->lifo.load(std::memory_order_relaxed) == nullptr) {
        w->lifo.store(c, std::memory_order_release);  // nobody else fills it
      } else if (cell_base* prev = w->lifo.exchange(c, std::memory_order_acq_rel)) {
        push_local(*w, prev);
        notify_if_needed();
      }
      return;
    }
    push_global(c);
  }

  void reschedule(cell_base* c) noexcept override {
    if (stopped_.load(std::memory_order_acquire)) {
      run_inline(c);
      return;
    }
    worker* w = tls_worker;
    if (w != nullptr && w->pool == this) {
      push_local(*w, c);
      // Wake a thief only for work this worker will not run next.
      if (w->lifo.load(std::memory_order_relaxed) != nullptr || w->qsize.load(std::memory_order_relaxed) > 1)
        notify_if_needed();
      return;
    }
    push_global(c);
  }

  void stop() noexcept override {
    if (stopping_.exchange(true)) {
      return;
    }
    monitor_word_.store(1, std::memory_order_seq_cst);
    futex_wake_one(monitor_word_);
    if (monitor_.joinable()) monitor_.join();
    for (auto& w : workers_) {
      w->parked.store(0, std::memory_order_seq_cst);
      futex_wake_one(w->parked);
    }
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
    stopped_.store(true, std::memory_order_release);
    // Whatever is still queued belongs to dead actors: let them refuse their messages.
    for (;;) {
      cell_base* c = nullptr;
      for (auto& w : workers_) {
        if ((c = w->lifo.exchange(nullptr)) != nullptr) break;
        std::lock_guard lock(w->qlock);
        if (!w->queue.empty()) {
          c = w->queue.pop_front();
          break;
        }
      }
      if (!c) {
        std::lock_guard lock(global_mutex_);
        if (!global_.empty()) c = global_.pop_front();
      }
      if (!c) break;
      run_inline(c);
    }
  }

private:
  void run_inline(cell_base* c) noexcept {
    // After stop only dead actors remain; their slices only refuse messages.
    c->run_slice(~0u);
  }

  void push_local(worker& w, cell_base* c) noexcept {
    {
      std::lock_guard lock(w.qlock);
      w.queue.push_back(c);
    }
    w.qsize.fetch_add(1, std::memory_order_seq_cst);
  }

  void push_global(cell_base* c) noexcept {
    {
      std::lock_guard lock(global_mutex_);
      global_.push_back(c);
    }
    global_size_.fetch_add(1, std::memory_order_seq_cst);
    notify_if_needed();
  }

  cell_base* pop_local(worker& w) noexcept {
    if (w.qsize.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard lock(w.qlock);
    if (w.queue.empty()) return nullptr;
    w.qsize.fetch_sub(1, std::memory_order_relaxed);
    return w.queue.pop_front();
  }

  cell_base* pop_global() noexcept {
    if (global_size_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard lock(global_mutex_);
    if (global_.empty()) return nullptr;
    global_size_.fetch_sub(1, std::memory_order_relaxed);
    return global_.pop_front();
  }

  /// Takes half of a victim's queue: one to run, the rest into our queue.
  cell_base* steal(worker& w) noexcept {
    const std::size_t n = workers_.size();
    if (n < 2) return nullptr;
    w.rng ^= w.rng << 13;
    w.rng ^= w.rng >> 7;
    w.rng ^= w.rng << 17;
    const std::size_t start = w.rng % n;
    for (std::size_t i = 0; i < n; ++i) {
      worker& v = *workers_[(start + i) % n];
      if (&v == &w || v.qsize.load(std::memory_order_relaxed) == 0) continue;
      cell_base* first = nullptr;
      std::vector<cell_base*> moved;
      {
        std::lock_guard lock(v.qlock);
        std::size_t take = (v.queue.size() + 1) / 2;
        if (take == 0) continue;
        first = v.queue.pop_front();
        for (std::size_t k = 1; k < take; ++k) moved.push_back(v.queue.pop_front());
        v.qsize.fetch_sub(take, std::memory_order_relaxed);
      }
      for (auto* c : moved) push_local(w, c);
      return first;
    }
    return nullptr;
  }

  cell_base* next(worker& w) noexcept {
    if (++w.tick % global_check_interval == 0) {
      if (auto* c = pop_global()) return c;
    }
    if (w.lifo.load(std::memory_order_relaxed) != nullptr) {
      if (cell_base* c = w.lifo.exchange(nullptr, std::memory_order_acquire)) {
        if (w.lifo_streak < max_lifo_streak) {
          ++w.lifo_streak;
          return c;
        }
        // Let queued work through: the slot's occupant waits its turn in the queue.
        push_local(w, c);
      }
    }
    w.lifo_streak = 0;
    if (auto* c = pop_local(w)) return c;
    if (auto* c = pop_global()) return c;
    return steal(w);
  }

  bool work_visible() const noexcept {
    if (global_size_.load(std::memory_order_seq_cst) != 0) return true;
    for (auto& v : workers_)
      if (v->qsize.load(std::memory_order_seq_cst) != 0) return true;
    return false;
  }

  void notify_if_needed() noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) == 0) return;
    if (searching_.load(std::memory_order_seq_cst) != 0) return;
    worker* s = nullptr;
    {
      std::lock_guard lock(idle_mutex_);
      if (idle_.empty()) return;
      s = idle_.back();
      idle_.pop_back();
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
    }
    s->parked.store(0, std::memory_order_seq_cst);
    futex_wake_one(s->parked);
  }

  /// Spins as a searching worker; returns work if some shows up.
  cell_base* search(worker& w) noexcept {
    if (searching_.load(std::memory_order_relaxed) >= max_searching_) return nullptr;
    searching_.fetch_add(1, std::memory_order_seq_cst);
    cell_base* found = nullptr;
    for (int i = 0; i < spin_rounds && !stopping_.load(std::memory_order_relaxed); ++i) {
      if (work_visible()) {
        if ((found = pop_global()) || (found = steal(w))) break;
      }
      cpu_relax();
      if ((i & 63) == 63) std::this_thread::yield();
    }
    searching_.fetch_sub(1, std::memory_order_seq_cst);
    // Work left behind (a long slice woke two actors, say) needs a worker too.
    if (found != nullptr && work_visible()) notify_if_needed();
    return found;
  }

  void park(worker& w) noexcept {
    {
      std::lock_guard lock(idle_mutex_);
      w.parked.store(1, std::memory_order_seq_cst);
      idle_.push_back(&w);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (work_visible() || stopping_.load(std::memory_order_seq_cst)) {
      std::lock_guard lock(idle_mutex_);
      auto it = std::find(idle_.begin(), idle_.end(), &w);
      if (it != idle_.end()) {
        idle_.erase(it);
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        w.parked.store(0, std::memory_order_seq_cst);
      }
    }
    while (w.parked.load(std::memory_order_seq_cst) == 1) futex_wait(w.parked, 1);
  }

  void run(worker& w) noexcept {
    tls_worker = &w;
    tls_on_worker() = true;
    while (!stopping_.load(std::memory_order_relaxed)) {
      cell_base* c = next(w);
      if (c == nullptr) c = search(w);
      if (c != nullptr) {
        w.slice_start.store(cycle_clock::now(), std::memory_order_relaxed);
        c->run_slice(throughput_);
        w.slice_start.store(0, std::memory_order_relaxed);
        continue;
      }
      park(w);
    }
    tls_worker = nullptr;
    tls_on_worker() = false;
  }

  /// The monitor's loop (see the top of the file).
  void watch() noexcept {
    const auto scale = static_cast<std::int64_t>(1 + workers_.size() / 64);
    const std::int64_t busy_ns = std::chrono::nanoseconds(monitor_busy_interval).count() * scale;
    const std::int64_t idle_ns = std::max(busy_ns, std::int64_t{std::chrono::nanoseconds(monitor_idle_interval).count()});
    std::int64_t interval = busy_ns;
    while (monitor_word_.load(std::memory_order_acquire) == 0) {
      futex_wait_for(monitor_word_, 0, interval);
      if (monitor_word_.load(std::memory_order_acquire) != 0) break;
      // Only when a worker could take the occupant: with every worker busy it would only lose
      // its place right after its sender's slice.
      const bool takers = sleeping_.load(std::memory_order_seq_cst) != 0 || searching_.load(std::memory_order_seq_cst) != 0;
      bool busy = false;  // some worker in a slice: a slot may go stale behind it
      for (auto& w : workers_) {
        if (w->slice_start.load(std::memory_order_relaxed) != 0) busy = true;
        if (!takers || w->lifo.load(std::memory_order_acquire) == nullptr) continue;
        const std::uint64_t since = w->lifo_since.load(std::memory_order_relaxed), now = cycle_clock::now();
        if (now <= since || now - since <= long_slice_ticks_) continue;
        if (cell_base* c = w->lifo.exchange(nullptr, std::memory_order_acq_rel)) push_global(c);
      }
      interval = busy ? busy_ns : std::min(idle_ns, interval * 2);
    }
  }

  system_impl& sys_;
  unsigned throughput_;
  unsigned max_searching_;
  std::uint64_t long_slice_ticks_ = cycle_clock::from_ns(std::chrono::nanoseconds(long_slice).count());
  std::vector<std::unique_ptr<worker>> workers_;
  std::mutex global_mutex_;
  ring global_;
  std::atomic<std::size_t> global_size_{0};
  std::atomic<unsigned> searching_{0};
  std::atomic<unsigned> sleeping_{0};
  std::mutex idle_mutex_;
  std::vector<worker*> idle_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::thread monitor_;
  std::atomic<std::uint32_t> monitor_word_{0};  // 1: stop
};

}  // namespace

std::unique_ptr<scheduler> make_thread_pool(system_impl& sys, unsigned threads,
                                            unsigned throughput) {
  return std::make_unique<thread_pool>(sys, threads, throughput);
}

}  // namespace troupe::detail
