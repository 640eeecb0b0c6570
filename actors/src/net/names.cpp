// The cluster's names (names.hpp): register_name and lookup of a cluster-wide name from any
// node, and the head's checks before a name goes to an actor.

#include <stdexcept>

#include "net/node_runtime.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {

namespace {

/// The head's answer to a cluster-wide name: completes the registration's future, and on a
/// refusal removes the local name the registration added (only while it still names that actor).
class name_sink final : public reply_sink {
public:
  name_sink(state<void>* st, system_impl& sys, std::string name, cell_base* added) noexcept
      : inner_(st), sys_(sys), name_(std::move(name)), added_(added) {}
  ~name_sink() override {
    if (!done_) roll_back();  // the inner sink fails the future with broken_promise
  }
  void deliver(std::span<const std::byte> payload, const std::shared_ptr<const void>& owner) noexcept override {
    done_ = true;
    inner_.deliver(payload, owner);
  }
  void fail(std::exception_ptr e) noexcept override {
    done_ = true;
    roll_back();
    inner_.fail(std::move(e));
  }

private:
  void roll_back() noexcept {
    if (!added_) return;
    std::lock_guard lock(sys_.names_mutex);
    if (auto it = sys_.names.find(name_); it != sys_.names.end() && it->second.get() == added_) sys_.names.erase(it);
  }

  typed_sink<void> inner_;
  system_impl& sys_;
  std::string name_;
  cell_base* added_;
  bool done_ = false;
};

}  // namespace

// ---- naming from this node -----------------------------------------------------------------

void node_runtime::forget_name(const std::string& name, cell_base* had) {
  {
    std::lock_guard lock(mu_);
    // A name of an actor that never travelled (not a TROUPE_REMOTE class) was never
    // cluster-wide: another node's actor may hold that name there.
    if (had && !exports_.exported(had)) return;
    if (self_ == head_id) {
      names_.forget(name);
      return;
    }
  }
  call(head_id, node_op(envelope_kind::tell, op::forget_name, encode(name)), nullptr);
}

std::optional<spawned> node_runtime::lookup(std::string_view name, std::string& type) {
  found_tuple found;
  if (self() == head_id) {
    found = find_name(std::string(name));
  } else {
    auto* st = make_state<found_tuple>();
    st->set_system(&sys_);
    st->add_ref();
    future<found_tuple> f{state_ptr<found_tuple>(st)};
    call(head_id, node_op(envelope_kind::call, op::lookup, encode(std::string(name))),
         std::make_unique<typed_sink<found_tuple>>(st));
    found = std::move(f).timeout(cfg_.join_timeout).get();
  }
  auto& [ok, wire, where, t] = found;
  if (!ok) return std::nullopt;
  type = t;
  if (where == self()) {
    std::lock_guard lock(mu_);
    auto* e = exports_.find(wire);
    if (!e || !e->cell) return std::nullopt;
    return spawned{e->cell, {}};
  }
  return spawned{{}, make_remote(where, wire)};
}

future<void> node_runtime::publish_name(const std::string& name, cell_base* local, remote_actor* remote,
                                        std::string_view type, cell_base* added) {
  name_tuple t;
  if (local) {
    auto wire = export_local(*local, type);
    t = {name, wire, self(), std::string(type)};
  } else {
    t = {name, remote->wire, remote->where, std::string(type)};
  }
  auto* st = make_state<void>();
  st->set_system(&sys_);
  st->add_ref();
  future<void> f{state_ptr<void>(st)};
  auto sink = std::make_unique<name_sink>(st, sys_, name, added);
  if (self() == head_id) {
    errc code{};
    if (auto why = add_name(std::move(t), code); !why.empty()) {
      sink->fail(std::make_exception_ptr(error(code, why)));  // removes the local name it added
      throw error(code, why);  // known at once: register_name throws, even inside an actor
    }
    sink->deliver({}, nullptr);
    return f;
  }
  call(head_id, node_op(envelope_kind::call, op::register_name, encode(t)), std::move(sink));
  return f;
}

void node_runtime::await_name(const std::string& name, future<void> f) {
  if (tls_current_cell() != nullptr || tls_on_worker()) {
    std::move(f).then([] {}, [name, self = self()](std::exception_ptr e) {
      log().warn("troupe node {}: register_name(\"{}\") refused: {}", self, name, describe(e).second);
    });
    return;
  }
  std::move(f).timeout(cfg_.join_timeout).get();
}

