#pragma once
// Membership and failure detection: who is in the cluster as this node knows it, and how it
// learns that a node is gone. The protocol (join, welcome, hello, the member lists, heartbeats,
// redials, losing a node) is the node's own (membership.cpp): losing a node reaches every other
// unit of it (its calls fail, its watches fire or wait, its names go, what it spawned here
// stops, what the head may re-create moves), so those functions are node_runtime's, and so is
// the member table with the connections (members_, conn_node_, self_: every unit reads them).
// This header holds what the node knows of each member.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/node_protocol.hpp"
#include "troupe/actors/detail/remote_handle.hpp"

namespace troupe::net {
class connection;
}

namespace troupe::detail {

/// A node of the cluster as this node knows it. Under the node's mutex.
struct member {
  node_id id = 0;
  std::string host;
  std::uint16_t port = 0;
  bool alive = true;
  std::uint64_t actors = 0;
  std::uint64_t placed = 0;  // actors this node placed there since its last load report
  std::vector<std::string> labels;  // the head's: what it joined with
  std::shared_ptr<net::connection> conn;
  bool dialing = false;
  bool timed_out = false;
  int redials = 0;  // redials in a row whose connection carried nothing
  clock_type::time_point lost_at{};  // when it was lost (members lost long ago are forgotten)
  bool left = false;  // gone on purpose (said goodbye): nothing of it is re-created
  std::vector<envelope> backlog;
  std::vector<std::unique_ptr<reply_sink>> in_doubt;  // written before the connection dropped
  clock_type::time_point heard = clock_type::now();
  /// The random key the head gave the node when it joined: its hello shows it, so that a peer
  /// that holds the cluster's token is not taken for a member it is not. Empty while unknown.
  std::vector<std::byte> key;
  clock_type::time_point said_hello{};  // when known from a hello alone (port 0)
};

/// A connection of a lost node that was told so (ctl::lost).
struct told_lost {
  std::shared_ptr<net::connection> conn;
  clock_type::time_point since;
};

/// How a node went: lost here, left (said goodbye), or reported gone by the head (which
/// logged the reason; here it is news).
enum class gone { lost, left, reported };

}  // namespace troupe::detail
