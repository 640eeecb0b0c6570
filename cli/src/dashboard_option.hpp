#pragma once
// `--dashboard [HOST:]PORT` (and `--dashboard-token`) of troupe node start, fedsim and train:
// the flags, the dashboard they open, and what a federated round puts on it.

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include <troupe/actors/dashboard.hpp>

namespace troupe::federated {
struct progress;
}

namespace troupe::cli {

struct dashboard_flags {
  std::string where;  ///< [HOST:]PORT; empty: no dashboard
  std::string token;  ///< --dashboard-token (node start: the cluster's token instead)
};

/// Adds --dashboard, and --dashboard-token unless `cluster_token` (the node's own token guards
/// its dashboard). Returns the --dashboard option (for needs/excludes).
CLI::Option* add_dashboard_options(CLI::App* cmd, dashboard_flags& f, bool cluster_token);

/// The dashboard the flags ask for, serving, its address said on stderr; nullptr without
/// --dashboard. `token` is the one it requires ("" for none). Throws std::invalid_argument for a
/// bad [HOST:]PORT and std::runtime_error when it cannot listen there, each naming the flag.
std::unique_ptr<troupe::dashboard> open_dashboard(const dashboard_flags& f, const std::string& token, const std::string& title);

/// The token of a run's dashboard: --dashboard-token, else $TROUPE_DASHBOARD_TOKEN ("" for none).
std::string run_dashboard_token(const dashboard_flags& f);

/// A federated round on the dashboard: the curves the report draws, the clients sampled and
/// heard from, the privacy budget spent (when the run reports epsilon), the pace.
void show_round(troupe::dashboard& d, const troupe::federated::progress& p);

}  // namespace troupe::cli
