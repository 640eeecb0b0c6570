#pragma once
/// @file
/// Remote actors: the same tell/ask on an actor that lives on another node.
///
///   struct store {
///     void put(std::string k, std::string v);
///     std::optional<std::string> get(std::string k);
///   };
///   TROUPE_REMOTE(store, put, get)          // at global namespace scope, after the class
///
///   troupe::actor_system sys{{.node = {.listen = "0.0.0.0:0", .head = "10.0.0.1:7100"}}};
///   auto s = sys.spawn_on<store>(troupe::any_node);   // the head's least-loaded node
///   s.tell(&store::put, "k", "v");
///   auto v = s.ask(&store::get, "k").get();
///
/// Arguments and results cross the wire through their codecs (troupe/core/codec.hpp); a
/// method's exception reaches the caller as troupe::error(errc::remote_exception) with its
/// message. Only the listed methods may be called remotely, and they must not be overloaded.
/// spawn_on<T>(node, args...) constructs T on that node from the decoded arguments: the node
/// must know the constructor, which it does when it runs the same program (a spawn_on with
/// those argument types registers it) or loads a library that declares it with
/// TROUPE_REMOTE_CTOR(T, argument types...). Default constructors are always known.

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "troupe/actors/actor_system.hpp"
#include "troupe/core/codec.hpp"

