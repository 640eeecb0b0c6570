#pragma once
/// @file
/// future<T>: the reply of an ask. One future, three ways to consume it:
///   - `co_await fut` in a coroutine (inside an actor it resumes in that actor's context),
///   - `fut.then(on_value[, on_error])` (inside an actor the callback runs in its context),
///   - `fut.get()` blocking, only outside actors: on an actor thread it throws
///     troupe::error(errc::would_deadlock) instead of deadlocking.
/// when_all(futures) and when_any(futures) combine several into one.
/// task<T>: the return type of coroutine methods and helper coroutines.

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/actors/detail/cell.hpp"

namespace troupe {

template <class T>
class future;
template <class T = void>
class task;
namespace detail {
struct future_access;
}

namespace detail {

struct unit {};
template <class T>
using stored_t = std::conditional_t<std::is_void_v<T>, unit, T>;

class state_base;

struct callback_base {
  virtual ~callback_base() = default;
  /// Runs with the completed state that owns this callback.
  virtual void invoke(state_base& st) noexcept = 0;
};

/// Shared state of a future; also a message, so that the continuation can travel to the
/// awaiting actor through its mailbox without another allocation.
///
/// status_ protocol (one atomic word, RMW only):
///   claimed: a completer won the right to write the result (a reply and a timeout may race)
///   cont:    a continuation is installed (before or after the result)
///   ready:   the result is written and visible
///   waiter:  a thread blocks in wait() and needs a futex wake
/// Exactly one of {completer, continuation setter} sees the other's bit and runs the
/// continuation; exactly one completer writes the result.
class state_base : public message {
public:
  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy_state();
  }
  void dispose() noexcept final { release(); }

  bool ready() const noexcept { return status_.load(std::memory_order_acquire) & st_ready; }
  /// The caller holds the only reference: no future can see the result. (A continuation may:
  /// then() gives its future's reference up once the continuation is installed; see
  /// has_continuation.)
  bool sole_owner() const noexcept { return refs_.load(std::memory_order_acquire) == 1; }
  /// A continuation (then() or co_await) waits for the result. Set before then() releases its
  /// reference, so that sole_owner() && !has_continuation() means nobody will see the result.
  bool has_continuation() const noexcept { return status_.load(std::memory_order_acquire) & st_cont; }

  /// Blocks until ready; refuses on actor threads; drives a test system instead of sleeping.
  void wait();

  /// Installs a coroutine continuation; false when the result is already there.
  bool set_resume(cell_base* cell, std::coroutine_handle<> h) noexcept;
  /// Resumes `h` in `cell` through its mailbox (the result is there already).
  void resume_later(cell_base& cell, std::coroutine_handle<> h) noexcept;
  /// Installs a callback continuation, consuming the caller's reference; runs it now when
  /// the result is already there.
  void set_callback(cell_base* cell, std::unique_ptr<callback_base> cb) noexcept;

  /// Fails the future with `e` unless it is already completed. `node_free` tells whether
  /// this object is in no mailbox right now (so it can carry the continuation itself).
  virtual bool fail(std::exception_ptr e, bool node_free) noexcept = 0;

  /// An asked method of actor `self` threw `e`: the asker gets it, and the actor fails too
  /// when it was spawned with fail_on_ask_exception.
  void fail_in(cell_base& self, std::exception_ptr e) noexcept {
    if (self.fails_on_ask_exception()) self.fail(e);
    fail(std::move(e), true);
  }

  void run(cell_base& self) final;
  /// Runs the continuation in `self`, the awaiting actor (dropped if it restarted since).
  void continue_in(cell_base& self) noexcept;
  void reject(errc why) noexcept final;
  const char* kind() const noexcept final { return phase_ == phase_request ? "ask" : "resume"; }
  bool is_continuation() const noexcept final { return phase_ != phase_request; }

  system_impl* system() const noexcept { return sys_; }
  void set_system(system_impl* s) noexcept { sys_ = s; }
  /// set_system for a promise's state, which nothing in the system completes or fails at its
  /// shutdown: the state keeps the system's runtime (not the actors) alive until it is gone, so
  /// that a get() or a timeout() after the system was destroyed still finds it.
  void keep_system(system_impl* s) noexcept;
  /// The actor an ask went to (identity only: it may be gone), or null.
  const cell_base* asked() const noexcept { return asked_; }
  void set_asked(const cell_base* c) noexcept { asked_ = c; }

protected:
  state_base() noexcept = default;
  ~state_base();

