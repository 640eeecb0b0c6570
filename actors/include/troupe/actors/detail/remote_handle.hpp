#pragma once
// The part of remote actors that actor_ref needs to see: a reference-counted handle to an actor
// on another node, and the hooks the typed call path (remote.hpp) uses. Internals: user code
// includes <troupe/actors/remote.hpp> and never names detail::.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "troupe/core/codec.hpp"

namespace troupe {

/// Identifies a node of a cluster; the head is node 1. 0 is "no node" (or, where a node is
/// asked for, "let the head choose").
using node_id = std::uint32_t;
/// spawn_on's "let the cluster choose": the live node with the fewest actors.
inline constexpr node_id any_node = 0;

/// Specialized by TROUPE_REMOTE(T, methods...) for classes whose methods may be called from
/// other nodes.
template <class T>
struct remote_interface;

namespace detail {

class system_impl;

/// A class declared with TROUPE_REMOTE.
template <class T>
concept remote_capable = requires { remote_interface<T>::type_name; };

/// Receives the reply of a call made to another node: the result's codec bytes (kept alive by
/// `owner`, so decoded views may point into them), or an error.
struct reply_sink {
  virtual ~reply_sink() = default;
  virtual void deliver(std::span<const std::byte> payload, const std::shared_ptr<const void>& owner) noexcept = 0;
  virtual void fail(std::exception_ptr e) noexcept = 0;
};

/// An actor on another node, as seen from this one (defined in src/net/node_runtime.hpp).
class remote_actor;
void retain(remote_actor* a) noexcept;
void release(remote_actor* a) noexcept;

/// Owning pointer to a remote_actor.
class remote_ptr {
public:
  remote_ptr() noexcept = default;
  static remote_ptr adopt(remote_actor* a) noexcept {
    remote_ptr p;
    p.a_ = a;
    return p;
  }
  remote_ptr(const remote_ptr& o) noexcept : a_(o.a_) {
    if (a_) retain(a_);
  }
  remote_ptr(remote_ptr&& o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
  remote_ptr& operator=(remote_ptr o) noexcept {
    std::swap(a_, o.a_);
    return *this;
  }
  ~remote_ptr() {
    if (a_) release(a_);
  }
  remote_actor* get() const noexcept { return a_; }
  remote_actor& operator*() const noexcept { return *a_; }
  explicit operator bool() const noexcept { return a_ != nullptr; }

private:
  remote_actor* a_ = nullptr;
};

/// The cluster-wide id of the actor (its node in the top bits).
std::uint64_t remote_wire_id(const remote_actor& a) noexcept;
node_id remote_node(const remote_actor& a) noexcept;
/// False once its node is lost or the actor is known to be gone.
bool remote_alive(const remote_actor& a) noexcept;
system_impl& remote_system(const remote_actor& a) noexcept;
/// Sends a call; `sink` is null for a tell. Spliced runs of `args` are written from their own
/// memory.
void remote_call(remote_actor& a, std::uint64_t method, encoded_pieces args, std::unique_ptr<reply_sink> sink);
void remote_stop(remote_actor& a);

// Defined in remote.hpp (instantiated only for remote_capable classes).
template <class T, class M, class... Args>
void remote_tell_typed(remote_actor& a, M method, Args&&... args);
template <class T, class R, class M, class... Args>
auto remote_ask_typed(remote_actor& a, M method, Args&&... args);

}  // namespace detail
}  // namespace troupe
