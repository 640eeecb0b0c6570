// The life of an actor: its mailbox protocol, its slices on a worker, failure, restart,
// stop and the down notices.
//
// Scheduling protocol. `status_` is idle or scheduled. A sender pushes its message and, if
// it finds the cell idle, moves it to scheduled and hands it (with a reference) to the
// scheduler. Only the worker running the slice moves it back to idle, and then re-checks
// the queues: a message that arrived in between is either seen by that re-check or its
// sender saw `idle` (sequentially consistent store/load on both sides), so no message is
// ever stranded and a cell never runs on two workers at once.
//
// Bounded mailboxes. `size_` counts normal messages. Past the capacity, the `reject` policy
// refuses; the `wait` policy blocks a sender thread outside the actors, and lets an actor's
// message in but throttles the sending actor: after its current method it parks on the
// receiver's waiter list until the receiver has drained to half its capacity. The waiter
// registration and the drain check use the same store-then-load pattern, so a waiter is
// never forgotten.
//
// Stop. A stop is an urgent message. Handling it destroys suspended coroutines (their asks
// fail with actor_dead), runs on_stop, destroys the object, refuses everything still queued
// (dead letters), releases throttled senders, sends down notices and forgets names. The cell
// itself lives on while references exist, refusing whatever still arrives.

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

#include "cycle_clock.hpp"
#include "sync.hpp"
#include "system.hpp"
#include "troupe/actors/future.hpp"
#include "troupe/core/log.hpp"
#include "troupe/core/trace.hpp"

namespace troupe::detail {
namespace {

class start_message final : public message {
public:
  void run(cell_base& self) override { self.handle_start(); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<start_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }
};

class restart_message final : public message {
public:
  void run(cell_base& self) override { self.handle_restart(); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<restart_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }
};

class stop_message final : public message {
public:
  explicit stop_message(exit_reason why) : why_(why) {}
  void run(cell_base& self) override { self.handle_stop(why_, {}); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<stop_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }  // stopped twice: nothing lost

private:
  exit_reason why_;
};

/// A failure found inside a method (an error without handler in a then() callback that ran
/// inline): the actor fails once that method is done, unless it restarted meanwhile.
class fail_message final : public message {
public:
  fail_message(std::exception_ptr e, std::uint32_t incarnation) : error_(std::move(e)), incarnation_(incarnation) {}
  void run(cell_base& self) override {
    if (self.incarnation() == incarnation_) self.fail(error_);
  }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<fail_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }

private:
  std::exception_ptr error_;
  std::uint32_t incarnation_;
};

class down_message final : public message {
public:
  explicit down_message(down_notice n) : notice_(std::move(n)) {}
  void run(cell_base& self) override { self.handle_down(notice_); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<down_message>{this}; }
  const char* kind() const noexcept override { return "system"; }
  bool dropped_silently() const noexcept override { return true; }

private:
  down_notice notice_;
};

std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

}  // namespace

message_ptr make_start_message() { return message_ptr(std::make_unique<start_message>().release()); }

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

void install_restart_factory(cell_base& c, std::unique_ptr<restart_factory> f) {
  system_access::extras(c).factory = std::move(f);
}

const restart_factory* find_restart_factory(cell_base& c) noexcept {
  return system_access::extras(c).factory.get();
}

void mark_named(cell_base& c) {
  flag_guard g(system_access::lock(c));
  system_access::extras(c).named = true;
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

void cell_base::stop(exit_reason why) noexcept {
  if (!alive()) return;
  stop_requested_.store(true, std::memory_order_seq_cst);
  enqueue_urgent(message_ptr(std::make_unique<stop_message>(why).release()));
}

// ---- bounded mailboxes ----------------------------------------------------------------

namespace {
std::int64_t low_watermark(std::uint32_t capacity) noexcept { return capacity / 2; }
}  // namespace

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

using wait_graph = std::unordered_map<const cell_base*, system_impl::waits_for>;

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

}  // namespace

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

namespace {
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
}  // namespace

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

// ---- coroutines -------------------------------------------------------------------

void cell_base::coroutine_suspended(void* frame) noexcept {
  ++suspended_;
  flag_guard g(lock_);
  extras().frames.push_back(frame);
}

void cell_base::coroutine_finished(void* frame) noexcept {
  std::vector<down_notice> deferred;
  {
    flag_guard g(lock_);
    auto& f = extras().frames;
    f.erase(std::remove(f.begin(), f.end(), frame), f.end());
    if (--suspended_ == 0) deferred.swap(extras_->deferred);
  }
  for (auto& n : deferred) handle_down(n);
}

