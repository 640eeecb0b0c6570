#pragma once
// The workloads of `troupe bench pipeline`: training steps of the pipeline runtime, per schedule,
// with and without activation checkpointing, against the whole model stepped in this thread.

#include <cstdint>
#include <iosfwd>
#include <string>

#include "actors_bench.hpp"

namespace troupe::bench {

struct pipeline_options : options {
  std::string model = "mlp:784-256-128-64-10";
  std::int64_t batch = 128;
  int microbatches = 8;
  int ranks = 2;
};

/// Prints {"suite":"pipeline","bench":...,"recompute":...,"metric":"samples_per_s",...} lines
/// (or a table), one per schedule (--only: "whole", the anchor, or one schedule's name) and
/// with or without recomputation. Returns a process exit code: 0, 1 when a row's weights differ
/// from the anchor's, 2 for bad options.
int run_pipeline(const pipeline_options& opts, std::ostream& out);

}  // namespace troupe::bench
