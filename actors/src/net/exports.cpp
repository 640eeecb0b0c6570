// The actors here that other nodes reach (exports.hpp): exporting a local actor under its wire
// id, telling the nodes that watch it when it goes, and resolving the actor_refs that arrive.

#include <algorithm>

#include "net/node_runtime.hpp"

namespace troupe::detail {

ref_address node_runtime::address_of_local(cell_base& c, std::string_view type) {
  const auto* entry = find_type(type);
  if (!entry) throw error(errc::type_mismatch, "an actor_ref of " + std::string(type) + ", which is no remote class");
  return {self(), export_local(c, type)};
}

spawned node_runtime::resolve(const ref_address& a, std::string_view type) {
  if (a.where != self()) return {{}, make_remote(a.where, a.wire)};
  std::lock_guard lock(mu_);
  auto* e = exports_.find(a.wire);
  if (!e || !e->cell)
    throw error(errc::actor_dead, "an actor_ref to actor " + std::to_string(a.wire) + " of node " +
                                      std::to_string(a.where) + ", which is gone");
  if (!e->type || e->type->name != type)
    throw error(errc::decode_error, "an actor_ref of " + std::string(type) + " points to a " +
                                        std::string(e->type ? e->type->name : "?"));
  return {e->cell, {}};
}

std::uint64_t node_runtime::export_local(cell_base& c, std::string_view type) {
  {
    std::lock_guard lock(mu_);
    if (auto wire = exports_.wire_of(&c)) return *wire;
  }
  auto wire = (static_cast<std::uint64_t>(self()) << wire_shift) | c.id();
  export_at(wire, c, find_type(type));
  return wire;
}

void node_runtime::export_at(std::uint64_t wire, cell_base& c, const remote_type_entry* type) {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;  // nothing is exported by a node that is stopping
    if (!exports_.add(wire, c, type)) return;  // an actor is there already
  }
  struct on_gone final : down_callback {
    std::weak_ptr<node_runtime> node;
    std::uint64_t wire;
    void notify(const down_notice& n) noexcept override {
      if (auto self = node.lock()) self->exported_down(wire, n);
    }
    bool abandoned() const noexcept override { return node.expired(); }
  };
  auto cb = std::make_unique<on_gone>();
  cb->node = weak_from_this();
  cb->wire = wire;
  c.on_down(std::move(cb));
}

void node_runtime::send_down_to(const std::vector<node_id>& nodes, const down_tuple& d) {
  auto payload = encode(d);
  for (auto w : nodes)
    if (auto m = members_.find(w); m != members_.end() && m->second.conn) m->second.conn->send(control(ctl::down, payload));
}

void node_runtime::exported_down(std::uint64_t wire, const down_notice& n) {
  std::lock_guard lock(mu_);
  // Remembered a while as gone, so that a watch arriving after it went is answered at once.
  auto watchers = exports_.remove(wire);
  if (!watchers) return;
  send_down_to(*watchers, down_tuple{wire, static_cast<std::uint8_t>(n.reason), n.what});
  // Its cluster-wide names go too.
  if (self_ == head_id) {
    names_.forget_actor(wire);
  } else if (auto h = members_.find(head_id); h != members_.end() && h->second.conn) {
    h->second.conn->send(node_op(envelope_kind::tell, op::unregister_name, encode(wire)));
  }
}

// ---- node operations on the actors here ----------------------------------------------------

void node_runtime::op_stop_actor(const envelope& env) {
  auto wire = decode<std::uint64_t>(env.payload);
  cell_ptr cell;
  {
    std::lock_guard lock(mu_);
    if (auto* e = exports_.find(wire)) cell = e->cell;
  }
  if (cell) cell->stop(exit_reason::stopped);
}

void node_runtime::op_watch(const std::shared_ptr<connection>& c, node_id from, const envelope& env) {
  auto wire = decode<std::uint64_t>(env.payload);
  std::lock_guard lock(mu_);
  auto* e = exports_.find(wire);
  if (e && e->cell) {
    if (std::find(e->watchers.begin(), e->watchers.end(), from) == e->watchers.end()) e->watchers.push_back(from);
  } else if (!e && (wire >> wire_shift) != self_ && from != 0 && !exports_.gone(wire)) {
    // Spawned here by another node, whose spawn may still be on its way (it travels on
    // another connection): the watch waits for it, forget_after at most.
    auto& early = exports_.awaiting(wire);
    if (std::find(early.watchers.begin(), early.watchers.end(), from) == early.watchers.end()) early.watchers.push_back(from);
  } else if (c) {
    // A spawn that failed says why; otherwise it is gone (or never was).
    const bool failed = e && !e->failure.empty();
    c->send(control(ctl::down, encode(down_tuple{wire, static_cast<std::uint8_t>(failed ? exit_reason::failed : exit_reason::stopped),
                                                 failed ? e->failure : std::string("no such actor")})));
  }
}

// ---- actor_refs on the wire (remote.hpp) ---------------------------------------------------

ref_address address_of(cell_base* local, remote_actor* remote, std::string_view type) {
  if (remote) return {remote->node->location(remote->where, remote->wire), remote->wire};
  if (!local) return {};
  auto& sys = local->system();
  if (!sys.node)
    throw error(errc::decode_error, "an actor_ref can travel to another process only from a node "
                                    "(set system_config::node.listen)");
  return sys.node->address_of_local(*local, type);
}

spawned resolve(const ref_address& a, std::string_view type) {
  if (a.where == 0 && a.wire == 0) return {};
  if (!tls_decoding_node)
    byte_reader::fail("an actor_ref can be decoded only by the node that receives it");
  return tls_decoding_node->resolve(a, type);
}

}  // namespace troupe::detail
