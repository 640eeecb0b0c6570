#pragma once
// Internals behind actor_ref and actor_system that templates need to see. Not part of the
// public API: user code includes <troupe/actors/actor_system.hpp> and never names detail::.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <string>
#include <typeinfo>
#include <utility>

#include "troupe/core/error.hpp"

namespace troupe {

/// Identifies an actor within its system; never reused.
using actor_id = std::uint64_t;

/// Why an actor stopped.
enum class exit_reason : std::uint8_t {
  stopped,   ///< stop() was called (by anyone, or by the actor itself)
  failed,    ///< an exception escaped a method with nobody to receive it, restarts exhausted
  shutdown,  ///< the actor system shut down
  node_lost, ///< the node the actor lived on stopped answering (remote actors)
};

/// What a monitor receives when the actor it watches is gone for good.
struct down_notice {
  actor_id id = 0;
  exit_reason reason = exit_reason::stopped;
  std::string what;  ///< the failure's message when reason == failed
};

/// Ray-style restarts: an actor that fails is re-created from its original constructor
/// arguments, at most `max_restarts` times (-1: forever), after a growing backoff.
/// Existing actor_refs reach the new instance; messages already queued are kept.
struct restart_policy {
  int max_restarts = 0;
  std::chrono::milliseconds backoff{0};  ///< delay before the first restart
  double backoff_multiplier = 2.0;       ///< each further restart waits this much longer
  std::chrono::milliseconds max_backoff{10'000};
};

/// What a sender experiences when a bounded mailbox is full.
enum class overflow_policy : std::uint8_t {
  /// The sender waits (the default). A thread outside the actors blocks in tell/ask until
  /// the mailbox has room. An actor's message is accepted, and the sending actor takes no
  /// further message until the receiver has drained to half its capacity: memory stays
  /// bounded by capacity plus what each sender sends in one method call, no worker thread
  /// blocks, and nothing is lost.
  wait,
  /// The message is refused: an ask fails with errc::mailbox_full, a tell goes to the dead
  /// letters (counted and logged).
  reject,
};

/// Per-actor options for actor_system::spawn.
struct spawn_options {
  std::size_t mailbox_capacity = 0;  ///< 0: unbounded
  overflow_policy overflow = overflow_policy::wait;
  restart_policy restart{};
  /// Let other messages in while a coroutine method is suspended. Off by default: then an
  /// actor's methods never interleave, at the price that two actors awaiting each other's
  /// replies deadlock (as in any non-reentrant actor model); on: no such deadlock, but state
  /// may change across a co_await.
  bool reentrant = false;
  /// Also treat an exception escaping an asked method as a failure of the actor (restart
  /// policy applies). The asker receives the exception either way.
  bool fail_on_ask_exception = false;
  /// An actor spawned on another node (spawn_on) lives as long as the node that spawned it:
  /// when that node is lost or leaves the cluster, the actor is stopped (Ray's owner
  /// fate-sharing). A detached actor lives on until stopped (or its own node goes).
  bool detached = false;
};

namespace detail {

class cell_base;
class system_impl;
struct cell_extras;

struct down_callback {
  virtual ~down_callback() = default;
  virtual void notify(const down_notice& n) noexcept = 0;
  /// Nobody would hear the notice any more (e.g. its future was dropped): it may be pruned.
  virtual bool abandoned() const noexcept { return false; }
};

/// `d` in nanoseconds, saturated: a wait too long for the clock is nanoseconds::max() (no limit).
template <class Rep, class Period>
constexpr std::chrono::nanoseconds saturated_ns(std::chrono::duration<Rep, Period> d) noexcept {
  if (d <= d.zero()) return std::chrono::nanoseconds::zero();
  if (std::chrono::duration<double>(d).count() >= 9.0e9) return std::chrono::nanoseconds::max();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d);
}

/// How many actor objects this thread is constructing now (a constructor runs on its
/// spawner's thread, as the spawner: this_actor::spawn_child refuses it).
inline int& tls_constructing() noexcept {
  thread_local int n = 0;
  return n;
}

/// The actor running on this thread, if any.
inline cell_base*& tls_current_cell() noexcept {
  thread_local cell_base* current = nullptr;
  return current;
}
/// True on a thread of the runtime that must never block: a scheduler worker (inside an actor
/// or not), the timer thread and a node's I/O thread.
inline bool& tls_on_worker() noexcept {
  thread_local bool on_worker = false;
  return on_worker;
}

/// Small-block recycling for messages and cells (see src/message_pool.cpp).
void* pool_allocate(std::size_t n);
void pool_free(void* p, std::size_t n) noexcept;

/// Gives a class the runtime's pooled allocation.
struct pooled {
  static void* operator new(std::size_t n) { return pool_allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { pool_free(p, n); }
  // Over-aligned actor classes and arguments (alignas(64) and up) bypass the pool.
  static void* operator new(std::size_t n, std::align_val_t a) { return ::operator new(n, a); }
  static void operator delete(void* p, std::size_t, std::align_val_t a) noexcept { ::operator delete(p, a); }
};

struct link {
  std::atomic<link*> next{nullptr};
};

/// A unit of work for one actor. Ownership travels with message_ptr; dispose() ends it.
class message : public link, public pooled {
public:
  /// Delivered: runs in the receiving actor's context.
  virtual void run(cell_base& self) = 0;
  /// Never delivered (dead receiver, refused by a full mailbox, shutdown).
  virtual void reject(errc why) noexcept = 0;
  virtual void dispose() noexcept = 0;
  /// A short static label for traces: "tell", "ask", "resume", "system".
  virtual const char* kind() const noexcept = 0;
  /// Continuations (coroutine resumptions, then-callbacks) run even while the actor has a
  /// suspended coroutine; they are dropped silently when the actor is dead.
  virtual bool is_continuation() const noexcept { return false; }
  /// Dropped without a dead letter when the actor is dead: continuations, and down notices (a
  /// watcher that is gone has nothing left to learn).
  virtual bool dropped_silently() const noexcept { return is_continuation(); }

protected:
  ~message() = default;
};

struct message_disposer {
  void operator()(message* m) const noexcept { m->dispose(); }
};
using message_ptr = std::unique_ptr<message, message_disposer>;

/// Vyukov's intrusive multi-producer single-consumer queue: push is one atomic exchange
/// (wait-free), pop is consumer-only. A push that has exchanged the head but not yet linked
/// its node makes pop() return nullptr while ready() is false and empty() is false.
class mpsc_queue {
public:
  mpsc_queue() noexcept : head_(&sentinel_), tail_(&sentinel_) {}
  mpsc_queue(const mpsc_queue&) = delete;
  mpsc_queue& operator=(const mpsc_queue&) = delete;

