// The reports of troupe fedsim runs (see run_report.hpp).

#include "run_report.hpp"

#include <cstdio>

#include <troupe/federated/simulation.hpp>

namespace troupe::cli {

namespace {
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

std::vector<std::vector<std::string>> fedsim_option_rows(const troupe::federated::simulation_options& o) {
  std::vector<std::vector<std::string>> rows = {
      {"model", o.client_models.empty() ? o.model : o.client_models},
      {"data", o.data.empty() ? (o.data_dir.empty() ? "Fashion-MNIST" : o.data_dir) : o.data},
      {"clients", std::to_string(o.clients)},
      {"per round", o.fraction > 0 ? num(o.fraction) + " of the clients" : std::to_string(o.per_round)},
      {"rounds", std::to_string(o.rounds)},
      {"partition", o.partition},
      {"strategy", o.strategy},
      {"client learning rate", num(o.lr)},
      {"batch", std::to_string(o.batch)},
      {"local work", o.local_steps > 0 ? std::to_string(o.local_steps) + " steps" : std::to_string(o.local_epochs) + " epochs"},
      {"client optimizer", o.client_optimizer + " (" + o.client_state + ")"},
      {"device", o.device},
      {"seed", std::to_string(o.seed)},
  };
  if (o.secagg) rows.push_back({"secure aggregation", "SecAgg+, dropout " + num(o.secagg_dropout)});
  if (o.dp_noise > 0) rows.push_back({"differential privacy", "clip " + num(o.dp_clip) + ", noise " + num(o.dp_noise)});
  if (!o.compress.empty()) rows.push_back({"compression", o.compress});
  if (!o.tee.empty())
    rows.push_back({"attested aggregation", o.tee == "sim" ? std::string("simulated enclave, test root") + (o.tee_oblivious ? ", oblivious" : "")
                                                           : std::string("software TPM (swtpm), test root") + (o.tee_oblivious ? ", oblivious" : "")});
  if (!o.attack.empty()) rows.push_back({"attack", o.attack});
  if (!o.async.empty()) rows.push_back({"asynchronous", o.async});
  if (!o.lora.empty()) rows.push_back({"LoRA", o.lora + " (" + o.lora_agg + ")"});
  if (!o.shift.empty()) rows.push_back({"shift", o.shift});
  if (o.dropout > 0) rows.push_back({"client failures", num(o.dropout)});
  return rows;
}

void write_run_report(const std::string& path, const std::string& title, const std::vector<std::vector<std::string>>& options,
                      const std::vector<std::vector<std::string>>& summary, const troupe::chart_book& charts) {
  troupe::report r(title);
  r.heading("Result");
  r.table({"measure", "value"}, summary);
  r.heading("Curves");
  charts.add_to(r);
  r.heading("Options");
  r.table({"option", "value"}, options);
  r.write(path);
}

}  // namespace troupe::cli
