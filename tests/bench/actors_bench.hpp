#pragma once
// The workloads of `troupe bench actors`. tests/bench/caf/caf_bench.cpp runs the same
// workloads on CAF; keep the two identical.

#include <iosfwd>
#include <string>

namespace troupe::bench {

struct options {
  bool json = false;
  bool quick = false;
  std::string only;      ///< run one workload
  unsigned threads = 0;  ///< worker threads; 0: hardware threads
};

/// The workload names, in the order they run.
const char* const* actor_bench_names();

/// Runs the actors suite and prints one line per metric. Returns a process exit code:
/// 0, or 1 when a workload's result was wrong.
int run_actors(const options& opts, std::ostream& out);

}  // namespace troupe::bench
