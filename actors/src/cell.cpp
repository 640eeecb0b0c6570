// The mailbox of an actor: sending, the scheduling protocol, and the slices a worker runs.
// Past a bounded mailbox's capacity, enqueue applies the overflow policy; the waiting and the
// pausing it may lead to are in cell_bounded.cpp. Failure, restart, stop and the down notices
// are in cell_lifecycle.cpp.
//
// Scheduling protocol. `status_` is idle or scheduled. A sender pushes its message and, if
// it finds the cell idle, moves it to scheduled and hands it (with a reference) to the
// scheduler. Only the worker running the slice moves it back to idle, and then re-checks
// the queues: a message that arrived in between is either seen by that re-check or its
// sender saw `idle` (sequentially consistent store/load on both sides), so no message is
// ever stranded and a cell never runs on two workers at once.

#include <algorithm>
#include <mutex>
#include <utility>

#include "cell_bounded.hpp"
#include "cycle_clock.hpp"
#include "sync.hpp"
#include "system.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::detail {

cell_base::cell_base(system_impl& sys, actor_id id, const spawn_options& opts)
    : system_(&sys),
      id_(id),
      capacity_(static_cast<std::uint32_t>(std::min<std::size_t>(opts.mailbox_capacity, 1u << 30))),
      overflow_(opts.overflow),
      reentrant_(opts.reentrant),
      fail_on_ask_exception_(opts.fail_on_ask_exception) {
  if (opts.restart.max_restarts < -1)
    throw std::invalid_argument("restart_policy.max_restarts must be -1 (forever) or >= 0");
  sys.add_ref();  // after the last throw: the destructor that releases it runs from here on
  if (capacity_ != 0) sys.has_bounded.store(true, std::memory_order_relaxed);
  if (opts.restart.max_restarts != 0) {
    extras().restart = opts.restart;
    extras().next_backoff = opts.restart.backoff;
  }
}

cell_base::~cell_base() {
  // Normally empty: a queued message keeps its cell scheduled and therefore alive.
  reject_all(errc::actor_dead, "a destroyed actor");
  reply_came();  // (a stop forgets it first)
  system_->release();
}

cell_extras& cell_base::extras() {
  if (!extras_) extras_ = std::make_unique<cell_extras>();
  return *extras_;
}

cell_extras* cell_base::extras_if_any() noexcept {
  // Under the lock: another thread (a monitor, a sender waiting for room) may be creating it.
  // Once there it stays, so the pointer may be used after the lock.
  flag_guard g(lock_);
  return extras_.get();
}


// ---- sending ------------------------------------------------------------------------

void deliver(cell_base& c, message_ptr m) { c.enqueue(std::move(m)); }

bool try_deliver(cell_base& c, message_ptr m, std::chrono::nanoseconds timeout) {
  const auto deadline = deadline_after(timeout);
  return c.enqueue(std::move(m), &deadline);
}

