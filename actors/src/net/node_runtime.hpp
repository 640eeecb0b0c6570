#pragma once
// The node part of an actor_system (node.hpp tells how a cluster works). Private: the units of
// the node and the class that holds them together. Each concern has a header and a .cpp:
//
//   header          state it owns (a member of node_runtime)             node_runtime's functions
//   membership.hpp  what is known of a member; the member table itself   membership.cpp
//                   and the connections are node_runtime's fields (every
//                   unit reads them)
//   calls.hpp       reply_table: the calls that wait for their reply     calls.cpp
//   exports.hpp     export_table: the actors here that other nodes reach exports.cpp
//   watches.hpp     watch_table: monitors of actors on other nodes       watches.cpp
//   names.hpp       name_registry: the head's cluster-wide names         names.cpp
//   spawning.hpp    restart_book: restart records, re-created actors     spawning.cpp
//   status.hpp      actor_rates: the status report's message rates       status.cpp
//   node_protocol.hpp  codes, payload tuples, helpers (no state)         node_protocol.cpp
//
// The tables know nothing of each other; node_runtime's functions for a concern, in the .cpp
// beside it, combine them (losing a node, in membership.cpp, reaches all of them). node.cpp has
// the lifecycle (configuration, start, stop) and hands each incoming envelope to its concern.
// Every table but actor_rates is guarded by the node's one mutex (mu_): losing a node changes
// most of them in one step, and a call reads the membership and files its reply in one step.
// Work that may run user code (completing futures, stopping actors, sending down notices to
// actors) runs outside mu_: posted to the node's I/O thread (post(aftermath)), or after the
// lock is released.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "net/calls.hpp"
#include "net/exports.hpp"
#include "net/membership.hpp"
#include "net/names.hpp"
#include "net/node.hpp"
#include "net/node_protocol.hpp"
#include "net/spawning.hpp"
#include "net/status.hpp"
#include "net/transport.hpp"
#include "net/watches.hpp"
#include "system.hpp"

namespace troupe::detail {

namespace asio = boost::asio;
using net::connection;

class node_runtime;

/// An actor on another node, as seen from this one (the handle behind remote_ptr).
class remote_actor {
public:
  remote_actor(std::shared_ptr<node_runtime> n, system_impl& s, node_id where, std::uint64_t wire)
      : node(std::move(n)), sys(&s), where(where), wire(wire) {
    sys->add_ref();
  }
  ~remote_actor() { sys->release(); }

  std::atomic<std::uint32_t> refs{1};
  std::shared_ptr<node_runtime> node;
  system_impl* sys;
  const node_id where;
  const std::uint64_t wire;
};

/// The node whose incoming payload this thread is decoding: what an actor_ref decodes against.
extern thread_local node_runtime* tls_decoding_node;
struct decoding_scope {
  explicit decoding_scope(node_runtime* n) noexcept : saved(std::exchange(tls_decoding_node, n)) {}
  ~decoding_scope() { tls_decoding_node = saved; }
  decoding_scope(const decoding_scope&) = delete;
  decoding_scope& operator=(const decoding_scope&) = delete;
  node_runtime* saved;
};

class node_runtime : public std::enable_shared_from_this<node_runtime> {
public:
  // ---- lifecycle (node.cpp) ----------------------------------------------------------------

  /// Checks the configuration: std::invalid_argument says what to change.
  node_runtime(system_impl& sys, const node_config& cfg);
  /// Listens, starts the I/O thread and the heartbeats, and joins the head (a worker).
  void start();
  /// Leaves the cluster: closes the connections, fails what waits on them. Idempotent.
  void stop() noexcept;
  std::uint16_t port() const noexcept { return port_; }
  node_id self() const;
  /// A worker's: why it lost the head, "" while it has not.
  std::string head_lost() const;

  // ---- membership (membership.cpp) -------------------------------------------------------

  bool member_alive(node_id id) const;

  // ---- remote calls (calls.cpp) ----------------------------------------------------------

  /// Sends a call (`sink` set) or a tell to node `to`, or to where the actor it targets lives
  /// now. A tell that cannot go is a dead letter (throws when it is too large).
  void call(node_id to, envelope env, std::unique_ptr<reply_sink> sink);
  remote_ptr make_remote(node_id where, std::uint64_t wire);

  // ---- the actors here that other nodes reach (exports.cpp) -------------------------------

  /// The address other nodes reach a local actor at (exported under it from now on).
  ref_address address_of_local(cell_base& c, std::string_view type);
  /// The actor at an address decoded here: this node's own actor, or a handle to another's.
  spawned resolve(const ref_address& a, std::string_view type);

