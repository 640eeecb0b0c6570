#pragma once
/// @file
/// Partitioners: how the layers of a model are cut into contiguous pipeline stages.
///
/// Every partitioner returns a `partition`: S+1 boundaries (stage `s` holds layers
/// `[boundaries[s], boundaries[s+1])`), never an empty stage, with the cost of every stage.
/// Three ways to cut:
///  - `partition_uniform`: by layer count alone;
///  - `partition_by_parameters`: the exact min-max partition of parameter counts;
///  - `partition_balanced`: the exact min-max partition of layer costs (measured or estimated
///    times), optionally under a per-stage memory limit.
///
/// The exact partitioners share one rule for ties, so their answers are reproducible:
/// among the partitions with the smallest maximum stage cost, the one with the largest minimum
/// stage cost; among those, the lexicographically largest boundaries (earlier stages take as
/// many layers as the optimum allows). With equal positive costs this gives `partition_uniform`'s
/// answer; with every cost zero all partitions tie, and the first stage takes all but one layer
/// per later stage.
///
/// All functions are pure and may be called from any thread. Bad input throws
/// `std::invalid_argument` with a message that says what to change.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace troupe::pipeline {

/// Contiguous stages over a list of layers.
struct partition {
  /// S+1 layer offsets: the first is 0, the last is the number of layers, strictly increasing
  /// (no stage is empty). Stage `s` holds layers `[boundaries[s], boundaries[s+1])`.
  std::vector<std::size_t> boundaries;
  /// The cost of every stage: the sum of its layers' costs, added first layer to last
  /// (layer counts for `partition_uniform`, parameter counts for `partition_by_parameters`).
  std::vector<double> stage_costs;
  /// The largest of `stage_costs`: the bottleneck stage that bounds the pipeline's throughput.
  double max_cost = 0;
  /// The memory of every stage, when memory per layer was given; empty otherwise.
  std::vector<double> stage_memory;

  /// The number of stages S.
  std::size_t stages() const noexcept { return boundaries.empty() ? 0 : boundaries.size() - 1; }
  /// The number of layers L.
  std::size_t layers() const noexcept { return boundaries.empty() ? 0 : boundaries.back(); }
  /// The number of layers in stage `s`.
  std::size_t stage_size(std::size_t s) const { return boundaries.at(s + 1) - boundaries.at(s); }
};

/// A per-stage memory limit: the sum of `memory` over the layers of any stage must not exceed
/// `limit`. `memory` has one non-negative value per layer (any unit, the same as `limit`).
/// The span is only read during the call that receives it.
struct memory_limit {
  std::span<const double> memory;  ///< memory of every layer
  double limit = 0;                ///< the most memory one stage may hold
};

/// Cuts `layers` layers into `stages` stages by count: every stage gets `layers / stages`
/// layers and the first `layers % stages` stages one more (as DeepSpeed's uniform partition
/// does), so stage sizes differ by at most one and the remainder never piles onto the last
/// stage. `stage_costs` are the layer counts.
/// @throws std::invalid_argument when `stages` is 0 or larger than `layers`.
partition partition_uniform(std::size_t layers, std::size_t stages);

/// The exact min-max partition of parameter counts: the largest stage (in parameters) is as
/// small as any contiguous split into `stages` non-empty stages allows. Sums are exact
/// (64-bit integers); `stage_costs` holds them as doubles. Ties as described in the file comment.
/// @throws std::invalid_argument when `stages` is 0 or larger than the number of layers, or the
///         total parameter count does not fit in 64 bits.
partition partition_by_parameters(std::span<const std::uint64_t> params, std::size_t stages);

/// The exact min-max partition of layer costs into `stages` contiguous non-empty stages.
/// With `limit`, only partitions where every stage's memory is within `limit.limit` count, and
/// the result is the min-max partition among those; `stage_memory` is then filled in.
/// Stage sums are added first layer to last, and "exact" holds for those sums: no contiguous
/// split has a smaller maximum. Time O(S·L²) in the worst case (usually far less), memory O(S·L).
/// Ties as described in the file comment.
/// @throws std::invalid_argument when `stages` is 0 or larger than the number of layers, a cost
///         or memory value is negative or not finite, the costs' sum overflows, the memory list
///         does not have one value per layer, the limit is negative or not finite, or no
///         partition fits the limit (the message gives the smallest limit that works, or says
///         that one layer alone exceeds it).
partition partition_balanced(std::span<const double> costs, std::size_t stages,
                             std::optional<memory_limit> limit = {});

}  // namespace troupe::pipeline