void cell_base::destroy_frames() noexcept {
  reply_came();  // an await of theirs is over
  cell_extras* ex = extras_if_any();
  if (!ex) return;
  std::vector<void*> frames;
  {
    flag_guard g(lock_);
    frames.swap(ex->frames);
  }
  suspended_ = 0;
  for (void* f : frames) std::coroutine_handle<>::from_address(f).destroy();
}

// ---- lifecycle --------------------------------------------------------------------

void cell_base::fail_soon(std::exception_ptr e) noexcept {
  enqueue_urgent(message_ptr(std::make_unique<fail_message>(std::move(e), incarnation()).release()));
}

void cell_base::handle_start() noexcept {
  if (life_.load(std::memory_order_relaxed) != life_running) return;
  try {
    call_on_start();
  } catch (...) {
    fail(std::current_exception());
  }
}

void cell_base::on_stop_threw(std::exception_ptr e) noexcept {
  log().error("actor {} ({}): on_stop threw (ignored, the actor stops anyway): {}", id_, type_name(), describe(e));
}

void cell_base::fail(std::exception_ptr e) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  std::string what = describe(e);
  cell_extras* ex = extras_if_any();
  const bool may_restart =
      ex && ex->factory && (ex->restart.max_restarts < 0 || ex->restarts < ex->restart.max_restarts);
  if (!may_restart) {
    log().error("actor {} ({}) failed: {}", id_, type_name(), what);
    handle_stop(exit_reason::failed, what);
    return;
  }
  ++ex->restarts;
  ex->failure = what;
  auto delay = ex->next_backoff;
  ex->next_backoff = std::min<std::chrono::nanoseconds>(
      std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(delay.count()) *
                                                         ex->restart.backoff_multiplier)),
      ex->restart.max_backoff);
  // A restart loop must not flood the log: the first few restarts, then every 1,000th.
  if (ex->restarts <= 10 || ex->restarts % 1000 == 0)
    log().warn("actor {} ({}) failed: {}; restart {} in {} ms", id_, type_name(), what, ex->restarts,
               std::chrono::duration_cast<std::chrono::milliseconds>(delay).count());
  // Continuations that still point into this incarnation (a coroutine about to be destroyed, a
  // callback on the old object) are dropped when they arrive.
  incarnation_.fetch_add(1, std::memory_order_relaxed);
  if (life == life_running) {
    destroy_frames();
    call_on_stop();
  }
  destroy_object();
  stop_children();  // the new object makes its own
  life_.store(life_restarting, std::memory_order_release);
  if (delay.count() <= 0) {
    enqueue_urgent(message_ptr(std::make_unique<restart_message>().release()));
  } else {
    add_timer(*system_, delay, std::chrono::nanoseconds{0}, [self = cell_ptr(this)] {
      self->enqueue_urgent(message_ptr(std::make_unique<restart_message>().release()));
      return false;
    });
  }
}

void cell_base::handle_restart() noexcept {
  if (life_.load(std::memory_order_relaxed) != life_restarting) return;
  try {
    recreate_object();
  } catch (...) {
    // The constructor failed: count it as another failure (restart policy applies).
    fail(std::current_exception());
    return;
  }
  life_.store(life_running, std::memory_order_release);
  handle_start();
  // Down notices held while the old incarnation was suspended: the monitors belong to the
  // actor, so the new incarnation hears of them.
  if (life_.load(std::memory_order_relaxed) != life_running) return;  // on_start failed
  std::vector<down_notice> deferred;
  {
    flag_guard g(lock_);
    if (extras_ && suspended_ == 0) deferred.swap(extras_->deferred);
  }
  for (auto& n : deferred) handle_down(n);
}

void cell_base::handle_stop(exit_reason why, const std::string& what) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  if (life == life_running) destroy_frames();
  life_.store(life_dead, std::memory_order_release);
  if (life == life_running) call_on_stop();
  destroy_object();
  reject_all(errc::actor_dead);
  stop_children();

  std::vector<cell_extras::waiter> waiters;
  std::vector<cell_extras::watcher> watchers;
  bool named = false;
  {
    flag_guard g(lock_);
    if (extras_) {
      waiters.swap(extras_->waiters);
      watchers.swap(extras_->watchers);
      extras_->deferred.clear();
      extras_->down_sent = true;
      named = extras_->named;
    }
    // (Kept for a monitor set later, with or without extras until now.)
    if (why == exit_reason::failed) extras().failure = what;
    exit_reason_ = why;
    down_sent_ = true;
  }
  has_waiters_.store(false, std::memory_order_relaxed);
  // Gone from the names and the live count before anyone hears of it: a monitor that fires
  // sees live_actors() without it and may register its name again.
  if (named) system_->forget_names_of(this);
  system_->remove_live(this);
  release_waiters(*system_, waiters);
  if (!watchers.empty()) {
    down_notice n{id_, why, why == exit_reason::failed ? what : std::string()};
    for (auto& w : watchers) {
      if (w.cell) w.cell->enqueue_urgent(message_ptr(std::make_unique<down_message>(n).release()));
      else w.callback->notify(n);
    }
  }
  system_->left_live();
  release();  // the system's reference (the scheduler still holds one while we run)
}

