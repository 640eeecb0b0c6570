// --contribution in the simulation: the options it refuses, the validation examples held out of
// every client's shard, the tracker that values each round, and the figures of a run's summary.

#include <cmath>
#include <limits>

#include "engine.hpp"
#include "spec.hpp"
#include "troupe/federated/contribution.hpp"
#include "troupe/federated/vertical.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated::detail {

void check_contribution_options(const simulation_options& o) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (o.contribution.empty()) {
    if (!o.contributions_file.empty()) fail("--contributions writes the values of --contribution: give --contribution too");
    if (!o.reward_budget.empty()) fail("--reward-budget pays from the Shapley values of --contribution: give --contribution too");
    return;
  }
  const std::string flag = "--contribution " + o.contribution;
  (void)parse_contribution(o.contribution);
  if (!o.reward_budget.empty()) (void)parse_reward_budget(o.reward_budget);
  if (o.coalition_model != "mean" && o.coalition_model != "share")
    fail("--coalition-model '" + o.coalition_model + "': use mean (the weighted mean of the coalition's updates) or share "
         "(its share of the round's FedAvg sum)");
  if (o.validation < 1) fail(flag + ": --validation must be at least 1 (the held-out examples the utility is measured on)");
  if (o.trainer != "mlp") fail(flag + " measures validation accuracy: use --trainer mlp (noop measures none)");
  if (o.secagg)
    fail(flag + " with --secagg: a coalition's model needs each client's update, and secure aggregation shows the "
                "server only the sum");
  if (parse_async(o.async) > 0) fail(flag + " with --async: FedBuff has no rounds whose participants form a game");
  if (o.dp_clip != 0 || o.dp_noise != 0)
    fail(flag + " with --dp-*: the values are computed from each client's unnoised update and published outside the "
                "privacy accounting");
  if (!o.lora.empty()) fail(flag + " with --lora: the updates are adapters, not deltas of the model");
  if (!o.client_models.empty()) fail(flag + " with --client-models: the clients' updates belong to different models");
  if (o.drift_response == "cluster")
    fail(flag + " with --drift-response cluster: the alarmed clients' updates go to a second model, outside the round's game");
  if (!o.checkpoint.empty())
    fail(flag + " with --checkpoint: the cumulative values are not saved in checkpoints, so a resumed run would lose "
                "them");
}

std::size_t hold_out_validation(const simulation_options& o, const shared_data& data) {
  if (o.contribution.empty()) return 0;
  if (!data) throw std::invalid_argument("--contribution needs data to hold validation examples out of");
  const auto n = static_cast<std::size_t>(data->train.size());
  if (o.validation >= n)
    throw std::invalid_argument("--validation " + std::to_string(o.validation) + " leaves no training examples of the " +
                                std::to_string(n) + "; hold out fewer");
  return n - o.validation;
}

std::unique_ptr<contribution_tracker> make_contribution_tracker(const engine_state& e, bool custom_trainer,
                                                                std::size_t first_row) {
  const auto& o = e.options;
  // The validation set: training rows [first_row, n), which no client's shard holds, as the
  // test set of a trainer of its own (the built-in one is made without the attack's poisoning,
  // which changes only what clients train on, and evaluates every row).
  auto held = std::make_shared<labelled_data>(*e.data);
  const auto n = static_cast<std::int64_t>(e.data->train.size()), first = static_cast<std::int64_t>(first_row);
  held->test.images = e.data->train.images.slice(first, n).clone();
  held->test.labels = e.data->train.labels.slice(first, n).clone();
  held->client_train = tensor{};
  simulation_options plain = o;
  plain.attack.clear();
  plain.test_limit = 0;
  trainer_factory factory = custom_trainer ? e.factory : make_trainer_factory(plain);
  std::shared_ptr<local_trainer> validator = factory(held);
  if (validator->dim() != e.dim) throw std::logic_error("--contribution: the validation trainer's model differs");
  std::unique_ptr<reward_budget> budget;
  if (!o.reward_budget.empty()) budget = std::make_unique<reward_budget>(parse_reward_budget(o.reward_budget));
  return std::make_unique<contribution_tracker>(
      parse_contribution(o.contribution), e.dim,
      [validator](std::span<const float> model) { return validator->evaluate(model).accuracy; },
      derive_seed(o.seed, stream_contribution), budget.get(), o.coalition_model == "share");
}

namespace {

/// The malicious fraction P of an --attack spec (its first number); 0 without an attack.
double attack_fraction(const std::string& spec) {
  if (spec.empty()) return 0;
  const auto parts = split_spec(spec);
  return parts.size() >= 2 ? spec_number(parts[1], "--attack '" + spec + "'") : 0.0;
}

}  // namespace

void summarize_contributions(const contribution_tracker& t, const simulation_options& o, summary& s) {
  s.contribution_rounds = t.rounds_valued();
  s.contribution_rounds_skipped = t.rounds_skipped();
  s.contribution_seconds = t.seconds();
  s.contribution_evaluations = t.evaluations();
  s.rewards_total = static_cast<double>(t.rewards_paid()) / static_cast<double>(micro_units);
  const double p = attack_fraction(o.attack);
  std::vector<double> scores;
  std::vector<std::uint8_t> honest;
  double sum[2] = {0, 0};
  std::size_t count[2] = {0, 0};
  for (const auto& c : t.totals()) {
    const bool bad = p > 0 && is_malicious(c.client, p, o.seed);
    scores.push_back(c.value);
    honest.push_back(bad ? 0 : 1);
    sum[bad] += c.value;
    ++count[bad];
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.value_mean_honest = count[0] ? sum[0] / static_cast<double>(count[0]) : nan;
  s.value_mean_malicious = count[1] ? sum[1] / static_cast<double>(count[1]) : nan;
  s.contribution_auc = count[0] && count[1] ? roc_auc(scores, honest) : nan;
}

bool is_attacker(const simulation_options& o, std::uint64_t client) {
  const double p = attack_fraction(o.attack);
  return p > 0 && is_malicious(client, p, o.seed);
}

}  // namespace troupe::federated::detail