  /// @threadsafe
  void push(link* n) noexcept {
    n->next.store(nullptr, std::memory_order_relaxed);
    link* prev = head_.exchange(n, std::memory_order_acq_rel);
    prev->next.store(n, std::memory_order_release);
  }

  /// Only the consumer may call this.
  link* pop() noexcept {
    link* tail = tail_;
    link* next = tail->next.load(std::memory_order_acquire);
    if (tail == &sentinel_) {
      if (next == nullptr) return nullptr;
      tail_ = next;
      tail = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    if (tail != head_.load(std::memory_order_acquire)) return nullptr;  // a push is in flight
    push(&sentinel_);
    next = tail->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    return nullptr;
  }

  /// Nothing queued and no push in flight. Only the consumer may call this.
  bool empty() const noexcept {
    return tail_ == &sentinel_ && sentinel_.next.load(std::memory_order_acquire) == nullptr &&
           head_.load(std::memory_order_seq_cst) == &sentinel_;
  }

  /// True when something was pushed since the queue was last seen empty() by its consumer.
  /// Reads only the producers' side, so any thread may call it. @threadsafe
  bool pushed_since_empty() const noexcept {
    return head_.load(std::memory_order_seq_cst) != &sentinel_;
  }

private:
  std::atomic<link*> head_;  // producers
  link* tail_;               // consumer
  link sentinel_;  // the dummy node of Vyukov's queue: never a message
};

/// The runtime half of an actor: its mailbox, its scheduling state and its lifecycle.
/// The typed half (the object itself) is cell<T>. Reference-counted; actor_ref, the
/// scheduler while it is queued, and the system while it is alive each hold a reference.
class cell_base : public pooled {
public:
  cell_base(const cell_base&) = delete;
  cell_base& operator=(const cell_base&) = delete;

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy_cell();
  }

  actor_id id() const noexcept { return id_; }
  system_impl& system() const noexcept { return *system_; }
  /// False once the actor has stopped for good. @threadsafe
  bool alive() const noexcept { return life_.load(std::memory_order_acquire) != life_dead; }
  /// Counts the restarts that destroyed the object and its suspended coroutines: a
  /// continuation installed before a restart must not run after it.
  std::uint32_t incarnation() const noexcept { return incarnation_.load(std::memory_order_relaxed); }

