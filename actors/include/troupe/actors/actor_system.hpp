#pragma once
/// @file
/// actor_system: worker threads, spawning, names, timers, monitors, counters, shutdown.
///
///   troupe::actor_system sys{{.threads = 2}};
///   auto c = sys.spawn<counter>(10);        // constructor arguments forwarded
///   c.tell(&counter::add, 1);
///   int v = c.ask(&counter::add, 2).get();  // blocking: only outside actors
///
/// test_system runs the same actors on the calling thread, only when told
/// (run_until_idle(), advance(d)), with a virtual clock: deterministic unit tests.
///
/// Lifecycle hooks, all optional and found at compile time on the actor's class:
///   void on_start();                       first message, before any other
///   void on_stop();                        when the actor stops, before it is destroyed
///   void on_down(const troupe::down_notice&);  a monitored actor is gone
///
/// Shutdown (destructor or shutdown()): stops every actor as stop() does: queued messages are
/// not run, their asks fail with errc::actor_dead; on_stop hooks run; the workers join.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "troupe/actors/actor_ref.hpp"
#include "troupe/actors/detail/cell.hpp"
#include "troupe/actors/future.hpp"

namespace troupe {

/// Makes an actor_system a node of a cluster (see remote.hpp). Nodes authenticate each other
/// with the cluster's token; a node that goes silent for `node_timeout` is lost.
struct node_config {
  /// "HOST:PORT" to listen on (port 0: any free port). Empty: the system is no node.
  std::string listen;
  /// "HOST:PORT" of the head to join. Empty: this node is the head.
  std::string head;
  /// The host other nodes dial to reach this one. Empty: the listen host, or when that is a
  /// wildcard (0.0.0.0), this side's address of the connection to the head.
  std::string advertise;
  /// The cluster's shared secret. Empty: the environment variable TROUPE_CLUSTER_TOKEN.
  std::string token;
  /// TLS (Asio's OpenSSL support): PEM files of this node's certificate and private key, and of
  /// the CA peers' certificates must chain to. Empty: the environment variables
  /// TROUPE_TLS_CERTIFICATE, TROUPE_TLS_PRIVATE_KEY, TROUPE_TLS_CA; no certificate: no TLS (the
  /// token still authenticates every node, but traffic is not encrypted).
  std::string tls_certificate;
  std::string tls_private_key;
  std::string tls_ca;
  /// Free-form tags of this node ("worker", "gpu", "zone=b"), shown in the cluster status so
  /// that a driver can pick the nodes it spawns on. Each of 1 to 64 characters from
  /// [A-Za-z0-9._:=/-], at most 32 of them.
  std::vector<std::string> labels;
  std::chrono::milliseconds heartbeat{100};
  /// Silence after which a node is lost: asks to it fail with errc::node_lost, monitors of
  /// its actors receive down notices.
  std::chrono::milliseconds node_timeout{800};
  /// How long joining the head may take before the constructor gives up.
  std::chrono::milliseconds join_timeout{10'000};
};

/// Settings of an actor_system.
struct system_config {
  /// Worker threads; 0 means one per hardware thread. At most max_threads (more throws
  /// std::invalid_argument from the actor_system constructor).
  unsigned threads = 0;
  static constexpr unsigned max_threads = 4096;
  /// Messages an actor handles before its worker moves on to another actor.
  unsigned throughput = 64;
  /// Cluster membership; by default the system is no node.
  node_config node{};
};

/// Counters of one actor, readable while it runs.
struct actor_stats {
  actor_id id = 0;
  const char* type = "";
  std::uint64_t messages = 0;      ///< messages handled
  std::int64_t mailbox_depth = 0;  ///< normal messages waiting
  std::chrono::nanoseconds busy{0};
  std::uint32_t restarts = 0;      ///< times its restart policy re-created it after a failure
};

/// A timer made by tell_after/tell_every. Copyable; cancel() may be called from any thread,
/// also after the system is gone.
class timer {
public:
  timer() = default;
  explicit timer(std::shared_ptr<std::atomic<bool>> cancelled) : cancelled_(std::move(cancelled)) {}
  void cancel() const noexcept {
    if (cancelled_) cancelled_->store(true, std::memory_order_relaxed);
  }

private:
  std::shared_ptr<std::atomic<bool>> cancelled_;
};

class actor_system;

namespace detail {
actor_id next_actor_id(system_impl& sys);
/// Makes a constructed cell live: the system takes its reference, on_start is queued.
void activate(system_impl& sys, cell_base* c, bool has_on_start);
system_impl* make_system(actor_system* facade, const system_config& cfg, bool manual);
void destroy_system(system_impl* s) noexcept;
/// Names c locally; false when it already had the name.
bool register_name(system_impl& s, std::string name, cell_base* c);
bool unregister_name(system_impl& s, std::string_view name);
cell_ptr lookup_name(system_impl& s, std::string_view name);
timer add_timer(system_impl& s, std::chrono::nanoseconds delay, std::chrono::nanoseconds period,
                std::function<bool()> fire);
actor_stats stats_of(cell_base& c);
std::vector<actor_stats> all_stats(system_impl& s);
std::uint64_t dead_letters(system_impl& s);
std::size_t live_actors(system_impl& s);
void shutdown(system_impl& s) noexcept;
void stop_all_actors(system_impl& s) noexcept;
bool await_all_actors_done(system_impl& s, std::optional<std::chrono::nanoseconds> timeout);
actor_system& facade_of(system_impl& s);
// test_system
bool manual_run_one(system_impl& s);
std::size_t manual_run_until_idle(system_impl& s);
void manual_advance(system_impl& s, std::chrono::nanoseconds d);
std::chrono::nanoseconds manual_now(system_impl& s);
cell_base& current_cell_or_throw(const char* what);
/// Stops `child` when `parent` is gone for good (this_actor::spawn_child).
void bind_child(cell_base& parent, cell_base& child);
// Remote actors (defined in src/net/, node_runtime.hpp lists its parts; templates in remote.hpp).
template <class T, class... A>
actor_ref<T> spawn_on_typed(actor_system& sys, node_id where, const spawn_options& opts, A&&... args);
template <class T>
std::optional<actor_ref<T>> lookup_remote_typed(system_impl& s, std::string_view name);
template <class T>
future<void> publish_name_typed(system_impl& s, const std::string& name, const actor_ref<T>& ref, cell_base* added);
void await_name(system_impl& s, const std::string& name, future<void> f);
future<down_notice> monitor_remote(remote_actor& a);
void watch_remote(remote_actor& a, cell_base& watcher);
node_id this_node(system_impl& s) noexcept;
std::uint16_t this_node_port(system_impl& s) noexcept;
}  // namespace detail

class actor_system {
public:
  explicit actor_system(system_config cfg = {})
      : impl_(detail::make_system(this, cfg, false)) {}
  actor_system(const actor_system&) = delete;
  actor_system& operator=(const actor_system&) = delete;
  virtual ~actor_system() { detail::destroy_system(impl_); }

