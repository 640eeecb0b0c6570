#pragma once
// Remote calls, the callee's side: the actors of this node that other nodes reach, by their
// cluster-wide wire id. With each, the nodes that watch it; besides them, the spawns from other
// nodes that failed here (why, for the calls on their way), the actors that went (remembered a
// while, so that a late call or watch is answered at once), and the calls and watches that came
// for an actor another node spawns here before its spawn did (a ref can travel faster, on
// another connection). The node's functions around it are in exports.cpp.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "net/node_protocol.hpp"
#include "troupe/actors/detail/cell.hpp"

namespace troupe::net {
class connection;
}

namespace troupe::detail {

/// An actor of this node under its wire id.
struct exported_actor {
  cell_ptr cell;
  const remote_type_entry* type = nullptr;
  std::string failure;           // set when construction failed
  std::vector<node_id> watchers;
  node_id owner = 0;  // the node whose end ends it (spawned from there, not detached)
};

/// A call that came before its actor, with the connection to answer on.
using early_call = std::pair<std::shared_ptr<net::connection>, envelope>;
/// Calls and watches of an actor another node spawns here that came before it: kept
/// forget_after at most, and handed over when it comes (calls in arrival order).
struct awaited {
  std::vector<early_call> calls;
  std::vector<node_id> watchers;
  clock_type::time_point since = clock_type::now();
};

/// Not thread-safe: the node uses it under its mutex.
class export_table {
public:
  /// The actor (or failed spawn) under `wire`, or null.
  exported_actor* find(std::uint64_t wire) {
    auto it = exported_.find(wire);
    return it == exported_.end() ? nullptr : &it->second;
  }
  bool contains(std::uint64_t wire) const { return exported_.contains(wire); }
  /// The wire id `c` was first exported under.
  std::optional<std::uint64_t> wire_of(const cell_base* c) const {
    auto it = wire_of_.find(c);
    if (it == wire_of_.end()) return std::nullopt;
    return it->second;
  }
  /// Whether `c` was ever exported (and has not gone).
  bool exported(const cell_base* c) const { return wire_of_.contains(c); }

  /// Exports `c` under `wire`, with the watches that came for it first. False when an actor is
  /// there already (nothing changes).
  bool add(std::uint64_t wire, cell_base& c, const remote_type_entry* type) {
    auto [it, fresh] = exported_.try_emplace(wire);
    if (!fresh && it->second.cell) return false;
    it->second.cell = cell_ptr(&c);
    it->second.type = type;
    wire_of_.try_emplace(&c, wire);
    if (auto e = awaited_.find(wire); e != awaited_.end()) it->second.watchers = std::move(e->second.watchers);
    return true;
  }
  /// Remembers why the spawn under `wire` failed, for the calls on their way (as many as the
  /// gone are remembered).
  void add_failure(std::uint64_t wire, std::string failure) {
    exported_[wire].failure = std::move(failure);
    failed_order_.push_back(wire);
    if (failed_order_.size() > remembered_gone) {
      if (auto old = exported_.find(failed_order_.front()); old != exported_.end() && !old->second.cell)
        exported_.erase(old);
      failed_order_.pop_front();
    }
  }
  /// Actor `wire` went: it is no longer exported, and remembered as gone. Its watchers, or
  /// nullopt when it was not exported.
  std::optional<std::vector<node_id>> remove(std::uint64_t wire) {
    auto it = exported_.find(wire);
    if (it == exported_.end()) return std::nullopt;
    auto watchers = std::move(it->second.watchers);
    if (auto w = wire_of_.find(it->second.cell.get()); w != wire_of_.end() && w->second == wire) wire_of_.erase(w);
    exported_.erase(it);
    if (gone_.insert(wire).second) gone_order_.push_back(wire);
    if (gone_order_.size() > remembered_gone) {
      gone_.erase(gone_order_.front());
      gone_order_.pop_front();
    }
    return watchers;
  }
  /// Whether actor `wire` was exported here and went (one of the latest remembered_gone).
  bool gone(std::uint64_t wire) const { return gone_.contains(wire); }

  /// What waits for actor `wire`, made on first use.
  awaited& awaiting(std::uint64_t wire) { return awaited_.try_emplace(wire).first->second; }
  /// What waited for actor `wire`, taken out (empty when nothing did).
  awaited take_awaited(std::uint64_t wire) {
    if (auto e = awaited_.extract(wire)) return std::move(e.mapped());
    return {};
  }
  /// Calls `f(wire, what)` on each awaited actor that `pred(wire, what)` picks, then forgets it.
  template <class Pred, class F>
  void take_awaited_if(Pred pred, F f) {
    for (auto e = awaited_.begin(); e != awaited_.end();) {
      if (pred(e->first, e->second)) {
        f(e->first, e->second);
        e = awaited_.erase(e);
      } else {
        ++e;
      }
    }
  }

  /// Node `id` is gone: it watches nothing here any more, and the actors it owns (spawned from
  /// there, not detached) are added to `orphans`.
  void forget_node(node_id id, std::vector<cell_ptr>& orphans) {
    for (auto& [wire, e] : exported_) {
      std::erase(e.watchers, id);
      if (e.owner == id && e.cell) orphans.push_back(e.cell);
    }
  }
  /// The wire id of each exported actor, by its local id.
  std::unordered_map<actor_id, std::uint64_t> wires_by_actor() const {
    std::unordered_map<actor_id, std::uint64_t> wires;
    for (auto& [wire, e] : exported_)
      if (e.cell) wires.emplace(e.cell->id(), wire);
    return wires;
  }
  /// Forgets the exported actors and what waits for actors to come (the node stops); the gone
  /// are still remembered.
  void clear() {
    exported_.clear();
    awaited_.clear();
    wire_of_.clear();
  }

private:
  std::unordered_map<std::uint64_t, exported_actor> exported_;
  std::unordered_map<const cell_base*, std::uint64_t> wire_of_;  // the first wire each exported cell got
  std::unordered_map<std::uint64_t, awaited> awaited_;
  /// The latest exported actors that went (remembered_gone of them), oldest first.
  std::unordered_set<std::uint64_t> gone_;
  std::deque<std::uint64_t> gone_order_;
  std::deque<std::uint64_t> failed_order_;  // wire ids of failed spawns, oldest first
};

}  // namespace troupe::detail
