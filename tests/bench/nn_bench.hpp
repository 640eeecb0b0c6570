#pragma once
// The workloads of `troupe bench nn`: GEMM at the shapes of the default MLP, and training.

#include <iosfwd>

#include "actors_bench.hpp"

namespace troupe::bench {

/// Prints {"suite":"nn","bench":...,"metric":...,"value":...,"unit":...} lines (or a table).
/// Returns a process exit code.
int run_nn(const options& opts, std::ostream& out);

}  // namespace troupe::bench
