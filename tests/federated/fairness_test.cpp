#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <map>
#include <set>
#include <vector>

#include <troupe/federated/fairness.hpp>
#include <troupe/federated/partition.hpp>

#include "support.hpp"

namespace {

using namespace troupe::federated;
using test_support::expect_error;

partition sample_partition() {
  partition p;
  p.offsets = {0, 10, 13, 13, 50};  // 10, 3, 0 and 37 examples
  for (std::uint32_t i = 0; i < 50; ++i) p.indices.push_back(1000 + i);
  return p;
}

TEST(HoldOut, TakesAFifthOfEachShardSeededAndKeepsTheRestForTraining) {
  const partition original = sample_partition();
  partition train = original;
  const partition held = hold_out(train, 0.2, 42);
  ASSERT_EQ(held.clients(), 4u);
  ASSERT_EQ(train.clients(), 4u);
  const std::size_t want[] = {2, 0, 0, 7};  // floor(0.2 n)
  for (std::size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(held.shard(c).size(), want[c]) << c;
    EXPECT_EQ(train.shard(c).size() + held.shard(c).size(), original.shard(c).size()) << c;
    // Together the two are the client's shard, each example once.
    std::multiset<std::uint32_t> together(train.shard(c).begin(), train.shard(c).end());
    together.insert(held.shard(c).begin(), held.shard(c).end());
    EXPECT_EQ(together, std::multiset<std::uint32_t>(original.shard(c).begin(), original.shard(c).end())) << c;
  }
  // The same seed gives the same rows; another seed other ones.
  partition again = original, other = original;
  EXPECT_EQ(hold_out(again, 0.2, 42).indices, held.indices);
  EXPECT_NE(hold_out(other, 0.2, 43).indices, held.indices);
  partition bad = original;
  EXPECT_THROW(hold_out(bad, 1.0, 1), std::invalid_argument);
}

TEST(ClientAccuracies, SummarizeMeanSpreadAndTheWorstAndBestTenth) {
  std::vector<double> a;
  for (int i = 1; i <= 20; ++i) a.push_back(i / 20.0);
  a.push_back(std::nan(""));  // a client without held-out rows
  std::shuffle(a.begin(), a.end(), std::mt19937(3));
  const auto s = summarize_client_accuracies(a);
  EXPECT_EQ(s.clients, 20u);
  EXPECT_DOUBLE_EQ(s.mean, 0.525);
  // Population std of 1..20 is sqrt((20^2 - 1) / 12); divided by 20.
  EXPECT_NEAR(s.std, std::sqrt(399.0 / 12) / 20, 1e-12);
  EXPECT_DOUBLE_EQ(s.worst10, (0.05 + 0.10) / 2);  // ceil(20 / 10) = 2 clients
  EXPECT_DOUBLE_EQ(s.best10, (1.0 + 0.95) / 2);
  const auto one = summarize_client_accuracies(std::vector<double>{0.7});
  EXPECT_EQ(one.worst10, 0.7);
  EXPECT_EQ(one.std, 0.0);
  EXPECT_EQ(summarize_client_accuracies(std::vector<double>{}).clients, 0u);
}

/// q-FedAvg's server step, Algorithm 2 of Li et al. written out: Δw_k = L (w − w_k),
/// Δ_k = F_k^q Δw_k, h_k = q F_k^(q−1) ‖Δw_k‖² + L F_k^q, w ← w − Σ Δ_k / Σ h_k.
TEST(QFedAvg, StepsAsAlgorithmTwoOfThePaper) {
  const double lr = 0.05, l = 1 / lr;
  const std::size_t dim = 40;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0, 0.1f);
  std::vector<float> w(dim);
  for (float& x : w) x = normal(rng);
  for (double q : {0.5, 1.0, 5.0}) {
    const std::vector<double> losses{2.3, 0.4, 1.1};
    std::vector<std::vector<float>> trained(3, std::vector<float>(dim));
    for (auto& t : trained)
      for (std::size_t i = 0; i < dim; ++i) t[i] = w[i] + normal(rng);
    // The paper.
    std::vector<double> num(dim, 0.0);
    double den = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      const double f = static_cast<float>(losses[k]);  // the loss travels as a float
      double sq = 0;
      for (std::size_t i = 0; i < dim; ++i) {
        const double dw = l * (static_cast<double>(w[i]) - trained[k][i]);
        num[i] += std::pow(f, q) * dw;
        sq += dw * dw;
      }
      den += q * std::pow(f, q - 1) * sq + l * std::pow(f, q);
    }
    // The engine's path: the clients' deltas with F as the last float, weighted F^q, through
    // FedAvg's weighted mean, then the strategy.
    auto strategy = make_qfedavg(q, lr);
    auto mean = make_weighted_mean();
    round_info info;
    info.dim = dim + 1;
    mean->begin(info);
    for (std::size_t k = 0; k < 3; ++k) {
      std::vector<float> d(dim + 1);
      for (std::size_t i = 0; i < dim; ++i) d[i] = trained[k][i] - w[i];
      d[dim] = static_cast<float>(losses[k]);
      const double weight = std::pow(static_cast<double>(static_cast<float>(losses[k])), q);
      mean->add(k, weight, d);
      strategy->observe(k, weight, d);
    }
    std::vector<float> x = w;
    strategy->apply(x, mean->finish(), info);
    for (std::size_t i = 0; i < dim; ++i) EXPECT_NEAR(x[i], w[i] - num[i] / den, 1e-6) << "q=" << q << " i=" << i;
  }
}