bool cell_base::enqueue(message_ptr m, const std::chrono::steady_clock::time_point* deadline) {
  // A message for an actor that is gone (before, or while the sender waited for room). A
  // try_tell's is dropped: its sender learns it from the result.
  auto refused_dead = [&] {
    if (alive()) return false;
    if (deadline) return true;
    if (!m->dropped_silently()) system_->dead_letter(*this, m->kind(), errc::actor_dead);
    m->reject(errc::actor_dead);
    return true;
  };
  if (refused_dead()) return false;
  if (capacity_ == 0) {
    size_.fetch_add(1, std::memory_order_relaxed);
  } else {
    for (;;) {
      auto prev = size_.fetch_add(1, std::memory_order_seq_cst);
      if (prev < static_cast<std::int64_t>(capacity_)) break;
      const bool thread_may_wait = tls_current_cell() == nullptr && !tls_on_worker() &&
                                   !(system_->manual != nullptr && system_->manual->firing());
      if (overflow_ == overflow_policy::reject || (deadline && !thread_may_wait)) {
        size_.fetch_sub(1, std::memory_order_relaxed);
        if (deadline) return false;
        system_->dead_letter(*this, m->kind(), errc::mailbox_full);
        m->reject(errc::mailbox_full);
        return false;
      }
      cell_base* sender = tls_current_cell();
      // (An actor of another actor_system is not paused: its system's workers run it, and a
      // cycle across systems could not be seen. Its message gets in, as the timer thread's.)
      if (sender != nullptr && sender->system_ == system_) {
        // An actor never blocks its worker: accept, and pause the sender after this method.
        if (sender != this && !sender->throttled_on_) sender->throttle_on(this);
        break;
      }
      if (sender != nullptr || tls_on_worker()) break;  // nor a worker outside any actor, the timer thread or a node's I/O thread
      if (system_->manual != nullptr) {
        if (system_->manual->firing()) break;  // its timers get in past the capacity, as on the timer thread
        // A test_system runs on the sender's thread: drain here, deterministically, or refuse.
        size_.fetch_sub(1, std::memory_order_seq_cst);
        while (size_.load(std::memory_order_seq_cst) >= static_cast<std::int64_t>(capacity_) && alive()) {
          if (system_->manual->run_something()) continue;
          if (deadline) return false;  // (its clock is virtual: nothing would make room)
          throw error(errc::would_deadlock,
                      "a tell to a full mailbox in a test_system would wait for good: nothing runnable "
                      "drains it (advance the clock, or use overflow_policy::reject)");
        }
        if (refused_dead()) return false;
        continue;
      }
      size_.fetch_sub(1, std::memory_order_seq_cst);
      if (!wait_for_room(deadline)) return false;
      if (refused_dead()) return false;
    }
  }
  normal_.push(m.release());
  if (status_.load(std::memory_order_seq_cst) == idle &&
      status_.exchange(scheduled, std::memory_order_seq_cst) == idle) {
    add_ref();
    system_->schedule(this);
  }
  return true;
}

void cell_base::enqueue_urgent(message_ptr m) noexcept {
  urgent_.push(m.release());
  if (status_.load(std::memory_order_seq_cst) == idle &&
      status_.exchange(scheduled, std::memory_order_seq_cst) == idle) {
    add_ref();
    system_->schedule(this);
    return;
  }
  // Scheduled, running, or parked on a full mailbox: a parked actor must not make its stop
  // wait for another actor's mailbox to drain (other urgent messages, such as a coroutine's
  // resumption, wait as normal ones do: the pause is what bounds the receiver's mailbox).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (stop_requested_.load(std::memory_order_seq_cst) && parked_on_.load(std::memory_order_seq_cst) != nullptr)
    unpark_for_urgent();
}

// ---- draining ---------------------------------------------------------------------

void release_waiters(system_impl& sys, std::vector<cell_extras::waiter>& waiters) noexcept {
  for (auto& w : waiters) {
    if (w.sender) {
      // The throttled sender is still "scheduled" and owns its scheduler reference.
      sys.reschedule(w.sender.get());
    } else {
      w.word->store(1, std::memory_order_release);
      futex_wake_one(*w.word);
    }
  }
  waiters.clear();
}

void cell_base::after_drain(std::int64_t taken) noexcept {
  auto now = size_.fetch_sub(taken, std::memory_order_seq_cst) - taken;
  if (capacity_ != 0 && now <= low_watermark(capacity_) &&
      has_waiters_.load(std::memory_order_seq_cst)) {
    std::vector<cell_extras::waiter> waiters;
    {
      flag_guard g(lock_);
      if (extras_) waiters.swap(extras_->waiters);
      has_waiters_.store(false, std::memory_order_relaxed);
    }
    release_waiters(*system_, waiters);
  }
}

// ---- running ----------------------------------------------------------------------

