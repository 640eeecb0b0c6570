#pragma once
// The cluster's names: the head keeps which actor (wire id, node, class) each cluster-wide name
// belongs to; the other nodes ask it (op::register_name, op::lookup, op::forget_name). The
// node's functions around the registry (publishing, looking up, the checks a name must pass)
// are in names.cpp.

#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "net/node_protocol.hpp"

namespace troupe::detail {

/// The head's registry of cluster-wide names. Not thread-safe: the node uses it under its mutex.
class name_registry {
public:
  struct entry {
    std::uint64_t wire = 0;
    node_id where = 0;  // where the actor was made
    std::string type;
  };
  /// What `name` names: (found, wire id, node, class).
  found_tuple find(const std::string& name) const {
    auto it = names_.find(name);
    if (it == names_.end()) return {false, 0, 0, {}};
    return {true, it->second.wire, it->second.where, it->second.type};
  }
  /// The actor `name` belongs to now, or null.
  const entry* holder(const std::string& name) const {
    auto it = names_.find(name);
    return it == names_.end() ? nullptr : &it->second;
  }
  void put(const std::string& name, entry e) { names_[name] = std::move(e); }
  void forget(const std::string& name) { names_.erase(name); }
  /// Forgets every name of actor `wire` (it went).
  void forget_actor(std::uint64_t wire) {
    std::erase_if(names_, [wire](const auto& kv) { return kv.second.wire == wire; });
  }
  /// Forgets every name of an actor made on node `id` (it is gone).
  void forget_node(node_id id) {
    std::erase_if(names_, [id](const auto& kv) { return kv.second.where == id; });
  }
  /// Calls `f(name, entry)` on each name, in order.
  template <class F>
  void each(F f) const {
    for (auto& [name, e] : names_) f(name, e);
  }

private:
  std::map<std::string, entry> names_;
};

}  // namespace troupe::detail