simulation_options small() {
  simulation_options o;
  o.clients = 20;
  o.per_round = 5;
  o.rounds = 3;
  o.model = "mlp:784-16-10";
  o.partition = "dirichlet:0.5";
  o.threads = 2;
  o.test_limit = 500;
  o.seed = 11;
  return o;
}

/// FedAvg whose clients all weigh 1.
class uniform_fedavg final : public server_strategy {
public:
  std::string name() const override { return "fedavg-uniform"; }
  client_rule rule() const override { return {.uniform_weights = true}; }
  void apply(std::span<float> x, std::span<const float> delta, const round_info&) override {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += 1.0f * delta[i];
  }
};

TEST(QFedAvg, WithQZeroIsFedAvgWithUniformWeightsBitForBit) {
  auto o = small();
  o.strategy = "qfedavg:0";
  simulation q0(o, test_support::fashion());
  auto f = small();
  simulation fedavg(f, test_support::fashion());
  fedavg.set_strategy(std::make_unique<uniform_fedavg>());
  for (int r = 0; r < o.rounds; ++r) {
    q0.run_round();
    fedavg.run_round();
  }
  EXPECT_EQ(test_support::model_of(q0), test_support::model_of(fedavg));
  // And a q > 0 moves the model elsewhere (the loss weighting is real).
  o.strategy = "qfedavg:5";
  simulation q5(o, test_support::fashion());
  for (int r = 0; r < o.rounds; ++r) q5.run_round();
  EXPECT_NE(test_support::model_of(q5), test_support::model_of(fedavg));
}

TEST(QFedAvg, RefusesSpecsAndCombinationsThatCannotWork) {
  for (const char* bad : {"qfedavg", "qfedavg:-1", "qfedavg:x", "qfedavg:1:2", "qfedavg:101"})
    EXPECT_THROW(parse_qfedavg(bad), std::invalid_argument) << bad;
  strategy_options server;
  EXPECT_THROW(make_strategy("qfedavg:1", server), std::invalid_argument);  // no client learning rate
  server.client_lr = 0.05;
  EXPECT_EQ(make_strategy("qfedavg:1", server)->name(), "qfedavg");
  server.server_lr = 0.5;
  EXPECT_THROW(make_strategy("qfedavg:1", server), std::invalid_argument);
  auto o = small();
  o.strategy = "qfedavg:1";
  auto with = [&](auto change) {
    auto x = o;
    change(x);
    return x;
  };
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.secagg = true; })); }, "secure aggregation");
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.dp_clip = 1, x.dp_noise = 1; })); }, "--dp-*");
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.compress = "topk:0.1"; })); }, "--compress");
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.attack = "sign-flip:0.1"; })); }, "rewrite the loss");
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.async = "fedbuff:2"; })); }, "--async");
  expect_error<std::invalid_argument>([&] { simulation s(with([](auto& x) { x.trainer = "noop"; })); }, "--trainer mlp");
}

TEST(EvalClients, ReportsTheSpreadOfTheClientsAccuraciesOnTheirHeldOutRows) {
  auto o = small();
  o.eval_clients = true;
  simulation sim(o, test_support::fashion());
  for (int r = 0; r < o.rounds; ++r) sim.run_round();
  const auto e = sim.evaluate();
  std::map<std::string, double> m(e.metrics.begin(), e.metrics.end());
  for (const char* name : {"client_accuracy_mean", "client_accuracy_std", "client_accuracy_worst10",
                           "client_accuracy_best10", "client_accuracy_clients"})
    ASSERT_TRUE(m.count(name)) << name;
  EXPECT_GT(m["client_accuracy_clients"], 15);  // clients holding at least 5 examples
  EXPECT_LE(m["client_accuracy_worst10"], m["client_accuracy_mean"]);
  EXPECT_LE(m["client_accuracy_mean"], m["client_accuracy_best10"]);
  EXPECT_GT(m["client_accuracy_std"], 0);
  EXPECT_GT(m["client_accuracy_mean"], 0.3);  // the model learned something the clients see
  // The held-out rows are out of training: the run differs from one without --eval-clients.
  auto plain = small();
  simulation without(plain, test_support::fashion());
  for (int r = 0; r < plain.rounds; ++r) without.run_round();
  EXPECT_NE(test_support::model_of(sim), test_support::model_of(without));
  // A trainer that measures nothing is refused.
  o.trainer = "noop";
  expect_error<std::invalid_argument>([&] { simulation s(o); }, "--eval-clients");
}

}  // namespace