namespace troupe {

namespace detail {

constexpr std::uint64_t fnv1a(std::string_view s,
                              std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// Parameter and result types of a member function pointer.
template <class M>
struct member_fn;
#define TROUPE_DETAIL_MEMBER_FN(QUALS)                         \
  template <class R, class C, class... A>                      \
  struct member_fn<R (C::*)(A...) QUALS> {                     \
    using result = R;                                          \
    using args = std::tuple<std::decay_t<A>...>;               \
  };
TROUPE_DETAIL_MEMBER_FN()
TROUPE_DETAIL_MEMBER_FN(const)
TROUPE_DETAIL_MEMBER_FN(noexcept)
TROUPE_DETAIL_MEMBER_FN(const noexcept)
#undef TROUPE_DETAIL_MEMBER_FN

/// One method listed in TROUPE_REMOTE; its id is a hash of "Type::method".
template <class T, auto P>
struct remote_method {
  static constexpr auto pointer = P;
  std::string_view name;
  constexpr std::uint64_t id(std::string_view type) const noexcept {
    return fnv1a(name, fnv1a("::", fnv1a(type)));
  }
};

// A ref may be local or remote, and only the ref knows which: a call that cannot cross the
// wire (a lambda, a method whose arguments or result have no codec, one not listed) compiles,
// serves local actors, and is refused when the actor is on another node.
[[noreturn]] inline void refuse_remote_call(std::string_view type, const char* why) {
  throw std::logic_error(std::string(why) + ": it cannot be called on an actor of " + std::string(type) +
                         " on another node (only methods listed in TROUPE_REMOTE(" + std::string(type) +
                         ", ...) can)");
}

template <class T, class M>
std::uint64_t method_id_of(M m) {
  constexpr auto type = remote_interface<T>::type_name;
  std::uint64_t id = 0;
  std::apply(
      [&](const auto&... e) {
        (
            [&] {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(e.pointer)>, M>)
                if (id == 0 && e.pointer == m) id = e.id(type);
            }(),
            ...);
      },
      remote_interface<T>::methods);
  if (id == 0) refuse_remote_call(type, "this method is not listed in TROUPE_REMOTE");
  return id;
}

/// Completes a future from the reply's bytes.
template <class R>
class typed_sink final : public reply_sink {
public:
  explicit typed_sink(state<R>* st) noexcept : st_(st) {}
  ~typed_sink() override {
    if (st_) st_->fail(std::make_exception_ptr(error(errc::broken_promise)), true);
  }
  void deliver(std::span<const std::byte> payload, const std::shared_ptr<const void>& owner) noexcept override {
    try {
      if constexpr (std::is_void_v<R>) {
        if (!payload.empty()) byte_reader::fail("a void reply carries bytes");
        st_->complete_value(true);
      } else {
        st_->complete_value(true, troupe::decode<R>(payload, owner));
      }
    } catch (...) {
      st_->fail(std::current_exception(), true);
    }
    st_.reset();
  }
  void fail(std::exception_ptr e) noexcept override {
    st_->fail(std::move(e), true);
    st_.reset();
  }

private:
  state_ptr<R> st_;
};

template <class M>
using remote_args_t = typename member_fn<M>::args;


template <class T, class M, class... Args>
encoded_pieces encode_call(M method, std::uint64_t& id, Args&&... args) {
  constexpr auto type = remote_interface<T>::type_name;
  if constexpr (!std::is_member_function_pointer_v<M>) {
    refuse_remote_call(type, "a lambda or other callable is no method");
  } else if constexpr (!serializable<remote_args_t<M>>) {
    refuse_remote_call(type, "a parameter of this method has no troupe::codec");
  } else {
    id = method_id_of<T>(method);
    return troupe::encode_pieces(remote_args_t<M>(std::forward<Args>(args)...));
  }
}

template <class T, class M, class... Args>
void remote_tell_typed(remote_actor& a, M method, Args&&... args) {
  std::uint64_t id = 0;
  auto bytes = encode_call<T>(method, id, std::forward<Args>(args)...);
  remote_call(a, id, std::move(bytes), nullptr);
}

template <class T, class R, class M, class... Args>
auto remote_ask_typed(remote_actor& a, M method, Args&&... args) {
  if constexpr (!std::is_void_v<R> && !serializable<R>) {
    refuse_remote_call(remote_interface<T>::type_name, "the result of this method has no troupe::codec");
    return future<R>{state_ptr<R>()};
  } else {
    std::uint64_t id = 0;
    auto bytes = encode_call<T>(method, id, std::forward<Args>(args)...);
    auto* st = make_state<R>();
    st->set_system(&remote_system(a));
    st->add_ref();  // one for the future, one for the sink
    future<R> f{state_ptr<R>(st)};
    remote_call(a, id, std::move(bytes), std::make_unique<typed_sink<R>>(st));
    return f;
  }
}

// ---- the receiving side --------------------------------------------------------------------

/// Sends the reply of a call that came from another node.
struct responder {
  virtual ~responder() = default;
  virtual void reply(encoded_pieces payload) noexcept = 0;
  virtual void error(std::exception_ptr e) noexcept = 0;
};

/// Decodes the arguments (kept alive by `owner`: decoded views point into them) and calls the
/// method on the local actor; `r` is null for a tell. Throws troupe::error(decode_error) when the
/// arguments do not decode.
using dispatch_fn = void (*)(cell_base& target, std::span<const std::byte> args,
                             const std::shared_ptr<const void>& owner, std::shared_ptr<responder> r);
/// Constructs an actor from encoded constructor arguments.
using construct_fn = cell_ptr (*)(actor_system& sys, std::span<const std::byte> args,
                                  const spawn_options& opts);

template <class T, auto P>
void dispatch(cell_base& target, std::span<const std::byte> bytes, const std::shared_ptr<const void>& owner,
              std::shared_ptr<responder> r) {
  using R = reply_t<typename member_fn<decltype(P)>::result>;
  auto args = troupe::decode<remote_args_t<decltype(P)>>(bytes, owner);
  actor_ref<T> ref{cell_ptr(&target)};
  if (!r) {
    std::apply([&](auto&... a) { ref.tell(P, std::move(a)...); }, args);
    return;
  }
  auto f = std::apply([&](auto&... a) { return ref.ask(P, std::move(a)...); }, args);
  auto on_error = [r](std::exception_ptr e) { r->error(std::move(e)); };
  if constexpr (std::is_void_v<R>) {
    std::move(f).then([r] { r->reply({}); }, std::move(on_error));
  } else {
    std::move(f).then([r](R v) { r->reply(troupe::encode_pieces(v)); }, std::move(on_error));
  }
}

template <class T, class... A>
cell_ptr construct_from(actor_system& sys, std::span<const std::byte> bytes,
                        const spawn_options& opts) {
  auto args = troupe::decode<std::tuple<A...>>(bytes);
  auto ref = std::apply([&](A&... a) { return sys.spawn<T>(opts, std::move(a)...); }, args);
  return cell_ptr(ref.cell());
}

struct remote_type_entry {
  std::string_view name;
  const std::type_info* type = nullptr;
  std::vector<std::pair<std::uint64_t, dispatch_fn>> methods;
  std::vector<std::string_view> method_names;
};
bool register_remote_type(remote_type_entry entry);
bool register_remote_constructor(std::string_view type, std::uint64_t key, construct_fn f);

/// Identifies a constructor by its parameter types (same compiler on every node).
template <class... A>
std::uint64_t constructor_key() {
  std::uint64_t h = fnv1a("(");
  ((h = fnv1a(typeid(A).name(), fnv1a(",", h))), ...);
  return h;
}

template <class T, class... A>
struct constructor_registrar {
  static inline const bool registered = register_remote_constructor(
      remote_interface<T>::type_name, constructor_key<A...>(), &construct_from<T, A...>);
};

template <class T>
bool register_remote_class() {
  constexpr auto type = remote_interface<T>::type_name;
  remote_type_entry e{type, &typeid(T), {}, {}};
  std::apply(
      [&](const auto&... m) {
        (e.methods.emplace_back(m.id(type), &dispatch<T, std::remove_cvref_t<decltype(m)>::pointer>),
         ...);
        (e.method_names.push_back(m.name), ...);
      },
      remote_interface<T>::methods);
  register_remote_type(std::move(e));
  if constexpr (std::is_default_constructible_v<T>) (void)constructor_registrar<T>::registered;
  return true;
}

/// Where a spawn went: here (cell) or to another node (remote).
struct spawned {
  cell_ptr local;
  remote_ptr remote;
};
spawned remote_spawn(system_impl& sys, node_id where, std::string_view type, std::uint64_t ctor,
                     std::vector<std::byte> args, const spawn_options& opts);

/// Where an actor lives, as an actor_ref travels: its node and its cluster-wide id there.
struct ref_address {
  node_id where = 0;
  std::uint64_t wire = 0;
};
/// The address of a ref (a local actor is exported by its node from then on); {} for a null ref.
/// Throws troupe::error when the actor is local and its system is no node.
ref_address address_of(cell_base* local, remote_actor* remote, std::string_view type);
/// The actor at `a`, seen from the node decoding the message that carries it: its own actor or a
/// handle to another node's. Throws troupe::error (decode_error outside a node's decoding,
/// actor_dead for an actor of this node that is gone).
spawned resolve(const ref_address& a, std::string_view type);

template <class T, class... A>
actor_ref<T> spawn_on_typed(actor_system& sys, node_id where, const spawn_options& opts,
                            A&&... args) {
  static_assert(remote_capable<T>, "spawn_on needs the class declared with TROUPE_REMOTE");
  static_assert(serializable<std::tuple<std::decay_t<A>...>>,
                "spawn_on's constructor arguments need troupe::codecs");
  (void)constructor_registrar<T, std::decay_t<A>...>::registered;
  auto bytes = troupe::encode(std::tuple<std::decay_t<A>...>(std::forward<A>(args)...));
  auto s = remote_spawn(sys.impl(), where, remote_interface<T>::type_name,
                        constructor_key<std::decay_t<A>...>(), std::move(bytes), opts);
  if (s.local) return actor_ref<T>(std::move(s.local));
  return actor_ref<T>(std::move(s.remote));
}

std::optional<spawned> remote_lookup(system_impl& s, std::string_view name, std::string& type);
future<void> publish_name(system_impl& s, const std::string& name, cell_base* local, remote_actor* remote,
                          std::string_view type, cell_base* added);
void await_name(system_impl& s, const std::string& name, future<void> f);

template <class T>
std::optional<actor_ref<T>> lookup_remote_typed(system_impl& s, std::string_view name) {
  std::string type;
  auto found = remote_lookup(s, name, type);
  if (!found) return std::nullopt;
  if (type != remote_interface<T>::type_name)
    throw error(errc::type_mismatch, "actor '" + std::string(name) + "' is a " + type + ", not a " +
                                         std::string(remote_interface<T>::type_name));
  if (found->local) return actor_ref<T>(std::move(found->local));
  return actor_ref<T>(std::move(found->remote));
}

template <class T>
future<void> publish_name_typed(system_impl& s, const std::string& name, const actor_ref<T>& ref, cell_base* added) {
  return publish_name(s, name, ref.cell(), ref.remote(), remote_interface<T>::type_name, added);
}

}  // namespace detail

/// An actor_ref travels between nodes as its address: a ref to a local actor, sent in a call to
/// another node, reaches there as a ref that calls back here, and a ref to a third node's actor
/// stays one. The class name travels too and must match on arrival. A ref to an actor that is
/// gone, arriving at the node it lived on, does not decode (troupe::error(errc::actor_dead)), so
/// the call carrying it fails (a tell becomes a dead letter).
template <class T>
struct codec<actor_ref<T>, std::enable_if_t<detail::remote_capable<T>>> {
  static void encode(byte_writer& w, const actor_ref<T>& ref) {
    const auto a = detail::address_of(ref.cell(), ref.remote(), remote_interface<T>::type_name);
    w.write_raw(a.where);
    w.write_raw(a.wire);
    codec<std::string>::encode(w, std::string(remote_interface<T>::type_name));
  }
  static actor_ref<T> decode(byte_reader& r) {
    detail::ref_address a;
    a.where = r.read_raw<node_id>();
    a.wire = r.read_raw<std::uint64_t>();
    if (codec<std::string>::decode(r) != remote_interface<T>::type_name)
      byte_reader::fail("an actor_ref of another class than " + std::string(remote_interface<T>::type_name));
    auto s = detail::resolve(a, remote_interface<T>::type_name);
    if (s.local) return actor_ref<T>(std::move(s.local));
    if (s.remote) return actor_ref<T>(std::move(s.remote));
    return actor_ref<T>();
  }
};

/// What a node knows about one member of its cluster.
struct node_info {
  node_id id = 0;
  std::string host;
  std::uint16_t port = 0;
  bool alive = true;
  std::uint64_t actors = 0;  ///< live actors at its last heartbeat
  std::vector<std::string> labels;  ///< node_config::labels it joined with
};

/// One actor in a cluster status report.
struct actor_status {
  std::uint64_t id = 0;
  std::string type;
  std::string name;  ///< a name it is registered under, here or by another node; "" if none
  std::int64_t mailbox_depth = 0;
  std::uint64_t messages = 0;
  double messages_per_s = 0;  ///< over the last status interval
  std::uint64_t wire = 0;     ///< the id other nodes (and their error messages) call it by; 0 if none has
  std::uint32_t restarts = 0; ///< times its restart policy re-created it after a failure
};

/// A failure of an actor on a node: its restart policy re-created it (`restarted`), or it had
/// no restart left and stopped.
struct actor_failure {
  std::uint64_t seq = 0;      ///< 1, 2, ... per node: which failures a reader has seen
  std::int64_t unix_ms = 0;   ///< when, in milliseconds since 1970 (UTC)
  std::uint64_t actor = 0;    ///< its id on the node
  std::string type;
  bool restarted = false;
  std::uint32_t restarts = 0; ///< its restarts so far, this one included
  std::string what;           ///< what the failure said
};

/// Failures of a node's actors of one type since the node started.
struct actor_type_failures {
  std::string type;
  std::uint64_t restarts = 0;  ///< re-created by their restart policy
  std::uint64_t failed = 0;    ///< stopped by a failure, no restart left
};

/// One node in a cluster status report.
struct node_status {
  node_info info;
  std::uint64_t dead_letters = 0;
  std::vector<actor_status> actors;
  /// Empty when the node answered; otherwise why only the head's record of it is shown ("no
  /// answer within 800 ms": the head waits node_timeout, 2 s at most; or why the call failed).
  std::string problem;
  /// Per actor type, the failures and restarts since the node started (a counter: actors that
  /// have stopped since still count).
  std::vector<actor_type_failures> failures_by_type;
  /// The node's latest actor failures (the last 32), the oldest first.
  std::vector<actor_failure> recent_failures;
};

/// Asks the head at "HOST:PORT" for the cluster's nodes and actors (as `troupe status` does).
/// Throws troupe::error(connection_lost) when the head cannot be reached or refuses the token.
std::vector<node_status> cluster_status(const std::string& head_address, const std::string& token,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// Runs a node until `stop_requested` returns true (checked every 100 ms) or the node fails;
/// for `troupe node start`.
void run_node(const system_config& cfg, const std::function<bool()>& stop_requested);

}  // namespace troupe

#define TROUPE_DETAIL_CAT2(a, b) a##b
#define TROUPE_DETAIL_CAT(a, b) TROUPE_DETAIL_CAT2(a, b)
#define TROUPE_DETAIL_EXPAND(x) x
// Applies F(T, x) to each of up to 32 arguments, comma-separated.
#define TROUPE_DETAIL_FE_1(F, T, x) F(T, x)
#define TROUPE_DETAIL_FE_2(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_1(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_3(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_2(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_4(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_3(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_5(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_4(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_6(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_5(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_7(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_6(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_8(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_7(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_9(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_8(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_10(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_9(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_11(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_10(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_12(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_11(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_13(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_12(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_14(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_13(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_15(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_14(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_16(F, T, x, ...) F(T, x), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_15(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                           N, ...)                                                                \
  N
#define TROUPE_DETAIL_FOR_EACH(F, T, ...)                                                         \
  TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_N(                                                        \
      __VA_ARGS__, TROUPE_DETAIL_FE_16, TROUPE_DETAIL_FE_15, TROUPE_DETAIL_FE_14,                 \
      TROUPE_DETAIL_FE_13, TROUPE_DETAIL_FE_12, TROUPE_DETAIL_FE_11, TROUPE_DETAIL_FE_10,         \
      TROUPE_DETAIL_FE_9, TROUPE_DETAIL_FE_8, TROUPE_DETAIL_FE_7, TROUPE_DETAIL_FE_6,             \
      TROUPE_DETAIL_FE_5, TROUPE_DETAIL_FE_4, TROUPE_DETAIL_FE_3, TROUPE_DETAIL_FE_2,             \
      TROUPE_DETAIL_FE_1)(F, T, __VA_ARGS__))
