// troupe fedsim --client-models: clients of different architectures (FedAvg within each, FedDF,
// FedMD), a line (or JSON object) per evaluated round and a summary.

#include <cstdio>
#include <string>

#include <unistd.h>

#include <troupe/federated/distillation.hpp>

#include "commands.hpp"
#include "run_report.hpp"

namespace troupe::cli {

namespace {
std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json_number(v[i], "%.4f");
  return s + "]";
}
std::string json_string(const std::string& v) {
  std::string s = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') s += '\\';
    s += c;
  }
  return s + "\"";
}
}  // namespace

int run_fedsim_heterogeneous(const troupe::federated::simulation_options& o, bool json, const std::string& report) {
  namespace fed = troupe::federated;
  const auto models = fed::split_model_list(o.client_models);
  const bool tty = isatty(STDERR_FILENO);
  troupe::chart_book charts;
  auto s = fed::run_heterogeneous(o, models, [&](const fed::heterogeneous_progress& p) {
    if (p.evaluated && !report.empty()) {
      for (std::size_t g = 0; g < p.accuracies.size(); ++g)
        charts.add("test accuracy per round", models[g], p.round, p.accuracies[g], "round", "accuracy");
      charts.add("training loss per round", "train loss", p.round, p.train_loss, "round", "loss");
      if (o.strategy == "feddf") charts.add("distillation loss per round", "KL to the ensemble", p.round, p.distill_loss, "round", "loss");
    }
    if (p.evaluated) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      double mean = 0;
      for (double a : p.accuracies) mean += a / static_cast<double>(p.accuracies.size());
      if (json) {
        std::printf("{\"round\":%d,\"test_accuracy\":%s,\"model_accuracies\":%s,\"train_loss\":%s,\"distill_loss\":%s,"
                    "\"seconds\":%.3f}\n",
                    p.round, json_number(mean, "%.4f").c_str(), json_list(p.accuracies).c_str(),
                    json_number(p.train_loss, "%.4f").c_str(), json_number(p.distill_loss, "%.4f").c_str(), p.seconds);
      } else {
        std::string each;
        for (std::size_t g = 0; g < p.accuracies.size(); ++g) {
          char buf[48];
          std::snprintf(buf, sizeof buf, "%s%.4f", g ? " " : "", p.accuracies[g]);
          each += buf;
        }
        std::printf("round %d/%d  test accuracy %.4f (per model: %s)  train loss %.4f  distill loss %.4f  %.1f s\n", p.round,
                    p.rounds, mean, each.c_str(), p.train_loss, p.distill_loss, p.seconds);
      }
      std::fflush(stdout);
    } else if (tty) {
      std::fprintf(stderr, "\r\033[Kround %d/%d  train loss %.4f", p.round, p.rounds, p.train_loss);
      std::fflush(stderr);
    }
  });
  if (tty) std::fprintf(stderr, "\r\033[K");
  if (json) {
    std::string names = "[";
    for (std::size_t g = 0; g < s.models.size(); ++g) names += (g ? "," : "") + json_string(s.models[g]);
    std::printf("{\"final_accuracy\":%s,\"model_accuracies\":%s,\"models\":%s],\"strategy\":%s,\"rounds\":%d,"
                "\"seconds\":%.2f,\"peak_rss_mb\":%.1f}\n",
                json_number(s.mean_accuracy, "%.4f").c_str(), json_list(s.accuracies).c_str(), names.c_str(),
                json_string(o.strategy).c_str(), s.rounds, s.seconds, s.peak_rss_mb);
  } else {
    std::printf("final test accuracy %.4f (mean over %zu models) after %d rounds, %.1f s, peak memory %.0f MB\n",
                s.mean_accuracy, s.models.size(), s.rounds, s.seconds, s.peak_rss_mb);
  }
  if (!report.empty()) {
    std::vector<std::vector<std::string>> summary = {{"mean final test accuracy", json_number(s.mean_accuracy, "%.4f")}};
    for (std::size_t g = 0; g < s.models.size(); ++g)
      summary.push_back({"final test accuracy of " + s.models[g], json_number(s.accuracies[g], "%.4f")});
    summary.push_back({"rounds", std::to_string(s.rounds)});
    summary.push_back({"wall time (s)", json_number(s.seconds, "%.2f")});
    write_run_report(report, "troupe fedsim --client-models", fedsim_option_rows(o), summary, charts);
  }
  return 0;
}

}  // namespace troupe::cli
