#pragma once
// The node part of an actor_system: membership, remote calls, remote spawn, the cluster-wide
// names, failure detection, the status report. Private, and what system.cpp sees of it; the
// node's units, each in its own files, are listed in node_runtime.hpp. No Asio here.
//
// How a cluster works
// - The head (node 1) keeps the membership and the registry of names. A node joins by dialling
//   the head (token handshake, transport.hpp), sending control(join) with the address it listens
//   on, and receiving control(welcome) with its id and the members. The head sends
//   control(members) to everyone when the membership changes, and every second with the loads.
// - Nodes dial each other on first use (control(hello) says who dials) and keep one connection
//   per peer for sending, so the envelopes of one sender reach a peer in send order.
// - An actor that other nodes can reach has a cluster-wide wire id: its creator's node id in the
//   top 24 bits and an id from the creator's counter in the low 40. Calls (kind call/tell) target
//   that id; target net::node_target (1) is the node itself (spawn, lookup, names, stop, watch,
//   status).
// - Every connection carries a heartbeat each `heartbeat`; a peer silent for `node_timeout` is
//   lost at once. A connection that closes (a killed process) is redialled once: if that fails
//   the peer is lost, if it succeeds the calls that were already written fail with
//   connection_lost (they may or may not have run: a call is delivered at most once), and the
//   calls still queued go out on the new connection.
// - A lost node: asks to it fail with node_lost, the head drops its names. It never comes back
//   under its id; a restarted process joins as a new node. The head re-creates its actors that
//   have a restart policy elsewhere under the same wire id, tells every node where each went
//   (control(moved)), then that this is all (control(relocated)). Meanwhile monitors of the lost
//   node's actors wait: those of a moved actor watch it on its new node, the others receive
//   down notices (exit_reason::node_lost). The actors a lost or departed node spawned elsewhere
//   (its wire ids, not detached) are stopped by their hosts and not re-created.
// - Whom a node believes. The token makes a peer a peer; what it may say is checked besides: a
//   connection that has not joined nor said hello may only ask for the status; the head gives
//   each node a random key with its id (control(welcome), and to all in the member list), and
//   a hello shows it (one naming a node this node does not know yet is believed until the
//   head's next list, and dropped when that list lacks it); member lists come from the head
//   alone; a reply completes a call only from the node the call went to; a spawn uses a wire id
//   of the spawner's (or of a lost node's, from the head) that is not taken; a name goes only to
//   an actor that exists. A peer that breaks these rules is refused (connection::refuse: it
//   learns why) and the cluster goes on. The members trust each other: a member could still
//   pass for another, as it holds every key.

#include <memory>
#include <string_view>

#include "troupe/actors/actor_system.hpp"

namespace troupe::detail {

class node_runtime;

/// Starts the node part of `sys` (and joins the head when configured). Throws
/// std::invalid_argument for a bad configuration, troupe::error when the head cannot be joined.
std::shared_ptr<node_runtime> start_node(system_impl& sys, const node_config& cfg);
/// Leaves the cluster: closes the connections, fails what waits on them. Idempotent.
void stop_node(node_runtime& n) noexcept;
/// unregister_name on a node: the head forgets the cluster-wide name too, unless the name was
/// this node's own (`had`, the actor it named here) and never went cluster-wide.
void forget_cluster_name(node_runtime& n, std::string_view name, cell_base* had);

}  // namespace troupe::detail
