// Spawning and placement (spawning.hpp): spawn_on (placement on the least-loaded live node),
// making the actors other nodes spawn here, stopping remote actors, re-creating a lost node's
// restartable actors elsewhere (head), and the registry of remote classes that makes them.

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "failure_log.hpp"
#include "net/node_runtime.hpp"
#include "troupe/core/log.hpp"

namespace troupe::detail {

// ---- the registry of remote classes ---------------------------------------------------------

namespace {

struct type_registry {
  std::mutex mu;
  std::unordered_map<std::string, remote_type_entry> types;
  std::unordered_map<std::string, std::unordered_map<std::uint64_t, construct_fn>> ctors;
};
type_registry& registry() {
  static type_registry r;
  return r;
}

}  // namespace

const remote_type_entry* find_type(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.types.find(std::string(name));
  return it == r.types.end() ? nullptr : &it->second;  // entries are never erased
}
construct_fn find_ctor(std::string_view type, std::uint64_t key) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.ctors.find(std::string(type));
  if (it == r.ctors.end()) return nullptr;
  auto c = it->second.find(key);
  return c == it->second.end() ? nullptr : c->second;
}

bool register_remote_type(remote_type_entry e) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.types.try_emplace(std::string(e.name), std::move(e));
  return true;
}

bool register_remote_constructor(std::string_view type, std::uint64_t key, construct_fn f) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.ctors[std::string(type)].try_emplace(key, f);
  return true;
}

// ---- spawn_on, placement, stopping ---------------------------------------------------------

node_id node_runtime::location(node_id made_on, std::uint64_t wire) const {
  std::lock_guard lock(mu_);
  return route(made_on, wire);
}

node_id node_runtime::place() const {  // under mu_: the live member with the fewest actors
  node_id best = self_;
  std::uint64_t best_load = ~std::uint64_t{0};
  for (auto& [id, m] : members_) {
    if (!m.alive) continue;
    std::uint64_t load = (id == self_ ? sys_.live_count.load(std::memory_order_relaxed) : m.actors) + m.placed;
    if (load < best_load) best = id, best_load = load;
  }
  return best;
}

spawned node_runtime::spawn(node_id where, std::string_view type, std::uint64_t ctor, std::vector<std::byte> args,
                            const spawn_options& opts) {
  node_id self;
  std::uint64_t wire;
  {
    std::lock_guard lock(mu_);
    self = self_;
    if (where == 0) where = place();
    auto it = members_.find(where);
    if (it == members_.end() || !it->second.alive)
      throw error(errc::node_lost, "spawn_on: node " + std::to_string(where) + " is not a live member");
    ++it->second.placed;
    wire = (static_cast<std::uint64_t>(self) << wire_shift) | sys_.next_id();
  }
  if (where == self) return {construct_local(type, ctor, args, opts), {}};
  auto record = spawn_tuple{std::string(type), ctor, wire, pack(opts), std::move(args)};
  if (opts.restart.max_restarts != 0) {
    // The head re-creates it elsewhere if its node is lost.
    if (self == head_id) add_restartable(where, record);
    else call(head_id, node_op(envelope_kind::tell, op::restartable, encode(std::tuple<std::uint32_t, spawn_tuple>(where, record))),
              nullptr);
  }
  auto payload = encode(record);
  struct spawn_sink final : reply_sink {
    std::string what;
    void deliver(std::span<const std::byte>, const std::shared_ptr<const void>&) noexcept override {}
    void fail(std::exception_ptr e) noexcept override {
      log().warn("spawn_on of {} failed: {}", what, describe(e).second);
    }
  };
  auto sink = std::make_unique<spawn_sink>();
  sink->what = std::string(type) + " on node " + std::to_string(where);
  call(where, node_op(envelope_kind::call, op::spawn, std::move(payload)), std::move(sink));
  return {{}, make_remote(where, wire)};
}

