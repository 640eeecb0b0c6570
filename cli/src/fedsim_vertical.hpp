#pragma once
// troupe fedsim's split-learning modes, --vertical 2 and --split horizontal: their flags, the
// refusal of the flags they cannot take, and the runs.

#include <CLI/CLI.hpp>

#include <string>

#include <troupe/federated/simulation.hpp>

namespace troupe::cli {

struct vertical_flags {
  int parties = 0;       ///< --vertical N (0: horizontal federated learning)
  double overlap = 0.9;  ///< --vertical-overlap
  double cut_noise = 0;  ///< --cut-noise
  int leakage_class = -1; ///< --leakage-class (< 0: 6, or the last class of data with fewer)
};

/// Empty, or why a flag given to `cmd` cannot combine with --vertical.
std::string vertical_conflict(const CLI::App& cmd);
/// Empty, or why a flag given to `cmd` cannot combine with --split horizontal.
std::string splitfed_conflict(const CLI::App& cmd);
/// Runs SplitFed (--split horizontal) with the fedsim options it reads; returns the exit code.
int run_fedsim_splitfed(const troupe::federated::simulation_options& s, bool json);
/// Runs the vertical mode with the fedsim options it reads; returns the exit code.
int run_fedsim_vertical(const troupe::federated::simulation_options& s, const vertical_flags& v, bool json);

}  // namespace troupe::cli
