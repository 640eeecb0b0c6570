#pragma once
// Spawning and placement: where the actors that other nodes spawn live, and how the head
// re-creates them when their node is lost. The head keeps a record of each actor spawned with a
// restart policy (op::restartable); when its node is lost it re-creates it on the least-loaded
// live node under the same wire id and tells every node where it went (ctl::moved), which each
// node remembers to route calls there. The node's functions around it (spawn_on, placement,
// making the actors other nodes spawn here) are in spawning.cpp.

#include <cstdint>
#include <unordered_map>

#include "net/node_protocol.hpp"

namespace troupe::detail {

/// The head's records of restartable actors, and every node's map of actors re-created on
/// another node. Not thread-safe: the node uses it under its mutex.
class restart_book {
public:
  /// Where actor `wire`, made on `made_on`, lives now.
  node_id route(node_id made_on, std::uint64_t wire) const {
    if (relocated_.empty()) return made_on;
    auto it = relocated_.find(wire);
    return it == relocated_.end() ? made_on : it->second;
  }
  /// Actor `wire` was re-created on `to` (the head's word).
  void moved(std::uint64_t wire, node_id to) { relocated_[wire] = to; }

  /// Head: how to re-create the actor `spawn` (its wire id included) that lives on `host`.
  void record(node_id host, const spawn_tuple& spawn) { restartable_[std::get<2>(spawn)] = {host, spawn, 0}; }
  /// Head: actor `wire` is not to be re-created (stopped on purpose).
  void forget(std::uint64_t wire) { restartable_.erase(wire); }
  /// Head: node `id` is gone: the actors it spawned (not detached) are not re-created either.
  void forget_spawned_by(node_id id) {
    std::erase_if(restartable_, [id](const auto& kv) {
      return (kv.first >> wire_shift) == id && !std::get<8>(std::get<3>(kv.second.spawn));
    });
  }
  /// Head: the records of the actors on lost node `lost`. Without `recreate` (it left) they are
  /// dropped; otherwise each with restarts left moves to `place()`, is routed there, and is
  /// handed to `moved(wire, to, spawn, restarts)` (restarts: how many times it has been re-created,
  /// this one included); the others are dropped and handed to `exhausted(wire, type, max)`.
  template <class Place, class Moved, class Exhausted>
  void relocate(node_id lost, bool recreate, Place place, Moved moved, Exhausted exhausted) {
    for (auto it = restartable_.begin(); it != restartable_.end();) {
      auto& r = it->second;
      if (r.host != lost) {
        ++it;
        continue;
      }
      if (!recreate) {
        it = restartable_.erase(it);
        continue;
      }
      int max = std::get<2>(std::get<3>(r.spawn));
      if (max >= 0 && r.restarts >= max) {
        exhausted(it->first, std::get<0>(r.spawn), max);
        it = restartable_.erase(it);
        continue;
      }
      node_id to = place();
      ++r.restarts;
      r.host = to;
      relocated_[it->first] = to;
      moved(it->first, to, r.spawn, r.restarts);
      ++it;
    }
  }

private:
  struct restartable {
    node_id host = 0;
    spawn_tuple spawn;  // how to make it again (its wire id included)
    int restarts = 0;
  };
  std::unordered_map<std::uint64_t, node_id> relocated_;  // actors re-created on another node
  std::unordered_map<std::uint64_t, restartable> restartable_;  // head: how to re-create them
};

}  // namespace troupe::detail
