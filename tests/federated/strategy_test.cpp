// Each server strategy against its paper's update rule, on vectors small enough to check by
// hand.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "troupe/federated/strategy.hpp"

namespace {

using namespace troupe::federated;

round_info round_of(std::size_t participants, std::size_t population) {
  static std::vector<std::uint64_t> ids(1000);
  return {.round = 1, .dim = 0, .population = population, .participants = {ids.data(), participants}};
}

TEST(Strategy, FedAvgAddsTheMeanDelta) {
  auto s = make_strategy("fedavg");
  std::vector<float> x{1.0f, 2.0f};
  const std::vector<float> d{0.5f, -1.0f};
  s->apply(x, d, round_of(2, 10));
  EXPECT_FLOAT_EQ(x[0], 1.5f);
  EXPECT_FLOAT_EQ(x[1], 1.0f);
  EXPECT_EQ(s->rule().proximal_mu, 0.0);
}

TEST(Strategy, FedProxIsFedAvgOnTheServerAndTellsClientsItsMu) {
  auto s = make_strategy("fedprox:0.01");
  EXPECT_DOUBLE_EQ(s->rule().proximal_mu, 0.01);
  std::vector<float> x{1.0f};
  s->apply(x, std::vector<float>{0.25f}, round_of(1, 1));
  EXPECT_FLOAT_EQ(x[0], 1.25f);
}

TEST(Strategy, FedAvgMAccumulatesServerMomentum) {
  auto s = make_strategy("fedavgm", {.server_lr = 1.0, .momentum = 0.9});
  std::vector<float> x{0.0f};
  s->apply(x, std::vector<float>{1.0f}, round_of(1, 1));  // v = 1, x = 1
  EXPECT_FLOAT_EQ(x[0], 1.0f);
  s->apply(x, std::vector<float>{0.5f}, round_of(1, 1));  // v = 0.9 + 0.5, x = 2.4
  EXPECT_FLOAT_EQ(x[0], 2.4f);
}

TEST(Strategy, FedAdamFollowsReddiAlgorithm2WithoutBiasCorrection) {
  auto s = make_strategy("fedadam", {.server_lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .tau = 1e-3});
  std::vector<float> x{1.0f};
  s->apply(x, std::vector<float>{0.5f}, round_of(1, 1));
  // m = 0.1 * 0.5 = 0.05; v = 0.99 * 1e-6 + 0.01 * 0.25 = 0.00250099
  const double m = 0.05, v = 0.99e-6 + 0.0025;
  EXPECT_NEAR(x[0], 1.0 + 0.01 * m / (std::sqrt(v) + 1e-3), 1e-7);
  s->apply(x, std::vector<float>{-0.2f}, round_of(1, 1));
  const double m2 = 0.9 * m + 0.1 * -0.2, v2 = 0.99 * v + 0.01 * 0.04;
  EXPECT_NEAR(x[0], 1.0 + 0.01 * m / (std::sqrt(v) + 1e-3) + 0.01 * m2 / (std::sqrt(v2) + 1e-3), 1e-6);
}

TEST(Strategy, FedAdamWithBiasCorrectionScalesItsStepAsFlowerDoes) {
  auto s = make_strategy("fedadam", {.server_lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .tau = 1e-3, .bias_correction = true});
  std::vector<float> x{1.0f};
  s->apply(x, std::vector<float>{0.5f}, round_of(1, 1));
  const double m = 0.05, v = 0.99e-6 + 0.0025, lr = 0.01 * std::sqrt(1 - 0.99) / (1 - 0.9);
  EXPECT_NEAR(x[0], 1.0 + lr * m / (std::sqrt(v) + 1e-3), 1e-6);
}

TEST(Strategy, FedYogiGrowsItsSecondMomentAdditivelyTowardsDeltaSquared) {
  auto s = make_strategy("fedyogi", {.server_lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .tau = 1e-3});
  std::vector<float> x{0.0f, 0.0f};
  // v starts at tau^2 = 1e-6 < delta^2: sign(v - d^2) = -1, v = 1e-6 + 0.01 d^2.
  s->apply(x, std::vector<float>{0.5f, -0.1f}, round_of(1, 1));
  const double v0 = 1e-6 + 0.01 * 0.25, v1 = 1e-6 + 0.01 * 0.01;
  EXPECT_NEAR(x[0], 0.01 * 0.05 / (std::sqrt(v0) + 1e-3), 1e-7);
  EXPECT_NEAR(x[1], 0.01 * -0.01 / (std::sqrt(v1) + 1e-3), 1e-7);
  // A small delta now: v > d^2, so v shrinks by (1 - b2) d^2.
  s->apply(x, std::vector<float>{0.001f, 0.0f}, round_of(1, 1));
  const double v0b = v0 - 0.01 * 1e-6, m0b = 0.9 * 0.05 + 0.1 * 0.001;
  EXPECT_NEAR(x[0], 0.01 * 0.05 / (std::sqrt(v0) + 1e-3) + 0.01 * m0b / (std::sqrt(v0b) + 1e-3), 1e-6);
}

TEST(Strategy, FedAdagradSumsSquaredDeltas) {
  auto s = make_strategy("fedadagrad", {.server_lr = 0.1, .beta1 = 0.0, .beta2 = 0.99, .tau = 1e-3});
  std::vector<float> x{0.0f};
  s->apply(x, std::vector<float>{0.3f}, round_of(1, 1));
  const double v = 1e-6 + 0.09;
  EXPECT_NEAR(x[0], 0.1 * 0.3 / (std::sqrt(v) + 1e-3), 1e-7);
  s->apply(x, std::vector<float>{0.4f}, round_of(1, 1));
  EXPECT_NEAR(x[0], 0.1 * 0.3 / (std::sqrt(v) + 1e-3) + 0.1 * 0.4 / (std::sqrt(v + 0.16) + 1e-3), 1e-6);
}

TEST(Strategy, ScaffoldMovesTheModelAndTheControlVariateBySampledShare) {
  auto s = make_strategy("scaffold");
  EXPECT_TRUE(s->rule().control_variates);
  EXPECT_TRUE(s->rule().uniform_weights);
  EXPECT_EQ(s->update_floats(2), 4u);
  std::vector<float> x{1.0f, -1.0f};
  // [dy | dc] means over 2 of 8 clients: x += dy; c += 2/8 dc.
  s->apply(x, std::vector<float>{0.5f, 0.25f, 4.0f, -8.0f}, round_of(2, 8));
  EXPECT_FLOAT_EQ(x[0], 1.5f);
  EXPECT_FLOAT_EQ(x[1], -0.75f);
  ASSERT_EQ(s->control().size(), 2u);
  EXPECT_FLOAT_EQ(s->control()[0], 1.0f);
  EXPECT_FLOAT_EQ(s->control()[1], -2.0f);
  EXPECT_THROW(s->apply(x, std::vector<float>{1.0f, 2.0f}, round_of(2, 8)), std::invalid_argument);
}

TEST(Strategy, RejectsUnknownMalformedAndAggregationRuleNames) {
  EXPECT_THROW(make_strategy("fedsgd"), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedprox"), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedprox:abc"), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedprox:-1"), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedavg:2"), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedadam", {.tau = 0}), std::invalid_argument);
  EXPECT_THROW(make_strategy("fedavgm", {.momentum = 1.0}), std::invalid_argument);
  try {
    make_strategy("median");
    FAIL() << "median is an aggregation rule, not a server strategy";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("make_robust_aggregator"), std::string::npos);
  }
}

