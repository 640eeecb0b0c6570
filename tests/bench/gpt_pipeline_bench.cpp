// `troupe bench gpt`'s pipeline rows: nanoGPT's CPU configuration trained by the pipeline runtime
// on 2 ranks with 4 microbatches, per schedule: tokens/s, the measured step (median time from a
// step's first action to its last) and what the simulator predicts for it from the median F, B,
// I, W measured per stage (pipeline::compare_with_simulator); and, for 1f1b, tokens/s with the
// timeline recorded and without, in interleaved runs (what recording costs).

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/lm.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>
#include <troupe/pipeline/timeline.hpp>

#include "gpt_bench.hpp"

namespace troupe::bench {
namespace {

constexpr int ranks = 2, microbatches = 4;

kernels::lm_options pipeline_run(const gpt_options& o) {
  kernels::lm_options t;  // nanoGPT's CPU configuration
  t.steps = o.quick ? 10 : std::min<std::int64_t>(o.steps, 50);
  t.eval_every = t.steps;
  t.eval_batches = 1;
  t.microbatches = microbatches;
  if (!o.text.empty()) {
    t.text = o.text;
    t.dataset.clear();
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int run_gpt_pipeline(const gpt_options& o, const gpt_line& line) {
  const auto t = pipeline_run(o);
  const std::vector<std::string> names =
      o.quick ? std::vector<std::string>{"gpipe", "1f1b", "zb-h1"} : pipeline::schedule_names();
  int rc = 0;
  for (const auto& name : names) {
    const std::string bench = "pipeline_" + name + "_p2_m4";
    try {
      actor_system sys{system_config{}};
      pipeline::measured_steps steps;
      const auto r = kernels::train_lm(
          t, {}, {},
          pipeline::lm_pipeline_engine(sys, pipeline::generate(name, ranks, microbatches), {},
                                       [&](const pipeline::schedule& plan, const pipeline::step_result& s) {
                                         steps.add(plan, s.timeline);
                                       }));
      const auto c = steps.compare();
      line(bench, "tokens_per_s", r.tokens_per_s, "tokens/s");
      line(bench, "step_ms_measured", c.measured_ms, "ms");
      line(bench, "step_ms_predicted", c.predicted_ms, "ms");
      line(bench, "predicted_over_measured", c.ratio(), "ratio");
    } catch (const std::exception& e) {
      std::cerr << "troupe bench gpt: " << bench << " failed: " << e.what() << "\n";
      rc = 1;
    }
  }
  // What recording costs: 1f1b with an observer (recorded) and without, alternately.
  try {
    std::vector<double> with, without;
    for (int pair = 0; pair < (o.quick ? 1 : 5); ++pair)
      for (const bool record : {true, false}) {
        actor_system sys{system_config{}};
        pipeline::step_observer observe;
        if (record) observe = [](const pipeline::schedule&, const pipeline::step_result&) {};
        const auto r = kernels::train_lm(
            t, {}, {}, pipeline::lm_pipeline_engine(sys, pipeline::generate("1f1b", ranks, microbatches), {}, observe));
        (record ? with : without).push_back(r.tokens_per_s);
      }
    line("pipeline_1f1b_p2_m4_recording", "tokens_per_s_recorded", median(with), "tokens/s");
    line("pipeline_1f1b_p2_m4_recording", "tokens_per_s_unrecorded", median(without), "tokens/s");
  } catch (const std::exception& e) {
    std::cerr << "troupe bench gpt: the recording's cost could not be measured: " << e.what() << "\n";
    rc = 1;
  }
  return rc;
}

}  // namespace troupe::bench