  /// Queues a normal message, applying the mailbox's capacity policy. @threadsafe
  /// With a `deadline` (try_tell), a full mailbox is waited for until then by a thread outside
  /// the actors and not at all elsewhere (no sending actor is paused): false when the message
  /// did not go in (dropped: no dead letter), or the actor is dead.
  bool enqueue(message_ptr m, const std::chrono::steady_clock::time_point* deadline = nullptr);
  /// Queues a system message or continuation: never refused, overtakes normal messages.
  /// @threadsafe
  void enqueue_urgent(message_ptr m) noexcept;

  /// Runs up to `budget` messages. Only the scheduler calls this, with the cell scheduled.
  void run_slice(unsigned budget) noexcept;

  /// Asks the actor to stop: an urgent message, so it overtakes queued work. @threadsafe
  void stop(exit_reason why) noexcept;

  /// Called from inside the actor when a method failed with nobody to tell.
  void fail(std::exception_ptr e) noexcept;
  /// Fails the actor once the message it runs now is done (fail() destroys the object: not
  /// from inside one of its methods).
  void fail_soon(std::exception_ptr e) noexcept;

  /// The number of normal messages waiting. @threadsafe
  std::int64_t mailbox_depth() const noexcept { return size_.load(std::memory_order_relaxed); }
  std::uint64_t messages_handled() const noexcept {
    return handled_.load(std::memory_order_relaxed);
  }
  /// Time spent running this actor's messages.
  std::uint64_t busy_ns() const noexcept;
  bool fails_on_ask_exception() const noexcept { return fail_on_ask_exception_; }

  /// Root coroutines (methods that are coroutines) report suspension and completion here.
  void coroutine_suspended(void* frame) noexcept;
  void coroutine_finished(void* frame) noexcept;

  /// Sends `watcher` (an actor with on_down) a down notice when this actor is gone for good;
  /// at once when it is gone already. @threadsafe
  void add_watcher(cell_base* watcher);
  /// True when the class has on_down (so it may monitor others).
  bool receives_down_notices() const noexcept { return has_on_down(); }
  /// Runs `f(notice)` on the thread that ends this actor (or now when it is gone).
  /// @threadsafe
  void on_down(std::unique_ptr<down_callback> f);
  /// Makes `child` stop when this actor stops or restarts (this_actor::spawn_child); stops it
  /// at once when this actor is gone already.
  void adopt_child(cell_base& child);

  virtual const char* type_name() const noexcept = 0;
  virtual const std::type_info& type() const noexcept = 0;
  virtual void* object() noexcept = 0;

  // Intrusive list of the system's live actors (guarded by the system's lock).
  cell_base* live_prev_ = nullptr;
  cell_base* live_next_ = nullptr;

protected:
  cell_base(system_impl& sys, actor_id id, const spawn_options& opts);
  virtual ~cell_base();

  // The typed half implements these; each runs in the actor's context.
  virtual void call_on_start() = 0;
  virtual void call_on_stop() noexcept = 0;
  virtual void call_on_down(const down_notice& n) = 0;
  virtual bool has_on_down() const noexcept = 0;
  virtual void destroy_object() noexcept = 0;
  virtual void recreate_object() = 0;  // throws when the constructor throws
  virtual void destroy_cell() noexcept = 0;

  /// Sets the restart factory (only when the restart policy allows restarts).
  void set_restart_policy(const restart_policy& p);

  friend class system_impl;
  friend struct system_access;

public:
  // Lifecycle states, written only in the actor's context.
  static constexpr std::uint8_t life_running = 0;
  static constexpr std::uint8_t life_restarting = 1;
  static constexpr std::uint8_t life_dead = 2;

