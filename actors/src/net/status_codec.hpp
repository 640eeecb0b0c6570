#pragma once
// The codecs of the status report (node_status and its parts, remote.hpp): what a node sends
// the head (op::node_stats) and the head a status client (op::cluster_status). Only the node
// speaks them (status.cpp); tests/fuzz/status_fuzz.cpp decodes arbitrary bytes with them.

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/actors/remote.hpp"
#include "troupe/core/codec.hpp"

template <>
struct troupe::codec<troupe::node_info> {
  using tuple = std::tuple<std::uint32_t, std::string, std::uint16_t, bool, std::uint64_t, std::vector<std::string>>;
  static void encode(byte_writer& w, const node_info& n) {
    troupe::codec<tuple>::encode(w, {n.id, n.host, n.port, n.alive, n.actors, n.labels});
  }
  static node_info decode(byte_reader& r) {
    auto [id, host, port, alive, actors, labels] = troupe::codec<tuple>::decode(r);
    return {id, std::move(host), port, alive, actors, std::move(labels)};
  }
};

template <>
struct troupe::codec<troupe::actor_status> {
  using tuple = std::tuple<std::uint64_t, std::string, std::string, std::int64_t, std::uint64_t, double, std::uint64_t, std::uint32_t>;
  static void encode(byte_writer& w, const actor_status& a) {
    troupe::codec<tuple>::encode(w, {a.id, a.type, a.name, a.mailbox_depth, a.messages, a.messages_per_s, a.wire, a.restarts});
  }
  static actor_status decode(byte_reader& r) {
    auto [id, type, name, depth, messages, rate, wire, restarts] = troupe::codec<tuple>::decode(r);
    return {id, std::move(type), std::move(name), depth, messages, rate, wire, restarts};
  }
};

template <>
struct troupe::codec<troupe::actor_failure> {
  using tuple = std::tuple<std::uint64_t, std::int64_t, std::uint64_t, std::string, bool, std::uint32_t, std::string>;
  static void encode(byte_writer& w, const actor_failure& f) {
    troupe::codec<tuple>::encode(w, {f.seq, f.unix_ms, f.actor, f.type, f.restarted, f.restarts, f.what});
  }
  static actor_failure decode(byte_reader& r) {
    auto [seq, when, actor, type, restarted, restarts, what] = troupe::codec<tuple>::decode(r);
    return {seq, when, actor, std::move(type), restarted, restarts, std::move(what)};
  }
};

template <>
struct troupe::codec<troupe::actor_type_failures> {
  using tuple = std::tuple<std::string, std::uint64_t, std::uint64_t>;
  static void encode(byte_writer& w, const actor_type_failures& t) { troupe::codec<tuple>::encode(w, {t.type, t.restarts, t.failed}); }
  static actor_type_failures decode(byte_reader& r) {
    auto [type, restarts, failed] = troupe::codec<tuple>::decode(r);
    return {std::move(type), restarts, failed};
  }
};

template <>
struct troupe::codec<troupe::node_status> {
  static void encode(byte_writer& w, const node_status& s) {
    troupe::codec<node_info>::encode(w, s.info);
    troupe::codec<std::uint64_t>::encode(w, s.dead_letters);
    troupe::codec<std::vector<actor_status>>::encode(w, s.actors);
    troupe::codec<std::string>::encode(w, s.problem);
    troupe::codec<std::vector<actor_type_failures>>::encode(w, s.failures_by_type);
    troupe::codec<std::vector<actor_failure>>::encode(w, s.recent_failures);
  }
  static node_status decode(byte_reader& r) {
    node_status s;
    s.info = troupe::codec<node_info>::decode(r);
    s.dead_letters = troupe::codec<std::uint64_t>::decode(r);
    s.actors = troupe::codec<std::vector<actor_status>>::decode(r);
    s.problem = troupe::codec<std::string>::decode(r);
    s.failures_by_type = troupe::codec<std::vector<actor_type_failures>>::decode(r);
    s.recent_failures = troupe::codec<std::vector<actor_failure>>::decode(r);
    return s;
  }
};
