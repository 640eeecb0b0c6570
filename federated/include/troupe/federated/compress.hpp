#pragma once
/// @file
/// Update compression for the uplink:
/// - top-k sparsification with error feedback (Stich et al., 2018; Karimireddy et al., 2019): the
///   client adds its residual to the update, sends the k largest-magnitude coordinates, and keeps
///   what it did not send as the next residual, so nothing is lost over rounds;
/// - QSGD (Alistarh et al., 2017) with s levels: each coordinate becomes ‖v‖₂ · sign(v_i) · l/s,
///   l rounded up or down at random with the probability that makes the result unbiased.
/// Both report the bytes they would put on the wire, so the saving is measurable.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace troupe::federated {

/// A sparse update: positions (ascending) and their values.
struct sparse_update {
  std::vector<std::uint32_t> index;
  std::vector<float> value;
  std::size_t dim = 0;
  std::size_t wire_bytes() const noexcept { return index.size() * (sizeof(std::uint32_t) + sizeof(float)); }
  /// Writes the dense vector (zeros where nothing was sent) into `out` of size dim. Throws
  /// std::invalid_argument for a position >= dim or for positions and values of different counts.
  void densify(std::span<float> out) const;
};

/// Top-k with error feedback. `residual` is the client's persistent state (zeros before the first
/// round), updated in place. Keeps max(1, round(fraction * dim)) coordinates; ties in magnitude go
/// to the lower position. Throws std::invalid_argument for a fraction outside (0, 1] or a
/// residual of another length.
sparse_update top_k(std::span<const float> update, double fraction, std::span<float> residual);

/// A QSGD-quantized update: the norm, and per coordinate a signed level in [-s, s].
struct quantized_update {
  float norm = 0;
  int levels = 0;
  std::vector<std::int8_t> level;  ///< levels <= 127
  /// Bytes on the wire with each level in ceil(log2(2s + 1)) bits, plus the norm.
  std::size_t wire_bytes() const noexcept;
  void dequantize(std::span<float> out) const;
};

/// Quantizes with `levels` in [1, 127], rounding stochastically from `seed`. Throws
/// std::invalid_argument for a level count outside that range, a non-finite update, or one whose
/// L2 norm (computed in double) is beyond the largest float, the norm's type on the wire.
quantized_update qsgd(std::span<const float> update, int levels, std::uint64_t seed);

}  // namespace troupe::federated