  /// Creates an actor of class T from `args` (forwarded to its constructor, on this thread:
  /// a throwing constructor throws here). @threadsafe
  template <class T, class... Args>
    requires std::constructible_from<T, Args&&...>
  actor_ref<T> spawn(Args&&... args) {
    return spawn<T>(spawn_options{}, std::forward<Args>(args)...);
  }

  /// Creates an actor of class T on node `where` (any_node: the least-loaded node) and returns
  /// at once; calls made meanwhile queue behind the creation. T must be declared with
  /// TROUPE_REMOTE and the arguments need codecs; a constructor that throws there makes the
  /// calls fail with its message. On this node (or when the system is no node) it is spawn().
  template <class T, class... Args>
    requires std::constructible_from<T, Args&&...>
  actor_ref<T> spawn_on(node_id where, Args&&... args) {
    return detail::spawn_on_typed<T>(*this, where, spawn_options{}, std::forward<Args>(args)...);
  }
  template <class T, class... Args>
    requires std::constructible_from<T, Args&&...>
  actor_ref<T> spawn_on(node_id where, const spawn_options& opts, Args&&... args) {
    return detail::spawn_on_typed<T>(*this, where, opts, std::forward<Args>(args)...);
  }

  /// This system's node id in its cluster (the head is 1); 0 when it is no node.
  node_id node() const noexcept { return detail::this_node(*impl_); }
  /// The TCP port this node listens on; 0 when it is no node.
  std::uint16_t node_port() const noexcept { return detail::this_node_port(*impl_); }