void cell_base::handle_down(const down_notice& n) noexcept {
  const auto life = life_.load(std::memory_order_relaxed);
  if (life == life_dead) return;
  // Held for later while a method is suspended, or while the actor restarts: the monitors
  // belong to the actor, and the next incarnation hears of them (handle_restart).
  if (life == life_restarting || (suspended_ != 0 && !reentrant_)) {
    flag_guard g(lock_);
    extras().deferred.push_back(n);
    return;
  }
  try {
    call_on_down(n);
  } catch (...) {
    fail(std::current_exception());
  }
}

namespace {
/// Watchers that are gone (a stopped actor, a dropped monitor future) leave the list when it
/// has doubled since it was last pruned: an actor watched by many short-lived ones keeps a list
/// as long as its live watchers, not as long as its history. Called under the cell's lock;
/// what is pruned is destroyed by the caller, after the lock.
std::vector<cell_extras::watcher> prune_watchers(cell_extras& ex) {
  std::vector<cell_extras::watcher> gone;
  if (ex.watchers.size() < ex.prune_watchers_at) return gone;
  auto keep = std::partition(ex.watchers.begin(), ex.watchers.end(), [](const cell_extras::watcher& w) {
    return w.cell ? w.cell->alive() : !w.callback->abandoned();
  });
  gone.assign(std::make_move_iterator(keep), std::make_move_iterator(ex.watchers.end()));
  ex.watchers.erase(keep, ex.watchers.end());
  ex.prune_watchers_at = std::max<std::size_t>(16, 2 * ex.watchers.size());
  return gone;
}
}  // namespace

void cell_base::add_watcher(cell_base* watcher) {
  if (!watcher->has_on_down())
    throw std::invalid_argument(std::string("monitor: ") + watcher->type_name() +
                                " has no on_down(const troupe::down_notice&) to receive the notice");
  down_notice late;
  std::vector<cell_extras::watcher> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      gone = prune_watchers(extras());
      extras().watchers.push_back({cell_ptr(watcher), nullptr});
      return;
    }
    late = {id_, exit_reason_, extras_ ? extras_->failure : std::string()};
  }
  watcher->enqueue_urgent(message_ptr(std::make_unique<down_message>(std::move(late)).release()));
}

void send_down_notice(cell_base& watcher, const down_notice& n) {
  watcher.enqueue_urgent(message_ptr(std::make_unique<down_message>(n).release()));
}

void cell_base::adopt_child(cell_base& child) {
  std::vector<cell_ptr> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      auto& ex = extras();
      if (ex.children.size() >= ex.prune_children_at) {  // children that ended leave the list
        auto keep = std::partition(ex.children.begin(), ex.children.end(), [](const cell_ptr& c) { return c->alive(); });
        gone.assign(std::make_move_iterator(keep), std::make_move_iterator(ex.children.end()));
        ex.children.erase(keep, ex.children.end());
        ex.prune_children_at = std::max<std::size_t>(16, 2 * ex.children.size());
      }
      ex.children.emplace_back(&child);
      return;
    }
  }
  child.stop(exit_reason::stopped);
}

void cell_base::stop_children() noexcept {
  std::vector<cell_ptr> children;
  {
    flag_guard g(lock_);
    if (extras_) children.swap(extras_->children);
  }
  for (auto& c : children) c->stop(exit_reason::stopped);
}

void cell_base::on_down(std::unique_ptr<down_callback> f) {
  down_notice late;
  std::vector<cell_extras::watcher> gone;
  {
    flag_guard g(lock_);
    if (!down_sent_) {
      gone = prune_watchers(extras());
      extras().watchers.push_back({cell_ptr(), std::move(f)});
      return;
    }
    late = {id_, exit_reason_, extras_ ? extras_->failure : std::string()};
  }
  f->notify(late);
}

}  // namespace troupe::detail
