#pragma once
/// @file
/// actor_ref<T>: a typed, copyable address of an actor of class T.
///
///   ref.tell(&T::method, args...);            // fire and forget, in send order per sender
///   future<R> f = ref.ask(&T::method, args...);  // R is the method's result (X for task<X>)
///
/// Arguments are moved (or copied) into the message; the method runs later on the actor's
/// worker, never concurrently with another method of the same actor. In process, nothing is
/// serialized. Any callable `f(T&, args...)` works where a member function pointer does.
///
/// A ref may also point to an actor on another node (spawn_on, a cluster-wide lookup): the
/// same calls then encode the arguments with their codecs and travel over TCP (remote.hpp);
/// only the methods listed in TROUPE_REMOTE(T, ...) may be called that way.

#include <concepts>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "troupe/actors/detail/cell.hpp"
#include "troupe/actors/detail/remote_handle.hpp"
#include "troupe/actors/future.hpp"

namespace troupe {

namespace detail {

template <class T, class M, class... Args>
using method_result_t = std::invoke_result_t<M, T&, Args...>;

/// Starts a root coroutine in `self`; the hook hears of its end.
template <class X, class Hook>
void start_root(task<X> t, Hook* hook, cell_base& self) {
  auto h = t.release();
  h.promise().root = hook;
  hook->self_ = &self;
  hook->running_sync_ = true;
  h.resume();
  if (!hook->finished_) {
    hook->running_sync_ = false;
    self.coroutine_suspended(h.address());
  }
}

/// Bookkeeping shared by the messages that may drive a root coroutine.
struct root_bookkeeping {
  cell_base* self_ = nullptr;
  bool running_sync_ = false;
  bool finished_ = false;

