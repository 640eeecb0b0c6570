#pragma once
/// @file
/// The validator and the simulator of schedules. Time is exact (rationals), so that sums never
/// drift and closed forms can be checked with ==.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/pipeline/rational.hpp"
#include "troupe/pipeline/schedule.hpp"

namespace troupe::pipeline {

/// Costs of one action type. Given for a rank's whole shard: with v stages per rank, one
/// stage's action costs a v-th of it, so schedules with different v compare on one model.
struct action_costs {
  rational f{1};
  rational b{2};  ///< full backward (schedules without the split)
  rational i{1};  ///< backward for inputs
  rational w{1};  ///< backward for weights
  rational comm{0};  ///< latency of one send to another rank
  /// An overlapped step of a forward and a full backward (OVERLAP_F_B); unset: f + b.
  std::optional<rational> fb{};
};

/// The cost model: uniform costs, or one entry per stage (then taken as that stage's own costs,
/// not divided by v; comm is the sending stage's).
struct cost_model {
  action_costs uniform{};
  std::vector<action_costs> per_stage{};

  /// Parses "F=1,B=2,I=1,W=1,comm=0,FB=2.5" (any subset, in any order; names are
  /// case-insensitive; FB is an overlapped forward + backward step).
  /// A backward is one cost, split or not: B = I + W. Without B it is I + W (each 1 unless
  /// given); B alone splits in halves; B with one of I and W gives the other the rest. Throws
  /// std::invalid_argument for B ≠ I + W (the simulator refuses that from code too).
  static cost_model parse(std::string_view text);
};

/// A schedule that cannot run: the message points at the first offending action.
class schedule_error : public std::invalid_argument {
public:
  using std::invalid_argument::invalid_argument;
};

/// Proves `s` complete and runnable: every (stage, microbatch) has exactly one F and one B (or
/// one I and one W), every action is on the rank that holds its stage, each rank's own order
/// respects the dependencies, sends and receives match, and execution cannot deadlock.
/// Throws schedule_error.
void validate(const schedule& s);

struct timed_action {
  action what;
  rational start;
  rational end;
};

/// What a schedule does with a cost model.
struct simulation {
  rational makespan;
  /// 1 - sum of busy time / (p x makespan): idle share when all ranks end with a synchronous
  /// optimizer step.
  double bubble = 0;
  /// The Zero Bubble paper's bubble rate: (cost - busy) / cost, where cost is the largest
  /// execution span (first action's start to last action's end) of any rank and busy that
  /// rank's compute time.
  double bubble_span = 0;
  /// Per rank, the most activations held at once, in units of one microbatch's activations
  /// through the rank's whole shard (a stage of v counts 1/v); held from F until the action
  /// that frees them (B, or W under the split backward).
  std::vector<double> peak_activations;
  std::vector<rational> busy;  ///< per rank
  std::vector<std::vector<timed_action>> timeline;  ///< per rank, in execution order
};

/// Validates and simulates `s` under `costs`. Throws schedule_error for an invalid schedule.
simulation simulate(const schedule& s, const cost_model& costs = {});

}  // namespace troupe::pipeline
