#pragma once
// The measured steps of a pipelined `troupe train` (pipeline/timeline.hpp): the last one drawn on
// its dashboard, and the measured step time beside the simulator's prediction from the measured
// costs, on the dashboard, in the final line and in the --json summary.

#include <chrono>
#include <string>

#include <troupe/actors/dashboard.hpp>
#include <troupe/pipeline/runtime.hpp>
#include <troupe/pipeline/timeline.hpp>

namespace troupe::cli {

class timeline_view {
public:
  /// `board` (may be null) gets the last step at most twice a second, and at publish().
  explicit timeline_view(troupe::dashboard* board) : board_(board) {}
  /// What the pipeline engine calls after every step (it records the steps only when given one).
  troupe::pipeline::step_observer observer();
  /// The last step and the comparison on the dashboard now (nothing without one, or no step yet).
  void publish();
  /// ,"step_ms_measured":X,"step_ms_predicted":Y,"step_ms_ratio":Y/X for a JSON summary, or ""
  /// when no step was kept (the first is the warm-up).
  std::string json_fields() const;
  /// The same as a line for people, or "".
  std::string text() const;
  /// The last step drawn (pipeline::render's SVG, in microseconds), or "" before the first.
  std::string svg() const;

private:
  troupe::dashboard* board_;
  troupe::pipeline::measured_steps steps_;
  bool dropped_ = false;  // a step's timeline was refused (logged once)
  std::chrono::steady_clock::time_point published_{};
};

}  // namespace troupe::cli
