#pragma once
// Monitors of actors on other nodes (monitor_remote, this_actor::monitor of a remote ref). The
// host of a watched actor tells this node when it goes (ctl::down); when the host is lost, the
// head may re-create the actor elsewhere (a restart policy), so its watches are held, not
// fired, until the head says where it went (ctl::moved: they move there) or that it re-created
// all it will of that node (ctl::relocated: they fire node_lost). A head that never says fires
// them after the node's hold limit. The node's functions around it are in watches.cpp.

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/node_protocol.hpp"
#include "troupe/actors/detail/cell.hpp"
#include "troupe/actors/future.hpp"

namespace troupe::detail {

/// A monitor of a remote actor: a future or an actor with on_down.
struct watch {
  state_ptr<down_notice> st;
  cell_ptr cell;
};
/// Completes the future, or sends the actor its down notice.
void fire(watch w, const down_notice& n);

/// The monitors of one remote actor.
struct watched {
  node_id host = 0;
  std::vector<watch> list;
  clock_type::time_point held_since{};  // while held; epoch when not
  bool held() const { return held_since != clock_type::time_point{}; }
};

/// The monitors of remote actors, by the actor's wire id. Not thread-safe: the node uses it
/// under its mutex.
class watch_table {
public:
  /// Adds `w` to the monitors of actor `wire`, which lives on `host`.
  watched& add(std::uint64_t wire, node_id host, watch w) {
    auto& entry = watches_[wire];
    entry.host = host;
    entry.list.push_back(std::move(w));
    return entry;
  }
  /// Actor `wire` lives on `to` now. True when its watches are to be renewed there (`to_alive`);
  /// held when `to` is lost as well. False when it is not watched or lived there already.
  bool rehost(std::uint64_t wire, node_id to, bool to_alive) {
    auto it = watches_.find(wire);
    if (it == watches_.end() || it->second.host == to) return false;
    it->second.host = to;
    if (to_alive) {
      it->second.held_since = {};
      return true;
    }
    it->second.held_since = clock_type::now();  // lost as well: held (the hold limit at most)
    return false;
  }
  /// Calls `f(wire, watches)` on each watched actor.
  template <class F>
  void each(F f) {
    for (auto& [wire, w] : watches_) f(wire, w);
  }
  /// Takes out the watches `pred` picks, to fire node_lost: adds them to `fired`.
  template <class Pred>
  void take_if(Pred pred, std::vector<std::pair<watch, down_notice>>& fired) {
    for (auto w = watches_.begin(); w != watches_.end();) {
      if (!pred(w->second)) {
        ++w;
        continue;
      }
      for (auto& x : w->second.list)
        fired.emplace_back(std::move(x), down_notice{w->first, exit_reason::node_lost,
                                                     "node " + std::to_string(w->second.host) + " is lost"});
      w = watches_.erase(w);
    }
  }
  /// Takes out the monitors of actor `wire` (none when it is not watched).
  std::vector<watch> take(std::uint64_t wire) {
    auto it = watches_.find(wire);
    if (it == watches_.end()) return {};
    auto list = std::move(it->second.list);
    watches_.erase(it);
    return list;
  }
  /// Takes out every monitor.
  std::vector<watch> take_all() {
    std::vector<watch> out;
    for (auto& [w, entry] : watches_)
      for (auto& x : entry.list) out.push_back(std::move(x));
    watches_.clear();
    return out;
  }

private:
  std::unordered_map<std::uint64_t, watched> watches_;
};

}  // namespace troupe::detail