  /// As spawn(args...), with a bounded mailbox, a restart policy or reentrancy.
  template <class T, class... Args>
    requires std::constructible_from<T, Args&&...>
  actor_ref<T> spawn(const spawn_options& opts, Args&&... args) {
    auto c = std::make_unique<detail::cell<T>>(*impl_, detail::next_actor_id(*impl_), opts,
                                               std::forward<Args>(args)...);
    auto* raw = c.release();
    auto ref = detail::cell_ptr::adopt(raw);
    detail::activate(*impl_, raw, detail::has_on_start_hook<T>);
    return actor_ref<T>(std::move(ref));
  }

  /// A promise whose future, waited on with get() outside actors, drives this system while it
  /// waits when this is a test_system (see promise<T>).
  template <class T>
  promise<T> make_promise() {
    return promise<T>(impl_);
  }

  /// Names an actor so that others find it with lookup<T>(name). Throws std::invalid_argument
  /// for an empty name, troupe::error(errc::name_taken) when the name belongs to another live
  /// actor. On a node,
  /// an actor of a TROUPE_REMOTE class is named cluster-wide: every node finds it, and the call
  /// waits for the head's answer (name_taken when another node's actor has the name; nothing
  /// is named then; errc::actor_dead for an actor known to be gone; errc::timeout when no answer
  /// comes within node.join_timeout, the name staying here as the head may yet accept it).
  /// Inside an actor, which cannot wait, a conflict known at once (on this node, or this node
  /// is the head) still throws, and another node's answer arrives later: a refusal is logged
  /// and the local name removed (register_name_async returns that answer instead).
  template <class T>
  void register_name(std::string name, const actor_ref<T>& ref) {
    if constexpr (detail::remote_capable<T>) {
      auto answer = name_everywhere(name, ref);
      detail::await_name(*impl_, name, std::move(answer));
    } else {
      detail::register_name(*impl_, std::move(name), ref.cell());
    }
  }
  /// As register_name, without waiting: the future completes once the name holds cluster-wide
  /// (at once off a node or for a class that is not TROUPE_REMOTE) and fails with the reason
  /// it was refused (name_taken, actor_dead, ...; then nothing is named). Usable inside actors
  /// (co_await, then).
  template <class T>
  future<void> register_name_async(std::string name, const actor_ref<T>& ref) {
    try {
      return name_everywhere(name, ref);
    } catch (...) {
      promise<void> refused(impl_);
      auto f = refused.get_future();
      refused.set_exception(std::current_exception());
      return f;
    }
  }
  /// Removes a name; on a node the head forgets it cluster-wide too (asynchronously: lookups
  /// elsewhere may find it a moment longer). True when this node had the name itself.
  bool unregister_name(std::string_view name) { return detail::unregister_name(*impl_, name); }

  /// The live actor registered as `name`, or nullopt. Throws troupe::error(errc::type_mismatch)
  /// when it is not a T. On a node, names of other nodes are asked of the head (blocking:
  /// not from inside an actor).
  template <class T>
  std::optional<actor_ref<T>> lookup(std::string_view name) {
    auto c = detail::lookup_name(*impl_, name);
    if (!c) {
      if constexpr (detail::remote_capable<T>) return detail::lookup_remote_typed<T>(*impl_, name);
      return std::nullopt;
    }
    if (c->type() != typeid(T))
      throw error(errc::type_mismatch, "actor '" + std::string(name) + "' is a " + c->type_name() +
                                           ", not a " + detail::type_name_of<T>());
    return actor_ref<T>(std::move(c));
  }

  /// A future that completes with the down notice when `target` is gone for good.
  template <class T>
  future<down_notice> monitor(const actor_ref<T>& target) {
    if (!target) throw std::invalid_argument("monitor: the actor_ref is empty");
    if (target.is_remote()) return detail::monitor_remote(*target.remote());
    return monitor_cell(*target.cell());
  }