  template <class X>
  void end_root(task_promise<X>& p) noexcept {
    finished_ = true;
    auto h = std::coroutine_handle<task_promise<X>>::from_promise(p);
    if (!running_sync_) self_->coroutine_finished(h.address());
  }
};

/// Calls the method with the stored arguments (moved: a message is delivered once).
template <class T, class M, class... Args>
struct stored_call {
  template <class... A>
  explicit stored_call(M m, A&&... a) : method(m), args(std::forward<A>(a)...) {}
  decltype(auto) operator()(T& obj) {
    return std::apply([&](Args&... a) -> decltype(auto) { return std::invoke(method, obj, std::move(a)...); },
                      args);
  }
  M method;
  std::tuple<Args...> args;
};

/// tell of a plain method.
template <class T, class M, class... Args>
class tell_message final : public message {
public:
  template <class... A>
  explicit tell_message(M m, A&&... a) : call_(m, std::forward<A>(a)...) {}
  void run(cell_base& self) override { call_(*static_cast<T*>(self.object())); }
  void reject(errc) noexcept override {}
  void dispose() noexcept override { std::unique_ptr<tell_message>{this}; }
  const char* kind() const noexcept override { return "tell"; }

private:
  stored_call<T, M, Args...> call_;
};

/// tell of a coroutine method: the message lives until the coroutine ends, since the
/// coroutine may refer to the arguments.
template <class T, class M, class... Args>
class tell_coroutine_message final
    : public message,
      public root_hook<reply_t<method_result_t<T, M, Args...>>>,
      private root_bookkeeping {
  using reply_type = reply_t<method_result_t<T, M, Args...>>;
  template <class X, class Hook>
  friend void start_root(task<X>, Hook*, cell_base&);

public:
  template <class... A>
  explicit tell_coroutine_message(M m, A&&... a) : call_(m, std::forward<A>(a)...) {}

  void run(cell_base& self) override {
    owners_ = 2;  // the mailbox and the coroutine frame
    try {
      start_root(call_(*static_cast<T*>(self.object())), this, self);
    } catch (...) {
      owners_ = 1;
      throw;
    }
  }
  void reject(errc) noexcept override {}
  void dispose() noexcept override {
    if (--owners_ == 0) std::unique_ptr<tell_coroutine_message>{this};
  }
  const char* kind() const noexcept override { return "tell"; }

  void root_finished(task_promise<reply_type>& p) noexcept override {
    end_root(p);
    if (p.error) self_->fail(p.error);
    std::coroutine_handle<task_promise<reply_type>>::from_promise(p).destroy();
    dispose();
  }
  void root_abandoned() noexcept override { dispose(); }

private:
  stored_call<T, M, Args...> call_;
  int owners_ = 1;
};

/// ask of a plain method: the message is also the reply's shared state.
template <class T, class M, class... Args>
class ask_message final : public state<method_result_t<T, M, Args...>> {
  using result_type = method_result_t<T, M, Args...>;

public:
  template <class... A>
  explicit ask_message(M m, A&&... a) : call_(m, std::forward<A>(a)...) {}

protected:
  void run_request(cell_base& self) override {
    try {
      if constexpr (std::is_void_v<result_type>) {
        call_(*static_cast<T*>(self.object()));
        this->complete_value(true);
      } else {
        this->complete_value(true, call_(*static_cast<T*>(self.object())));
      }
    } catch (...) {
      this->fail_in(self, std::current_exception());
    }
  }
  void destroy_state() noexcept override { std::unique_ptr<ask_message>{this}; }

private:
  stored_call<T, M, Args...> call_;
};

/// ask of a coroutine method; the reply comes when the coroutine ends.
template <class T, class M, class... Args>
class ask_coroutine_message final : public state<reply_t<method_result_t<T, M, Args...>>>,
                                    public root_hook<reply_t<method_result_t<T, M, Args...>>>,
                                    private root_bookkeeping {
  using reply_type = reply_t<method_result_t<T, M, Args...>>;
  template <class X, class Hook>
  friend void start_root(task<X>, Hook*, cell_base&);

public:
  template <class... A>
  explicit ask_coroutine_message(M m, A&&... a) : call_(m, std::forward<A>(a)...) {}

  void root_finished(task_promise<reply_type>& p) noexcept override {
    end_root(p);
    if (p.error) {
      this->fail_in(*self_, p.error);
    } else if constexpr (std::is_void_v<reply_type>) {
      this->complete_value(true);
    } else {
      this->complete_value(true, std::move(*p.value));
    }
    std::coroutine_handle<task_promise<reply_type>>::from_promise(p).destroy();
    this->release();  // the frame's reference
  }
  void root_abandoned() noexcept override {
    this->fail(std::make_exception_ptr(error(errc::actor_dead)), true);
    this->release();
  }

protected:
  void run_request(cell_base& self) override {
    this->add_ref();  // the frame's reference
    try {
      start_root(call_(*static_cast<T*>(self.object())), this, self);
    } catch (...) {
      this->release();
      this->fail_in(self, std::current_exception());
    }
  }
  void destroy_state() noexcept override { std::unique_ptr<ask_coroutine_message>{this}; }

private:
  stored_call<T, M, Args...> call_;
};

template <class T, class M, class... Args>
using tell_message_for = std::conditional_t<is_task<method_result_t<T, M, Args...>>::value,
                                            tell_coroutine_message<T, M, Args...>,
                                            tell_message<T, M, Args...>>;
template <class T, class M, class... Args>
using ask_message_for = std::conditional_t<is_task<method_result_t<T, M, Args...>>::value,
                                           ask_coroutine_message<T, M, Args...>,
                                           ask_message<T, M, Args...>>;

void deliver(cell_base& c, message_ptr m);
/// try_tell's delivery: false when the message did not go in within `timeout`.
bool try_deliver(cell_base& c, message_ptr m, std::chrono::nanoseconds timeout);

}  // namespace detail

/// A typed, copyable address of an actor of class T. Default-constructed: points nowhere.
/// @threadsafe (a ref may be copied and used from any thread)
template <class T>
class actor_ref {
public:
  using actor_type = T;

  actor_ref() noexcept = default;
  explicit actor_ref(detail::cell_ptr c) noexcept : cell_(std::move(c)) {}
  explicit actor_ref(detail::remote_ptr r) noexcept : remote_(std::move(r)) {}

  /// The actor's id: in its system, or cluster-wide (its node in the top bits) when remote.
  actor_id id() const noexcept {
    return cell_ ? cell_->id() : remote_ ? detail::remote_wire_id(*remote_) : 0;
  }
  explicit operator bool() const noexcept { return cell_ || remote_; }
  /// False once the actor has stopped for good (it may still be running when true); for a
  /// remote actor, also once its node is lost.
  bool alive() const noexcept {
    return cell_ ? cell_->alive() : remote_ && detail::remote_alive(*remote_);
  }
  /// True when the actor lives on another node.
  bool is_remote() const noexcept { return static_cast<bool>(remote_); }
  /// The node the actor lives on (0 when it is in this process and this is no node).
  node_id node() const noexcept { return remote_ ? detail::remote_node(*remote_) : 0; }