  /// Asks (the request phase) override this; plain states are never queued as requests.
  virtual void run_request(cell_base& self);
  virtual void destroy_state() noexcept = 0;

  bool try_claim() noexcept {
    return (status_.fetch_or(st_claimed, std::memory_order_acq_rel) & st_claimed) == 0;
  }
  /// Publishes the result written after a successful try_claim().
  void publish(bool node_free) noexcept;

  static constexpr std::uint32_t st_claimed = 1;
  static constexpr std::uint32_t st_cont = 2;
  static constexpr std::uint32_t st_ready = 4;
  static constexpr std::uint32_t st_waiter = 8;

  static constexpr std::uint8_t phase_request = 0;
  static constexpr std::uint8_t phase_resume = 1;
  static constexpr std::uint8_t phase_callback = 2;

private:
  void dispatch_continuation(bool node_free) noexcept;
  /// Installs the continuation's target; true when the result was already there.
  bool install(cell_base* cell) noexcept;
  /// Runs the installed callback or resumes the installed coroutine.
  void continue_now() noexcept;

  std::atomic<std::uint32_t> refs_{1};
  std::atomic<std::uint32_t> status_{0};
  std::uint8_t phase_ = phase_request;
  system_impl* sys_ = nullptr;
  bool holds_system_ = false;  // keep_system: sys_ holds a reference for this state
  const cell_base* asked_ = nullptr;
  cell_base* cont_cell_ = nullptr;  // holds a reference while set
  std::uint32_t cont_incarnation_ = 0;  // of cont_cell_ when the continuation was installed
  std::coroutine_handle<> cont_handle_;
  std::unique_ptr<callback_base> cont_callback_;
};

template <class T>
class state : public state_base {
public:
  template <class... A>
  bool complete_value(bool node_free, A&&... a) noexcept {
    if (!try_claim()) return false;
    try {
      result_.template emplace<1>(std::forward<A>(a)...);
    } catch (...) {
      result_.template emplace<2>(std::current_exception());
    }
    publish(node_free);
    return true;
  }
  bool fail(std::exception_ptr e, bool node_free) noexcept final {
    if (!try_claim()) return false;
    result_.template emplace<2>(std::move(e));
    publish(node_free);
    return true;
  }
  /// Moves the value out, or rethrows the error. Only once, after ready().
  T take() {
    if (result_.index() == 2) std::rethrow_exception(std::get<2>(result_));
    if constexpr (!std::is_void_v<T>) return std::move(std::get<1>(result_));
  }

protected:
  void destroy_state() noexcept override { std::unique_ptr<state>{this}; }

public:
  ~state() = default;

private:
  std::variant<std::monostate, stored_t<T>, std::exception_ptr> result_;
};

template <class T>
state<T>* make_state() {
  return std::make_unique<state<T>>().release();
}

template <class T>
struct state_deleter {
  void operator()(state<T>* s) const noexcept { s->release(); }
};
template <class T>
using state_ptr = std::unique_ptr<state<T>, state_deleter<T>>;

/// Arms a timer that fails `st` with errc::timeout after `d`.
void arm_timeout(state_base& st, std::chrono::nanoseconds d);

// ---- task<T> machinery -------------------------------------------------------------

template <class T>
struct task_promise;

/// Receives the end of a root coroutine (a coroutine method run by an actor).
template <class T>
struct root_hook {
  virtual void root_finished(task_promise<T>& p) noexcept = 0;
  virtual void root_abandoned() noexcept = 0;  // the frame was destroyed before it finished
};

struct task_promise_base {
  std::coroutine_handle<> continuation;
  std::exception_ptr error;
  // An awaited task starts inside its awaiter's await_suspend; the first of the two to get here
  // leaves the resumption of the awaiting coroutine to the other. A task that finishes at once
  // thus returns to it without a transfer (no frame per iteration of an awaiting loop, even
  // where the compiler makes no tail call of the transfer, as GCC at -O0).
  enum : std::uint8_t { running, detached, finished_at_once };
  std::atomic<std::uint8_t> start_state{running};
  std::suspend_always initial_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }
};

