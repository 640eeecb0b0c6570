#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include <troupe/federated/alignins.hpp>
#include <troupe/federated/mechanisms.hpp>

#include "engine.hpp"
#include "filtering.hpp"
#include "support.hpp"

namespace {

using namespace troupe::federated;

std::vector<float> random_vector(std::size_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(dim);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Runs the aggregator as the engine does: begin with the round's global model, add, finish.
std::vector<float> aggregate(aggregator& a, const std::vector<std::vector<float>>& updates,
                             const std::vector<double>& weights, const std::vector<float>& global) {
  round_info info;
  info.dim = global.size();
  info.global = global;
  a.begin(info);
  for (std::size_t i = 0; i < updates.size(); ++i) a.add(i, weights[i], updates[i]);
  return a.finish();
}

TEST(AlignIns, DropsTheOneReversedUpdateAmongNineAndReturnsTheOthers) {
  const auto u = random_vector(500, 1), global = random_vector(500, 2);
  std::vector<std::vector<float>> updates(9, u);
  std::vector<float> minus(u);
  for (float& x : minus) x = -x;
  updates.push_back(minus);
  const std::vector<double> weights{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  alignins_inspection seen;
  const std::vector<update_view> views(updates.begin(), updates.end());
  const auto out = alignins_aggregate(views, weights, global, {}, &seen);
  EXPECT_EQ(seen.kept, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  // TDA: nine of c and one of -c: median c, std 0.6 |c|, so the reversed one scores 2/0.6.
  EXPECT_NEAR(seen.tda_z[9], 2 / 0.6, 1e-9);
  EXPECT_EQ(seen.tda_z[0], 0);
  // MPSA: the majority sign is u's everywhere: 1 for u, 0 for -u; median 1, std 0.3.
  EXPECT_EQ(seen.mpsa[0], 1.0);
  EXPECT_EQ(seen.mpsa[9], 0.0);
  EXPECT_NEAR(seen.mpsa_z[9], 1 / 0.3, 1e-9);
  ASSERT_EQ(out.size(), u.size());
  for (std::size_t j = 0; j < u.size(); ++j) EXPECT_FLOAT_EQ(out[j], u[j]) << j;
  // Through the aggregator that --strategy alignins installs.
  auto rule = make_robust_aggregator("alignins");
  const auto via_rule = aggregate(*rule, updates, weights, global);
  EXPECT_EQ(via_rule, out);
  // It says which update it left out (the simulation counts them, honest and malicious).
  const auto* filter = dynamic_cast<const detail::filtering_aggregator*>(rule.get());
  ASSERT_NE(filter, nullptr);
  EXPECT_EQ(filter->filtered(), std::vector<std::uint64_t>{9});
}

TEST(AlignIns, IdenticalUpdatesGiveFedAvgBitForBit) {
  const auto u = random_vector(1000, 3), global = random_vector(1000, 4);
  const std::vector<std::vector<float>> updates(7, u);
  const std::vector<double> weights{600, 12, 3000, 1, 77, 450, 2};
  auto rule = make_alignins("alignins");
  auto fedavg = make_weighted_mean();
  EXPECT_EQ(aggregate(*rule, updates, weights, global), aggregate(*fedavg, updates, weights, global));
}

TEST(AlignIns, KeepsEveryUpdateThatIsNoOutlierAndClipsThemToTheirMedianNorm) {
  // Three updates along the same direction, norms 1, 2 and 4: the same TDA and MPSA (z = 0), all
  // kept, and each scaled to at most the median norm 2: the weighted mean of u, 2u and 2u.
  const auto dir = random_vector(64, 5), global = random_vector(64, 6);
  double n = 0;
  for (float x : dir) n += double(x) * x;
  std::vector<std::vector<float>> updates;
  for (double s : {1.0, 2.0, 4.0}) {
    updates.emplace_back(dir);
    for (float& x : updates.back()) x = static_cast<float>(x * s / std::sqrt(n));
  }
  const std::vector<double> weights{1, 2, 5};
  alignins_inspection seen;
  const std::vector<update_view> views(updates.begin(), updates.end());
  const auto out = alignins_aggregate(views, weights, global, {}, &seen);
  EXPECT_EQ(seen.kept.size(), 3u);
  EXPECT_NEAR(seen.clip_norm, 2.0, 1e-6);
  for (std::size_t j = 0; j < dir.size(); ++j)
    EXPECT_NEAR(out[j], (1 * 1 + 2 * 2 + 5 * 2) / 8.0 * dir[j] / std::sqrt(n), 1e-6) << j;
}

TEST(AlignIns, MedianZScoresMatchAHandComputedCase) {
  // values 1, 2, 3, 10: median 2.5, mean 4, population std sqrt((9 + 4 + 1 + 36) / 4) = sqrt(12.5).
  const std::vector<double> v{1, 2, 3, 10};
  const auto z = median_z_scores(v);
  const double s = std::sqrt(12.5);
  EXPECT_DOUBLE_EQ(z[0], 1.5 / s);
  EXPECT_DOUBLE_EQ(z[1], 0.5 / s);
  EXPECT_DOUBLE_EQ(z[2], 0.5 / s);
  EXPECT_DOUBLE_EQ(z[3], 7.5 / s);
  // No spread: every score is 0 (nothing to single out).
  EXPECT_EQ(median_z_scores(std::vector<double>{0.25, 0.25, 0.25}), (std::vector<double>{0, 0, 0}));
}

TEST(AlignIns, MpsaCountsTheTopMagnitudeCoordinatesThatAgreeWithTheMajoritySign) {
  // Ten coordinates, top 30% = 3 coordinates per update.
  // a: largest at 0, 1, 2 (+, +, -)      b: largest at 0, 1, 2 (+, +, +)      c: largest at 7, 8, 9 (-, -, -)
  // Majority signs: coordinate 0: +,+,+ -> +; 1: +,+,+ -> +; 2: -,+,+ -> +; 7..9: +,+,- -> +.
  const std::vector<float> a{9, 8, -7, 0, 0, 0, 0, 1, 1, 1};
  const std::vector<float> b{9, 8, 7, 0, 0, 0, 0, 1, 1, 1};
  const std::vector<float> c{1, 1, 1, 0, 0, 0, 0, -9, -8, -7};
  const std::vector<update_view> views{a, b, c};
  const auto m = alignins_mpsa(views);
  EXPECT_DOUBLE_EQ(m[0], 2.0 / 3);
  EXPECT_DOUBLE_EQ(m[1], 1.0);
  EXPECT_DOUBLE_EQ(m[2], 0.0);
  // A tie in the vote (one +, one -) is sign 0, which no non-zero coordinate matches.
  const std::vector<float> p{1, 0, 0, 0}, q{-1, 0, 0, 0};
  const std::vector<update_view> tie{p, q};
  EXPECT_EQ(alignins_mpsa(tie), (std::vector<double>{0, 0}));
}

TEST(AlignIns, TdaIsTheCosineWithTheGlobalModel) {
  const std::vector<float> u{3, 4, 0}, g{4, 3, 0}, zero{0, 0, 0};
  EXPECT_DOUBLE_EQ(alignins_tda(u, g), 24.0 / 25);
  EXPECT_DOUBLE_EQ(alignins_tda(u, zero), 0.0);  // no direction to align with: 0, not NaN
}

TEST(AlignIns, NoUpdateKeptLeavesTheModelWhereItIs) {
  // Two updates, each far from the median of two: with tiny lambdas neither passes.
  const std::vector<float> a{1, 2, 3, 4}, b{-4, 1, -2, 3}, global{1, 1, 1, 1};
  const std::vector<update_view> views{a, b};
  const std::vector<double> w{1, 1};
  alignins_inspection seen;
  const auto out = alignins_aggregate(views, w, global, {.lambda_tda = 1e-6, .lambda_mpsa = 1e-6}, &seen);
  EXPECT_TRUE(seen.kept.empty());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 0}));
}

TEST(AlignIns, RefusesBadSpecsAndRoundsWithoutTheGlobalModel) {
  EXPECT_TRUE(is_robust_rule("alignins"));
  EXPECT_TRUE(is_robust_rule("alignins:1.5:2"));
  const auto o = parse_alignins("alignins:1.5:2");
  EXPECT_EQ(o.lambda_tda, 1.5);
  EXPECT_EQ(o.lambda_mpsa, 2.0);
  for (const char* bad : {"alignins:1", "alignins:1:2:3", "alignins:0:1", "alignins:1:-1", "alignins:x:1",
                          "alignins:1:inf", "alignins:"})
    EXPECT_THROW(make_robust_aggregator(bad), std::invalid_argument) << bad;
  auto rule = make_alignins("alignins");
  round_info info;
  info.dim = 4;
  EXPECT_THROW(rule->begin(info), std::invalid_argument);  // no global model
  const std::vector<float> global{1, 2, 3, 4};
  info.global = global;
  rule->begin(info);
  const std::vector<float> short_update{1, 2};
  EXPECT_THROW(rule->add(0, 1, short_update), std::invalid_argument);
  EXPECT_THROW(rule->add(0, -1, global), std::invalid_argument);
  EXPECT_THROW(rule->finish(), std::logic_error);  // nothing added
  const std::vector<float> nan_update{1, NAN, 0, 0};
  rule->add(0, 1, nan_update);
  EXPECT_THROW(rule->finish(), std::invalid_argument);
}

simulation_options small() {
  simulation_options o;
  o.clients = 30;
  o.per_round = 10;
  o.rounds = 10;
  o.model = "mlp:784-24-10";
  o.partition = "iid";
  o.threads = 2;
  o.test_limit = 1000;
  o.seed = 7;
  return o;
}

TEST(AlignInsSimulation, KeepsABackdoorOutThatFedAvgLetsIn) {
  // 30% of the clients train on stamped images labelled 0: FedAvg learns the trigger, AlignIns
  // filters their updates (their signs and their angle to the model stand out).
  auto run = [](const std::string& strategy) {
    auto o = small();
    o.strategy = strategy;
    o.attack = "backdoor:0.3:0";
    simulation sim(o, test_support::fashion());  // the options poison the malicious clients
    double filtered = 0, malicious = 0, sampled_malicious = 0;
    for (int r = 0; r < o.rounds; ++r) {
      const auto rr = sim.run_round();
      for (const auto& [name, value] : rr.metrics) {
        if (name == "filtered_honest") filtered += value;
        if (name == "filtered_malicious") malicious += value;
      }
      for (const auto c : rr.sampled_clients) sampled_malicious += troupe::federated::detail::is_attacker(o, c);
    }
    if (strategy == "alignins") {
      // Most of the malicious updates are among those left out.
      EXPECT_GT(malicious, 0.5 * sampled_malicious);
      EXPECT_LE(malicious, sampled_malicious);
      EXPECT_GE(filtered, 0);
    } else {
      EXPECT_EQ(malicious + filtered, 0);  // FedAvg filters nothing and reports nothing
    }
    const auto e = sim.evaluate();
    EXPECT_EQ(e.metrics.at(0).first, "backdoor_success");
    return std::make_pair(e.accuracy, e.metrics.at(0).second);
  };
  const auto [fedavg_accuracy, fedavg_backdoor] = run("fedavg");
  const auto [alignins_accuracy, alignins_backdoor] = run("alignins");
  EXPECT_GT(fedavg_backdoor, 0.5);
  EXPECT_LT(alignins_backdoor, 0.2);
  EXPECT_GT(alignins_accuracy, fedavg_accuracy - 0.05);
}

TEST(AlignInsSimulation, RefusesSecureAggregationDifferentialPrivacyAndFedBuff) {
  auto o = small();
  o.trainer = "noop";
  o.strategy = "alignins";
  {
    simulation sim(o);  // runs: the engine hands the rule each round's global model
    sim.run_round();
  }
  auto with = [&](auto change) {
    auto x = o;
    change(x);
    return x;
  };
  test_support::expect_error<std::invalid_argument>(
      [&] { simulation sim(with([](simulation_options& x) { x.secagg = true; })); }, "secure aggregation hides");
  test_support::expect_error<std::invalid_argument>(
      [&] { simulation sim(with([](simulation_options& x) { x.dp_clip = 1, x.dp_noise = 1; })); }, "differential privacy");
  test_support::expect_error<std::invalid_argument>(
      [&] { simulation sim(with([](simulation_options& x) { x.async = "fedbuff:5"; })); }, "AlignIns compares");
}

}  // namespace
