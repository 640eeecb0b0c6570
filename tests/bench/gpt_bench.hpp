#pragma once
// The workloads of `troupe bench gpt`: training throughput of nanoGPT's CPU configuration, and
// the time of each kernel of its step at that configuration's shapes.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

namespace troupe::bench {

struct gpt_options {
  bool json = false;
  bool quick = false;             ///< 20 training steps, shorter kernel timings (for CI)
  std::string only;               ///< train, pipeline, kernels, or one kernel's name
  std::int64_t steps = 200;       ///< training steps timed
  std::string text;               ///< a UTF-8 file to train on; empty: the King James Bible
};

/// The workload names, in the order they run (after "train" and "kernels").
const char* const* gpt_kernel_names();

/// Prints {"suite":"gpt","bench":...,"metric":...,"value":...,"unit":...} lines (or a table).
/// Returns a process exit code: 0, 1 when a workload failed, 2 for an unknown workload.
int run_gpt(const gpt_options& opts, std::ostream& out);

/// Prints one row: (bench, metric, value, unit).
using gpt_line = std::function<void(const std::string&, const std::string&, double, const char*)>;

/// The "pipeline" workload (gpt_pipeline_bench.cpp): per schedule on 2 ranks and 4 microbatches
/// (--quick: gpipe, 1f1b, zb-h1, 10 steps; else every generator, up to 50 steps), tokens/s and
/// the measured step against the simulator's prediction from the measured costs; and 1f1b's
/// tokens/s with its timeline recorded and without. Returns 0, or 1 when a run failed.
int run_gpt_pipeline(const gpt_options& opts, const gpt_line& line);

}  // namespace troupe::bench