void node_runtime::stop_remote(remote_actor& a) {
  {
    std::lock_guard lock(mu_);
    restarts_.forget(a.wire);  // stopped on purpose: not to be re-created
  }
  if (self() != head_id)
    call(head_id,
         node_op(envelope_kind::tell, op::restartable,
                 encode(std::tuple<std::uint32_t, spawn_tuple>(0, spawn_tuple{{}, 0, a.wire, {}, {}}))),
         nullptr);
  call(location(a.where, a.wire), node_op(envelope_kind::tell, op::stop_actor, encode(a.wire)), nullptr);
}

// ---- re-creating a lost node's actors (head) -----------------------------------------------

void node_runtime::add_restartable(node_id host, const spawn_tuple& record) {
  std::lock_guard lock(mu_);
  restarts_.record(host, record);
}

void node_runtime::relocate(node_id lost, bool recreate) {
  std::vector<std::pair<node_id, spawn_tuple>> todo;
  aftermath after;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    restarts_.relocate(
        lost, recreate,
        [this] {
          node_id to = place();
          ++members_[to].placed;
          return to;
        },
        [&](std::uint64_t wire, node_id to, const spawn_tuple& spawn, int restarts) {
          todo.emplace_back(to, spawn);
          auto payload = encode(moved_tuple{wire, to});
          for (auto& [id, m] : members_)
            if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::moved, payload));
          rehost(wire, to, after);
          const auto& type = std::get<0>(spawn);
          log().info("troupe node 1: re-creating actor {} ({}) of lost node {} on node {}", wire, type, lost, to);
          // A restart like one after a failure: counted for its type and listed among the
          // failures of the head's status report.
          sys_.failures->record(wire, type.c_str(), true, static_cast<std::uint32_t>(restarts),
                                "node " + std::to_string(lost) + " was lost; re-created on node " + std::to_string(to));
        },
        [&](std::uint64_t wire, const std::string& type, int max) {
          log().warn("troupe node 1: actor {} ({}) was on lost node {} and has used its {} restarts", wire, type, lost, max);
          sys_.failures->record(wire, type.c_str(), false, static_cast<std::uint32_t>(max),
                                "node " + std::to_string(lost) + " was lost; its restarts are used up");
        });
    auto payload = encode(static_cast<std::uint32_t>(lost));
    for (auto& [id, m] : members_)
      if (id != self_ && m.alive && m.conn) m.conn->send(control(ctl::relocated, payload));
    watches_.take_if([lost](const watched& w) { return w.host == lost; }, after.fired);
  }
  for (auto& [to, record] : todo) {
    if (to == self()) {
      if (auto failure = host_spawned(record); !failure.empty())
        log().warn("troupe node 1: re-creating actor {} failed: {}", std::get<2>(record), failure);
      continue;
    }
    struct respawn_sink final : reply_sink {
      void deliver(std::span<const std::byte>, const std::shared_ptr<const void>&) noexcept override {}
      void fail(std::exception_ptr e) noexcept override {
        log().warn("troupe node 1: re-creating an actor failed: {}", describe(e).second);
      }
    };
    call(to, node_op(envelope_kind::call, op::spawn, encode(record)), std::make_unique<respawn_sink>());
  }
  post(std::move(after));  // (the watches go to the new hosts after the spawns)
}

// ---- the actors other nodes spawn here -----------------------------------------------------

std::string node_runtime::host_spawned(const spawn_tuple& record) {
  const auto& [type, ctor, wire, opts, args] = record;
  cell_ptr cell;
  std::string failure;
  try {
    cell = construct_local(type, ctor, args, unpack(opts));
  } catch (...) {
    failure = "constructing " + type + " on node " + std::to_string(self()) + " failed: " +
              describe(std::current_exception()).second;
  }
  if (cell) {
    export_spawned(wire, *cell, type, opts);
  } else {
    std::lock_guard lock(mu_);
    exports_.add_failure(wire, failure);  // for the calls that were on their way
  }
  awaited early;
  {
    std::lock_guard lock(mu_);
    early = exports_.take_awaited(wire);
    // (A made actor's watchers were taken by export_at.)
    if (!cell) send_down_to(early.watchers, down_tuple{wire, static_cast<std::uint8_t>(exit_reason::failed), failure});
  }
  for (auto& [c, env] : early.calls) on_call(c, std::move(env));
  return failure;
}