  /// Tells `ref` `method(args...)` once, after `delay`.
  template <class T, class M, class... Args>
    requires std::invocable<M, T&, std::decay_t<Args>...>
  timer tell_after(std::chrono::nanoseconds delay, const actor_ref<T>& ref, M method,
                   Args&&... args) {
    if (!ref) throw std::invalid_argument("tell_after: the actor_ref is empty");
    // Sent once: the arguments move into the message (move-only ones too).
    auto held = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
    return detail::add_timer(*impl_, delay, std::chrono::nanoseconds{0}, [ref, method, held]() {
      if (ref.alive()) std::apply([&](auto&... a) { ref.tell(method, std::move(a)...); }, *held);
      return false;
    });
  }

  /// Tells `ref` `method(args...)` every `period` (first after one period) until cancelled
  /// or the actor is gone. Arguments are copied for each message.
  template <class T, class M, class... Args>
    requires std::invocable<M, T&, std::decay_t<Args>...> && (std::copy_constructible<std::decay_t<Args>> && ...)
  timer tell_every(std::chrono::nanoseconds period, const actor_ref<T>& ref, M method,
                   Args&&... args) {
    if (period <= std::chrono::nanoseconds{0})
      throw std::invalid_argument("tell_every needs a positive period");
    return detail::add_timer(*impl_, period, period,
                             make_sender(ref, method, std::forward<Args>(args)...));
  }

  /// Counters of one actor. @threadsafe
  template <class T>
  actor_stats stats(const actor_ref<T>& ref) const {
    if (!ref) throw std::invalid_argument("stats: the actor_ref is empty");
    if (ref.is_remote())
      throw std::logic_error("stats() reads local actors; `troupe status` reports remote ones");
    return detail::stats_of(*ref.cell());
  }
  /// Counters of every live actor. @threadsafe
  std::vector<actor_stats> all_stats() const { return detail::all_stats(*impl_); }
  /// Messages that reached no method (dead receiver, refused by a full mailbox). @threadsafe
  std::uint64_t dead_letters() const { return detail::dead_letters(*impl_); }
  /// Actors spawned and not yet gone. @threadsafe
  std::size_t live_actors() const { return detail::live_actors(*impl_); }

  /// Stops every actor and joins the workers; idempotent. Not from an actor thread.
  void shutdown() { detail::shutdown(*impl_); }

  /// Blocks until no actor of this system is alive (each stopped, or failed past its restart
  /// policy), e.g. until the actors ended the program with stop_all_actors() or stopped
  /// themselves. Not from an actor thread (std::logic_error). A test_system runs until idle
  /// instead, and throws std::logic_error when actors still live then.
  void await_all_actors_done() { detail::await_all_actors_done(*impl_, std::nullopt); }
  /// As await_all_actors_done(), for at most `timeout`: false when actors still live.
  template <class Rep, class Period>
  bool await_all_actors_done(std::chrono::duration<Rep, Period> timeout) {
    return detail::await_all_actors_done(*impl_, detail::saturated_ns(timeout));
  }
  /// Stops every live actor as shutdown() does (exit_reason::shutdown; queued asks fail with
  /// errc::actor_dead, on_stop runs) without waiting for them: the way to end a program from
  /// inside an actor. Until the last is gone, spawns throw errc::system_shutdown (so none
  /// outlives it); then the system is as before. @threadsafe, inside actors too.
  void stop_all_actors() noexcept { detail::stop_all_actors(*impl_); }

  detail::system_impl& impl() noexcept { return *impl_; }

protected:
  actor_system(system_config cfg, bool manual) : impl_(detail::make_system(this, cfg, manual)) {}

private:
  /// Names `ref` here (throwing when the name is taken on this node) and, on a node, asks the
  /// head to name it cluster-wide: the future is the head's answer.
  template <class T>
  future<void> name_everywhere(const std::string& name, const actor_ref<T>& ref) {
    if constexpr (detail::remote_capable<T>) {
      if (ref.is_remote()) return detail::publish_name_typed<T>(*impl_, name, ref, nullptr);
      const bool added = detail::register_name(*impl_, name, ref.cell());
      return detail::publish_name_typed<T>(*impl_, name, ref, added ? ref.cell() : nullptr);
    } else {
      detail::register_name(*impl_, name, ref.cell());
      promise<void> named(impl_);
      auto f = named.get_future();
      named.set_value();
      return f;
    }
  }

