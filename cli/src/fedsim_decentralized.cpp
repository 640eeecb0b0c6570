// troupe fedsim --decentralized gossip|dpsgd|allreduce [--topology ring|torus|random-regular:D|complete]:
// serverless training by peer actors, a line per evaluated round and a summary (text or JSON),
// and the refusal of the server's flags, which a run without a server would silently ignore.

#include <cmath>
#include <cstdio>
#include <string>

#include <troupe/federated/decentralized.hpp>

#include "commands.hpp"
#include "fedsim_decentralized.hpp"

namespace troupe::cli {

std::string decentralized_conflict(const CLI::App& cmd, const std::string& mode) {
  struct conflict {
    const char* flag;
    const char* why;
  };
  static const conflict conflicts[] = {
      {"--vertical", "peers hold whole examples and whole models"},
      {"--split", "peers hold whole models"},
      {"--client-models", "every peer trains the same architecture"},
      {"--secagg", "there is no server to hide the updates from"},
      {"--secagg-dropout", "there is no server to hide the updates from"},
      {"--async", "peers average in synchronous rounds"},
      {"--strategy", "there is no server strategy: peers average their models"},
      {"--server-lr", "there is no server"},
      {"--server-momentum", "there is no server"},
      {"--dp-clip", "DP-FedAvg is a server-side mechanism"},
      {"--dp-noise", "DP-FedAvg is a server-side mechanism"},
      {"--compress", "peers send whole models"},
      {"--attack", "the attacks are not wired to peers"},
      {"--checkpoint", "decentralized runs keep no checkpoints"},
      {"--per-round", "every peer takes part in every round"},
      {"--fraction", "every peer takes part in every round"},
      {"--min-per-round", "every peer takes part in every round"},
      {"--dropout", "every peer takes part in every round"},
      {"--deadline", "every peer takes part in every round"},
      {"--over-select", "every peer takes part in every round"},
      {"--latency", "decentralized runs keep no simulated clock"},
      {"--client-optimizer", "peers take plain SGD steps"},
      {"--client-state", "peers keep no optimizer state"},
      {"--finetune-from", "peers start from a fresh model"},
      {"--lora", "peers train whole models"},
      {"--lora-agg", "peers train whole models"},
      {"--lora-alpha", "peers train whole models"},
      {"--trainer", "peers train the model (the mlp trainer)"},
      {"--public", "it is read with --client-models"},
      {"--distill-steps", "it is read with --client-models"},
      {"--shift", "fine-tuning's shifted data belongs to runs with a server"},
      {"--eval-clients", "peers are evaluated through their mean model"},
      {"--contribution", "the Shapley values are of a server round's updates"},
      {"--contributions", "the Shapley values are of a server round's updates"},
      {"--reward-budget", "the rewards are paid from a server round's Shapley values"},
      {"--validation", "it is read with --contribution"},
      {"--coalition-model", "it is read with --contribution"},
      {"--drift", "drift is injected into the horizontal simulation's clients"},
      {"--drift-detect", "drift is detected on the horizontal simulation's clients"},
      {"--drift-response", "drift is answered in the horizontal simulation"},
      {"--continual", "the tasks and their consolidation run in the horizontal simulation"},
      {"--cl", "it is read with --continual"},
      {"--task-rounds", "it is read with --continual"},
      {"--verify-norm", "there is no server to verify the norm proofs"},
      {"--verify-bits", "there is no server to verify the norm proofs"},
  };
  for (const auto& c : conflicts) {
    if (cmd.count(c.flag) == 0) continue;
    if (std::string(c.flag) == "--strategy") {
      const auto* opt = cmd.get_option_no_throw(c.flag);
      if (opt && opt->as<std::string>() == "fedavg") continue;
    }
    if (std::string(c.flag) == "--trainer") {
      const auto* opt = cmd.get_option_no_throw(c.flag);
      if (opt && opt->as<std::string>() == "mlp") continue;
    }
    return std::string(c.flag) + " cannot combine with --decentralized (" + c.why + ")";
  }
  if (mode == "allreduce" && cmd.count("--topology") > 0)
    return "--topology cannot combine with --decentralized allreduce (the all-reduce forms its own ring of all clients)";
  if (mode == "dpsgd" && cmd.count("--local-epochs") > 0)
    return "--local-epochs cannot combine with --decentralized dpsgd (each iteration is one step; a round is "
           "--local-steps iterations)";
  return {};
}

int run_fedsim_decentralized(const troupe::federated::simulation_options& o, const std::string& topology,
                             const std::string& mode, bool json) {
  troupe::federated::decentralized_options d;
  d.base = o;
  d.topology = topology;
  d.mode = mode;
  const double rounds = o.rounds;
  auto s = troupe::federated::run_decentralized(d, nullptr, nullptr, [&](const troupe::federated::decentralized_report& r) {
    if (!r.evaluated) return;
    if (json)
      std::printf("{\"round\":%d,\"test_accuracy\":%s,\"test_loss\":%s,\"consensus_error\":%s,\"train_loss\":%s,"
                  "\"bytes\":%llu,\"seconds\":%.3f}\n",
                  r.round, json_number(r.accuracy, "%.4f").c_str(), json_number(r.loss, "%.4f").c_str(),
                  json_number(r.consensus_error, "%.6g").c_str(), json_number(r.train_loss, "%.4f").c_str(),
                  static_cast<unsigned long long>(r.bytes), r.seconds);
    else
      std::printf("round %d/%d  mean model's test accuracy %.4f  test loss %.4f  consensus error %.4g  train loss %.4f  "
                  "%.1f MB sent  %.1f s\n",
                  r.round, o.rounds, r.accuracy, r.loss, r.consensus_error, r.train_loss, static_cast<double>(r.bytes) / 1e6,
                  r.seconds);
    std::fflush(stdout);
  });
  const std::string topo = mode == "allreduce" ? "ring all-reduce" : topology;
  if (json)
    std::printf("{\"final_accuracy\":%s,\"final_loss\":%s,\"consensus_error\":%s,\"rounds\":%d,\"clients\":%zu,"
                "\"decentralized\":\"%s\",\"topology\":\"%s\",\"bytes\":%llu,\"bytes_per_round\":%.0f,\"seconds\":%.2f}\n",
                json_number(s.final_accuracy, "%.4f").c_str(), json_number(s.final_loss, "%.9g").c_str(),
                json_number(s.consensus_error, "%.6g").c_str(), s.rounds, o.clients, mode.c_str(), topo.c_str(),
                static_cast<unsigned long long>(s.bytes), static_cast<double>(s.bytes) / rounds, s.seconds);
  else
    std::printf("final mean model's test accuracy %.4f after %d rounds (%s, %s, %zu clients), consensus error %.4g, "
                "%.1f MB sent, %.1f s\n",
                s.final_accuracy, s.rounds, mode.c_str(), topo.c_str(), o.clients, s.consensus_error,
                static_cast<double>(s.bytes) / 1e6, s.seconds);
  return 0;
}

}  // namespace troupe::cli
