#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include <troupe/federated/mechanisms.hpp>
#include <troupe/federated/simulation.hpp>
#include <troupe/kernels/data.hpp>

#include "fashion_subset.hpp"

namespace {

using namespace troupe::federated;

const shared_data& fashion() { return test_data::fashion_subset(); }

simulation_options small() {
  simulation_options o;
  o.clients = 30;
  o.per_round = 10;
  o.rounds = 2;
  o.model = "mlp:784-24-10";
  o.partition = "iid";
  o.threads = 2;
  o.test_limit = 1000;
  o.seed = 7;
  return o;
}

double metric(const round_report& r, const std::string& name) {
  for (const auto& [k, v] : r.metrics)
    if (k == name) return v;
  ADD_FAILURE() << "no metric " << name;
  return NAN;
}

TEST(SecureAggregation, GivesTheWeightedMeanUpToFixedPointRoundingEvenWithDropouts) {
  for (double dropout : {0.0, 0.1}) {
    simulation plain(small(), fashion()), secure(small(), fashion());
    auto m = make_secure_aggregation({.clip = 4.0, .mean_weight = 100.0, .max_clients = 10, .dropout = dropout});
    secure.add_transform(std::move(m.transform));
    secure.set_aggregator(std::move(m.aggregator));
    for (int r = 0; r < 2; ++r) {
      plain.run_round();
      const auto report = secure.run_round();
      EXPECT_EQ(metric(report, "secagg_survivors"), 10);
    }
    const auto a = plain.global_model(), b = secure.global_model();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    EXPECT_LT(worst, 1e-4) << "dropout " << dropout;
  }
}

TEST(DifferentialPrivacy, ClipsSumsNoisesAndDividesByTheExpectedCount) {
  auto m = make_differential_privacy({.clip = 1.0, .noise = 1e-9, .expected_clients = 4, .population = 100});
  std::vector<std::uint64_t> who{1, 2};
  round_info round{.round = 1, .dim = 2, .population = 100, .participants = who, .seed = 3};
  client_update big{.client = 1, .weight = 50, .delta = {3, 4}, .words = {}},
      small_update{.client = 2, .weight = 1, .delta = {0.1f, 0}, .words = {}};
  splitmix64 rng{1};
  m.transform->apply(big, {}, round, rng);
  m.transform->apply(small_update, {}, round, rng);
  EXPECT_NEAR(big.delta[0], 0.6, 1e-6);  // clipped to norm 1
  m.aggregator->begin(round);
  m.aggregator->add(1, big.weight, big.delta);  // weights are ignored
  m.aggregator->add(2, small_update.weight, small_update.delta);
  const auto out = m.aggregator->finish();
  EXPECT_NEAR(out[0], (0.6 + 0.1) / 4, 1e-6);
  EXPECT_NEAR(out[1], 0.8 / 4, 1e-6);
  std::vector<std::pair<std::string, double>> metrics;
  m.transform->end_round(round, metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].first, "epsilon");
  EXPECT_GT(metrics[0].second, 0);
  EXPECT_THROW(make_differential_privacy({.clip = 0, .noise = 1, .expected_clients = 1, .population = 1}), std::invalid_argument);
  EXPECT_THROW(make_differential_privacy({.clip = 1, .noise = 1, .expected_clients = 5, .population = 4}), std::invalid_argument);
}

TEST(DifferentialPrivacy, ReportsAGrowingEpsilonFromTheEngine) {
  simulation sim(small(), fashion());
  auto m = make_differential_privacy({.clip = 0.5, .noise = 1.0, .expected_clients = 10, .population = 30, .adaptive = true, .count_noise = 2});
  sim.add_transform(std::move(m.transform));
  sim.set_aggregator(std::move(m.aggregator));
  const double e1 = metric(sim.run_round(), "epsilon");
  const double e2 = metric(sim.run_round(), "epsilon");
  EXPECT_GT(e1, 0);
  EXPECT_GT(e2, e1);
}