#define TROUPE_DETAIL_REMOTE_METHOD(T, m) ::troupe::detail::remote_method<T, &T::m>{#m}

/// Makes class T callable from other nodes through the listed methods (up to 16; none
/// overloaded). Use at global namespace scope, right after the class, before any call. Each
/// translation unit that sees it registers T (registering twice is harmless); the flag has
/// internal linkage, because __COUNTER__ restarts in every translation unit and two inline
/// flags of the same name in one program would be merged into one, leaving a class unregistered.
#define TROUPE_REMOTE(T, ...)                                                                   \
  template <>                                                                                   \
  struct troupe::remote_interface<T> {                                                          \
    static constexpr std::string_view type_name = #T;                                           \
    static constexpr auto methods =                                                             \
        std::tuple{TROUPE_DETAIL_FOR_EACH(TROUPE_DETAIL_REMOTE_METHOD, T, __VA_ARGS__)};        \
  };                                                                                            \
  [[maybe_unused]] static const bool TROUPE_DETAIL_CAT(troupe_remote_registered_, __COUNTER__) = \
      ::troupe::detail::register_remote_class<T>();

/// Declares a constructor of T that other nodes may call through spawn_on (needed only where
/// this program does not itself call spawn_on<T> with these argument types).
#define TROUPE_REMOTE_CTOR(T, ...)                                                              \
  [[maybe_unused]] static const bool TROUPE_DETAIL_CAT(troupe_remote_ctor_, __COUNTER__) =      \
      ::troupe::detail::constructor_registrar<T, __VA_ARGS__>::registered;