  // ---- spawning and placement (spawning.cpp) ---------------------------------------------

  /// Where an actor lives now: where it was made, unless it was re-created elsewhere.
  node_id location(node_id made_on, std::uint64_t wire) const;
  spawned spawn(node_id where, std::string_view type, std::uint64_t ctor, std::vector<std::byte> args,
                const spawn_options& opts);
  void stop_remote(remote_actor& a);

  // ---- names (names.cpp) -----------------------------------------------------------------

  /// unregister_name: the head forgets the name (a tell: a later register_name from this
  /// node arrives after it).
  void forget_name(const std::string& name, cell_base* had);
  /// Blocking lookup of a cluster-wide name (asks the head).
  std::optional<spawned> lookup(std::string_view name, std::string& type);
  /// Names an actor cluster-wide. The future completes with the head's answer; on a refusal
  /// (name_taken) the local name `added` by this registration goes too.
  future<void> publish_name(const std::string& name, cell_base* local, remote_actor* remote, std::string_view type,
                            cell_base* added);
  /// register_name: waits for the head's answer where a thread may wait; elsewhere the answer,
  /// a refusal, is logged.
  void await_name(const std::string& name, future<void> f);

  // ---- monitors of remote actors (watches.cpp) -------------------------------------------

  void add_watch(remote_actor& a, watch w);

private:
  /// What a change of membership sets off outside mu_: completing a future may run its
  /// continuations inline, and a call takes mu_.
  struct aftermath {
    std::vector<std::unique_ptr<reply_sink>> failed;
    std::exception_ptr failure;
    std::vector<std::pair<watch, down_notice>> fired;
    std::vector<std::pair<node_id, std::uint64_t>> rewatch;  // (host, wire): monitor it there
    std::vector<cell_ptr> orphans;  // actors whose owner went (spawn_options::detached)
    std::vector<early_call> unmade;  // calls to an actor never made
  };

  // ---- lifecycle: envelopes in (node.cpp) ------------------------------------------------

  void on_envelope(const std::shared_ptr<connection>& c, envelope env);
  void on_control(const std::shared_ptr<connection>& c, node_id from, envelope env);
  void on_op(const std::shared_ptr<connection>& c, node_id from, envelope env);

  // ---- membership and failure detection (membership.cpp) ---------------------------------

  void join();
  void on_open(const std::shared_ptr<connection>& c);
  /// Makes `c` the connection to `to` and sends what waited for it (under mu_).
  void attach(node_id to, const std::shared_ptr<connection>& c);
  void dial(member& m);
  std::vector<member_tuple> member_list() const;
  void broadcast_members();  // head, under mu_
  void on_members(const std::vector<member_tuple>& list);  // worker, under mu_
  void arm_heartbeat();
  void beat();
  member& self_member() { return members_[self_]; }
  void on_close(const std::shared_ptr<connection>& c, const std::string& why);
  void lose(node_id id, const std::string& why);
  void lose_locked(node_id id, const std::string& why, gone how = gone::lost);
  /// Runs what a change set off, on the I/O thread.
  void post(aftermath a);
  // control envelopes of membership
  void on_heartbeat(node_id from, const envelope& env);
  void on_join(const std::shared_ptr<connection>& c, const envelope& env);
  void on_welcome(const std::shared_ptr<connection>& c, const envelope& env);
  void on_hello(const std::shared_ptr<connection>& c, const envelope& env);
  void on_lost_notice(const std::shared_ptr<connection>& c, node_id from);
  void on_leave(node_id from);
  void on_member_list(const std::shared_ptr<connection>& c, node_id from, const envelope& env);

  // ---- remote calls (calls.cpp) ----------------------------------------------------------

  class conn_responder;
  /// What answers a call that came on `c` (null for a tell).
  std::shared_ptr<responder> responder_for(const std::shared_ptr<connection>& c, const envelope& env);
  void send_on(std::uint64_t conn, envelope env) noexcept;
  void on_reply(const std::shared_ptr<connection>& c, node_id from, envelope env);
  void on_call(const std::shared_ptr<connection>& c, envelope env);
  /// Answers a call with `e` (a tell: a dead letter).
  void refuse_call(const std::shared_ptr<connection>& c, const envelope& env, std::exception_ptr e);
  std::string no_actor(std::uint64_t wire) const;

  // ---- the actors here that other nodes reach (exports.cpp) -------------------------------