template <class T>
struct final_awaiter {
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<task_promise<T>> h) noexcept {
    auto& p = h.promise();
    if (p.continuation) {
      if (p.start_state.exchange(task_promise_base::finished_at_once, std::memory_order_acq_rel) ==
          task_promise_base::detached)
        return p.continuation;
      return std::noop_coroutine();  // back into the awaiter's await_suspend, which goes on
    }
    if (p.root) {
      auto* hook = std::exchange(p.root, nullptr);
      hook->root_finished(p);  // may destroy the frame
    }
    return std::noop_coroutine();
  }
  void await_resume() const noexcept {}
};

template <class T>
struct task_promise_value : task_promise_base {
  std::optional<T> value;
  template <class U>
    requires std::convertible_to<U, T>
  void return_value(U&& v) {
    value.emplace(std::forward<U>(v));
  }
  T take() {
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
};
template <>
struct task_promise_value<void> : task_promise_base {
  void return_void() noexcept {}
  void take() {
    if (error) std::rethrow_exception(error);
  }
};

template <class T>
struct task_promise : task_promise_value<T> {
  root_hook<T>* root = nullptr;
  task<T> get_return_object() noexcept;
  final_awaiter<T> final_suspend() noexcept { return {}; }
  ~task_promise() {
    if (root) root->root_abandoned();
  }
};

template <class T>
struct is_task : std::false_type {};
template <class T>
struct is_task<task<T>> : std::true_type {};

template <class R>
struct reply_of : std::type_identity<R> {};
template <class X>
struct reply_of<task<X>> : std::type_identity<X> {};

/// The value a caller receives from a method returning R: task<X> → X, otherwise R.
template <class R>
using reply_t = typename reply_of<R>::type;

}  // namespace detail

/// The reply of an ask. Move-only; consume it once (get, co_await or then).
template <class T>
class [[nodiscard]] future {
public:
  using value_type = T;

  future() noexcept = default;
  explicit future(detail::state_ptr<T> st) noexcept : st_(std::move(st)) {}

  bool valid() const noexcept { return st_ != nullptr; }
  bool ready() const noexcept { return st_ && st_->ready(); }

  /// Blocks until the reply arrives and returns it, or rethrows the method's exception, or
  /// throws troupe::error (actor_dead, timeout, mailbox_full...). Only outside actors.
  T get() {
    check_valid();
    st_->wait();
    auto st = std::move(st_);
    return st->take();
  }

  /// Fails with errc::timeout when no reply has arrived after `d`. The call itself may still
  /// run later; its reply is then discarded.
  future&& timeout(std::chrono::nanoseconds d) && {
    check_valid();
    detail::arm_timeout(*st_, d);
    return std::move(*this);
  }

  /// Calls `on_value(T)` when the reply arrives. Inside an actor it runs in that actor's
  /// context (its state is safe to touch); an error there fails the actor as an exception
  /// from a tell would. Outside actors it runs on the thread that completes the future, and
  /// an error is logged.
  template <class F>
  void then(F&& on_value) && {
    check_valid();
    auto* cell = detail::tls_current_cell();
    auto cb = std::make_unique<value_callback<std::decay_t<F>>>(std::forward<F>(on_value));
    st_.release()->set_callback(cell, std::move(cb));  // hands our reference over
  }

  /// As then(on_value), with errors passed to `on_error(std::exception_ptr)`.
  template <class F, class E>
  void then(F&& on_value, E&& on_error) && {
    check_valid();
    auto* cell = detail::tls_current_cell();
    auto cb = std::make_unique<full_callback<std::decay_t<F>, std::decay_t<E>>>(
        std::forward<F>(on_value), std::forward<E>(on_error));
    st_.release()->set_callback(cell, std::move(cb));  // hands our reference over
  }