TEST(RobustAggregation, WithstandsScaledSignFlipsThatBreakTheMean) {
  auto accuracy = [](const std::string& rule) {
    auto o = small();
    o.rounds = 12;
    simulation sim(o, fashion());
    if (rule != "none") sim.add_transform(make_update_attack("scale:0.3:-4", 11));
    if (!rule.empty() && rule != "none") sim.set_aggregator(make_robust_aggregator(rule));
    for (int r = 0; r < o.rounds; ++r) sim.run_round();
    return sim.evaluate().accuracy;
  };
  // Measured: clean 0.77; under attack mean 0.11, median 0.48, trimmed mean 0.46, Multi-Krum 0.75.
  const double clean = accuracy("none"), mean = accuracy("");
  EXPECT_GT(clean, 0.7);
  EXPECT_LT(mean, 0.3);
  EXPECT_GT(accuracy("median"), mean + 0.25);
  EXPECT_GT(accuracy("trimmed-mean:3"), mean + 0.25);
  EXPECT_GT(accuracy("multi-krum:3:4"), clean - 0.08);
}

TEST(RobustAggregation, ParsesItsRulesAndRefusesOthers) {
  for (const char* ok : {"median", "trimmed-mean:2", "krum:1", "multi-krum:1:3"}) {
    EXPECT_TRUE(is_robust_rule(ok));
    EXPECT_NE(make_robust_aggregator(ok), nullptr) << ok;
  }
  EXPECT_FALSE(is_robust_rule("fedavg"));
  for (const char* bad : {"median:1", "trimmed-mean", "trimmed-mean:x", "krum:-1", "multi-krum:1:0", "krum:1.5"})
    EXPECT_THROW(make_robust_aggregator(bad), std::invalid_argument) << bad;
}

TEST(Compression, TopKKeepsAResidualPerClientAndReportsTheUplinkRatio) {
  simulation sim(small(), fashion());
  sim.add_transform(make_compression("topk:0.1"));
  const auto report = sim.run_round();
  EXPECT_NEAR(metric(report, "uplink_ratio"), 0.2, 1e-3);  // 10% of coordinates, 8 bytes each
  EXPECT_GE(sim.client_state_bytes(), 10 * 4 * sim.global_model().size());
  simulation q(small(), fashion());
  q.add_transform(make_compression("qsgd:8"));
  EXPECT_LT(metric(q.run_round(), "uplink_ratio"), 0.2);  // 5 bits of 32 per coordinate
  for (const char* bad : {"topk:0", "topk:2", "qsgd:0", "qsgd:200", "zip"})
    EXPECT_THROW(make_compression(bad), std::invalid_argument) << bad;
}

TEST(Attacks, PickAFixedSeededFractionOfClients) {
  int malicious = 0;
  for (std::uint64_t c = 0; c < 10000; ++c) malicious += is_malicious(c, 0.2, 5);
  EXPECT_NEAR(malicious / 10000.0, 0.2, 0.02);
  EXPECT_EQ(is_malicious(42, 0.2, 5), is_malicious(42, 0.2, 5));
  EXPECT_THROW(make_update_attack("sign-flip:2", 1), std::invalid_argument);
  EXPECT_THROW(make_update_attack("poison", 1), std::invalid_argument);
}

}  // namespace

namespace {

TEST(DataAttacks, ABackdoorTakesHoldAndLabelFlippingCostsAccuracy) {
  auto run = [](const std::string& attack, std::vector<std::pair<std::string, double>>* metrics) {
    auto o = small();
    o.rounds = 10;
    o.attack = attack;
    simulation sim(o, fashion(), attack.empty() ? trainer_factory{} : poison_training(make_trainer_factory(small()), attack, o.seed));
    for (int r = 0; r < o.rounds; ++r) sim.run_round();
    const auto e = sim.evaluate();
    if (metrics) *metrics = e.metrics;
    return e.accuracy;
  };
  std::vector<std::pair<std::string, double>> metrics;
  const double clean = run("", nullptr);
  run("backdoor:0.3:0", &metrics);
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].first, "backdoor_success");
  EXPECT_GT(metrics[0].second, 0.5);
  EXPECT_LT(run("label-flip:0.8", nullptr), clean - 0.2);  // a malicious majority
  for (const char* bad : {"label-flip", "label-flip:2", "backdoor:0.1", "backdoor:0.1:10", "backdoor:0.1:x"})
    EXPECT_THROW(poison_training(make_trainer_factory(small()), bad, 1), std::invalid_argument) << bad;
}

}  // namespace