  // Used by system messages (start, restart, stop) implemented in the runtime.
  void handle_start() noexcept;
  void handle_restart() noexcept;
  void handle_stop(exit_reason why, const std::string& what) noexcept;
  void handle_down(const down_notice& n) noexcept;
  void throttle_on(cell_base* receiver) noexcept {
    receiver->add_ref();
    throttled_on_ = receiver;
  }
  /// Registers a throttled sender; false when the mailbox has already drained.
  bool add_waiter(cell_base* sender) noexcept;
  /// Takes a throttled sender off the waiter list; false when it was not on it.
  bool remove_waiter(cell_base* sender) noexcept;
  /// Blocks a thread outside the actors until this bounded mailbox has room (or `deadline`
  /// passes: false).
  bool wait_for_room(const std::chrono::steady_clock::time_point* deadline) noexcept;
  /// True when a coroutine of this actor awaiting `target`'s reply would wait for good: the
  /// actor itself, which takes no message while one of its non-reentrant methods is suspended.
  bool awaits_itself(const cell_base* target) const noexcept { return target == this && !reentrant_; }
  /// A tell of the running method went into a full mailbox past its capacity: this actor
  /// pauses when the method returns or its coroutine next suspends.
  bool pause_due() const noexcept { return throttled_on_ != nullptr; }
  /// A coroutine of this actor is about to await a reply of `target` (null: of no actor). A
  /// non-reentrant actor takes no message and sends no reply until it comes, so no actor that
  /// `target` waits for, directly or through others, may be paused on its mailbox meanwhile
  /// (one paused already runs on): none of them would run again.
  /// (Called once the reply is known not to be there; the resumption forgets it, reply_came.)
  void awaiting_reply_from(const cell_base* target) noexcept {
    if (target != nullptr && target != this && !reentrant_) note_awaiting(target);
  }
  /// Logs an exception that escaped on_stop.
  void on_stop_threw(std::exception_ptr e) noexcept;
  void stop_children() noexcept;
  /// The awaited reply came (or was there already), or the awaiting coroutine is gone.
  void reply_came() noexcept {
    if (awaiting_) forget_awaiting();
  }

private:
  bool accepts_normal() const noexcept {
    return life_.load(std::memory_order_relaxed) == life_running &&
           (suspended_ == 0 || reentrant_);
  }
  void handle(message* m) noexcept;
  void after_drain(std::int64_t taken) noexcept;
  /// Fails every queued message (dead letters); `type` names the actor in the log (null: its
  /// type_name(), which the destructor cannot call any more).
  void reject_all(errc why, const char* type = nullptr) noexcept;
  cell_extras& extras();  // allocated on first use, under lock_
  cell_extras* extras_if_any() noexcept;  // the extras when there are any (takes lock_)

  static constexpr std::uint32_t idle = 0;
  static constexpr std::uint32_t scheduled = 1;