  /// Throws std::logic_error for a future consumed already (or never set).
  auto operator co_await() && {
    struct awaiter {
      detail::state_ptr<T> st;
      bool on_itself = false;
      bool await_ready() const noexcept {
        const detail::cell_base* self = detail::tls_current_cell();
        return st->ready() && !(self && self->pause_due());
      }
      bool await_suspend(std::coroutine_handle<> h) noexcept {
        detail::cell_base* self = detail::tls_current_cell();
        const detail::cell_base* asked = st->asked();
        if (self && self->awaits_itself(asked)) {
          on_itself = true;  // refused at once instead of a wait that never ends
          return false;
        }
        if (!st->set_resume(self, h)) {
          // There already. A pause that is due takes effect here all the same (how fast the
          // reply came must not let more messages past a full mailbox): resume through this
          // actor's mailbox, after the pause.
          if (self == nullptr || !self->pause_due()) return false;
          st->resume_later(*self, h);
          return true;
        }
        // The reply resumes this coroutine through the actor's mailbox, so not before this
        // slice ends: the wait is recorded in time.
        if (self) self->awaiting_reply_from(asked);
        return true;
      }
      T await_resume() {
        if (on_itself)
          throw error(errc::would_deadlock,
                      "an actor awaited its own ask: it takes the ask only after the awaiting method "
                      "returns (use .then, a tell, or spawn_options::reentrant)");
        return st->take();
      }
    };
    check_valid();
    return awaiter{std::move(st_)};
  }

private:
  friend struct detail::future_access;
  void check_valid() const {
    if (!st_) throw std::logic_error("troupe::future used after it was consumed (or never set)");
  }

  static void report_unhandled(std::exception_ptr e) noexcept;

  template <class F>
  struct value_callback final : detail::callback_base {
    explicit value_callback(F f) : fn(std::move(f)) {}
    void invoke(detail::state_base& base) noexcept override {
      auto* st = static_cast<detail::state<T>*>(&base);
      try {
        if constexpr (std::is_void_v<T>) {
          st->take();
          fn();
        } else {
          fn(st->take());
        }
      } catch (...) {
        report_unhandled(std::current_exception());
      }
    }
    F fn;
  };

  template <class F, class E>
  struct full_callback final : detail::callback_base {
    full_callback(F f, E e) : fn(std::move(f)), on_error(std::move(e)) {}
    void invoke(detail::state_base& base) noexcept override {
      auto* st = static_cast<detail::state<T>*>(&base);
      std::exception_ptr err;
      try {
        if constexpr (std::is_void_v<T>) {
          st->take();
          fn();
        } else {
          fn(st->take());
        }
        return;
      } catch (...) {
        err = std::current_exception();
      }
      try {
        on_error(err);
      } catch (...) {
        report_unhandled(std::current_exception());
      }
    }
    F fn;
    E on_error;
  };

  detail::state_ptr<T> st_;
};

namespace detail {
/// Inside an actor: fails the actor; outside: logs.
void report_callback_error(std::exception_ptr e) noexcept;
}  // namespace detail

template <class T>
void future<T>::report_unhandled(std::exception_ptr e) noexcept {
  detail::report_callback_error(std::move(e));
}

namespace detail {

struct future_access {
  template <class T>
  static void check(const future<T>& f) {
    f.check_valid();
  }
  template <class T>
  static state_ptr<T> take(future<T>& f) noexcept {
    return std::move(f.st_);
  }
  template <class T>
  static system_impl* system(const future<T>& f) noexcept {
    return f.st_ ? f.st_->system() : nullptr;
  }
  template <class T>
  static const cell_base* asked(const future<T>& f) noexcept {
    return f.st_ ? f.st_->asked() : nullptr;
  }
};

/// Hands each future's result to `on_result(index, state<T>&)`, on the thread that completes
/// it (never in an actor's context: the combined future is what an actor consumes). Throws
/// std::logic_error, consuming nothing, when one of them was consumed already.
template <class T, class F>
void on_each(std::vector<future<T>>& fs, const F& on_result) {
  for (const auto& f : fs) future_access::check(f);
  struct callback final : callback_base {
    callback(F f, std::size_t i) : fn(std::move(f)), index(i) {}
    void invoke(state_base& st) noexcept override { fn(index, static_cast<state<T>&>(st)); }
    F fn;
    std::size_t index;
  };
  for (std::size_t i = 0; i < fs.size(); ++i)
    future_access::take(fs[i]).release()->set_callback(nullptr, std::make_unique<callback>(on_result, i));
}

/// A fresh state for a combined future, that get() waits for as it would for `fs`'s (driving
/// their test_system). Also kept by `keep` (the combiner's share).
template <class R, class T>
future<R> combined(const std::vector<future<T>>& fs, state_ptr<R>& keep) {
  auto* st = make_state<R>();
  for (const auto& f : fs)
    if (auto* sys = future_access::system(f)) {
      st->set_system(sys);
      break;
    }
  // The actor it waits on, for an awaiting actor's checks: itself when it asked itself (an
  // await that could never end is refused), else the first one asked.
  const cell_base* self = tls_current_cell();
  for (const auto& f : fs) {
    const cell_base* asked = future_access::asked(f);
    if (asked && (!st->asked() || asked == self)) st->set_asked(asked);
  }
  st->add_ref();
  keep.reset(st);
  return future<R>(state_ptr<R>(st));
}

}  // namespace detail

