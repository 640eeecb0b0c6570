#pragma once
// What the units of a cell share about bounded mailboxes: the mailbox (cell.cpp) releases the
// waiters and unparks a released actor, the lifecycle (cell_lifecycle.cpp) releases the waiters
// of a stopped actor, and the back-pressure (cell_bounded.cpp) parks and registers them.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "system.hpp"

namespace troupe::detail {

/// A full mailbox lets its waiters go once it has drained to this many messages.
inline std::int64_t low_watermark(std::uint32_t capacity) noexcept { return capacity / 2; }

using wait_graph = std::unordered_map<const cell_base*, system_impl::waits_for>;

/// Records in `waits` that `c` is parked on `receiver`, or no longer parked when `receiver` is
/// null (under system_impl::park_mutex). cell_bounded.cpp.
void set_parked_on(wait_graph& waits, const cell_base* c, cell_base* receiver);

/// Lets waiters go: a throttled sender is rescheduled, a blocked thread woken. cell.cpp.
void release_waiters(system_impl& sys, std::vector<cell_extras::waiter>& waiters) noexcept;

}  // namespace troupe::detail
