// `--dashboard` of the commands (dashboard_option.hpp).

#include "dashboard_option.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include <troupe/actors/http_server.hpp>
#include <troupe/federated/simulation.hpp>

namespace troupe::cli {

CLI::Option* add_dashboard_options(CLI::App* cmd, dashboard_flags& f, bool cluster_token) {
  auto* opt = cmd->add_option("--dashboard", f.where,
                              "serve a live dashboard (page, /metrics, /api/...) on [HOST:]PORT; HOST defaults to "
                              "127.0.0.1, PORT 0 takes any free port");
  if (!cluster_token)
    cmd->add_option("--dashboard-token", f.token,
                    "the dashboard requires this token (bearer field or its login page; default: "
                    "$TROUPE_DASHBOARD_TOKEN; none: no token)")
        ->needs(opt);
  return opt;
}

std::unique_ptr<troupe::dashboard> open_dashboard(const dashboard_flags& f, const std::string& token, const std::string& title) {
  if (f.where.empty()) return nullptr;
  troupe::dashboard_config cfg;
  try {
    cfg.listen = troupe::http::listen_address(f.where);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--dashboard: ") + e.what());
  }
  cfg.token = token;
  cfg.title = title;
  std::unique_ptr<troupe::dashboard> d;
  try {
    d = std::make_unique<troupe::dashboard>(cfg);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--dashboard: ") + e.what());
  }
  const auto host = cfg.listen.substr(0, cfg.listen.rfind(':'));
  std::fprintf(stderr, "dashboard: http://%s:%u/%s\n", host.c_str(), static_cast<unsigned>(d->port()),
               token.empty() ? "" : " (it asks for the token)");
  std::fflush(stderr);
  return d;
}

std::string run_dashboard_token(const dashboard_flags& f) {
  if (!f.token.empty()) return f.token;
  const char* env = std::getenv("TROUPE_DASHBOARD_TOKEN");
  return env ? env : "";
}

void show_round(troupe::dashboard& d, const troupe::federated::progress& p) {
  const auto& r = *p.round;
  const double x = r.round;
  d.add_point("clients per round", "sampled", x, static_cast<double>(r.sampled), "round", "clients");
  d.add_point("clients per round", "updates aggregated", x, static_cast<double>(r.participants), "round", "clients");
  if (r.dropped + r.late > 0 || r.round == 1) {
    d.add_point("clients per round", "failed", x, static_cast<double>(r.dropped), "round", "clients");
    d.add_point("clients per round", "late", x, static_cast<double>(r.late), "round", "clients");
  }
  if (!r.sampled_clients.empty()) {
    // The ids, the first 100 of them: a page that shows the last 20 rounds stays small at any
    // population.
    constexpr std::size_t shown_ids = 100;
    std::string ids;
    const std::size_t n = std::min(r.sampled_clients.size(), shown_ids);
    for (std::size_t i = 0; i < n; ++i) ids += (i ? " " : "") + std::to_string(r.sampled_clients[i]);
    if (r.sampled_clients.size() > n) ids += " ... and " + std::to_string(r.sampled_clients.size() - n) + " more";
    d.add_row("sampled clients", {"round", "clients", "ids"}, {std::to_string(r.round), std::to_string(r.sampled_clients.size()), ids});
  }
  if (r.participants > 0) d.add_point("loss per round", "train loss", x, r.train_loss, "round", "loss");
  if (p.evaluated) {
    d.add_point("test accuracy per round", "test accuracy", x, p.eval.accuracy, "round", "accuracy");
    d.add_point("loss per round", "test loss", x, p.eval.loss, "round", "loss");
    for (const auto& [name, value] : p.eval.metrics) d.add_point(name + " per round", name, x, value, "round", name);
  }
  for (const auto& [name, value] : r.metrics) {
    d.add_point(name + " per round", name, x, value, "round", name);
    if (name.find("epsilon") != std::string::npos) d.set_figure("privacy budget spent (" + name + ")", value, "epsilon of (epsilon, delta)-DP so far");
  }
  d.set_figure("round", x, "rounds done of " + std::to_string(p.rounds));
  d.set_figure("rounds per second", p.rounds_per_s, "rounds per second of round time so far");
  d.set_figure("uplink MB", static_cast<double>(p.uplink_bytes) / 1e6, "bytes the clients sent so far, in MB");
  if (!r.aborted.empty()) d.note("round " + std::to_string(r.round) + " aborted: " + r.aborted);
  if (!r.drift_alarms.empty()) d.note("round " + std::to_string(r.round) + ": " + std::to_string(r.drift_alarms.size()) + " drift alarms");
}

}  // namespace troupe::cli