/// The values of every future, in their order, once all have arrived: `co_await
/// troupe::when_all(std::move(asks))` gathers a fan-out. Fails with the first error to arrive,
/// without waiting for the rest (which still run; their results are dropped). A vector of
/// future<void> gives a future<void>; none gives an empty vector at once. Consumes the futures;
/// throws std::logic_error (consuming none) when one was consumed already.
template <class T>
auto when_all(std::vector<future<T>> fs) -> future<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> {
  using R = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  struct shared {
    detail::state_ptr<R> out;
    std::vector<std::optional<detail::stored_t<T>>> values;
    std::atomic<std::size_t> left;
  };
  auto sh = std::make_shared<shared>();
  auto result = detail::combined<R>(fs, sh->out);
  if (fs.empty()) {
    sh->out->complete_value(true);
    return result;
  }
  if constexpr (!std::is_void_v<T>) sh->values.resize(fs.size());
  sh->left.store(fs.size(), std::memory_order_relaxed);
  detail::on_each(fs, [sh](std::size_t i, detail::state<T>& st) {
    try {
      if constexpr (std::is_void_v<T>) st.take();
      else sh->values[i].emplace(st.take());
    } catch (...) {
      sh->out->fail(std::current_exception(), true);  // the first error wins; later ones are dropped
    }
    if (sh->left.fetch_sub(1, std::memory_order_acq_rel) != 1 || sh->out->ready()) return;
    if constexpr (std::is_void_v<T>) {
      sh->out->complete_value(true);
    } else {
      std::vector<T> all;
      all.reserve(sh->values.size());
      for (auto& v : sh->values) {
        if (!v) return;  // failed (the failure completed the result)
        all.push_back(std::move(*v));
      }
      sh->out->complete_value(true, std::move(all));
    }
  });
  return result;
}

/// The first value to arrive, with the index of its future: a pair (index, value), or the index
/// alone for future<void>. A failed future does not end the race while another may still
/// succeed; when all fail, it fails with the error of the first future (by index). The others
/// still run; their results are dropped. Throws std::invalid_argument for no futures and
/// std::logic_error (consuming none) when one was consumed already.
template <class T>
auto when_any(std::vector<future<T>> fs)
    -> future<std::conditional_t<std::is_void_v<T>, std::size_t, std::pair<std::size_t, T>>> {
  using R = std::conditional_t<std::is_void_v<T>, std::size_t, std::pair<std::size_t, T>>;
  if (fs.empty()) throw std::invalid_argument("troupe::when_any of no futures would never complete");
  struct shared {
    detail::state_ptr<R> out;
    std::vector<std::exception_ptr> errors;
    std::atomic<std::size_t> failed{0};
  };
  auto sh = std::make_shared<shared>();
  auto result = detail::combined<R>(fs, sh->out);
  sh->errors.resize(fs.size());
  detail::on_each(fs, [sh](std::size_t i, detail::state<T>& st) {
    try {
      if constexpr (std::is_void_v<T>) {
        st.take();
        sh->out->complete_value(true, i);
      } else {
        sh->out->complete_value(true, i, st.take());
      }
      return;
    } catch (...) {
      sh->errors[i] = std::current_exception();
    }
    if (sh->failed.fetch_add(1, std::memory_order_acq_rel) + 1 == sh->errors.size())
      sh->out->fail(sh->errors.front(), true);
  });
  return result;
}

