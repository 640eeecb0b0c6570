#pragma once
// troupe fedsim's federated graph learning, --graph knn:K with --graph-hops, --graph-beta and
// --graph-labelled: the refusal of the flags it cannot take, and the run.

#include <CLI/CLI.hpp>

#include <string>

#include <troupe/federated/simulation.hpp>

namespace troupe::cli {

struct graph_flags {
  std::string graph;          ///< --graph knn:K (empty: no graph)
  int hops = 2;               ///< --graph-hops
  int depth = 2;              ///< --graph-depth
  double beta = 10000;        ///< --graph-beta
  std::size_t labelled = 60000;  ///< --graph-labelled
};

/// Empty, or why a flag given to `cmd` cannot combine with --graph.
std::string graph_conflict(const CLI::App& cmd);
/// Runs FedGCN and FedAvg of SGC with the fedsim options it reads; returns the exit code.
int run_fedsim_graph(const troupe::federated::simulation_options& o, const graph_flags& g, bool json);

}  // namespace troupe::cli
