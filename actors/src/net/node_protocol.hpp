#pragma once
// What the node's units say to each other's peers, on top of the frames (wire.hpp) and the
// transport (transport.hpp): the control codes and node operations, the tuples their payloads
// encode, the ids and limits of the cluster, and the helpers every unit of the node shares
// (envelopes, errors on the wire, addresses, labels, TLS settings). Private; no Asio here.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "net/wire.hpp"
#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/remote.hpp"

namespace troupe::net {
struct tls_config;
}

namespace troupe::detail {

using net::envelope;
using net::envelope_kind;
using clock_type = std::chrono::steady_clock;

/// Control codes after the handshake's (transport.hpp).
enum class ctl : std::uint64_t {
  join = 16,
  welcome = 17,
  hello = 18,
  members = 19,
  heartbeat = 20,
  down = 21,
  leave = 22,
  moved = 23,  // an actor was re-created on another node (head -> all)
  lost = 24,   // "this node counts you as lost": the receiver stops dialling the sender
  relocated = 25,  // the head has re-created what it will of a lost node (head -> all)
};
/// Operations of the node itself (calls and tells to net::node_target).
enum class op : std::uint64_t {
  spawn = 1,
  lookup = 2,
  register_name = 3,
  unregister_name = 4,
  stop_actor = 5,
  watch = 6,
  node_stats = 7,
  cluster_status = 8,
  restartable = 9,  // tells the head how to re-create an actor elsewhere
  forget_name = 10,  // unregister_name of one name, cluster-wide
};

inline constexpr int wire_shift = 40;
inline constexpr node_id head_id = 1;
/// A connection that keeps dropping right after each redial: the peer counts as lost.
inline constexpr int max_redials = 3;
/// How many of the exported actors that went a node remembers (see op::watch).
inline constexpr std::size_t remembered_gone = 1 << 16;
/// How long the cluster remembers a node that was lost or left.
inline constexpr auto forget_after = std::chrono::seconds(10);

/// id, host, port, alive, actors, key (see ctl::hello).
using join_tuple = std::tuple<std::string, std::uint16_t, std::vector<std::string>>;  // host, port, labels
using member_tuple = std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::byte>>;
/// A node's id and key: what it says on a connection it opens to another node.
using hello_tuple = std::tuple<std::uint32_t, std::vector<std::byte>>;
using spawn_opts_tuple = std::tuple<std::uint64_t, std::uint8_t, std::int32_t, std::int64_t, double,
                                    std::int64_t, bool, bool, bool>;
using spawn_tuple =
    std::tuple<std::string, std::uint64_t, std::uint64_t, spawn_opts_tuple, std::vector<std::byte>>;
using name_tuple = std::tuple<std::string, std::uint64_t, std::uint32_t, std::string>;
using found_tuple = std::tuple<bool, std::uint64_t, std::uint32_t, std::string>;
using down_tuple = std::tuple<std::uint64_t, std::uint8_t, std::string>;
using moved_tuple = std::tuple<std::uint64_t, std::uint32_t>;

spawn_opts_tuple pack(const spawn_options& o);
/// Throws troupe::error(decode_error) for an overflow policy this program does not know.
spawn_options unpack(const spawn_opts_tuple& t);

inline envelope make_envelope(envelope_kind kind, std::uint64_t target, std::uint64_t method,
                              std::vector<std::byte> payload = {}, std::uint64_t request = 0) {
  envelope e;
  e.kind = kind;
  e.target = target;
  e.method = method;
  e.request_id = request;
  e.payload = std::move(payload);
  return e;
}
inline envelope control(ctl code, std::vector<std::byte> payload = {}) {
  return make_envelope(envelope_kind::control, 0, static_cast<std::uint64_t>(code), std::move(payload));
}
/// A call or tell to the node `op` of another node (target net::node_target).
inline envelope node_op(envelope_kind kind, op code, std::vector<std::byte> payload = {}) {
  return make_envelope(kind, net::node_target, static_cast<std::uint64_t>(code), std::move(payload));
}

/// True when every character of `text` is an ASCII letter or digit, or one of `others`.
bool made_of(std::string_view text, std::string_view others);
/// Why `labels` are not node labels (node_config::labels), or "" when they are.
std::string label_problem(const std::vector<std::string>& labels);
/// "HOST:PORT" (IPv6 hosts in brackets) into its parts; std::invalid_argument naming `what`.
std::pair<std::string, std::uint16_t> split_address(const std::string& a, const char* what);
/// The TLS settings, each defaulting to its environment variable.
net::tls_config tls_settings(const std::string& cert, const std::string& key, const std::string& ca);
inline bool wildcard(const std::string& host) { return host == "0.0.0.0" || host == "::" || host.empty(); }

/// The largest payload a call or reply may carry: a frame's limit less room for the rest of
/// the envelope. A larger one is refused before it is sent (the receiver would drop the
/// connection, and every call on it).
inline constexpr std::uint64_t max_payload_bytes = net::wire_limits{}.max_frame_bytes - (std::uint64_t{1} << 20);
std::string too_large(std::size_t bytes, const char* what);

/// The error an exception becomes on the wire.
std::pair<errc, std::string> describe(std::exception_ptr e);
/// The exception an error envelope becomes here.
std::exception_ptr error_from(const envelope& env);

// ---- the registry of remote classes (TROUPE_REMOTE, TROUPE_REMOTE_CTOR; spawning.cpp) -------

/// The class registered under `name`, or null. Entries are never erased.
const remote_type_entry* find_type(std::string_view name);
/// The constructor of `type` registered under `key`, or null.
construct_fn find_ctor(std::string_view type, std::uint64_t key);

}  // namespace troupe::detail