  /// The wire id other nodes call `c` by: the one it was spawned or first exported under, so
  /// that every ref to it anywhere compares equal.
  std::uint64_t export_local(cell_base& c, std::string_view type);
  void export_at(std::uint64_t wire, cell_base& c, const remote_type_entry* type);
  void exported_down(std::uint64_t wire, const down_notice& n);
  /// Sends a down notice to each of `nodes` (under mu_).
  void send_down_to(const std::vector<node_id>& nodes, const down_tuple& d);
  void op_stop_actor(const envelope& env);
  void op_watch(const std::shared_ptr<connection>& c, node_id from, const envelope& env);

  // ---- spawning and placement (spawning.cpp) ---------------------------------------------

  node_id place() const;  // under mu_: the live member with the fewest actors
  node_id route(node_id made_on, std::uint64_t wire) const { return restarts_.route(made_on, wire); }  // under mu_
  void add_restartable(node_id host, const spawn_tuple& record);  // head
  /// Head: re-creates the restartable actors of a lost node (not one that left: `recreate`
  /// false) on the least-loaded live node, under the same wire id, tells every node where they
  /// are now, then that this is all (the watches of its other actors fire).
  void relocate(node_id lost, bool recreate);
  /// Makes an actor another node spawns here (or the head re-creates here): exports it, or
  /// remembers why it failed (returned) for the calls on their way; then runs the calls and
  /// watches that came first. On the I/O thread, so no call comes in between.
  std::string host_spawned(const spawn_tuple& record);
  cell_ptr construct_local(std::string_view type, std::uint64_t ctor, std::span<const std::byte> args,
                           const spawn_options& opts);
  /// Exports an actor spawned here by another node (or re-created here for a lost one's
  /// spawner), tied to the node that spawned it unless detached: stopped at once when that node
  /// is gone already.
  void export_spawned(std::uint64_t wire, cell_base& c, const std::string& type, const spawn_opts_tuple& opts);
  void op_spawn(node_id from, const envelope& env, const std::shared_ptr<responder>& r);
  void op_restartable(const envelope& env);

  // ---- names (names.cpp) -----------------------------------------------------------------

  /// Head: names an actor cluster-wide; on a refusal, its reason (and the code in `code`).
  std::string add_name(name_tuple t, errc& code);
  found_tuple find_name(const std::string& name);
  void op_lookup(const envelope& env, const std::shared_ptr<responder>& r);
  void op_register_name(const envelope& env, const std::shared_ptr<responder>& r);
  void op_forget_name(const envelope& env);
  void op_unregister_name(const envelope& env);

  // ---- monitors of remote actors (watches.cpp) -------------------------------------------

  std::chrono::milliseconds hold_limit() const { return 3 * cfg_.node_timeout; }
  /// Whether the head may still re-create actors of lost node `id` elsewhere (under mu_).
  bool may_relocate(node_id id) const;
  /// The watched actor `wire` lives on `to` now (under mu_): its watches go there.
  void rehost(std::uint64_t wire, node_id to, aftermath& out);
  void on_down_notice(const envelope& env);
  void on_moved(const std::shared_ptr<connection>& c, node_id from, const envelope& env);
  void on_relocated(const std::shared_ptr<connection>& c, node_id from, const envelope& env);

  // ---- status (status.cpp) ---------------------------------------------------------------

  node_status local_status();
  void gather_status(std::shared_ptr<responder> r);
  void op_node_stats(const std::shared_ptr<responder>& r);

  // ---- state -----------------------------------------------------------------------------

  system_impl& sys_;
  node_config cfg_;
  std::string listen_host_, head_host_;
  std::uint16_t listen_port_ = 0, head_port_ = 0, port_ = 0;

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::steady_timer heartbeat_{io_};
  std::unique_ptr<net::transport> transport_;
  std::thread thread_;

  /// Guards everything below but rates_ (which guards itself).
  mutable std::mutex mu_;
  bool stopped_ = false;

  // membership and failure detection
  std::condition_variable joined_cv_;
  std::string join_error_;
  std::string head_lost_;  // a worker's: why the head is lost ("" while it is not)
  node_id self_ = 0;
  node_id next_node_ = 2;
  node_id largest_id_ = 0;  // a worker's: the largest node id the head has listed
  std::unordered_map<std::uint64_t, told_lost> told_lost_;  // by connection id
  std::uint64_t beats_ = 0;
  clock_type::time_point last_beat_ = clock_type::now();
  std::map<node_id, member> members_;
  std::unordered_map<std::uint64_t, node_id> conn_node_;
  std::unordered_map<std::uint64_t, std::shared_ptr<connection>> conns_;

  // the units
  reply_table replies_;
  export_table exports_;
  watch_table watches_;  // remote actors monitored from here
  restart_book restarts_;
  name_registry names_;  // head
  actor_rates rates_;
};

}  // namespace troupe::detail
