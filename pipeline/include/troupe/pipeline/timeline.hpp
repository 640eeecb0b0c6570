#pragma once
/// @file
/// A pipeline step as it ran: per rank, each action of the (lowered) schedule with its measured
/// start and end (trainer::step records it, step_result::timeline); and what the simulator
/// predicts from the costs measured there.
///
///   auto r = trainer.step(x, y);                       // r.timeline: per rank, in run order
///   history.push_back(r.timeline);
///   auto c = pipeline::compare_with_simulator(trainer.plan(), history);
///   // c.measured_ms: the median step span; c.predicted_ms: simulate(plan, median costs)
///
/// Times are nanoseconds on the steady clock from the step's start: the earliest start of a
/// rank's part of the step among the ranks in the driver's process (one clock), or, for a rank
/// on another node, that rank's own start (its clock cannot be compared with this one).
/// A RECV_F/RECV_B lasts from the moment the rank asks for the tensor to the moment it has it
/// (the wait included); a SEND_F/SEND_B is the time to hand the tensor over.

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/pipeline/schedule.hpp"
#include "troupe/pipeline/simulator.hpp"

namespace troupe::pipeline {

/// One action a rank ran, measured.
struct measured_action {
  action what;                ///< as the lowered schedule names it (F, B, I, W, RECOMPUTE, SEND_F, ...)
  std::int64_t start_ns = 0;  ///< from the step's start
  std::int64_t end_ns = 0;
};

/// Per rank, the actions it ran in one step, in the order it ran them.
using step_timeline = std::vector<std::vector<measured_action>>;

/// Last end minus first start over every rank, in ns (0 for an empty timeline).
std::int64_t span_ns(const step_timeline& t);

/// Throws std::invalid_argument unless `t` has, per rank of `plan` (lowered: trainer::plan()),
/// exactly that rank's actions in the schedule's order, with 0 <= start <= end and each action
/// starting no earlier than the one before it ended.
void check_timeline(const schedule& plan, const step_timeline& t);

/// The cost model the measured steps imply: per stage, the median duration (ns) of its F, B, I
/// and W over every step of `steps` (an even count: the mean of the middle two), comm 0. A
/// RECOMPUTE costs F in the simulator, so it is not measured apart. A split schedule's B is
/// I + W; a schedule without the split gets I = W = B / 2. Throws std::invalid_argument when
/// `steps` is empty or a stage has an action kind with no measurement.
cost_model measured_costs(const schedule& plan, const std::vector<step_timeline>& steps);

/// The measured step against the simulator's prediction from the measured costs.
struct timeline_comparison {
  double measured_ms = 0;   ///< median span_ns of the steps, in ms
  double predicted_ms = 0;  ///< simulate(plan, measured_costs(plan, steps)).makespan, in ms
  int steps = 0;            ///< steps measured
  /// predicted / measured (1: exact; below 1: the run was slower than the simulator says).
  double ratio() const { return measured_ms > 0 ? predicted_ms / measured_ms : 0; }
};

/// See timeline_comparison. Throws as measured_costs does.
timeline_comparison compare_with_simulator(const schedule& plan, const std::vector<step_timeline>& steps);

/// The measured steps of a run, for compare_with_simulator: the first `skip` steps (the
/// warm-up: first allocations, cold caches) are left out, then the last `keep` are kept, or
/// fewer for a large schedule: at most max_kept_actions actions in all (at least one step).
/// Not thread-safe: one run's training thread adds to it.
class measured_steps {
public:
  static constexpr std::size_t max_kept_actions = 1'000'000;  // about 32 MB
  /// Throws std::invalid_argument for keep < 1 or skip < 0.
  explicit measured_steps(std::size_t keep = 500, std::int64_t skip = 1);
  /// One step of `plan` (every step of one plan: another one throws std::invalid_argument, as
  /// does a timeline that check_timeline refuses). An empty timeline (none recorded) is ignored.
  void add(const schedule& plan, step_timeline t);
  /// Steps added (those skipped included).
  std::int64_t count() const noexcept { return count_; }
  /// The plan of the steps; nullptr before the first.
  const schedule* plan() const noexcept { return plan_.empty() ? nullptr : &plan_.front(); }
  /// The last step added (empty before the first).
  const step_timeline& last() const noexcept { return last_; }
  /// The kept steps, oldest first.
  std::vector<step_timeline> kept() const;
  /// compare_with_simulator over the kept steps; steps == 0 when none is kept yet.
  timeline_comparison compare() const;

private:
  std::size_t keep_;
  std::int64_t skip_, count_ = 0;
  std::vector<schedule> plan_;     // one, once known
  std::vector<step_timeline> ring_;  // the kept steps; next_ is the oldest once full
  std::size_t next_ = 0;
  step_timeline last_;
};

/// `t` as a simulation of `plan` (times in whole microseconds, bubble from the compute actions),
/// so that render() draws the measured step as it draws a simulated one. Throws as
/// check_timeline does.
simulation as_simulation(const schedule& plan, const step_timeline& t);

/// {"schedule","step","unit":"ns","span_ns","ranks":[[{"action":"0F1","kind":"F","stage":0,
/// "microbatch":1,"start_ns":..,"end_ns":..},...],...]}: one array per rank, in run order.
std::string timeline_json(const schedule& plan, const step_timeline& t, std::int64_t step);

}  // namespace troupe::pipeline
