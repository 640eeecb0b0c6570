// The measured steps of a pipelined `troupe train` (pipeline_timeline.hpp).

#include "pipeline_timeline.hpp"

#include <cstdio>
#include <exception>

#include <troupe/core/log.hpp>
#include <troupe/pipeline/render.hpp>

namespace troupe::cli {

troupe::pipeline::step_observer timeline_view::observer() {
  return [this](const troupe::pipeline::schedule& plan, const troupe::pipeline::step_result& r) {
    // The step is applied already: a timeline that does not fit the plan is dropped (logged the
    // first time) and the training goes on with the steps measured so far.
    try {
      steps_.add(plan, r.timeline);
    } catch (const std::exception& e) {
      if (!dropped_) troupe::log().warn("pipeline: a measured step is dropped ({}); training goes on (logged once)", e.what());
      dropped_ = true;
    }
    if (board_ && std::chrono::steady_clock::now() - published_ >= std::chrono::milliseconds(500)) publish();
  };
}

void timeline_view::publish() {
  published_ = std::chrono::steady_clock::now();
  if (!board_ || !steps_.plan()) return;
  board_->set_timeline(svg(), troupe::pipeline::timeline_json(*steps_.plan(), steps_.last(), steps_.count()));
  if (const auto c = steps_.compare(); c.steps > 0) {
    const std::string over = " over the last " + std::to_string(c.steps) + " steps";
    board_->set_figure("step ms (measured)", c.measured_ms, "median time from a step's first action to its last" + over);
    board_->set_figure("step ms (simulated)", c.predicted_ms,
                       "the simulator's step time from the median measured F, B, I, W of each stage" + over);
  }
}

std::string timeline_view::svg() const {
  if (!steps_.plan()) return "";
  const auto& plan = *steps_.plan();
  auto titled = plan;
  titled.name = plan.name + ", step " + std::to_string(steps_.count()) + " as measured";
  troupe::pipeline::render_options o;
  o.time_unit = "us";
  return troupe::pipeline::render(titled, troupe::pipeline::as_simulation(plan, steps_.last()),
                                  troupe::pipeline::render_format::svg, o);
}

std::string timeline_view::json_fields() const {
  const auto c = steps_.compare();
  if (c.steps == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, ",\"step_ms_measured\":%.3f,\"step_ms_predicted\":%.3f,\"step_ms_ratio\":%.3f",
                c.measured_ms, c.predicted_ms, c.ratio());
  return buf;
}

std::string timeline_view::text() const {
  const auto c = steps_.compare();
  if (c.steps == 0) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "pipeline step %.2f ms measured, %.2f ms simulated from the measured costs (ratio %.3f, median of %d "
                "steps)",
                c.measured_ms, c.predicted_ms, c.ratio(), c.steps);
  return buf;
}

}  // namespace troupe::cli