/// The writing end of a future, for a reply that comes after the method that promised it: an
/// actor keeps the promise, hands out its future, and sets it when messages from other actors
/// have arrived (a pipeline stage's step ends when its last gradient is in).
///
///   troupe::promise<int> p;
///   auto f = p.get_future();       // once
///   p.set_value(42);               // or p.set_exception(e); once
///
/// The future is consumed as any other: get() outside actors, co_await or then() inside (a
/// reentrant actor lets other messages in while a coroutine awaits it). A promise destroyed
/// unset fails its future with errc::broken_promise. Move-only; set it from one thread at a
/// time (an actor's own methods qualify).
template <class T>
class promise {
public:
  promise() : st_(detail::make_state<T>()) {
    // Inside an actor (or a test_system's), get() outside it drives that system while waiting.
    if (auto* cell = detail::tls_current_cell()) st_->keep_system(&cell->system());
  }
  /// A promise of `sys` (actor_system::make_promise): get() on its future drives `sys` while
  /// waiting when it is a test_system.
  explicit promise(detail::system_impl* sys) : promise() {
    if (sys) st_->keep_system(sys);
  }
  promise(promise&&) noexcept = default;
  promise& operator=(promise&& other) noexcept {
    if (this != &other) {
      abandon();
      st_ = std::move(other.st_);
      future_taken_ = other.future_taken_;
    }
    return *this;
  }
  ~promise() { abandon(); }

  /// The future this promise completes. Throws std::logic_error when called twice, or after
  /// the promise was set or moved from.
  future<T> get_future() {
    if (!st_ || future_taken_) throw std::logic_error("troupe::promise: get_future() called twice or after set");
    future_taken_ = true;
    st_->add_ref();
    return future<T>(detail::state_ptr<T>(st_.get()));
  }

  /// Completes the future with a value (nothing for promise<void>). Throws std::logic_error
  /// when the promise was already set.
  template <class... A>
  void set_value(A&&... a) {
    auto st = take_state();
    st->complete_value(true, std::forward<A>(a)...);
  }
  /// Completes the future with an error, rethrown where it is consumed. Throws
  /// std::invalid_argument for a null exception_ptr (nothing could be rethrown).
  void set_exception(std::exception_ptr e) {
    if (!e) throw std::invalid_argument("troupe::promise::set_exception: a null exception_ptr");
    auto st = take_state();
    st->fail(std::move(e), true);
  }

  /// False once set (or moved from).
  bool pending() const noexcept { return st_ != nullptr; }

private:
  detail::state_ptr<T> take_state() {
    if (!st_) throw std::logic_error("troupe::promise: already set (or moved from)");
    return std::move(st_);
  }
  void abandon() noexcept {
    // The state is ours alone until it is set, and never sits in a mailbox as a request.
    if (st_) std::exchange(st_, nullptr)->fail(std::make_exception_ptr(error(errc::broken_promise)), true);
  }

  detail::state_ptr<T> st_;
  bool future_taken_ = false;
};

/// A lazily started coroutine: the return type of coroutine methods (`task<int> m()`) and of
/// helpers they co_await. Inside an actor, `co_await` of a future resumes in that actor.
template <class T>
class [[nodiscard]] task {
public:
  using promise_type = detail::task_promise<T>;
  using value_type = T;

  task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  task& operator=(task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~task() {
    if (h_) h_.destroy();
  }

  /// Awaiting a task starts it; the awaiter resumes when it finishes.
  auto operator co_await() && noexcept {
    struct awaiter {
      std::coroutine_handle<promise_type> h;
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> cont) noexcept {
        auto& p = h.promise();
        p.continuation = cont;
        h.resume();  // until it first suspends, or to its end
        return p.start_state.exchange(detail::task_promise_base::detached, std::memory_order_acq_rel) !=
               detail::task_promise_base::finished_at_once;
      }
      T await_resume() { return h.promise().take(); }
    };
    return awaiter{h_};
  }

  /// Hands the coroutine over (the runtime drives root coroutines).
  std::coroutine_handle<promise_type> release() noexcept { return std::exchange(h_, {}); }

private:
  friend struct detail::task_promise<T>;
  explicit task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

namespace detail {
template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
  return task<T>(std::coroutine_handle<task_promise<T>>::from_promise(*this));
}
}  // namespace detail

}  // namespace troupe
