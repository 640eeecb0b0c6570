// Bounded mailboxes: senders waiting for room, and actors paused on a full mailbox.
//
// Bounded mailboxes. `size_` counts normal messages. Past the capacity, the `reject` policy
// refuses; the `wait` policy blocks a sender thread outside the actors, and lets an actor's
// message in but throttles the sending actor: after its current method it parks on the
// receiver's waiter list until the receiver has drained to half its capacity. The waiter
// registration and the drain check use the same store-then-load pattern, so a waiter is
// never forgotten. (cell.cpp applies the policy in enqueue and releases the waiters in
// after_drain.)
//
// A pause that would close a loop of actors, each waiting for the next one's mailbox to drain
// or for its reply, is not taken (park_on), or is released when an await closes it
// (note_awaiting); system_impl::waits holds what each actor waits for.

#include <algorithm>
#include <chrono>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "cell_bounded.hpp"
#include "sync.hpp"
#include "system.hpp"

namespace troupe::detail {

bool cell_base::add_waiter(cell_base* sender) noexcept {
  flag_guard g(lock_);
  has_waiters_.store(true, std::memory_order_seq_cst);
  if (size_.load(std::memory_order_seq_cst) <= low_watermark(capacity_) || !alive()) {
    if (!extras_ || extras_->waiters.empty()) has_waiters_.store(false, std::memory_order_relaxed);
    return false;
  }
  extras().waiters.push_back({cell_ptr(sender), nullptr});
  return true;
}

bool cell_base::remove_waiter(cell_base* sender) noexcept {
  cell_ptr found;  // released after the lock
  flag_guard g(lock_);
  if (!extras_) return false;
  auto& w = extras_->waiters;
  auto it = std::find_if(w.begin(), w.end(), [sender](const cell_extras::waiter& x) { return x.sender.get() == sender; });
  if (it == w.end()) return false;
  found = std::move(it->sender);
  w.erase(it);
  return true;
}

namespace {

// The actors on a chain of waits from `from` to `to` (both included), or none when no chain
// leads there. Breadth-first over what each actor waits for (at most two others).
std::vector<const cell_base*> wait_path(const wait_graph& waits, const cell_base* from,
                                        const cell_base* to) {
  struct step {
    const cell_base* cell;
    std::size_t before;  // index of the actor that waits for this one
  };
  std::vector<step> seen{{from, 0}};
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (seen[i].cell == to) {
      std::vector<const cell_base*> path;
      for (std::size_t k = i;; k = seen[k].before) {
        path.push_back(seen[k].cell);
        if (k == 0) break;
      }
      std::reverse(path.begin(), path.end());
      return path;
    }
    auto it = waits.find(seen[i].cell);
    if (it == waits.end()) continue;
    for (const cell_base* next : {static_cast<const cell_base*>(it->second.parked_on), it->second.awaits})
      if (next != nullptr && std::none_of(seen.begin(), seen.end(), [next](const step& s) { return s.cell == next; }))
        seen.push_back({next, i});
  }
  return {};
}

}  // namespace

void set_parked_on(wait_graph& waits, const cell_base* c, cell_base* receiver) {
  if (receiver != nullptr) {
    waits[c].parked_on = receiver;
    return;
  }
  auto it = waits.find(c);
  if (it == waits.end()) return;
  it->second.parked_on = nullptr;
  if (it->second.awaits == nullptr) waits.erase(it);
}


