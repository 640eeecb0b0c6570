#pragma once
// The workloads of `troupe bench optim`: fused optimizer steps over many tensors in each state
// storage, against the memory bandwidth measured in the same run.

#include <cstdint>
#include <iosfwd>
#include <string>

namespace troupe::bench {

struct optim_options {
  bool json = false;
  std::int64_t params = 50'000'000;  ///< parameters in all
  int tensors = 100;                 ///< split into this many equal tensors
  int steps = 7;                     ///< timed steps per row (the median is reported)
  int threads = 0;                   ///< 0: the optimizer's default (all cores at this size)
  std::string only;                  ///< sgd, adam or adamw
  std::string device = "cpu";        ///< cpu, cuda or cuda:N (parameters and state live there)
  bool options = false;              ///< also the state options (stochastic rounding, AMSGrad, ...)
};

/// Prints {"suite":"optim","bench":...,"state":...,"device":"cpu","metric":"seconds_per_step",
/// "value":...,"bytes_per_param":...,"fraction_of_bandwidth":...} lines (or a table), after
/// the triad and in-place bandwidth lines (on a CUDA device: after a device-to-device copy
/// bandwidth line, against which the fraction is taken). With `options`, each optimizer's rows
/// are followed by rows of its state options, which carry an "options" field (for example
/// "stochastic", "amsgrad", "percentile_scale=99.9"). Returns a process exit code.
int run_optim(const optim_options& opts, std::ostream& out);

}  // namespace troupe::bench