// ---- the head's registry -------------------------------------------------------------------

std::string node_runtime::add_name(name_tuple t, errc& code) {
  std::lock_guard lock(mu_);
  auto& [name, wire, where, type] = t;
  code = errc::decode_error;
  if (name.empty()) return "register_name: a name must not be empty";
  code = errc::node_lost;
  const node_id at = route(where, wire);  // where it lives now (re-created elsewhere, perhaps)
  if (auto m = members_.find(at); m == members_.end() || !m->second.alive) {
    return "register_name('" + name + "'): node " + std::to_string(at) + " of actor " + std::to_string(wire) + " is lost";
  } else if (at != self_ && m->second.conn) {
    // Its node answers with a down notice when the actor goes, or is gone already: the name
    // goes with it.
    m->second.conn->send(node_op(envelope_kind::tell, op::watch, encode(wire)));
  }
  code = errc::actor_dead;
  if (at == self_) {
    auto* e = exports_.find(wire);
    if (!e || !e->cell)
      return "register_name('" + name + "'): actor " + std::to_string(wire) + " is gone (or never was)";
  }
  code = errc::name_taken;
  if (auto* holder = names_.holder(name); holder && holder->wire != wire) {
    auto m = members_.find(holder->where);
    if (m != members_.end() && m->second.alive)
      return "the name '" + name + "' already belongs to actor " + std::to_string(holder->wire) + " on node " +
             std::to_string(holder->where);
  }
  names_.put(name, {wire, where, type});
  return {};
}

found_tuple node_runtime::find_name(const std::string& name) {
  std::lock_guard lock(mu_);
  return names_.find(name);
}

// ---- node operations of names --------------------------------------------------------------

void node_runtime::op_lookup(const envelope& env, const std::shared_ptr<responder>& r) {
  auto found = encode(find_name(decode<std::string>(env.payload)));
  if (r) r->reply({std::move(found), {}});
}

void node_runtime::op_register_name(const envelope& env, const std::shared_ptr<responder>& r) {
  const auto t = decode<name_tuple>(env.payload);
  errc code{};
  if (auto why = add_name(t, code); !why.empty()) {
    if (r) throw error(code, why);
    log().warn("troupe node {}: {}; refused for actor {} on node {}", self(), why, std::get<1>(t), std::get<2>(t));
  }
  if (r) r->reply({});
}

void node_runtime::op_forget_name(const envelope& env) {
  auto name = decode<std::string>(env.payload);
  std::lock_guard lock(mu_);
  names_.forget(name);
}

void node_runtime::op_unregister_name(const envelope& env) {  // every name of an actor that is gone
  auto wire = decode<std::uint64_t>(env.payload);
  std::lock_guard lock(mu_);
  names_.forget_actor(wire);
}

// ---- the functions behind register_name and lookup (remote.hpp, node.hpp) ------------------

namespace {
node_runtime& node_of(system_impl& s, const char* what) {
  if (!s.node)
    throw std::invalid_argument(std::string(what) +
                                ": this actor_system is no node (set system_config::node.listen)");
  return *s.node;
}
}  // namespace

void forget_cluster_name(node_runtime& n, std::string_view name, cell_base* had) { n.forget_name(std::string(name), had); }

std::optional<spawned> remote_lookup(system_impl& s, std::string_view name, std::string& type) {
  if (!s.node) return std::nullopt;
  return s.node->lookup(name, type);
}

future<void> publish_name(system_impl& s, const std::string& name, cell_base* local, remote_actor* remote,
                          std::string_view type, cell_base* added) {
  if (!s.node) {
    if (remote) node_of(s, "register_name of a remote actor");
    promise<void> named(&s);
    auto f = named.get_future();
    named.set_value();
    return f;
  }
  return s.node->publish_name(name, local, remote, type, added);
}

void await_name(system_impl& s, const std::string& name, future<void> f) {
  if (s.node) return s.node->await_name(name, std::move(f));
  // Not a node: the future is complete already.
  if (tls_current_cell() == nullptr && !tls_on_worker()) std::move(f).get();
}

}  // namespace troupe::detail