  /// Sends `method(args...)` without waiting for it. Messages from one sender to one actor
  /// are handled in send order. To a dead actor the message goes to the dead letters.
  template <class M, class... Args>
    requires std::invocable<M, T&, std::decay_t<Args>...>
  void tell(M method, Args&&... args) const {
    if constexpr (detail::remote_capable<T>) {
      if (remote_) return detail::remote_tell_typed<T>(*remote_, method, std::forward<Args>(args)...);
    }
    using msg_t = detail::tell_message_for<T, M, std::decay_t<Args>...>;
    check();
    detail::deliver(*cell_, detail::message_ptr(
                                std::make_unique<msg_t>(method, std::forward<Args>(args)...).release()));
  }

  /// As tell, but never waits long for room: true when the message went in, false when it did
  /// not (nothing sent, no dead letter). A full bounded mailbox (overflow_policy::wait) is
  /// waited for at most `timeout` by a thread outside the actors; an actor, a timer or a node's
  /// thread never waits nor is paused: full is false at once. A dead actor is false. To a
  /// remote actor the message is sent (true) unless its node is lost (its mailbox is not seen).
  template <class Rep, class Period, class M, class... Args>
    requires std::invocable<M, T&, std::decay_t<Args>...>
  bool try_tell(std::chrono::duration<Rep, Period> timeout, M method, Args&&... args) const {
    if constexpr (detail::remote_capable<T>) {
      if (remote_) {
        if (!detail::remote_alive(*remote_)) return false;
        detail::remote_tell_typed<T>(*remote_, method, std::forward<Args>(args)...);
        return true;
      }
    }
    using msg_t = detail::tell_message_for<T, M, std::decay_t<Args>...>;
    check();
    return detail::try_deliver(*cell_, detail::message_ptr(std::make_unique<msg_t>(method, std::forward<Args>(args)...).release()),
                               detail::saturated_ns(timeout));
  }

  /// Calls `method(args...)` and returns a future of its result (X when it returns task<X>).
  /// An exception thrown by the method reaches the caller at get()/co_await.
  template <class M, class... Args>
    requires std::invocable<M, T&, std::decay_t<Args>...>
  auto ask(M method, Args&&... args) const
      -> future<detail::reply_t<detail::method_result_t<T, M, std::decay_t<Args>...>>> {
    using reply = detail::reply_t<detail::method_result_t<T, M, std::decay_t<Args>...>>;
    using msg_t = detail::ask_message_for<T, M, std::decay_t<Args>...>;
    if constexpr (detail::remote_capable<T>) {
      if (remote_) return detail::remote_ask_typed<T, reply>(*remote_, method, std::forward<Args>(args)...);
    }
    check();
    auto* m = std::make_unique<msg_t>(method, std::forward<Args>(args)...).release();
    m->set_system(&cell_->system());
    m->set_asked(cell_.get());
    m->add_ref();  // one reference for the mailbox, one for the future
    future<reply> f{detail::state_ptr<reply>(m)};
    detail::deliver(*cell_, detail::message_ptr(m));
    return f;
  }

  /// Stops the actor: urgent, so it overtakes queued messages, which are then refused
  /// (their asks fail with errc::actor_dead). on_stop runs, monitors get a down notice.
  void stop() const {
    if (remote_) return detail::remote_stop(*remote_);
    check();
    cell_->stop(exit_reason::stopped);
  }

  friend bool operator==(const actor_ref& a, const actor_ref& b) noexcept {
    if (a.remote_ || b.remote_) return a.id() == b.id() && a.remote_ && b.remote_;
    return a.cell_.get() == b.cell_.get();
  }

  /// The runtime cell (for the runtime's own use); null for a remote actor.
  detail::cell_base* cell() const noexcept { return cell_.get(); }
  /// The remote handle (for the runtime's own use); null for a local actor.
  detail::remote_actor* remote() const noexcept { return remote_.get(); }

private:
  void check() const {
    if (!cell_) {
      if (remote_)
        throw std::logic_error(std::string("troupe::actor_ref<") + detail::type_name_of<T>() +
                               ">: this call cannot reach an actor on another node (declare the "
                               "class and the method with TROUPE_REMOTE)");
      throw std::logic_error("troupe::actor_ref is empty (default-constructed)");
    }
  }
  detail::cell_ptr cell_;
  detail::remote_ptr remote_;
};

}  // namespace troupe
