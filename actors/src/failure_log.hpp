#pragma once
// What a node's status report says of its actors' failures (remote.hpp: actor_failure,
// actor_type_failures): every failure of a live actor, restarted by its policy or not, counted
// per type since the system started, and the latest 32 in order. Written by the failing
// actor's worker (cell_base::fail), read by the status report. @threadsafe

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/remote.hpp"

namespace troupe::detail {

class failure_log {
public:
  /// How many failures `recent()` keeps, and how much of a failure's message.
  static constexpr std::size_t kept = 32;
  static constexpr std::size_t what_limit = 512;

  void record(actor_id id, const char* type, bool restarted, std::uint32_t restarts, const std::string& what) noexcept;
  /// The counts per type, sorted by type.
  std::vector<actor_type_failures> by_type() const;
  /// The latest failures, the oldest first.
  std::vector<actor_failure> recent() const;

private:
  mutable std::mutex mu_;
  std::uint64_t seq_ = 0;
  std::map<std::string, actor_type_failures, std::less<>> types_;
  std::deque<actor_failure> recent_;
};

}  // namespace troupe::detail