cell_ptr node_runtime::construct_local(std::string_view type, std::uint64_t ctor, std::span<const std::byte> args,
                                     const spawn_options& opts) {
  decoding_scope decoding(this);
  auto fn = find_ctor(type, ctor);
  if (!fn) {
    if (!find_type(type))
      throw std::invalid_argument("spawn_on: node " + std::to_string(self()) + " does not know the class '" +
                                  std::string(type) + "' (declare it with TROUPE_REMOTE in the program or a loaded library)");
    throw std::invalid_argument("spawn_on: node " + std::to_string(self()) + " knows no constructor of " +
                                std::string(type) + " with these argument types (declare it with TROUPE_REMOTE_CTOR)");
  }
  if (!sys_.facade) throw error(errc::system_shutdown, "the actor system is gone");
  return fn(*sys_.facade, args, opts);
}

void node_runtime::export_spawned(std::uint64_t wire, cell_base& c, const std::string& type, const spawn_opts_tuple& opts) {
  export_at(wire, c, find_type(type));
  if (std::get<8>(opts)) return;
  const auto owner = static_cast<node_id>(wire >> wire_shift);
  {
    std::lock_guard lock(mu_);
    auto* e = exports_.find(wire);
    if (!e) return;  // (this node is stopping)
    e->owner = owner;
    auto m = members_.find(owner);
    if (owner == self_ || (m != members_.end() && m->second.alive)) return;
  }
  c.stop(exit_reason::stopped);
}

// ---- node operations of spawning -----------------------------------------------------------

void node_runtime::op_spawn(node_id from, const envelope& env, const std::shared_ptr<responder>& r) {
  const auto record = decode<spawn_tuple>(env.payload);
  const auto wire = std::get<2>(record);
  {
    // The wire id is the spawner's (its node id above wire_shift), or the one a lost
    // node's actor had when the head re-creates it; and it is nobody's here yet.
    std::lock_guard lock(mu_);
    if ((wire >> wire_shift) != from && from != head_id)
      throw error(errc::decode_error, "node " + std::to_string(from) + " spawns under wire id " +
                                          std::to_string(wire) + ", which is not of its ids");
    if (exports_.contains(wire))
      throw error(errc::decode_error, "wire id " + std::to_string(wire) + " is taken on node " +
                                          std::to_string(self_) + " already");
  }
  if (auto failure = host_spawned(record); !failure.empty()) throw error(errc::actor_dead, failure);
  if (r) r->reply({});
}

void node_runtime::op_restartable(const envelope& env) {
  auto [host, record] = decode<std::tuple<std::uint32_t, spawn_tuple>>(env.payload);
  if (self() != head_id) throw error(errc::decode_error, "restart records go to the head");
  if (host == 0) {  // stopped on purpose
    std::lock_guard lock(mu_);
    restarts_.forget(std::get<2>(record));
  } else {
    add_restartable(host, record);
  }
}

// ---- the functions behind spawn_on and stop (remote.hpp) ------------------------------------

spawned remote_spawn(system_impl& sys, node_id where, std::string_view type, std::uint64_t ctor,
                     std::vector<std::byte> args, const spawn_options& opts) {
  if (!sys.node) {
    if (where != 0)
      throw std::invalid_argument("spawn_on(" + std::to_string(where) +
                                  "): this actor_system is no node (set system_config::node.listen)");
    auto fn = find_ctor(type, ctor);
    if (!fn || !sys.facade) throw std::logic_error("spawn_on: no constructor registered for " + std::string(type));
    return {fn(*sys.facade, args, opts), {}};
  }
  return sys.node->spawn(where, type, ctor, std::move(args), opts);
}

void remote_stop(remote_actor& a) { a.node->stop_remote(a); }

}  // namespace troupe::detail
