// Continual learning in the engine: the options' checks, the task of each round, and the
// consolidation at each task's end (EWC's Fisher diagonal, GPM's bases) from the clients of the
// task's last round.
//
// The consolidation is the clients' work and the server's: each client of the round computes its
// message from its own shard at the global model (fisher_sum; layer_inputs then gpm_summarize)
// and the server combines them (a sum divided by the examples; gpm_merge). The simulation runs the
// clients' part on the server's thread with one trainer, client after client: it is a few forward
// and backward passes per client, once per task. The messages' bytes are counted as uplink.

#include <stdexcept>
#include <string>

#include "continual_trainer.hpp"
#include "engine.hpp"
#include "troupe/federated/fedgen.hpp"

namespace troupe::federated::detail {

void check_continual_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (o.continual.empty()) {
    if (!o.cl.empty()) fail("--cl " + o.cl + " keeps earlier tasks: give the tasks with --continual permuted:T or split:T");
    if (o.task_rounds != 0) fail("--task-rounds is read with --continual");
    return;
  }
  const continual_tasks t = parse_continual(o.continual);
  const continual_method m = parse_cl(o.cl);
  const std::string flag = "--continual " + o.continual;
  if (o.task_rounds < 0) fail("--task-rounds must be at least 1");
  if (o.task_rounds == 0 && o.rounds % t.tasks != 0)
    fail(flag + ": --rounds " + std::to_string(o.rounds) + " does not split into " + std::to_string(t.tasks) +
         " tasks; give a multiple of " + std::to_string(t.tasks) + " or --task-rounds");
  const long long needed = static_cast<long long>(t.tasks) * (o.task_rounds > 0 ? o.task_rounds : o.rounds / t.tasks);
  if (needed < t.tasks) fail(flag + ": --rounds " + std::to_string(o.rounds) + " gives each task no round");
  if (needed > o.rounds)
    fail(flag + " --task-rounds " + std::to_string(o.task_rounds) + " needs " + std::to_string(needed) +
         " rounds; --rounds is " + std::to_string(o.rounds));
  if (o.trainer != "mlp") fail(flag + " needs --trainer mlp (the noop trainer has no data)");
  if (o.model.rfind("mlp:", 0) != 0)
    fail(flag + " trains an MLP (--model mlp:IN-H-...-OUT): GPM and EWC read its linear layers, not '" + o.model + "'");
  if (o.device != "cpu") fail(flag + " with --device " + o.device + ": its terms and projections are applied on the host; use --device cpu");
  if (!o.lora.empty()) fail(flag + " with --lora is not supported: the LoRA trainer has no tasks");
  if (!o.async.empty()) fail(flag + " with --async is not supported: the tasks and their consolidation follow synchronous rounds");
  if (!o.checkpoint.empty())
    fail(flag + " with --checkpoint is not supported: the consolidated tasks (Fisher diagonals, bases) are not saved");
  if (!o.drift.empty() || !o.drift_detect.empty())
    fail(flag + " with --drift or --drift-detect: both change the clients' data over rounds; run them apart");
  if (!o.attack.empty()) fail(flag + " with --attack is not supported: the attacks are not wired to the tasks");
  if (!o.unlearn.empty()) fail(flag + " with --unlearn is not supported: unlearning replays rounds without the tasks' consolidation");
  if (o.verify_norm != 0) fail(flag + " with --verify-norm is not supported yet: the proofs are not checked across the tasks' consolidation");
  if (!o.contribution.empty())
    fail(flag + " with --contribution is not supported: the validation examples are not split into tasks");
  if (o.eval_clients) fail(flag + " with --eval-clients is not supported: the clients' held-out examples are not split into tasks");
  if (is_fedgen(o.strategy)) fail(flag + " with --strategy fedgen is not supported: the continual trainer has no generator term");
  if (m.type == continual_method::kind::gpm) {
    const std::string why = "--cl " + o.cl + " projects every SGD step off the earlier tasks' inputs";
    if (o.client_optimizer != "sgd")
      fail(why + ", and the projected change is the gradient's only for plain SGD: use --client-optimizer sgd");
    const std::string base = o.strategy.substr(0, o.strategy.find(':'));
    if (base != "fedavg" && base != "fedprox")
      fail(why + "; --strategy " + o.strategy + " changes the aggregate off that subspace: use fedavg or fedprox");
    if (o.dp_noise != 0 || o.dp_clip != 0 || o.dp_adaptive)
      fail(why + "; DP-FedAvg's noise is added to the aggregate and is not projected");
    if (!o.compress.empty()) fail(why + "; --compress " + o.compress + " would send a sparsified update that is not");
  }
}

