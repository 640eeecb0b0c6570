#pragma once
// The workloads of `troupe bench pipeline`: training steps of the pipeline runtime, per schedule,
// with and without activation checkpointing, against the whole model stepped in this thread.

#include <iosfwd>

#include "actors_bench.hpp"

namespace troupe::bench {

/// The schedules' names, as --only takes them (plus "whole", the anchor).
/// Prints {"suite":"pipeline","bench":...,"recompute":...,"metric":"samples_per_s",...} lines
/// (or a table). Returns a process exit code: 0, 1 when a step's result was wrong, 2 for a bad
/// --only.
int run_pipeline(const options& opts, std::ostream& out);

}  // namespace troupe::bench