TEST(Strategy, AdaptiveStrategiesRefuseANegativeSecondMomentFromACheckpoint) {
  for (const char* name : {"fedadam", "fedyogi", "fedadagrad"}) {
    auto s = make_strategy(name, {});
    // t = 1, m = {0, 0}, v = {1, -1}: sqrt(-1) would be NaN in the next step.
    const std::vector<double> bad{1, 0, 0, 1, -1};
    EXPECT_THROW(s->load_state(bad), std::invalid_argument) << name;
    const std::vector<double> good{1, 0, 0, 1, 0};
    EXPECT_NO_THROW(s->load_state(good)) << name;
  }
}

TEST(WeightedMean, RefusesWeightsAndUpdatesThatAreNotFiniteAndSumsThatOverflow) {
  const std::vector<std::uint64_t> who{1, 2};
  const round_info round{.round = 1, .dim = 2, .population = 2, .participants = who, .seed = 1};
  const std::vector<float> d{1, 2}, nan{std::numeric_limits<float>::quiet_NaN(), 1};
  auto m = make_weighted_mean();
  m->begin(round);
  EXPECT_THROW(m->add(1, std::numeric_limits<double>::infinity(), d), std::invalid_argument);
  EXPECT_THROW(m->add(1, std::numeric_limits<double>::quiet_NaN(), d), std::invalid_argument);
  EXPECT_THROW(m->add(1, -1, d), std::invalid_argument);
  EXPECT_THROW(m->add(1, 1, nan), std::invalid_argument);
  m->begin(round);
  m->add(1, 1e308, d);
  EXPECT_THROW(m->add(2, 1e308, d), std::invalid_argument) << "the weights' total overflows";
  m->begin(round);
  const std::vector<float> big{3e38f, 1};
  m->add(1, 1e300, big);  // weight * delta overflows a double
  EXPECT_THROW(m->finish(), std::invalid_argument);
  m->begin(round);
  m->add(1, 1, d);
  m->add(2, 3, std::vector<float>{5, 6});
  EXPECT_EQ(m->finish(), (std::vector<float>{4, 5}));
}

}  // namespace
