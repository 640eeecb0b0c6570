// Monitors of actors on other nodes (watches.hpp): asking the actor's host to watch it, holding
// the watches of a lost node's actors until the head says where they went, and firing them.

#include <stdexcept>

#include "net/node_runtime.hpp"

namespace troupe::detail {

void fire(watch w, const down_notice& n) {
  if (w.st) w.st->complete_value(true, n);
  if (w.cell) send_down_notice(*w.cell, n);
}

void node_runtime::add_watch(remote_actor& a, watch w) {
  bool lost = false;
  node_id where;
  {
    std::lock_guard lock(mu_);
    where = route(a.where, a.wire);
    auto it = members_.find(where);
    lost = stopped_ || it == members_.end() || !it->second.alive;
    if (!lost || may_relocate(where)) {
      auto& entry = watches_.add(a.wire, where, std::move(w));
      if (lost) {  // its node is lost: the watch waits for the head's word (see watched)
        entry.held_since = it->second.lost_at;
        return;
      }
    }
  }
  if (lost) return fire(std::move(w), down_notice{a.wire, exit_reason::node_lost, "node " + std::to_string(where) + " is lost"});
  call(where, node_op(envelope_kind::tell, op::watch, encode(a.wire)), nullptr);
}

bool node_runtime::may_relocate(node_id id) const {
  if (stopped_ || id == head_id) return false;
  auto m = members_.find(id);
  if (m == members_.end() || m->second.alive || m->second.left) return false;
  if (clock_type::now() - m->second.lost_at > hold_limit()) return false;
  if (self_ == head_id) return true;
  auto h = members_.find(head_id);
  return h != members_.end() && h->second.alive;
}

void node_runtime::rehost(std::uint64_t wire, node_id to, aftermath& out) {
  auto m = members_.find(to);
  if (watches_.rehost(wire, to, m != members_.end() && m->second.alive)) out.rewatch.emplace_back(to, wire);
}

// ---- envelopes of watches ------------------------------------------------------------------

void node_runtime::on_down_notice(const envelope& env) {
  auto [wire, reason, what] = decode<down_tuple>(env.payload);
  if (reason > static_cast<std::uint8_t>(exit_reason::node_lost))
    throw error(errc::decode_error, "unknown exit reason");
  std::vector<watch> list;
  {
    std::lock_guard lock(mu_);
    if (self_ == head_id)  // the names of an actor that is gone (one may have been named after it went)
      names_.forget_actor(wire);
    list = watches_.take(wire);
  }
  down_notice n{wire, static_cast<exit_reason>(reason), what};
  for (auto& w : list) fire(std::move(w), n);
}

void node_runtime::on_moved(const std::shared_ptr<connection>& c, node_id from, const envelope& env) {
  auto [wire, to] = decode<moved_tuple>(env.payload);
  aftermath after;
  {
    std::lock_guard lock(mu_);
    if (from != head_id) return c->refuse("a moved notice from node " + std::to_string(from) + ": only the head sends it");
    restarts_.moved(wire, to);
    rehost(wire, to, after);
  }
  post(std::move(after));
}

void node_runtime::on_relocated(const std::shared_ptr<connection>& c, node_id from, const envelope& env) {
  auto lost = decode<std::uint32_t>(env.payload);
  aftermath after;
  {
    std::lock_guard lock(mu_);
    if (from != head_id) return c->refuse("a relocated notice from node " + std::to_string(from) + ": only the head sends it");
    watches_.take_if([lost](const watched& w) { return w.host == lost; }, after.fired);
  }
  post(std::move(after));
}

// ---- the functions behind monitor (remote.hpp) ---------------------------------------------

future<down_notice> monitor_remote(remote_actor& a) {
  auto* st = make_state<down_notice>();
  st->set_system(a.sys);
  st->add_ref();
  future<down_notice> f{state_ptr<down_notice>(st)};
  a.node->add_watch(a, {state_ptr<down_notice>(st), {}});
  return f;
}

void watch_remote(remote_actor& a, cell_base& watcher) {
  if (!watcher.receives_down_notices())
    throw std::logic_error(std::string("this_actor::monitor: ") + watcher.type_name() +
                           " has no on_down(const troupe::down_notice&) to receive the notice");
  a.node->add_watch(a, {{}, cell_ptr(&watcher)});
}

}  // namespace troupe::detail