int continual_task_rounds(const simulation_options& o) {
  if (o.continual.empty()) return 0;
  return o.task_rounds > 0 ? o.task_rounds : o.rounds / parse_continual(o.continual).tasks;
}

std::shared_ptr<continual_state> continual_state_of(local_trainer& t) {
  auto* c = dynamic_cast<continual_trainer*>(&t);
  return c ? c->state() : nullptr;
}

void continual_begin_round(continual_state& s, int round) { s.seen = s.task_of(round) + 1; }

std::uint64_t continual_end_round(continual_state& s, local_trainer& trainer, const partition& part,
                                  std::span<const std::uint64_t> clients, std::span<const float> global, int round) {
  const int task = s.task_of(round);
  if (round % s.task_rounds != 0 || task + 1 >= s.tasks.tasks || round / s.task_rounds != task + 1) return 0;
  auto* t = dynamic_cast<continual_trainer*>(&trainer);
  if (!t) throw std::logic_error("continual_end_round: the trainer is not the continual trainer");
  std::uint64_t bytes = 0;
  if (s.method.type == continual_method::kind::ewc) {
    // Each client sends n_k F_k and n_k; the server's F is their sum over sum n_k.
    std::vector<double> sum(global.size(), 0.0), mine;
    std::size_t n = 0;
    for (auto c : clients) {
      n += t->fisher_sum(part.shard(c), task, global, mine);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += mine[i];
      bytes += 4 * (static_cast<std::uint64_t>(global.size()) + 1);
    }
    if (n > 0) {
      std::vector<float> fisher(sum.size());
      for (std::size_t i = 0; i < sum.size(); ++i) fisher[i] = static_cast<float>(sum[i] / static_cast<double>(n));
      // Under plain SGD the clients apply the penalty as a proximal step (ewc_penalty::proximal),
      // stable for every lambda; the explicit step would diverge once lr lambda F >= 2.
      s.ewc.add_task(std::move(fisher), std::vector<float>(global.begin(), global.end()));
    }
  } else if (s.method.type == continual_method::kind::gpm) {
    const auto& sizes = t->layer_sizes();
    if (s.bases.empty()) {
      s.bases.resize(sizes.size());
      s.bases_f.resize(sizes.size());
      for (std::size_t l = 0; l < sizes.size(); ++l) s.bases[l].rows = sizes[l].first + 1;
    }
    std::vector<std::vector<gpm_summary>> summaries(sizes.size());
    for (auto c : clients) {
      splitmix64 g{derive_seed(s.seed, (static_cast<std::uint64_t>(round) << 32) | (c & 0xffffffffu))};
      std::size_t rows = 0;
      const auto inputs = t->layer_inputs(part.shard(c), task, global, gpm_examples_per_client, g, rows);
      if (rows == 0) continue;
      for (std::size_t l = 0; l < sizes.size(); ++l) {
        summaries[l].push_back(gpm_summarize(inputs[l], rows, s.bases[l]));
        bytes += summaries[l].back().wire_bytes();
      }
    }
    for (std::size_t l = 0; l < sizes.size(); ++l) {
      (void)gpm_merge(s.bases[l], summaries[l], s.method.threshold);
      s.bases_f[l].assign(s.bases[l].m.begin(), s.bases[l].m.end());
    }
  }
  s.uplink_bytes += bytes;
  return bytes;
}

}  // namespace troupe::federated::detail