  future<down_notice> monitor_cell(detail::cell_base& target);

  template <class T, class M, class... Args>
  static std::function<bool()> make_sender(const actor_ref<T>& ref, M method, Args&&... args) {
    if (!ref) throw std::invalid_argument("tell_every: the actor_ref is empty");
    return [ref, method, ... a = std::decay_t<Args>(std::forward<Args>(args))]() {
      if (!ref.alive()) return false;
      ref.tell(method, a...);
      return true;
    };
  }

  detail::system_impl* impl_;
};

/// A deterministic, single-threaded actor system for unit tests: nothing runs until
/// run_one(), run_until_idle() or advance() is called, on the calling thread, with a virtual
/// clock for timers and timeouts. future::get() on it runs the system until the reply is
/// there, and throws troupe::error(errc::would_deadlock) if it goes idle first.
/// Use it from one thread only.
class test_system : public actor_system {
public:
  test_system() : actor_system(system_config{.threads = 1}, true) {}

  /// Runs one slice of one runnable actor; false when nothing is runnable.
  bool run_one() { return detail::manual_run_one(impl()); }
  /// Runs until no actor is runnable; returns the number of slices run.
  std::size_t run_until_idle() { return detail::manual_run_until_idle(impl()); }
  /// Moves the virtual clock forward by `d`, firing due timers in order, running the system
  /// until idle after each.
  void advance(std::chrono::nanoseconds d) { detail::manual_advance(impl(), d); }
  /// Virtual time since the system was made.
  std::chrono::nanoseconds now() { return detail::manual_now(impl()); }
};

/// What an actor may ask about itself, from inside one of its methods.
namespace this_actor {

/// The running actor's id. Throws std::logic_error outside actors.
inline actor_id id() { return detail::current_cell_or_throw("this_actor::id").id(); }

/// The system the running actor belongs to.
inline actor_system& system() {
  return detail::facade_of(detail::current_cell_or_throw("this_actor::system").system());
}

/// Stops the running actor after the current method returns.
inline void stop() { detail::current_cell_or_throw("this_actor::stop").stop(exit_reason::stopped); }

/// A ref to the running actor, which must be a T.
template <class T>
actor_ref<T> self() {
  auto& c = detail::current_cell_or_throw("this_actor::self");
  if (c.type() != typeid(T))
    throw error(errc::type_mismatch,
                std::string("this_actor::self<") + detail::type_name_of<T>() + ">() in a " +
                    c.type_name());
  return actor_ref<T>(detail::cell_ptr(&c));
}

/// Spawns an actor that belongs to the running one: it is stopped (exit_reason::stopped) when
/// the running actor stops, whatever ended it, or restarts (the new object makes its own), and
/// so on down its own children. A child's end reaches the parent only if the parent monitors
/// it. Not from a constructor, which runs as its spawner (std::logic_error): use on_start.
template <class T, class... Args>
  requires std::constructible_from<T, Args&&...>
actor_ref<T> spawn_child(const spawn_options& opts, Args&&... args) {
  auto& parent = detail::current_cell_or_throw("this_actor::spawn_child");
  if (detail::tls_constructing() != 0)
    throw std::logic_error("this_actor::spawn_child in a constructor, which runs as its spawner: spawn children in on_start");
  auto child = detail::facade_of(parent.system()).spawn<T>(opts, std::forward<Args>(args)...);
  detail::bind_child(parent, *child.cell());
  return child;
}
template <class T, class... Args>
  requires std::constructible_from<T, Args&&...>
actor_ref<T> spawn_child(Args&&... args) {
  return spawn_child<T>(spawn_options{}, std::forward<Args>(args)...);
}

/// Watches `target`: the running actor's on_down(const down_notice&) is called when it is
/// gone for good (at once if it is gone already). The class must have on_down.
template <class T>
void monitor(const actor_ref<T>& target) {
  auto& c = detail::current_cell_or_throw("this_actor::monitor");
  if (!target) throw std::invalid_argument("this_actor::monitor: the actor_ref is empty");
  if (target.is_remote()) return detail::watch_remote(*target.remote(), c);
  target.cell()->add_watcher(&c);
}

}  // namespace this_actor

}  // namespace troupe
