#pragma once
/// @file
/// Layer costs measured on real layers, for the partitioners.

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/kernels/layers.hpp"

namespace troupe::pipeline {

struct layer_profile {
  std::vector<std::string> names;
  std::vector<double> cost_us;           ///< median forward + full backward time per layer
  std::vector<double> activation_bytes;  ///< held by each layer between its forward and backward
};

/// The most timed runs per layer profile_layers takes (a median of that many is stable).
inline constexpr int max_profile_repeats = 10000;

/// Runs every layer of `model` on a seeded random batch of `batch` rows, `repeats` times, and
/// reports each layer's median forward + backward time and activation memory. Throws
/// std::invalid_argument for batch < 1, repeats outside 1..max_profile_repeats or a model whose
/// input width is unknown.
layer_profile profile_layers(kernels::sequential& model, std::int64_t batch, int repeats,
                             std::uint64_t seed = 0);

}  // namespace troupe::pipeline
