#pragma once
// The workloads of `troupe bench group`: ristretto255's operations in the project's own code
// (federated/r255.hpp) beside libsodium's, and the multi-scalar multiplication per point.

#include <iosfwd>

#include "actors_bench.hpp"

namespace troupe::bench {

/// Prints {"suite":"group","bench":...,"metric":...,"value":...,"unit":...} lines (or a table).
/// Returns a process exit code: 0, 1 when a result disagreed with its reference, 2 for an unknown
/// workload.
int run_group(const options& opts, std::ostream& out);

}  // namespace troupe::bench
