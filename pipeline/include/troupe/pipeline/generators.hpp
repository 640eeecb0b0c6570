#pragma once
/// @file
/// Schedule generators. Each returns a compute-only schedule (F, B or I/W); lower() adds the
/// communication. A generator refuses (std::invalid_argument saying what to change) any
/// (p, m, v) for which it cannot produce a correct schedule; it never drops a microbatch.

#include <string>
#include <vector>

#include "troupe/pipeline/schedule.hpp"

namespace troupe::pipeline {

/// The names generate() knows: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zb-v.
std::vector<std::string> schedule_names();

/// The default number of stages per rank of a schedule (1, or 2 for the looped and V ones).
int default_virtual_stages(const std::string& name);

/// Generates schedule `name` for p ranks and m microbatches with v stages per rank
/// (0: the schedule's default).
schedule generate(const std::string& name, int ranks, int microbatches, int virtual_stages = 0);

}  // namespace troupe::pipeline
