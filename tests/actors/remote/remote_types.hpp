#pragma once
// Actor classes shared by the remote tests and the worker node they start (remote_node.cpp).

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/collective.hpp"  // ring members live on worker nodes too
#include "troupe/actors/remote.hpp"

namespace remote_test {

/// A key-value store.
class kv {
public:
  void put(std::string k, std::string v) { m_[std::move(k)] = std::move(v); }
  std::optional<std::string> get(const std::string& k) const {
    auto it = m_.find(k);
    if (it == m_.end()) return std::nullopt;
    return it->second;
  }
  std::uint64_t size() const { return m_.size(); }

private:
  std::map<std::string, std::string> m_;
};

/// Arithmetic, errors, payloads, ordering and the process it runs in.
class worker {
public:
  explicit worker(std::int64_t base) : base_(base) {
    if (base < 0) throw std::invalid_argument("worker: a negative base");
  }
  std::int64_t add(std::int64_t x) const { return base_ + x; }
  std::string fail(std::string why) { throw std::runtime_error(why); }
  std::vector<std::byte> echo(std::vector<std::byte> b) { return b; }
  /// n bytes (a reply larger than its request).
  std::vector<std::byte> bytes(std::uint64_t n) { return std::vector<std::byte>(n, std::byte{1}); }
  std::uint64_t checksum(std::vector<float> v) {
    std::uint64_t h = 0;
    for (float f : v) h = h * 31 + static_cast<std::uint64_t>(f);
    return h;
  }
  /// Messages from one sender carry 0, 1, 2...: counts those that arrive out of order.
  void record(std::uint32_t sender, std::uint64_t seq) {
    auto& next = next_[sender];
    if (seq != next) ++out_of_order_;
    next = seq + 1;
    ++received_;
  }
  std::uint64_t received() const { return received_; }
  std::uint64_t out_of_order() const { return out_of_order_; }
  std::int64_t pid() const { return ::getpid(); }
  void sleep_ms(std::int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  troupe::task<std::int64_t> twice(std::int64_t x) { co_return 2 * (base_ + x); }
  /// Calls add on another worker whose ref came in the message (on any node).
  troupe::task<std::int64_t> add_via(troupe::actor_ref<worker> other, std::int64_t x) {
    co_return co_await other.ask(&worker::add, x);
  }
  troupe::actor_ref<worker> self_ref() const { return troupe::this_actor::self<worker>(); }
  troupe::actor_ref<worker> echo_ref(troupe::actor_ref<worker> r) const { return r; }
  /// A new worker on node `where`, spawned by this actor's node.
  troupe::actor_ref<worker> spawn_at(std::uint32_t where, std::int64_t base, bool detached) const {
    return troupe::this_actor::system().spawn_on<worker>(where, troupe::spawn_options{.detached = detached}, base);
  }
  /// Neither listed in TROUPE_REMOTE nor encodable: for workers in the caller's process.
  std::int64_t apply(std::function<std::int64_t(std::int64_t)> f) const { return f(base_); }
  std::shared_ptr<std::int64_t> base_ptr() const { return std::make_shared<std::int64_t>(base_); }
  /// Encodable, but not listed in TROUPE_REMOTE.
  std::int64_t base() const { return base_; }

private:
  std::int64_t base_;
  std::map<std::uint32_t, std::uint64_t> next_;
  std::uint64_t received_ = 0;
  std::uint64_t out_of_order_ = 0;
};

}  // namespace remote_test

TROUPE_REMOTE(remote_test::kv, put, get, size)
TROUPE_REMOTE(remote_test::worker, add, fail, echo, bytes, checksum, record, received, out_of_order, pid,
              sleep_ms, twice, add_via, self_ref, echo_ref, spawn_at)
// The worker node never calls spawn_on<worker>(std::int64_t) itself, so it learns the
// constructor here.
TROUPE_REMOTE_CTOR(remote_test::worker, std::int64_t)