  std::atomic<std::uint32_t> refs_{1};
  std::atomic<std::uint32_t> status_{idle};
  mpsc_queue normal_;
  mpsc_queue urgent_;
  std::atomic<std::int64_t> size_{0};
  system_impl* system_;
  actor_id id_;
  std::atomic<std::uint64_t> handled_{0};
  std::atomic<std::uint64_t> busy_ticks_{0};  // cycle-counter ticks; written by the running worker
  std::uint32_t capacity_;
  std::uint32_t suspended_ = 0;  // root coroutines suspended (actor context only)
  std::atomic<std::uint8_t> life_{life_running};
  std::atomic<std::uint32_t> incarnation_{0};
  overflow_policy overflow_;
  bool reentrant_;
  bool fail_on_ask_exception_;
  std::atomic<bool> has_waiters_{false};
  bool down_sent_ = false;                    // guarded by lock_
  exit_reason exit_reason_ = exit_reason::stopped;  // guarded by lock_
  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;  // guards extras_
  cell_base* throttled_on_ = nullptr;         // actor context only
  // The receiver this actor is parked on (holding a reference), until it runs again; written
  // in the actor's context under system_impl::park_mutex, read by others under it.
  std::atomic<cell_base*> parked_on_{nullptr};
  std::atomic<bool> stop_requested_{false};  // set by stop(): unparks
  // A suspended method's await is recorded in system_impl::waits (actor context only).
  bool awaiting_ = false;
  bool park_on(cell_base* receiver) noexcept;
  void unpark_for_urgent() noexcept;
  void note_awaiting(const cell_base* target) noexcept;  // awaiting_reply_from, not reentrant
  void forget_awaiting() noexcept;
  void destroy_frames() noexcept;  // of the suspended coroutines, on a stop or restart
  std::unique_ptr<cell_extras> extras_;
};

/// The runtime's access to a cell's private parts.
struct system_access {
  static cell_extras& extras(cell_base& c) { return c.extras(); }
  static cell_extras* extras_if_any(cell_base& c) noexcept { return c.extras_if_any(); }
  static std::atomic_flag& lock(cell_base& c) noexcept { return c.lock_; }
};

/// Intrusive smart pointer for cells.
class cell_ptr {
public:
  cell_ptr() noexcept = default;
  /// Adopts one reference.
  static cell_ptr adopt(cell_base* c) noexcept {
    cell_ptr p;
    p.c_ = c;
    return p;
  }
  explicit cell_ptr(cell_base* c) noexcept : c_(c) {
    if (c_) c_->add_ref();
  }
  cell_ptr(const cell_ptr& o) noexcept : c_(o.c_) {
    if (c_) c_->add_ref();
  }
  cell_ptr(cell_ptr&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  cell_ptr& operator=(cell_ptr o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~cell_ptr() {
    if (c_) c_->release();
  }
  cell_base* get() const noexcept { return c_; }
  cell_base* operator->() const noexcept { return c_; }
  cell_base& operator*() const noexcept { return *c_; }
  explicit operator bool() const noexcept { return c_ != nullptr; }
  cell_base* detach() noexcept { return std::exchange(c_, nullptr); }

private:
  cell_base* c_ = nullptr;
};

std::string demangle(const char* mangled);

/// T's name, for logs and traces. Never destroyed: the trace file is written at exit, after
/// function-local statics are gone.
template <class T>
const char* type_name_of() {
  static const std::string* const name = new std::string(demangle(typeid(T).name()));
  return name->c_str();
}

template <class T>
concept has_on_start_hook = requires(T& t) { t.on_start(); };
template <class T>
concept has_on_stop_hook = requires(T& t) { t.on_stop(); };
template <class T>
concept has_on_down_hook = requires(T& t, const down_notice& n) { t.on_down(n); };

/// Stores the constructor arguments of a restartable actor.
struct restart_factory {
  virtual ~restart_factory() = default;
  virtual void construct(void* storage) const = 0;
};

void install_restart_factory(cell_base& c, std::unique_ptr<restart_factory> f);
const restart_factory* find_restart_factory(cell_base& c) noexcept;

template <class T>
class cell final : public cell_base {
public:
  template <class... Args>
  cell(system_impl& sys, actor_id id, const spawn_options& opts, Args&&... args)
      : cell_base(sys, id, opts) {
    if (opts.restart.max_restarts != 0) {
      if constexpr ((std::is_copy_constructible_v<std::decay_t<Args>> && ...)) {
        install_restart_factory(*this, std::make_unique<factory<std::decay_t<Args>...>>(args...));
      } else {
        throw std::invalid_argument(
            "a restart policy re-creates the actor from copies of its constructor arguments: "
            "make them copyable or spawn without restarts");
      }
    }
    construct_in(storage_, std::forward<Args>(args)...);
    constructed_ = true;
  }

  T& get() noexcept { return *std::launder(reinterpret_cast<T*>(storage_)); }

  /// Constructs T with parentheses, which also initializes aggregates from leading members
  /// (the rest are value-initialized, as spawning with fewer arguments intends).
  template <class... A>
  static void construct_in(void* storage, A&&... a) {
    struct counted {
      counted() { ++tls_constructing(); }
      ~counted() { --tls_constructing(); }
    } constructing;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
    ::new (storage) T(std::forward<A>(a)...);
#pragma GCC diagnostic pop
  }
  void* object() noexcept override { return &get(); }
  const char* type_name() const noexcept override { return type_name_of<T>(); }
  const std::type_info& type() const noexcept override { return typeid(T); }

private:
  template <class... Stored>
  struct factory final : restart_factory {
    template <class... A>
    explicit factory(const A&... a) : args(a...) {}
    void construct(void* storage) const override {
      std::apply([&](const Stored&... a) { construct_in(storage, a...); }, args);
    }
    std::tuple<Stored...> args;
  };

public:
  ~cell() override { destroy_object(); }

private:
  // A hook's result would be dropped: a coroutine hook (returning a task) would never run.
  template <class R>
  static constexpr void check_hook_result() {
    static_assert(std::is_void_v<R>,
                  "on_start, on_stop and on_down must return void (a coroutine hook would never run: "
                  "start such work from the hook with a tell to the actor itself)");
  }
  void call_on_start() override {
    if constexpr (has_on_start_hook<T>) {
      check_hook_result<decltype(get().on_start())>();
      get().on_start();
    }
  }
  void call_on_stop() noexcept override {
    if constexpr (has_on_stop_hook<T>) {
      check_hook_result<decltype(get().on_stop())>();
      try {
        get().on_stop();
      } catch (...) {
        on_stop_threw(std::current_exception());  // logged; the actor is stopping anyway
      }
    }
  }
  void call_on_down(const down_notice& n) override {
    if constexpr (has_on_down_hook<T>) {
      check_hook_result<decltype(get().on_down(n))>();
      get().on_down(n);
    }
  }
  bool has_on_down() const noexcept override { return has_on_down_hook<T>; }
  void destroy_object() noexcept override {
    if (constructed_) {
      constructed_ = false;
      get().~T();
    }
  }
  void recreate_object() override {
    destroy_object();
    find_restart_factory(*this)->construct(storage_);
    constructed_ = true;
  }
  void destroy_cell() noexcept override { std::unique_ptr<cell>{this}; }

  bool constructed_ = false;
  alignas(T) std::byte storage_[sizeof(T)];
};

}  // namespace detail
}  // namespace troupe
