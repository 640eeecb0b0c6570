// Dropout's masks, one definition for the host and the device: element i of the k-th training
// forward since the seed is dropped when the i-th word of the splitmix64 stream keyed by
// (seed, k) falls below p. The whole generator state is (seed, k), so a checkpointed forward
// replays from two numbers and a backward draws the mask again instead of keeping it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::kernels::dropout_mask {

/// splitmix64's output function: a bijection of 64-bit words that mixes every bit into every other.
TROUPE_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The key of the `call`-th training forward since `seed`.
TROUPE_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t call) noexcept {
  return mix64(seed ^ mix64(call + 0x9e3779b97f4a7c15ULL));
}

/// Whether element i survives: 53 bits of the stream's i-th word, uniform in [0, 1), against p.
TROUPE_HOST_DEVICE constexpr bool kept(std::uint64_t key, std::uint64_t i, double p) noexcept {
  const std::uint64_t w = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<double>(w >> 11) * 0x1.0p-53 >= p;
}

}  // namespace troupe::kernels::dropout_mask