void cell_base::handle(message* m) noexcept {
  const bool tracing = trace::enabled();
  const char* kind = tracing ? m->kind() : nullptr;
  const auto t0 = tracing ? trace::now_ns() : 0;
  try {
    m->run(*this);
  } catch (...) {
    fail(std::current_exception());
  }
  m->dispose();
  if (tracing) trace::record(type_name(), kind, t0, trace::now_ns() - t0, id_);
}

void cell_base::run_slice(unsigned budget) noexcept {
  if (parked_on_.load(std::memory_order_relaxed) != nullptr) {
    // Released (the receiver drained, or an urgent message came): no longer parked.
    cell_base* receiver;
    {
      std::lock_guard lock(system_->park_mutex);
      receiver = parked_on_.exchange(nullptr, std::memory_order_relaxed);
      set_parked_on(system_->waits, this, nullptr);
    }
    receiver->release();
  }
  auto& current = tls_current_cell();
  cell_base* const outer = current;
  current = this;
  const auto t0 = cycle_clock::now();
  std::int64_t taken = 0;
  unsigned n = 0;
  if (!alive()) {
    reject_all(errc::actor_dead);
  } else {
    while (n < budget) {
      link* l = urgent_.pop();
      if (l == nullptr) {
        if (!accepts_normal()) break;
        l = normal_.pop();
        if (l == nullptr) break;
        // A bounded mailbox frees its slot at once, so that no sender is refused or kept
        // waiting for room that exists (a slice may take many slow messages); unbounded ones
        // settle their count once per slice.
        if (capacity_ != 0) after_drain(1);
        else ++taken;
      }
      handle(static_cast<message*>(l));
      ++n;
      if (throttled_on_ != nullptr) break;
      if (!alive()) {
        reject_all(errc::actor_dead);
        break;
      }
    }
  }
  if (taken != 0) after_drain(taken);
  // Only the worker running this slice writes the counters (the status handoff orders
  // successive slices), so plain stores suffice; readers may see a slightly old value.
  handled_.store(handled_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  busy_ticks_.store(busy_ticks_.load(std::memory_order_relaxed) + (cycle_clock::now() - t0),
                    std::memory_order_relaxed);
  current = outer;

  if (throttled_on_ != nullptr) {
    cell_base* receiver = std::exchange(throttled_on_, nullptr);
    // Parked: the receiver reschedules us once it has drained (or a stop does); the reference
    // to it stays in parked_on_ until then.
    if (alive() && park_on(receiver)) return;
    receiver->release();
  }
  // A dead actor takes normal messages too, to refuse them: one pushed by a sender that saw it
  // alive an instant before would otherwise wait in the lane for good.
  const bool accepts = accepts_normal() || !alive();
  if (!urgent_.empty() || (accepts && !normal_.empty())) {
    system_->reschedule(this);
    return;
  }
  status_.store(idle, std::memory_order_seq_cst);
  // From here on another worker may own the cell: touch only what producers touch.
  if ((urgent_.pushed_since_empty() || (accepts && normal_.pushed_since_empty())) &&
      status_.exchange(scheduled, std::memory_order_seq_cst) == idle) {
    system_->reschedule(this);
    return;
  }
  release();  // the scheduler's reference
}

void cell_base::reject_all(errc why, const char* type) noexcept {
  std::int64_t taken = 0;
  for (;;) {
    link* l = urgent_.pop();
    if (l == nullptr) {
      l = normal_.pop();
      if (l != nullptr) ++taken;
    }
    if (l == nullptr) break;
    auto* m = static_cast<message*>(l);
    if (!m->dropped_silently()) {
      if (type) system_->dead_letter(id_, type, m->kind(), why);
      else system_->dead_letter(*this, m->kind(), why);
    }
    m->reject(why);
    m->dispose();
  }
  if (taken != 0) after_drain(taken);
}

std::uint64_t cell_base::busy_ns() const noexcept {
  return cycle_clock::to_ns(busy_ticks_.load(std::memory_order_relaxed));
}

}  // namespace troupe::detail
