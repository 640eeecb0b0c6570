#pragma once
// troupe fedsim's serverless mode, --decentralized gossip|dpsgd|allreduce with --topology: the
// refusal of the flags it cannot take, and the run.

#include <CLI/CLI.hpp>

#include <string>

#include <troupe/federated/simulation.hpp>

namespace troupe::cli {

/// Empty, or why a flag given to `cmd` cannot combine with --decentralized `mode`.
std::string decentralized_conflict(const CLI::App& cmd, const std::string& mode);
/// Runs decentralized training with the fedsim options it reads; returns the exit code.
int run_fedsim_decentralized(const troupe::federated::simulation_options& o, const std::string& topology,
                             const std::string& mode, bool json);

}  // namespace troupe::cli
