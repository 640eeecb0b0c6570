#pragma once
// Standard normal draws for the privacy mechanisms, on the clients' splitmix64 generator, with
// every step written out so the same seed gives the same numbers with any standard library.

#include <cmath>
#include <cstdint>
#include <numbers>

#include "troupe/federated/rng.hpp"

namespace troupe::federated::detail {

/// The Box–Muller transform: two normal draws per pair of uniforms.
class normal_draws {
public:
  explicit normal_draws(std::uint64_t seed) noexcept : rng_{seed} {}
  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u = 1.0 - rng_.uniform01();  // (0, 1]: safe under the logarithm
    const double r = std::sqrt(-2.0 * std::log(u));
    const double theta = 2.0 * std::numbers::pi * rng_.uniform01();
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

private:
  splitmix64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace troupe::federated::detail