bool cell_base::park_on(cell_base* receiver) noexcept {
  std::lock_guard lock(system_->park_mutex);
  auto& waits = system_->waits;
  try {
    // Parking would close a loop of actors each waiting for the next one: for its mailbox to
    // drain (two actors filling each other's), or for its reply (an actor that awaits this
    // one's, or one that this one is paused on). None would run again. This one runs on
    // instead; its message is in, one past the receiver's capacity.
    if (!wait_path(waits, receiver, this).empty()) return false;
    set_parked_on(waits, this, receiver);
  } catch (const std::bad_alloc&) {
    return false;  // unrecorded, the pause could not be checked: none is taken
  }
  // A stop that came meanwhile runs first: either it is seen here, or its sender sees
  // parked_on_ (stop: flag, push, fence, load) and unparks this cell once the mutex is free.
  parked_on_.store(receiver, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (stop_requested_.load(std::memory_order_seq_cst) || !receiver->add_waiter(this)) {  // (false: drained already)
    parked_on_.store(nullptr, std::memory_order_relaxed);
    set_parked_on(waits, this, nullptr);
    return false;
  }
  // On the waiter list: the receiver may run this cell on another worker at any moment, so
  // nothing of it is touched from here on.
  return true;
}

void cell_base::note_awaiting(const cell_base* target) noexcept {
  if (!system_->has_bounded.load(std::memory_order_relaxed)) return;  // nothing pauses
  std::lock_guard lock(system_->park_mutex);
  auto& waits = system_->waits;
  std::vector<const cell_base*> loop;
  try {
    waits[this].awaits = target;
    awaiting_ = true;
    loop = wait_path(waits, target, this);
  } catch (const std::bad_alloc&) {
    // Unrecorded: a loop this await closes is not seen (as without bounded mailboxes).
  }
  // The await closes a loop: one actor on it that is parked runs on. (A cell on a waiter list
  // is still "scheduled" and owns its scheduler reference, so it is alive; so is the
  // receiver it holds a reference to.)
  for (std::size_t k = 0; k + 1 < loop.size(); ++k) {
    auto it = waits.find(loop[k]);
    if (it == waits.end() || it->second.parked_on != loop[k + 1]) continue;
    auto* parked = const_cast<cell_base*>(loop[k]);
    if (it->second.parked_on->remove_waiter(parked)) system_->reschedule(parked);
    break;
  }
}

void cell_base::forget_awaiting() noexcept {
  awaiting_ = false;
  std::lock_guard lock(system_->park_mutex);
  auto& waits = system_->waits;
  auto it = waits.find(this);
  if (it == waits.end()) return;
  it->second.awaits = nullptr;
  if (it->second.parked_on == nullptr) waits.erase(it);
}

void cell_base::unpark_for_urgent() noexcept {
  std::lock_guard lock(system_->park_mutex);
  cell_base* receiver = parked_on_.load(std::memory_order_relaxed);
  // Still on the receiver's list: take it off and run (the cell is still "scheduled" and owns
  // its scheduler reference). Off the list already: the receiver has released it.
  if (receiver != nullptr && receiver->remove_waiter(this)) system_->reschedule(this);
}

bool cell_base::wait_for_room(const std::chrono::steady_clock::time_point* deadline) noexcept {
  std::atomic<std::uint32_t> word{0};
  {
    flag_guard g(lock_);
    has_waiters_.store(true, std::memory_order_seq_cst);
    if (size_.load(std::memory_order_seq_cst) <= low_watermark(capacity_) || !alive()) {
      if (!extras_ || extras_->waiters.empty()) has_waiters_.store(false, std::memory_order_relaxed);
      return true;
    }
    extras().waiters.push_back({cell_ptr(), &word});
  }
  while (word.load(std::memory_order_acquire) == 0) {
    if (deadline == nullptr) {
      futex_wait(word, 0);
      continue;
    }
    const auto left = *deadline - std::chrono::steady_clock::now();
    if (left > std::chrono::steady_clock::duration::zero()) {
      futex_wait_for(word, 0, std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
      continue;
    }
    // Time is up: leave the list, unless a release took this waiter off it already (then its
    // word is about to be set, and must be, before this frame goes).
    {
      flag_guard g(lock_);
      auto& waiters = extras().waiters;
      auto it = std::find_if(waiters.begin(), waiters.end(), [&](const cell_extras::waiter& w) { return w.word == &word; });
      if (it != waiters.end()) {
        waiters.erase(it);
        if (waiters.empty()) has_waiters_.store(false, std::memory_order_relaxed);
        return false;
      }
    }
    while (word.load(std::memory_order_acquire) == 0) futex_wait(word, 0);
  }
  return true;
}

}  // namespace troupe::detail
