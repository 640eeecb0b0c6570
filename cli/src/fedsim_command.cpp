// troupe fedsim: a federated simulation on Fashion-MNIST, with a progress bar and a line per
// evaluated round (or one JSON object per evaluated round and a final summary).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <unistd.h>

#include <troupe/federated/continual.hpp>
#include <troupe/federated/drift.hpp>
#include <troupe/federated/simulation.hpp>

#include "commands.hpp"
#include "dashboard_option.hpp"
#include "run_report.hpp"
#include "fedsim_decentralized.hpp"
#include "fedsim_graph.hpp"
#include "fedsim_tee.hpp"
#include "fedsim_vertical.hpp"

namespace troupe::cli {

namespace {

struct fedsim_flags {
  troupe::federated::simulation_options o;
  vertical_flags vertical;
  std::string split;
  std::string decentralized, topology = "ring";
  graph_flags graph;
  bool json = false;
  bool bias_correction = false;
  std::string report;
  dashboard_flags dashboard;
};

/// "0.8812", or "n/a" for what was not measured (the noop trainer's accuracy, the training loss
/// of a round without updates).
std::string text_number(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

/// The summary's drift fields: "drift_alarms" (each round with alarms and its clients), and
/// under --drift the drifted clients, the first alarm on one of them at or after the drift's
/// round less that round ("drift_detection_delay", null: none) and the alarms before that round
/// or on clients that did not drift ("drift_false_alarms").
std::string drift_json(const troupe::federated::simulation_options& o, const troupe::federated::summary& s) {
  if (o.drift.empty() && o.drift_detect.empty()) return "";
  std::string out = ",\"drift_alarms\":[";
  std::size_t total = 0;
  for (std::size_t i = 0; i < s.drift_alarms.size(); ++i) {
    const auto& [round, clients] = s.drift_alarms[i];
    out += (i ? ",{\"round\":" : "{\"round\":") + std::to_string(round) + ",\"clients\":[";
    for (std::size_t j = 0; j < clients.size(); ++j) out += (j ? "," : "") + std::to_string(clients[j]);
    out += "]}";
    total += clients.size();
  }
  out += "],\"drift_alarm_count\":" + std::to_string(total);
  if (o.drift.empty()) return out;
  const auto d = troupe::federated::parse_drift(o.drift);
  std::vector<char> drifted(o.clients, 0);
  out += ",\"drifted_clients\":[";
  for (std::size_t j = 0; j < s.drifted_clients.size(); ++j) {
    out += (j ? "," : "") + std::to_string(s.drifted_clients[j]);
    drifted[s.drifted_clients[j]] = 1;
  }
  out += "]";
  int first = -1;
  std::size_t false_alarms = 0;
  std::vector<char> caught(o.clients, 0);
  std::size_t detected = 0;
  for (const auto& [round, clients] : s.drift_alarms)
    for (auto c : clients) {
      if (round < d.round || !drifted[c]) {
        ++false_alarms;
        continue;
      }
      if (first < 0) first = round;
      if (!caught[c]) ++detected;
      caught[c] = 1;
    }
  if (!o.drift_detect.empty())
    out += ",\"drift_detection_delay\":" + (first < 0 ? std::string("null") : std::to_string(first - d.round)) +
           ",\"drift_false_alarms\":" + std::to_string(false_alarms) + ",\"drifted_clients_alarmed\":" +
           std::to_string(detected);
  return out;
}

/// The summary's continual-learning fields: the tasks and the method, each task's accuracy right
/// after its training and at the end, ACC, BWT and the consolidations' bytes.
std::string continual_json(const troupe::federated::simulation_options& o, const troupe::federated::summary& s) {
  if (o.continual.empty()) return "";
  auto list = [](const std::vector<double>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + json_number(v[i], "%.4f");
    return out + "]";
  };
  const int task_rounds = o.task_rounds > 0 ? o.task_rounds : o.rounds / troupe::federated::parse_continual(o.continual).tasks;
  std::string out = ",\"continual\":\"" + o.continual + "\",\"cl\":\"" + (o.cl.empty() ? "none" : o.cl) +
                    "\",\"task_rounds\":" + std::to_string(task_rounds) +
                    ",\"task_accuracy_after\":" + list(s.task_accuracy_after) +
                    ",\"task_accuracy_final\":" + list(s.task_accuracy_final) +
                    ",\"consolidation_bytes\":" + std::to_string(s.consolidation_bytes);
  if (!s.task_accuracy_final.empty())
    out += ",\"acc\":" + json_number(s.acc, "%.4f") + ",\"bwt\":" + json_number(s.bwt, "%.4f");
  return out;
}

}  // namespace

void add_fedsim_command(CLI::App& app, int& rc) {
  auto f = std::make_shared<fedsim_flags>();
  auto& o = f->o;
  auto* cmd = app.add_subcommand("fedsim", "simulate federated learning (Fashion-MNIST or your own data): client actors, a server, strategies");
  cmd->add_option("--clients", o.clients, "clients in the population")->capture_default_str();
  auto* per_round = cmd->add_option("--per-round", o.per_round, "clients sampled per round")->capture_default_str();
  cmd->add_option("--fraction", o.fraction, "sample this fraction of the clients per round instead (0: use --per-round)")
      ->excludes(per_round);
  cmd->add_option("--min-per-round", o.min_per_round, "at least this many clients per round")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "rounds to run")->capture_default_str();
  cmd->add_option("--local-epochs", o.local_epochs, "passes over its shard per client per round")->capture_default_str();
  cmd->add_option("--local-steps", o.local_steps, "steps per client per round instead of --local-epochs passes (0: passes)")
      ->capture_default_str();
  cmd->add_option("--train-limit", o.train_limit, "train on the first N training examples only (0: all)")->capture_default_str();
  cmd->add_option("--batch", o.batch, "client batch size")->capture_default_str();
  cmd->add_option("--lr", o.lr, "clients' learning rate")->capture_default_str();
  cmd->add_option("--client-optimizer", o.client_optimizer,
                  "sgd (no state), or adam or adamw: each client keeps its own moments between its rounds")
      ->capture_default_str();
  cmd->add_option("--client-state", o.client_state, "storage of the clients' optimizer moments: fp32, bf16 or int8")
      ->capture_default_str();
  cmd->add_option("--model", o.model, "mlp:IN-H1-...-OUT, or a layer description: 'sequential(linear(784->64), gelu, linear(64->10))'")
      ->capture_default_str();
  cmd->add_option("--partition", o.partition, "iid, dirichlet:A, shards:K or powerlaw:A")->capture_default_str();
  cmd->add_option("--strategy", o.strategy,
                  troupe::federated::strategy_names() + ", or a robust rule: median, trimmed-mean:B, krum:F, multi-krum:F:M, geomed, norm-bound:M, "
                  "or the backdoor defence alignins[:LAMBDA_T:LAMBDA_S]")
      ->capture_default_str();
  cmd->add_option("--client-models", o.client_models,
                  "clients of different architectures: SPEC,SPEC,... assigned round-robin (--strategy fedavg, feddf or fedmd)");
  cmd->add_option("--public", o.public_examples, "with --client-models: training examples the server holds out as its public data")
      ->capture_default_str();
  cmd->add_option("--distill-steps", o.distill_steps, "feddf: the server's distillation steps per round (batches of 64)")
      ->capture_default_str();
  cmd->add_option("--server-lr", o.server.server_lr, "server learning rate (default: the strategy's)")
      ->check(positive_number);
  cmd->add_option("--server-momentum", o.server.momentum, "fedavgm's momentum")->capture_default_str();
  cmd->add_option("--beta1", o.server.beta1, "adaptive strategies' first-moment decay")->capture_default_str();
  cmd->add_option("--beta2", o.server.beta2, "adaptive strategies' second-moment decay")->capture_default_str();
  cmd->add_option("--tau", o.server.tau, "adaptive strategies' adaptivity (epsilon)")->capture_default_str();
  cmd->add_flag("--bias-correction", f->bias_correction, "Adam-style bias correction of the server step (Flower's; the paper has none)");
  cmd->add_flag("--secagg", o.secagg, "secure aggregation (SecAgg+): the server sees only the sum");
  cmd->add_option("--secagg-dropout", o.secagg_dropout, "fraction of each round's clients lost after masking")
      ->check(CLI::Range(0.0, 0.99));
  auto* dp_clip = cmd->add_option("--dp-clip", o.dp_clip, "DP-FedAvg: clip each update to this L2 norm");
  auto* dp_noise = cmd->add_option("--dp-noise", o.dp_noise, "DP-FedAvg: noise multiplier z");
  cmd->add_option("--dp-delta", o.dp_delta, "DP-FedAvg: delta of the reported epsilon")
      ->capture_default_str()->needs(dp_clip)->needs(dp_noise)->check(open_unit_interval);
  cmd->add_flag("--dp-adaptive", o.dp_adaptive, "DP-FedAvg: adapt the clipping bound to the median update norm")
      ->needs(dp_clip)->needs(dp_noise);
  dp_clip->needs(dp_noise)->check(positive_number);
  dp_noise->needs(dp_clip)->check(positive_number);
  cmd->add_option("--compress", o.compress, "topk:F (with error feedback) or qsgd:L");
  cmd->add_option("--async", o.async,
                  "fedbuff:K: buffered asynchronous aggregation, a server update every K arrivals (--per-round clients in flight; "
                  "works with --dropout, robust rules, fixed-bound DP and --checkpoint)");
  cmd->add_option("--latency", o.latency, "clients' simulated speed: lognormal:SIGMA or exponential:MEAN (a factor per client)")
      ->capture_default_str();
  cmd->add_option("--attack", o.attack, "malicious clients (fraction P): sign-flip:P, scale:P:X, label-flip:P or backdoor:P:T");
  auto* verify_norm = cmd->add_option("--verify-norm", o.verify_norm,
                  "every client proves in zero knowledge (Bulletproofs on ristretto255, RoFL) that its update's L2 norm "
                  "is at most B; the server drops the clients whose proof fails and reports them")
      ->check(positive_number);
  cmd->add_option("--verify-bits", o.verify_bits, "with --verify-norm: bits per quantized coordinate (8, 16 or 32)")
      ->capture_default_str()->check(CLI::IsMember({8, 16, 32}))->needs(verify_norm);
  add_tee_options(cmd, o);
  auto* checkpoint = cmd->add_option("--checkpoint", o.checkpoint,
                  "save the simulation in this directory after every evaluated round; resume from it when it holds one");
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "with --checkpoint: save every N rounds instead")
      ->check(CLI::Range(0, 1'000'000'000))->needs(checkpoint);
  cmd->add_option("--dropout", o.dropout, "probability that a sampled client fails in a round (with --async: per dispatch; its slot is refilled)")
      ->capture_default_str();
  cmd->add_option("--deadline", o.deadline, "simulated seconds a round waits for updates (0: no deadline)")->capture_default_str();
  cmd->add_option("--over-select", o.over_select, "sample this fraction more clients, keep the first --per-round to finish")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of every random choice")->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "evaluate every N rounds (and after the last)")->capture_default_str();
  cmd->add_flag("--eval-clients", o.eval_clients,
                "hold out 20% of each client's shard (seeded, never trained on) and report the mean, std, worst 10% and "
                "best 10% of the clients' accuracies at every evaluation (client_accuracy_*)");
  cmd->add_option("--threads", o.threads, "worker threads (0: one per core)")->capture_default_str()->check(CLI::Range(0, 256));
  cmd->add_option("--data-dir", o.data_dir, "where the Fashion-MNIST files are (default: their Debian location)");
  cmd->add_option("--data", o.data,
                  "your own data instead of Fashion-MNIST: npz:FILE (x_train, y_train, x_test, y_test, optional "
                  "client_train: the clients' own partition) or idx:DIR (MNIST-style IDX files)");
  cmd->add_option("--finetune-from", o.finetune_from,
                  "start from a saved model: a --checkpoint directory of an earlier run (same --model) or a `troupe train --save` file");
  cmd->add_option("--shift", o.shift, "shift the training and test images: rot90 (square images) or brightness:C (pixels times C, clipped)");
  cmd->add_option("--lora", o.lora,
                  "train LoRA adapters of rank R on every linear layer instead of the whole model (needs --finetune-from); "
                  "R1,R2,... gives client c rank R[c % n]");
  cmd->add_option("--lora-agg", o.lora_agg, "how the server combines the adapters: fedit, fedex, flexlora or hetlora")
      ->capture_default_str();
  cmd->add_option("--lora-alpha", o.lora_alpha, "LoRA's alpha: the change is (alpha / rank) B A (0: alpha = rank)")
      ->capture_default_str();
  auto* contribution = cmd->add_option("--contribution", o.contribution,
                  "value each round's clients by their Shapley values on held-out validation accuracy: exact (K <= 12), "
                  "mc:P (P random permutations) or gtg:EPS (GTG-Shapley)");
  cmd->add_option("--validation", o.validation,
                  "with --contribution: the last N training examples, held out of every client's shard, measure the utility")
      ->capture_default_str()->needs(contribution);
  cmd->add_option("--coalition-model", o.coalition_model,
                  "with --contribution: a coalition's model adds the weighted mean of its updates (mean) or its share "
                  "of the round's FedAvg sum (share: a client sending no change is worth exactly 0)")
      ->capture_default_str()->needs(contribution)->check(CLI::IsMember({"mean", "share"}));
  cmd->add_option("--contributions", o.contributions_file,
                  "with --contribution: write each client's cumulative Shapley value and reward to this CSV file");
  cmd->add_option("--reward-budget", o.reward_budget,
                  "with --contribution: pay B per round, a floor of min(FLOOR_FRACTION*B, B/n) to each participant and "
                  "the rest in proportion to the positive part of its Shapley value (B[:FLOOR_FRACTION], micro-units)");
  cmd->add_option("--drift", o.drift,
                  "concept drift: swap:ROUND:FRACTION:A-B (from round ROUND, a seeded FRACTION of the clients swap labels A and B)");
  cmd->add_option("--drift-detect", o.drift_detect,
                  "a drift detector per client on its stream of local errors: ddm or adwin (alarms are reported)");
  cmd->add_option("--drift-response", o.drift_response,
                  "what an alarm does: reset (the client's detector and optimizer/algorithm state) or cluster (a second "
                  "model, FedAvg among the alarmed clients)");
  cmd->add_option("--unlearn", o.unlearn,
                  "remove these clients' contribution after round --unlearn-at: attackers (those --attack makes malicious) or ID,ID,...");
  cmd->add_option("--unlearn-at", o.unlearn_at, "with --unlearn: the round after which the clients are removed")
      ->check(CLI::Range(1, 1000000000));
  cmd->add_option("--unlearn-method", o.unlearn_method,
                  "with --unlearn: retrain (from round 1 without them), pga[:K] (projected gradient ascent, then K FedAvg rounds) "
                  "or calibrate[:DT] (FedEraser over the updates stored every DT rounds)")
      ->capture_default_str();
  cmd->add_option("--continual", o.continual,
                  "continual learning: permuted:T (T tasks, each a fixed seeded permutation of the pixels) or split:T "
                  "(class-incremental: the classes in T groups), one after another; the summary reports ACC and BWT");
  cmd->add_option("--cl", o.cl,
                  "with --continual: none, ewc:LAMBDA (EWC's Fisher penalty, FedCurv's federated form) or gpm:THRESHOLD "
                  "(gradient projection memory with that energy threshold)");
  cmd->add_option("--task-rounds", o.task_rounds, "with --continual: rounds per task (default: --rounds / T)");
  cmd->add_option("--trainer", o.trainer, "mlp, or noop to measure the orchestration alone")->capture_default_str();
  auto* vertical = cmd->add_option("--vertical", f->vertical.parties,
                  "2: vertical federated learning: two parties hold each image's left and right columns for their own, "
                  "partly overlapping ID sets, aligned by private set intersection, and train a split MLP (SplitNN; "
                  "--rounds counts epochs)")
      ->check(CLI::IsMember({2}));
  cmd->add_option("--vertical-overlap", f->vertical.overlap, "with --vertical: fraction of the training examples in each party's ID set")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0))->needs(vertical);
  cmd->add_option("--cut-noise", f->vertical.cut_noise,
                  "with --vertical: Gaussian noise (this standard deviation) on the cut-layer gradients the label party sends")
      ->check(CLI::NonNegativeNumber)->needs(vertical);
  cmd->add_option("--leakage-class", f->vertical.leakage_class,
                  "with --vertical: the class whose one-vs-rest label the norm attack's AUC is reported for "
                  "(default: 6, shirts, or the last class of data with fewer)")
      ->check(CLI::NonNegativeNumber)->needs(vertical);
  cmd->add_option("--split", f->split,
                  "horizontal: SplitFed: each of --clients clients holds the MLP's first layer and a shard, the server the "
                  "rest; the clients' bottoms are averaged (FedAvg) after every round")
      ->check(CLI::IsMember({"horizontal"}));
  auto* decentralized = cmd->add_option("--decentralized", f->decentralized,
                  "no server: gossip (local training, then random pairwise averaging), dpsgd (D-PSGD: one SGD step and one "
                  "Metropolis averaging with the neighbours per iteration) or allreduce (local training, then the exact mean "
                  "by a ring all-reduce between the client actors)")
      ->check(CLI::IsMember({"gossip", "dpsgd", "allreduce"}));
  cmd->add_option("--topology", f->topology, "with --decentralized gossip|dpsgd: ring, torus, random-regular:D or complete")
      ->capture_default_str()->needs(decentralized);
  auto* graph = cmd->add_option("--graph", f->graph.graph,
                  "knn:K: federated graph learning: the train and test images are the nodes of their K-nearest-neighbour "
                  "graph (cosine after PCA to 50), the test nodes unlabelled; FedGCN's exchange, then FedAvg of SGC "
                  "(softmax(A^2 X W))");
  cmd->add_option("--graph-hops", f->graph.hops,
                  "with --graph: propagations FedGCN exchanges across clients (2: exact A^2 X; 1: exact A X, the second "
                  "inside each client; 0: the edges between clients dropped; at most --graph-depth)")
      ->capture_default_str()->check(CLI::Range(0, 8))->needs(graph);
  cmd->add_option("--graph-depth", f->graph.depth,
                  "with --graph: SGC's propagations K, softmax(A^K X W) (0: the same linear model without the graph)")
      ->capture_default_str()->check(CLI::Range(0, 8))->needs(graph);
  cmd->add_option("--graph-beta", f->graph.beta, "with --graph: nodes go to clients by Dirichlet(B) over their labels")
      ->capture_default_str()->check(positive_number)->needs(graph);
  cmd->add_option("--graph-labelled", f->graph.labelled,
                  "with --graph: training nodes whose labels train (a seeded choice; the rest are unlabelled nodes)")
      ->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32))->needs(graph);
  cmd->add_flag("--json", f->json, "one JSON object per evaluated round and a final summary");
  cmd->add_option("--report", f->report, "also write a self-contained HTML report (charts per round) to this file");
  add_dashboard_options(cmd, f->dashboard, false);
  cmd->callback([f, cmd, &rc] {
    auto fail = [&](const std::string& why) {
      std::fprintf(stderr, "troupe fedsim: %s\n", why.c_str());
      rc = 1;
    };
    // A server option the strategy does not read is a mistake, not a no-op.
    {
      const std::string base = f->o.strategy.substr(0, f->o.strategy.find(':'));
      const bool adaptive = base == "fedadam" || base == "fedyogi" || base == "fedadagrad";
      const std::string adaptive_readers = "fedadam, fedyogi and fedadagrad read it";
      const struct {
        const char* flag;
        bool read;
        std::string readers;
      } options[] = {{"--server-momentum", base == "fedavgm", "only fedavgm has a server momentum"},
                     {"--beta1", adaptive, adaptive_readers},
                     {"--tau", adaptive, adaptive_readers},
                     {"--bias-correction", adaptive, adaptive_readers},
                     {"--beta2", base == "fedadam" || base == "fedyogi", "fedadam and fedyogi read it"}};
      for (const auto& x : options)
        if (cmd->count(x.flag) > 0 && !x.read) {
          fail(std::string(x.flag) + " is not read by --strategy " + f->o.strategy + " (" + x.readers + ")");
          return;
        }
    }
    f->o.server.bias_correction = f->bias_correction;
    if (!f->o.drift.empty() || !f->o.drift_detect.empty() || !f->o.drift_response.empty()) {
      const char* other = !f->o.client_models.empty() ? "--client-models" : !f->split.empty() ? "--split" : f->vertical.parties > 0 ? "--vertical" : !f->decentralized.empty() ? "--decentralized" : nullptr;
      if (other) {
        fail(std::string("--drift, --drift-detect and --drift-response run in the horizontal simulation; they cannot combine with ") + other);
        return;
      }
    }
    if (!f->o.unlearn.empty() || cmd->count("--unlearn-at") > 0 || cmd->count("--unlearn-method") > 0) {
      const char* other = !f->o.client_models.empty() ? "--client-models" : !f->split.empty() ? "--split" : f->vertical.parties > 0 ? "--vertical" : !f->decentralized.empty() ? "--decentralized" : !f->graph.graph.empty() ? "--graph" : nullptr;
      if (other) {
        fail(std::string("--unlearn, --unlearn-at and --unlearn-method run in the horizontal simulation; they cannot combine with ") + other);
        return;
      }
    }
    if (!f->o.continual.empty() && !f->o.client_models.empty()) {
      fail("--continual cannot combine with --client-models (the tasks are trained by clients of one model)");
      return;
    }
    if (!f->o.continual.empty() && !f->graph.graph.empty()) {
      fail("--continual cannot combine with --graph (the graph's nodes are the images of one task)");
      return;
    }
    if (!f->report.empty()) {
      if (f->vertical.parties > 0 || !f->split.empty() || !f->decentralized.empty()) {
        fail("--report draws the rounds of a federated run with a server; --vertical, --split and --decentralized have none yet");
        return;
      }
      try {
        troupe::check_report_path(f->report);
      } catch (const std::exception& e) {
        fail(e.what());
        return;
      }
    }
    if (!f->dashboard.where.empty()) {
      const char* other = f->vertical.parties > 0 ? "--vertical" : !f->graph.graph.empty() ? "--graph" : !f->split.empty() ? "--split" : !f->decentralized.empty() ? "--decentralized" : !f->o.client_models.empty() ? "--client-models" : nullptr;
      if (other) {
        fail(std::string("--dashboard follows the rounds of a federated run with one server model; it cannot combine with ") + other);
        return;
      }
    }
    if (!f->o.tee.empty()) {
      quiet_info_logs();  // the enclave's node joining and leaving is not the run's output
      const char* other = f->vertical.parties > 0 ? "--vertical" : !f->graph.graph.empty() ? "--graph" : !f->split.empty() ? "--split" : !f->decentralized.empty() ? "--decentralized" : !f->o.client_models.empty() ? "--client-models" : nullptr;
      if (other) {
        fail(std::string("--tee puts the server's aggregation in an enclave; it cannot combine with ") + other);
        return;
      }
    }
    if (!f->graph.graph.empty()) {
      if (auto why = graph_conflict(*cmd); !why.empty()) {
        fail(why);
        return;
      }
      try {
        rc = run_fedsim_graph(f->o, f->graph, f->json);
      } catch (const std::bad_alloc&) {
        fail("out of memory (the graph or its features are too large for this machine)");
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    if (!f->decentralized.empty()) {
      if (auto why = decentralized_conflict(*cmd, f->decentralized); !why.empty()) {
        fail(why);
        return;
      }
      try {
        rc = run_fedsim_decentralized(f->o, f->topology, f->decentralized, f->json);
      } catch (const std::bad_alloc&) {
        fail("out of memory (the clients' models are too large for this machine)");
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    if (!f->o.client_models.empty()) {
      if (!f->o.contribution.empty()) {
        fail("--contribution cannot combine with --client-models (the clients' updates belong to different models)");
        return;
      }
      if (f->o.verify_norm > 0) {
        fail("--verify-norm cannot combine with --client-models (the proofs are wired to one model's updates)");
        return;
      }
      if (f->vertical.parties > 0 || !f->split.empty()) {
        fail("--client-models cannot combine with --vertical or --split (those split one model between parties)");
        return;
      }
      try {
        rc = run_fedsim_heterogeneous(f->o, f->json, f->report);
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    const bool tty = isatty(STDERR_FILENO);
    const bool json = f->json;
    if (!f->split.empty()) {
      if (auto why = splitfed_conflict(*cmd); !why.empty()) {
        fail(why);
        return;
      }
      try {
        rc = run_fedsim_splitfed(f->o, json);
      } catch (const std::bad_alloc&) {
        fail("out of memory (the model or the data are too large for this machine)");
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    if (f->vertical.parties > 0) {
      if (auto why = vertical_conflict(*cmd); !why.empty()) {
        fail(why);
        return;
      }
      try {
        rc = run_fedsim_vertical(f->o, f->vertical, json);
      } catch (const std::bad_alloc&) {
        fail("out of memory (the model or the data are too large for this machine)");
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    try {
      auto board = open_dashboard(f->dashboard, run_dashboard_token(f->dashboard), "troupe fedsim");
      if (board) {
        std::vector<std::pair<std::string, std::string>> options;
        for (auto& row : fedsim_option_rows(f->o)) options.emplace_back(row[0], row[1]);
        board->set_run("troupe fedsim", std::move(options));
      }
      troupe::chart_book charts;
      int empty_rounds = 0;  // rounds in which no update arrived (all late or failed)
      std::size_t alarms_since_eval = 0;  // drift alarms in the rounds since the last evaluated one
      // --verify-norm: the per-client means of the rounds with proofs, summed (averaged at the end).
      double proof_rounds = 0, proof_bytes = 0, prove_ms = 0, verify_ms = 0;
      auto s = troupe::federated::run_simulation(f->o, [&](const troupe::federated::progress& p) {
        const int r = p.round->round;
        if (board) show_round(*board, p);
        if (p.round->aborted.empty() && p.round->sampled > 0 && p.round->participants == 0) ++empty_rounds;
        if (!p.round->aborted.empty()) {
          if (tty) std::fprintf(stderr, "\r\033[K");
          std::fprintf(stderr, "troupe fedsim: round %d aborted, the model unchanged: %s\n", r, p.round->aborted.c_str());
        }
        if (!p.round->drift_alarms.empty() && !json) {
          if (tty) std::fprintf(stderr, "\r\033[K");
          std::string who;
          for (auto c : p.round->drift_alarms) who += (who.empty() ? "" : ", ") + std::to_string(c);
          std::fprintf(stderr, "troupe fedsim: round %d: drift alarm from client%s %s\n", r,
                       p.round->drift_alarms.size() > 1 ? "s" : "", who.c_str());
        }
        alarms_since_eval += p.round->drift_alarms.size();
        if (!p.round->rejected.empty()) {
          if (tty) std::fprintf(stderr, "\r\033[K");
          std::string who;
          for (auto c : p.round->rejected) who += (who.empty() ? "" : ", ") + std::to_string(c);
          if (!json)
            std::fprintf(stderr, "troupe fedsim: round %d: dropped client%s %s (norm proof failed)\n", r,
                         p.round->rejected.size() > 1 ? "s" : "", who.c_str());
        }
        for (const auto& [name, value] : p.round->metrics) {
          if (name == "proof_bytes") proof_rounds += 1, proof_bytes += value;
          if (name == "prove_ms") prove_ms += value;
          if (name == "verify_ms") verify_ms += value;
        }
        if (p.evaluated) {
          if (tty) std::fprintf(stderr, "\r\033[K");
          if (!f->report.empty()) {
            charts.add("test accuracy per round", "test accuracy", r, p.eval.accuracy, "round", "accuracy");
            charts.add("loss per round", "test loss", r, p.eval.loss, "round", "loss");
            if (p.round->participants > 0) charts.add("loss per round", "train loss", r, p.round->train_loss, "round", "loss");
            charts.add("uplink per round", "MB sent by the clients so far", r, static_cast<double>(p.uplink_bytes) / 1e6, "round", "MB");
            for (const auto& [name, value] : p.round->metrics) charts.add(name + " per round", name, r, value, "round", name);
            for (const auto& [name, value] : p.eval.metrics) charts.add(name + " per round", name, r, value, "round", name);
          }
          std::string extra;
          // The counts, when some sampled client failed or was late (JSON: only then, so that the
          // usual line keeps its fields).
          if (json && p.round->dropped + p.round->late > 0)
            extra += ",\"updates\":" + std::to_string(p.round->participants) + ",\"sampled\":" +
                     std::to_string(p.round->sampled) + ",\"failed\":" + std::to_string(p.round->dropped) +
                     ",\"late\":" + std::to_string(p.round->late);
          else if (!json && p.round->sampled != p.round->participants)
            extra += "  " + std::to_string(p.round->participants) + "/" + std::to_string(p.round->sampled) + " updates (" +
                     std::to_string(p.round->dropped) + " failed, " + std::to_string(p.round->late) + " late)";
          if (!f->o.tee.empty()) extra += json ? tee_json(f->o) : "  tee " + std::string(f->o.tee == "sim" ? "simulated" : "swtpm");
          if (json && !f->o.drift_detect.empty()) extra += ",\"round_drift_alarms\":" + std::to_string(alarms_since_eval);
          alarms_since_eval = 0;
          auto metrics = p.round->metrics;
          metrics.insert(metrics.end(), p.eval.metrics.begin(), p.eval.metrics.end());
          for (const auto& [name, value] : metrics) {
            if (json) {
              extra += ",\"" + name + "\":" + json_number(value, "%.6g");
            } else {
              char buf[96];
              std::snprintf(buf, sizeof buf, "  %s %.4g", name.c_str(), value);
              extra += buf;
            }
          }
          if (json)
            std::printf("{\"round\":%d,\"test_accuracy\":%s,\"test_loss\":%s,\"seconds\":%.3f,\"simulated_seconds\":%.3f,"
                        "\"uplink_bytes\":%llu%s}\n",
                        r, json_number(p.eval.accuracy, "%.4f").c_str(), json_number(p.eval.loss, "%.4f").c_str(),
                        p.seconds, p.simulated_seconds, static_cast<unsigned long long>(p.uplink_bytes), extra.c_str());
          else
            std::printf("round %d/%d  test accuracy %s  test loss %s  train loss %s  %.1f rounds/s  %.1f s  simulated %.1f s%s\n",
                        r, p.rounds, text_number(p.eval.accuracy).c_str(), text_number(p.eval.loss).c_str(),
                        text_number(p.round->participants > 0 ? p.round->train_loss : std::nan("")).c_str(), p.rounds_per_s,
                        p.seconds, p.simulated_seconds, extra.c_str());
          std::fflush(stdout);
        }
        if (tty && r < p.rounds) {
          const int width = 30, done = static_cast<int>(static_cast<long long>(width) * r / p.rounds);
          std::fprintf(stderr, "\r\033[Kround %d/%d [%.*s%*s] train loss %.4f  %.1f rounds/s", r, p.rounds, done,
                       "==============================", width - done, "", p.round->train_loss, p.rounds_per_s);
          std::fflush(stderr);
        }
      });
      if (tty) std::fprintf(stderr, "\r\033[K");
      if (empty_rounds > 0)
        std::fprintf(stderr,
                     "troupe fedsim: warning: in %d of %d rounds no update arrived (every sampled client was late or "
                     "failed), so the model did not change in them; see --deadline and --dropout\n",
                     empty_rounds, s.rounds - s.resumed_from);
      if (s.resumed_from > 0) std::fprintf(stderr, "troupe fedsim: resumed from the checkpoint of round %d\n", s.resumed_from);
      // The uplink: total bytes the clients sent in the rounds this run ran, and per round.
      const int ran = s.rounds - s.resumed_from;
      const double per_round = ran > 0 ? static_cast<double>(s.uplink_bytes) / ran : 0.0;
      std::string settings;  // the fine-tuning settings, when given (validated spellings: no escaping needed)
      if (!f->o.shift.empty()) settings += ",\"shift\":\"" + f->o.shift + "\"";
      if (!f->o.finetune_from.empty()) settings += ",\"finetuned\":true";
      // The last evaluation's further measures (backdoor_success, client_accuracy_*...).
      std::string finals, finals_text;
      for (const auto& [name, value] : s.final_metrics) {
        finals += ",\"" + name + "\":" + json_number(value, "%.6g");
        char buf[96];
        std::snprintf(buf, sizeof buf, ", %s %.4g", name.c_str(), value);
        finals_text += buf;
      }
      settings += drift_json(f->o, s);
      settings += continual_json(f->o, s);
      if (f->o.verify_norm > 0) {
        std::string who = ",\"rejected_clients\":[";
        std::size_t rejected = 0;
        for (std::size_t i = 0; i < s.rejected_clients.size(); ++i) {
          const auto& [round, clients] = s.rejected_clients[i];
          who += (i ? ",{\"round\":" : "{\"round\":") + std::to_string(round) + ",\"clients\":[";
          for (std::size_t j = 0; j < clients.size(); ++j) who += (j ? "," : "") + std::to_string(clients[j]);
          who += "]}";
          rejected += clients.size();
        }
        const double n = std::max(1.0, proof_rounds);
        settings += who + "],\"rejected_count\":" + std::to_string(rejected) + ",\"verify_norm\":" +
                    json_number(f->o.verify_norm, "%.6g") + ",\"verify_bits\":" + std::to_string(f->o.verify_bits) +
                    ",\"proof_bytes\":" + json_number(proof_bytes / n, "%.0f") + ",\"prove_ms\":" +
                    json_number(prove_ms / n, "%.3f") + ",\"verify_ms\":" + json_number(verify_ms / n, "%.3f");
        char buf[200];
        std::snprintf(buf, sizeof buf, ", norm proofs: %zu updates rejected, %.0f bytes, prove %.1f ms, verify %.1f ms per client",
                      rejected, proof_bytes / n, prove_ms / n, verify_ms / n);
        finals_text += buf;
      }
      if (!f->o.tee.empty())
        finals_text += f->o.tee == "sim" ? ", tee simulated (aggregated in a simulated enclave, test root)"
                                         : ", tee swtpm (aggregated in a process measured by a software TPM, test root)";
      if (!f->o.lora.empty())
        settings += ",\"lora\":\"" + f->o.lora + "\",\"lora_agg\":\"" + f->o.lora_agg + "\",\"lora_alpha\":" +
                    json_number(f->o.lora_alpha, "%.6g");
      settings += tee_json(f->o);
      std::string valued;  // --contribution's figures (the spec is validated: no escaping needed)
      if (!f->o.contribution.empty()) {
        const double rounds_valued = static_cast<double>(std::max<std::size_t>(1, s.contribution_rounds));
        settings += ",\"contribution\":\"" + f->o.contribution + "\",\"coalition_model\":\"" + f->o.coalition_model +
                    "\",\"validation\":" + std::to_string(f->o.validation) +
                    ",\"contribution_rounds\":" + std::to_string(s.contribution_rounds) +
                    ",\"contribution_rounds_skipped\":" + std::to_string(s.contribution_rounds_skipped) +
                    ",\"contribution_seconds_per_round\":" + json_number(s.contribution_seconds / rounds_valued, "%.4g") +
                    ",\"contribution_evaluations_per_round\":" +
                    json_number(static_cast<double>(s.contribution_evaluations) / rounds_valued, "%.4g");
        char buf[160];
        std::snprintf(buf, sizeof buf, "values of %zu rounds by %s, %.3f s and %.1f evaluations per round",
                      s.contribution_rounds, f->o.contribution.c_str(), s.contribution_seconds / rounds_valued,
                      static_cast<double>(s.contribution_evaluations) / rounds_valued);
        valued = buf;
        if (std::isfinite(s.contribution_auc)) {
          settings += ",\"contribution_auc\":" + json_number(s.contribution_auc, "%.4f") + ",\"value_mean_honest\":" +
                      json_number(s.value_mean_honest, "%.6g") + ",\"value_mean_malicious\":" +
                      json_number(s.value_mean_malicious, "%.6g");
          std::snprintf(buf, sizeof buf, ", AUC honest vs malicious %.4f (mean value %.4g vs %.4g)", s.contribution_auc,
                        s.value_mean_honest, s.value_mean_malicious);
          valued += buf;
        }
        if (!f->o.reward_budget.empty()) {
          settings += ",\"reward_budget\":\"" + f->o.reward_budget + "\",\"rewards_total\":" + json_number(s.rewards_total, "%.6f");
          std::snprintf(buf, sizeof buf, ", rewards paid %.6f", s.rewards_total);
          valued += buf;
        }
      }
      if (json)
        std::printf("{\"final_accuracy\":%s,\"rounds_per_s\":%.2f,\"peak_rss_mb\":%.1f,\"rounds\":%d,\"seconds\":%.2f,"
                    "\"final_loss\":%s,\"model_crc32\":\"%08x\",\"resumed_from\":%d,\"state_bytes_per_client\":%.0f,"
                    "\"uplink_bytes\":%llu,\"uplink_bytes_per_round\":%.0f%s%s}\n",
                    json_number(s.final_accuracy, "%.4f").c_str(), s.rounds_per_s, s.peak_rss_mb, s.rounds, s.seconds,
                    json_number(s.final_loss, "%.9g").c_str(),
                    static_cast<unsigned>(s.model_crc32), s.resumed_from, s.state_bytes_per_client,
                    static_cast<unsigned long long>(s.uplink_bytes), per_round, finals.c_str(), settings.c_str());
      else
        std::printf("final test accuracy %s after %d rounds, %.1f rounds/s, peak memory %.0f MB, %.1f s, model CRC-32 %08x, "
                    "uplink %.2f MB%s\n",
                    text_number(s.final_accuracy).c_str(), s.rounds, s.rounds_per_s, s.peak_rss_mb, s.seconds,
                    static_cast<unsigned>(s.model_crc32), static_cast<double>(s.uplink_bytes) / 1e6, finals_text.c_str());
      if (!f->report.empty()) {
        char crc[16];
        std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(s.model_crc32));
        write_run_report(f->report, "troupe fedsim", fedsim_option_rows(f->o),
                         {{"final test accuracy", troupe::report_number(s.final_accuracy)},
                          {"final test loss", troupe::report_number(s.final_loss)},
                          {"rounds", std::to_string(s.rounds)},
                          {"rounds per second", troupe::report_number(s.rounds_per_s)},
                          {"wall time (s)", troupe::report_number(s.seconds)},
                          {"peak memory (MB)", troupe::report_number(s.peak_rss_mb)},
                          {"uplink (MB)", troupe::report_number(static_cast<double>(s.uplink_bytes) / 1e6)},
                          {"model CRC-32", crc}},
                         charts);
      }
      if (!json && !valued.empty()) std::printf("contributions: %s\n", valued.c_str());
      if (!json && !s.task_accuracy_final.empty()) {
        std::string per_task;
        for (std::size_t t = 0; t < s.task_accuracy_final.size(); ++t) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%s%.4f->%.4f", t ? ", " : "", s.task_accuracy_after[t], s.task_accuracy_final[t]);
          per_task += buf;
        }
        std::printf("continual %s, --cl %s: ACC %.4f, BWT %+.4f (each task right after its training -> at the end: %s), "
                    "consolidation %.2f MB\n",
                    f->o.continual.c_str(), f->o.cl.empty() ? "none" : f->o.cl.c_str(), s.acc, s.bwt, per_task.c_str(),
                    static_cast<double>(s.consolidation_bytes) / 1e6);
      }
      rc = 0;
    } catch (const std::bad_alloc&) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      fail("out of memory (the model, the clients or their state are too large for this machine)");
    } catch (const std::exception& e) {
      if (tty) std::fprintf(stderr, "\r\033[K");
      fail(e.what());
    }
  });
}

}  // namespace troupe::cli
