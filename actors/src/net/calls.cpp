// Remote calls (calls.hpp): sending a call or tell to another node and filing it for its
// reply, delivering the replies, and answering the calls that other nodes make to this node's
// actors (the actors are found in exports.hpp's table). Also the remote_actor handle's hooks.

#include "net/node_runtime.hpp"

namespace troupe::detail {

/// Answers a call that came on connection `conn` (by id: the connection may be gone by then).
class node_runtime::conn_responder final : public responder {
public:
  conn_responder(std::weak_ptr<node_runtime> n, std::uint64_t conn, std::uint64_t request)
      : node_(std::move(n)), conn_(conn), request_(request) {}
  void reply(encoded_pieces payload) noexcept override {
    if (payload.size() > max_payload_bytes) {
      // Sent, the frame would cost the connection (and every call on it): the caller gets why.
      auto env = make_envelope(envelope_kind::error, 0, 0, {}, request_);
      env.error_code = static_cast<std::uint32_t>(errc::message_too_large);
      env.error_message = too_large(payload.size(), "the reply");
      send(std::move(env));
      return;
    }
    auto env = make_envelope(envelope_kind::reply, 0, 0, std::move(payload.bytes), request_);
    env.splices = std::move(payload.splices);
    send(std::move(env));
  }
  void error(std::exception_ptr e) noexcept override {
    auto [code, what] = describe(std::move(e));
    auto env = make_envelope(envelope_kind::error, 0, 0, {}, request_);
    env.error_code = static_cast<std::uint32_t>(code);
    env.error_message = what.substr(0, 4096);
    send(std::move(env));
  }

private:
  void send(envelope env) noexcept {
    if (auto n = node_.lock()) n->send_on(conn_, std::move(env));
  }
  std::weak_ptr<node_runtime> node_;
  std::uint64_t conn_;
  std::uint64_t request_;
};

// ---- calls out -----------------------------------------------------------------------------

void node_runtime::call(node_id to, envelope env, std::unique_ptr<reply_sink> sink) {
  std::exception_ptr failure;
  if (env.payload_size() > max_payload_bytes) {
    error e(errc::message_too_large, too_large(env.payload_size(), "a message"));
    if (!sink) throw e;  // a tell has nobody else to tell
    failure = std::make_exception_ptr(e);
  } else {
    std::lock_guard lock(mu_);
    if (env.target != net::node_target) to = route(to, env.target);
    auto it = members_.find(to);
    if (stopped_) {
      failure = std::make_exception_ptr(error(errc::system_shutdown, "this node is stopping"));
    } else if (it == members_.end() || !it->second.alive) {
      failure = std::make_exception_ptr(
          error(errc::node_lost, "node " + std::to_string(to) +
                                     (it == members_.end() ? " is not a member of the cluster" : " is lost")));
    } else {
      auto& m = it->second;
      if (sink) {
        env.kind = envelope_kind::call;
        env.request_id = replies_.add(to, std::move(sink), m.conn != nullptr);
      }
      if (m.conn) {
        m.conn->send(std::move(env));
      } else {
        m.backlog.push_back(std::move(env));
        if (!m.dialing) dial(m);
      }
    }
  }
  if (failure) {
    if (sink) sink->fail(failure);
    else sys_.dead_letters.fetch_add(1, std::memory_order_relaxed);
  }
}

remote_ptr node_runtime::make_remote(node_id where, std::uint64_t wire) {
  return remote_ptr::adopt(new remote_actor(shared_from_this(), sys_, where, wire));
}

// ---- replies in ---------------------------------------------------------------------------

void node_runtime::on_reply(const std::shared_ptr<connection>& c, node_id from, envelope env) {
  std::unique_ptr<reply_sink> sink;
  {
    std::lock_guard lock(mu_);
    node_id made_to = 0;
    sink = replies_.take_reply(env.request_id, from, made_to);
    if (made_to == 0) return;  // timed out or failed already
    // Only the node that was called answers: a reply from another is a confused or lying peer.
    if (made_to != from)
      return c->refuse("a reply to call " + std::to_string(env.request_id) + " from node " + std::to_string(from) +
                       ", which was made to node " + std::to_string(made_to));
  }
  if (env.kind == envelope_kind::reply) {
    auto owner = net::share_payload(std::move(env.payload));
    sink->deliver(*owner, owner);
  }
  else sink->fail(error_from(env));
}

// ---- calls in ------------------------------------------------------------------------------

std::shared_ptr<responder> node_runtime::responder_for(const std::shared_ptr<connection>& c, const envelope& env) {
  if (env.kind != envelope_kind::call) return nullptr;
  return std::make_shared<conn_responder>(weak_from_this(), c->id(), env.request_id);
}

void node_runtime::send_on(std::uint64_t conn, envelope env) noexcept {
  std::lock_guard lock(mu_);
  auto it = conns_.find(conn);
  if (it != conns_.end()) it->second->send(std::move(env));
}

void node_runtime::on_call(const std::shared_ptr<connection>& c, envelope env) {
  auto r = responder_for(c, env);
  cell_ptr target;
  const remote_type_entry* type = nullptr;
  std::string failure;
  {
    std::lock_guard lock(mu_);
    if (auto* e = exports_.find(env.target)) {
      target = e->cell;
      type = e->type;
      failure = e->failure;
    } else if ((env.target >> wire_shift) != self_ && !exports_.gone(env.target) && !stopped_) {
      // An actor another node spawns here, whose spawn may still be on its way (a ref to it
      // can travel faster, on another connection): the call waits for it, forget_after at
      // most, and runs in arrival order when it comes (host_spawned).
      auto& early = exports_.awaiting(env.target);
      if (early.calls.size() < remembered_gone) {
        early.calls.emplace_back(c, std::move(env));
        return;
      }
    }
  }
  auto refuse = [&](errc code, std::string what) { refuse_call(c, env, std::make_exception_ptr(error(code, what))); };
  if (!failure.empty()) return refuse(errc::actor_dead, failure);
  if (!target) return refuse(errc::actor_dead, no_actor(env.target));
  if (!type)
    return refuse(errc::decode_error, "actor " + std::to_string(env.target) + " on node " + std::to_string(self()) +
                                          " is of a class this program does not declare remote");
  dispatch_fn fn = nullptr;
  for (auto& [id, f] : type->methods)
    if (id == env.method) fn = f;
  if (!fn)
    return refuse(errc::decode_error, std::string(type->name) + " has no remote method with id " +
                                          std::to_string(env.method) + " (do both programs list the same TROUPE_REMOTE methods?)");
  try {
    // Shared: views decoded from it (shared_span arguments) point into the frame's buffer.
    auto owner = net::share_payload(std::move(env.payload));
    fn(*target, *owner, owner, r);
  } catch (...) {
    auto [code, what] = describe(std::current_exception());
    refuse(code, "arguments of a call to " + std::string(type->name) + ": " + what);
  }
}

void node_runtime::refuse_call(const std::shared_ptr<connection>& c, const envelope& env, std::exception_ptr e) {
  if (env.kind == envelope_kind::call) conn_responder(weak_from_this(), c->id(), env.request_id).error(std::move(e));
  else sys_.dead_letters.fetch_add(1, std::memory_order_relaxed);
}

std::string node_runtime::no_actor(std::uint64_t wire) const {
  return "no actor " + std::to_string(wire) + " on node " + std::to_string(self()) + " (stopped, or never spawned)";
}

// ---- the remote_actor handle (remote_handle.hpp) --------------------------------------------

void retain(remote_actor* a) noexcept { a->refs.fetch_add(1, std::memory_order_relaxed); }
void release(remote_actor* a) noexcept {
  if (a->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) std::unique_ptr<remote_actor>{a};
}
std::uint64_t remote_wire_id(const remote_actor& a) noexcept { return a.wire; }
node_id remote_node(const remote_actor& a) noexcept { return a.node->location(a.where, a.wire); }
bool remote_alive(const remote_actor& a) noexcept {
  return a.node->member_alive(a.node->location(a.where, a.wire));
}
system_impl& remote_system(const remote_actor& a) noexcept { return *a.sys; }

void remote_call(remote_actor& a, std::uint64_t method, encoded_pieces args, std::unique_ptr<reply_sink> sink) {
  envelope env;
  env.kind = sink ? envelope_kind::call : envelope_kind::tell;
  env.target = a.wire;
  env.method = method;
  env.payload = std::move(args.bytes);
  env.splices = std::move(args.splices);
  a.node->call(a.where, std::move(env), std::move(sink));
}

}  // namespace troupe::detail
