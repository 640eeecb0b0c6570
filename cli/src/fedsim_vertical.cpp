// troupe fedsim --vertical 2 (vertical federated learning: PSI, then split learning) and
// --split horizontal (SplitFed), each with a line per evaluated round and a summary, in text or
// JSON, and the refusal of the horizontal simulation's flags they do not read.

#include <cmath>
#include <cstdio>
#include <span>
#include <string>

#include <troupe/core/file.hpp>
#include <troupe/federated/splitfed.hpp>
#include <troupe/federated/vertical.hpp>

#include "commands.hpp"
#include "fedsim_vertical.hpp"

namespace troupe::cli {

namespace {

struct conflict {
  const char* flag;
  const char* why;
};

std::string first_conflict(const CLI::App& cmd, std::span<const conflict> conflicts, const std::string& mode) {
  for (const auto& c : conflicts) {
    if (cmd.count(c.flag) == 0) continue;
    if (std::string(c.flag) == "--strategy") {
      const auto* opt = cmd.get_option_no_throw(c.flag);
      if (opt && opt->as<std::string>() == "fedavg") continue;
    }
    return std::string(c.flag) + " cannot combine with " + mode + " (" + c.why + ")";
  }
  return {};
}

/// Flags of the other horizontal families, which neither split mode reads.
const conflict horizontal_only[] = {
      {"--client-models", "one model is split; --client-models gives clients different whole models"},
      {"--public", "it is read with --client-models"},
      {"--distill-steps", "it is read with --client-models --strategy feddf"},
      {"--finetune-from", "fine-tuning starts a horizontal run from a saved model"},
      {"--shift", "fine-tuning's shifted data belongs to horizontal runs"},
      {"--lora", "LoRA adapters are trained by horizontal clients"},
      {"--lora-agg", "LoRA adapters are trained by horizontal clients"},
      {"--lora-alpha", "LoRA adapters are trained by horizontal clients"},
      {"--contribution", "the Shapley values are of horizontal clients' model updates"},
      {"--contributions", "the Shapley values are of horizontal clients' model updates"},
      {"--reward-budget", "the rewards are paid from horizontal clients' Shapley values"},
      {"--validation", "it is read with --contribution"},
      {"--coalition-model", "it is read with --contribution"},
      {"--decentralized", "it trains whole models without a server"},
      {"--topology", "it is read with --decentralized"},
      {"--continual", "the tasks and their consolidation run in the horizontal simulation with a server"},
      {"--cl", "it is read with --continual"},
      {"--task-rounds", "it is read with --continual"},
      {"--verify-norm", "the norm proofs are of horizontal clients' model updates"},
      {"--verify-bits", "it is read with --verify-norm"},
};

}  // namespace

std::string splitfed_conflict(const CLI::App& cmd) {
  static const conflict conflicts[] = {
      {"--vertical", "--split horizontal splits the model across clients that hold different examples"},
      {"--secagg", "secure aggregation is not wired to SplitFed's bottoms"},
      {"--secagg-dropout", "secure aggregation is not wired to SplitFed's bottoms"},
      {"--async", "SplitFed's rounds are synchronous"},
      {"--strategy", "the bottoms are averaged by FedAvg (fedavg is the only strategy accepted)"},
      {"--dp-clip", "DP-FedAvg is not wired to SplitFed"},
      {"--dp-noise", "DP-FedAvg is not wired to SplitFed"},
      {"--compress", "compression is not wired to SplitFed"},
      {"--attack", "the attacks are not wired to SplitFed"},
      {"--checkpoint", "SplitFed runs keep no checkpoints"},
      {"--per-round", "every client takes part in every round"},
      {"--fraction", "every client takes part in every round"},
      {"--client-optimizer", "clients and server take plain SGD steps"},
      {"--client-state", "clients keep no optimizer state"},
      {"--local-epochs", "each client walks its shard once per round"},
      {"--dropout", "every client takes part in every round"},
      {"--deadline", "every client takes part in every round"},
      {"--over-select", "every client takes part in every round"},
      {"--trainer", "SplitFed trains the MLP"},
      {"--server-lr", "the server steps its top with --lr"},
      {"--min-per-round", "every client takes part in every round"},
      {"--latency", "SplitFed runs no simulated clock"},
      {"--local-steps", "each client walks its shard once per round"},
      {"--eval-clients", "SplitFed evaluates the split model on the test set only"},
  };
  if (auto why = first_conflict(cmd, conflicts, "--split horizontal"); !why.empty()) return why;
  return first_conflict(cmd, horizontal_only, "--split horizontal");
}

std::string vertical_conflict(const CLI::App& cmd) {
  // What the horizontal simulation reads and a vertical run has no use for: a flag given with
  // --vertical would be silently ignored, so it is refused.
  static const conflict conflicts[] = {
      {"--secagg", "secure aggregation sums client updates; split learning exchanges cut layers"},
      {"--secagg-dropout", "secure aggregation sums client updates; split learning exchanges cut layers"},
      {"--async", "FedBuff buffers client updates; the two parties step together"},
      {"--strategy", "the parties take plain SGD steps (fedavg is the only strategy accepted)"},
      {"--dp-clip", "DP-FedAvg clips client updates; see --cut-noise for noise on the cut gradients"},
      {"--dp-noise", "DP-FedAvg noises client updates; see --cut-noise for noise on the cut gradients"},
      {"--compress", "compression applies to client updates"},
      {"--attack", "the attacks poison client updates"},
      {"--checkpoint", "vertical runs keep no checkpoints"},
      {"--clients", "there are two parties"},
      {"--per-round", "there are two parties"},
      {"--fraction", "there are two parties"},
      {"--partition", "each party's IDs are a random --vertical-overlap of the examples"},
      {"--client-optimizer", "the parties take plain SGD steps"},
      {"--client-state", "the parties keep no optimizer state"},
      {"--local-epochs", "--rounds counts the epochs"},
      {"--dropout", "both parties take part in every step"},
      {"--deadline", "both parties take part in every step"},
      {"--over-select", "both parties take part in every step"},
      {"--trainer", "the parties train the MLP"},
      {"--server-lr", "there is no server step"},
      {"--min-per-round", "there are two parties"},
      {"--latency", "vertical runs have no simulated clock"},
      {"--local-steps", "--rounds counts the epochs"},
      {"--eval-clients", "the two parties hold columns, not clients' shards"},
  };
  if (auto why = first_conflict(cmd, conflicts, "--vertical"); !why.empty()) return why;
  return first_conflict(cmd, horizontal_only, "--vertical");
}

int run_fedsim_splitfed(const troupe::federated::simulation_options& s, bool json) {
  troupe::federated::splitfed_options o;
  o.model = s.model;
  o.clients = s.clients;
  o.partition = s.partition;
  o.rounds = s.rounds;
  o.batch = s.batch;
  o.lr = s.lr;
  o.seed = s.seed;
  o.eval_every = s.eval_every;
  o.threads = s.threads;
  o.data_dir = s.data_dir;
  o.data = s.data;
  const auto sum = troupe::federated::run_splitfed(o, nullptr, [&](const troupe::federated::splitfed_progress& p) {
    if (json)
      std::printf("{\"round\":%d,\"test_accuracy\":%s,\"test_loss\":%s,\"train_loss\":%s,\"seconds\":%.3f}\n", p.round,
                  json_number(p.accuracy, "%.4f").c_str(), json_number(p.loss, "%.4f").c_str(),
                  json_number(p.train_loss, "%.4f").c_str(), p.seconds);
    else
      std::printf("round %d/%d  test accuracy %.4f  test loss %.4f  train loss %.4f  %.1f s\n", p.round, p.rounds, p.accuracy,
                  p.loss, p.train_loss, p.seconds);
    std::fflush(stdout);
  });
  const auto crc = troupe::crc32(std::as_bytes(std::span(sum.model)));
  if (json)
    std::printf("{\"final_accuracy\":%s,\"final_loss\":%s,\"rounds\":%d,\"clients\":%zu,\"steps\":%lld,"
                "\"bytes_per_step\":%.1f,\"seconds\":%.2f,\"model_crc32\":\"%08x\"}\n",
                json_number(sum.final_accuracy, "%.4f").c_str(), json_number(sum.final_loss, "%.9g").c_str(), o.rounds,
                o.clients, static_cast<long long>(sum.steps), sum.bytes_per_step, sum.seconds, static_cast<unsigned>(crc));
  else
    std::printf("final test accuracy %.4f after %d rounds of SplitFed with %zu clients, %.0f bytes per step, %.1f s, model CRC-32 %08x\n",
                sum.final_accuracy, o.rounds, o.clients, sum.bytes_per_step, sum.seconds, static_cast<unsigned>(crc));
  return 0;
}

int run_fedsim_vertical(const troupe::federated::simulation_options& s, const vertical_flags& v, bool json) {
  troupe::federated::vertical_options o;
  o.model = s.model;
  o.overlap = v.overlap;
  o.epochs = s.rounds;
  o.batch = s.batch;
  o.lr = s.lr;
  o.seed = s.seed;
  o.cut_noise = v.cut_noise;
  o.leakage_class = v.leakage_class;
  o.eval_every = s.eval_every;
  o.threads = s.threads;
  o.data_dir = s.data_dir;
  o.data = s.data;
  const auto sum = troupe::federated::run_vertical(o, [&](const troupe::federated::vertical_progress& p) {
    if (json)
      std::printf("{\"round\":%d,\"test_accuracy\":%s,\"test_loss\":%s,\"train_loss\":%s,\"seconds\":%.3f}\n", p.epoch,
                  json_number(p.accuracy, "%.4f").c_str(), json_number(p.loss, "%.4f").c_str(),
                  json_number(p.train_loss, "%.4f").c_str(), p.seconds);
    else
      std::printf("epoch %d/%d  test accuracy %.4f  test loss %.4f  train loss %.4f  %.1f s\n", p.epoch, p.epochs, p.accuracy,
                  p.loss, p.train_loss, p.seconds);
    std::fflush(stdout);
  });
  if (json) {
    std::printf(
        "{\"final_accuracy\":%s,\"final_loss\":%s,\"centralised_accuracy\":%s,\"rounds\":%d,\"steps\":%lld,"
        "\"psi_ids_a\":%zu,\"psi_ids_b\":%zu,\"psi_intersection\":%zu,\"psi_seconds\":%.3f,\"psi_bytes\":%zu,"
        "\"bytes_per_step\":%.1f,\"leakage_class\":%d,\"label_leakage_auc\":%s,\"label_leakage_auc_noised\":%s,"
        "\"cut_noise\":%s,\"seconds\":%.2f}\n",
        json_number(sum.final_accuracy, "%.4f").c_str(), json_number(sum.final_loss, "%.9g").c_str(),
        json_number(sum.centralised_accuracy, "%.4f").c_str(), o.epochs, static_cast<long long>(sum.steps), sum.ids_a,
        sum.ids_b, sum.psi_intersection, sum.psi_seconds, sum.psi_bytes, sum.bytes_per_step, sum.leakage_class,
        json_number(sum.label_leakage_auc, "%.4f").c_str(),
        sum.label_leakage_auc_noised >= 0 ? json_number(sum.label_leakage_auc_noised, "%.4f").c_str() : "null",
        json_number(o.cut_noise, "%.6g").c_str(), sum.seconds);
  } else {
    std::printf("PSI: %zu and %zu IDs, %zu common, %.2f s, %zu bytes\n", sum.ids_a, sum.ids_b, sum.psi_intersection,
                sum.psi_seconds, sum.psi_bytes);
    std::printf("final test accuracy %.4f (centralised, same model and batches: %.4f) after %d epochs, %.0f bytes per step\n",
                sum.final_accuracy, sum.centralised_accuracy, o.epochs, sum.bytes_per_step);
    std::printf("label leakage (norm attack, class %d vs rest): AUC %.4f", sum.leakage_class, sum.label_leakage_auc);
    if (sum.label_leakage_auc_noised >= 0) std::printf(", %.4f with --cut-noise %g", sum.label_leakage_auc_noised, o.cut_noise);
    std::printf("\n");
  }
  return 0;
}

}  // namespace troupe::cli
