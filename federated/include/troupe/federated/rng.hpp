#pragma once
/// @file
/// splitmix64: the small seeded generator every client keeps (8 bytes of state, where
/// std::mt19937_64 keeps 5 KB). Its output is fixed by its definition (Steele, Lea and Flood,
/// "Fast splittable pseudorandom number generators", 2014), so the same seed gives the same draws
/// with any compiler and standard library.

#include <cstdint>

namespace troupe::federated {

struct splitmix64 {
  std::uint64_t state = 0;

  /// The next 64 random bits.
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), unbiased (rejection of the short last interval); n > 0.
  std::uint64_t below(std::uint64_t n) noexcept {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }
  /// Uniform in [0, 1) from 53 bits.
  double uniform01() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

/// A well-mixed seed for stream `stream` of seed `seed` (clients, rounds, layers...).
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
  splitmix64 g{seed ^ (stream * 0xD1B54A32D192ED03ull)};
  g.next();
  return g.next();
}

}  // namespace troupe::federated
