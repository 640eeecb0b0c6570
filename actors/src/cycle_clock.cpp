#include "cycle_clock.hpp"

#include <chrono>
#include <thread>

namespace troupe::detail::cycle_clock {

namespace {
double ns_per_tick() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static const double ratio = [] {
    auto t0 = std::chrono::steady_clock::now();
    auto c0 = now();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto c1 = now();
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    return c1 > c0 ? ns / static_cast<double>(c1 - c0) : 1.0;
  }();
  return ratio;
#else
  return 1.0;
#endif
}
}  // namespace

std::uint64_t to_ns(std::uint64_t ticks) noexcept {
  return static_cast<std::uint64_t>(static_cast<double>(ticks) * ns_per_tick());
}

std::uint64_t from_ns(std::uint64_t ns) noexcept {
  return static_cast<std::uint64_t>(static_cast<double>(ns) / ns_per_tick());
}

}  // namespace troupe::detail::cycle_clock
