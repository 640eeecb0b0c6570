#pragma once
// Small, seeded, portable random draws for the federated mechanisms. SplitMix64 (Steele, Lea and
// Flood, 2014) is 8 bytes of state and passes BigCrush; every draw is written out here, so the
// same seed gives the same numbers with any compiler and standard library.

#include <cmath>
#include <cstdint>
#include <numbers>

namespace troupe::federated::detail {

class splitmix64 {
public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in (0, 1]: safe under a logarithm.
  double uniform_open0() noexcept { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }
  /// Uniform integer in [0, n) by rejection (unbiased); n > 0.
  std::uint64_t below(std::uint64_t n) noexcept {
    const std::uint64_t limit = -n % n;  // 2^64 mod n
    for (;;) {
      const std::uint64_t x = next();
      if (x >= limit) return x % n;
    }
  }

private:
  std::uint64_t state_;
};

/// Standard normal draws by the Box–Muller transform, two per pair of uniforms.
class normal_draws {
public:
  explicit normal_draws(std::uint64_t seed) noexcept : rng_(seed) {}
  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(rng_.uniform_open0()));
    const double theta = 2.0 * std::numbers::pi * rng_.uniform();
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

private:
  splitmix64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

/// Mixes a seed with a stream number (a round, a client) into an independent seed.
inline std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) noexcept {
  splitmix64 g(seed ^ (stream * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
  g.next();
  return g.next();
}

}  // namespace troupe::federated::detail
