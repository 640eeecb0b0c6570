#pragma once
// The status report (`troupe status`, cluster_status()): every node reports its own actors
// (op::node_stats); the head gathers the reports of all members (op::cluster_status) and shows
// the ones that do not answer in time as it knows them. The node's functions that build and
// gather the reports, the codecs of the report and the client that asks the head are in
// status.cpp.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/remote.hpp"

namespace troupe::detail {

/// Each actor's message count at the last report, for the rate in the next. @threadsafe
class actor_rates {
public:
  /// The actors of `sys` as a report shows them: with their local names, their wire ids
  /// (`wires`, by local id) and their messages per second since the last sample.
  std::vector<actor_status> sample(system_impl& sys, const std::unordered_map<actor_id, std::uint64_t>& wires);

private:
  using clock = std::chrono::steady_clock;
  std::mutex mu_;
  std::unordered_map<actor_id, std::pair<std::uint64_t, clock::time_point>> last_;
};

}  // namespace troupe::detail
