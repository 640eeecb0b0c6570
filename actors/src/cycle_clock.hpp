#pragma once
// A cheap clock for per-actor busy time: the CPU's cycle counter where it is invariant,
// converted to nanoseconds against steady_clock when read.

#include <chrono>
#include <cstdint>

namespace troupe::detail::cycle_clock {

inline std::uint64_t now() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_ia32_rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

/// Converts a tick count to nanoseconds (calibrated on first use over about a millisecond).
std::uint64_t to_ns(std::uint64_t ticks) noexcept;
/// The tick count of `ns` nanoseconds.
std::uint64_t from_ns(std::uint64_t ns) noexcept;

}  // namespace troupe::detail::cycle_clock
