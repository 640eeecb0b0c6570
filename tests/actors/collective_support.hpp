#pragma once
// What the all-reduce tests share: members' vectors of small integers held in floats, whose sums
// are exact in any order.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace troupe::collective_support {

using vec = std::vector<float>;

/// p vectors of n integers in [-1000, 1000], seeded.
inline std::vector<vec> random_integers(std::size_t p, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<vec> x(p, vec(n));
  for (auto& v : x)
    for (auto& e : v) e = static_cast<float>(d(rng));
  return x;
}

}  // namespace troupe::collective_support
