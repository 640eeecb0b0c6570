// Shapley values by their definition (efficiency, symmetry, null player), the permutation
// estimators against exact enumeration, and budgeted rewards.

#include "troupe/federated/contribution.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace troupe::federated {
namespace {

bool member(const coalition& c, std::size_t i) { return c[i / 64] >> (i % 64) & 1; }

/// A game on 6 players that is far from additive: players 0 and 1 are interchangeable, player 5
/// adds nothing to any coalition, and the others interact.
double synthetic(const coalition& c) {
  const double w[6] = {0.3, 0.3, 0.15, -0.05, 0.2, 0.0};
  double additive = 0;
  int n = 0;
  for (std::size_t i = 0; i < 6; ++i)
    if (member(c, i)) {
      additive += w[i];
      n += i == 5 ? 0 : 1;
    }
  double v = additive;
  if (member(c, 0) && member(c, 1)) v -= 0.1;   // two similar clients overlap
  if (member(c, 2) && member(c, 4)) v += 0.07;  // two complementary ones
  if (member(c, 3) && member(c, 0)) v += 0.05 * std::sqrt(static_cast<double>(n));
  if (member(c, 3) && member(c, 1)) v += 0.05 * std::sqrt(static_cast<double>(n));
  return v + 0.01 * n * n;
}

/// A random game on `players` players: each coalition's utility drawn once.
coalition_utility random_game(std::size_t players, std::uint32_t seed) {
  auto table = std::make_shared<std::vector<double>>(std::size_t{1} << players);
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  for (auto& v : *table) v = d(g);
  (*table)[0] = 0;
  return [table](const coalition& c) { return (*table)[c[0]]; };
}

coalition all_of(std::size_t players) {
  coalition c(1, 0);
  for (std::size_t i = 0; i < players; ++i) c[0] |= std::uint64_t{1} << i;
  return c;
}

TEST(Shapley, ExactSatisfiesEfficiencySymmetryAndNullPlayer) {
  const auto r = exact_shapley(6, synthetic);
  ASSERT_EQ(r.values.size(), 6u);
  const double sum = std::accumulate(r.values.begin(), r.values.end(), 0.0);
  EXPECT_NEAR(sum, synthetic(all_of(6)), 1e-12) << "efficiency";
  EXPECT_NEAR(r.values[0], r.values[1], 1e-12) << "symmetry: 0 and 1 are interchangeable";
  EXPECT_NEAR(r.values[5], 0.0, 1e-12) << "null player";
  EXPECT_EQ(r.evaluations, 63u) << "every non-empty coalition once";
  EXPECT_NE(r.values[2], r.values[4]);  // a game where these differ: the test can tell players apart
}

TEST(Shapley, ExactMatchesTheAverageOverEveryOrder) {
  // The definition by orders: the mean marginal contribution over all 6! permutations.
  const auto game = random_game(6, 7);
  std::vector<std::size_t> order(6);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::vector<double> mean(6, 0.0);
  int count = 0;
  do {
    const auto m = permutation_marginals(order, game);
    for (std::size_t i = 0; i < 6; ++i) mean[i] += m[i];
    ++count;
  } while (std::next_permutation(order.begin(), order.end()));
  const auto exact = exact_shapley(6, game);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_NEAR(exact.values[i], mean[i] / count, 1e-12) << i;
}

TEST(Shapley, UntruncatedPermutationMarginalsAreEfficientForEveryOrder) {
  const auto game = random_game(6, 11);
  const double grand = game(all_of(6));
  std::vector<std::size_t> order(6);
  std::iota(order.begin(), order.end(), std::size_t{0});
  int orders = 0;
  do {
    const auto m = permutation_marginals(order, game);
    EXPECT_NEAR(std::accumulate(m.begin(), m.end(), 0.0), grand, 1e-12);
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 720);
  // Monte Carlo and GTG without truncation (EPS 0) average such orders: efficient too.
  const auto mc = monte_carlo_shapley(6, 7, 3, game);
  EXPECT_NEAR(std::accumulate(mc.values.begin(), mc.values.end(), 0.0), grand, 1e-12);
  const auto gtg = gtg_shapley(6, 0.0, 3, game);
  EXPECT_NEAR(std::accumulate(gtg.values.begin(), gtg.values.end(), 0.0), grand, 1e-12);
}

TEST(Shapley, MonteCarloConvergesToExact) {
  const auto game = random_game(5, 23);
  const auto exact = exact_shapley(5, game);
  double err_few = 0, err_many = 0;
  const auto few = monte_carlo_shapley(5, 20, 1, game);
  const auto many = monte_carlo_shapley(5, 20000, 1, game);
  for (std::size_t i = 0; i < 5; ++i) {
    err_few = std::max(err_few, std::abs(few.values[i] - exact.values[i]));
    err_many = std::max(err_many, std::abs(many.values[i] - exact.values[i]));
  }
  EXPECT_LT(err_many, 0.02);
  EXPECT_LT(err_many, err_few);
  EXPECT_LE(many.evaluations, 31u) << "coalitions are cached within the round";
}

TEST(Shapley, SeededEstimatesRepeat) {
  const auto game = random_game(6, 5);
  EXPECT_EQ(monte_carlo_shapley(6, 10, 9, game).values, monte_carlo_shapley(6, 10, 9, game).values);
  EXPECT_EQ(gtg_shapley(6, 0.01, 9, game).values, gtg_shapley(6, 0.01, 9, game).values);
}

TEST(Shapley, GtgIsCloseToExactAndTruncates) {
  const auto exact = exact_shapley(6, synthetic);
  const auto gtg = gtg_shapley(6, 0.0, 4, synthetic);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_NEAR(gtg.values[i], exact.values[i], 0.03) << i;
  EXPECT_GE(gtg.permutations, 30u);
  // Guided sampling: each player leads equally often, so its solo utility is always evaluated.
  // Within-round truncation: a large EPS stops orders early, fewer coalitions evaluated.
  const auto truncated = gtg_shapley(6, 0.5, 4, synthetic);
  EXPECT_LT(truncated.evaluations, gtg.evaluations);
}

TEST(Shapley, GtgSkipsARoundWithoutGain) {
  const coalition_utility flat = [](const coalition& c) { return member(c, 0) ? 0.002 : -0.001; };
  // U(all) = 0.002 < EPS = 0.01: the round is not valued.
  const auto r = gtg_shapley(4, 0.01, 1, flat);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.evaluations, 1u);
  for (double v : r.values) EXPECT_EQ(v, 0.0);
  EXPECT_FALSE(gtg_shapley(4, 0.001, 1, flat).skipped);
}

TEST(Shapley, RefusesMoreThanTwelvePlayersForExact) {
  try {
    (void)exact_shapley(13, synthetic);
    ADD_FAILURE() << "accepted 13 players";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 12"), std::string::npos) << e.what();
  }
}

TEST(Shapley, ParsesAndRefusesSpecs) {
  EXPECT_EQ(parse_contribution("exact").type, contribution_method::kind::exact);
  EXPECT_EQ(parse_contribution("mc:20").permutations, 20u);
  EXPECT_DOUBLE_EQ(parse_contribution("gtg:0.01").epsilon, 0.01);
  EXPECT_EQ(describe(parse_contribution("gtg:0.01")), "gtg:0.01");
  for (const char* bad : {"", "exact:1", "mc", "mc:0", "mc:1.5", "mc:x", "gtg", "gtg:1", "gtg:-0.1", "tmc:3"})
    EXPECT_THROW((void)parse_contribution(bad), std::invalid_argument) << bad;
}

// ---- rewards -------------------------------------------------------------------------------------

std::vector<double> values_for(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-0.02, 0.05);
  std::vector<double> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void expect_sound(const std::vector<double>& values, const reward_budget& b) {
  const auto r = budget_rewards(values, b);
  ASSERT_EQ(r.size(), values.size());
  const std::int64_t total = std::accumulate(r.begin(), r.end(), std::int64_t{0});
  EXPECT_EQ(total, std::llround(b.budget * 1e6)) << "n = " << values.size();
  const double floor_each = std::min(b.floor_fraction * b.budget, b.budget / static_cast<double>(values.size())) * 1e6;
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_GE(r[i], 0);
    EXPECT_GE(static_cast<double>(r[i]), std::floor(floor_each) - 1e-9);
    for (std::size_t j = 0; j < r.size(); ++j) {
      if (values[i] > values[j]) {
        EXPECT_GE(r[i], r[j]) << "monotone: " << values[i] << " > " << values[j];
      }
    }
  }
}

TEST(Rewards, SumToTheBudgetExactlyAndAreMonotone) {
  for (std::size_t n : {1u, 99u, 100u, 200u})
    for (const reward_budget b : {reward_budget{1.0, 0.0}, reward_budget{1000.0, 0.1}, reward_budget{7.777777, 0.5},
                                  reward_budget{3.0, 1.0}})
      expect_sound(values_for(n, static_cast<std::uint32_t>(n)), b);
}

TEST(Rewards, ProportionalToThePositivePart) {
  const auto r = budget_rewards(std::vector<double>{0.3, 0.1, -0.2, 0.0}, {100.0, 0.0});
  EXPECT_EQ(r, (std::vector<std::int64_t>{75'000'000, 25'000'000, 0, 0}));
  // A floor of 10% of B for each of the four, then the remaining 60 by the values.
  const auto f = budget_rewards(std::vector<double>{0.3, 0.1, -0.2, 0.0}, {100.0, 0.1});
  EXPECT_EQ(f, (std::vector<std::int64_t>{55'000'000, 25'000'000, 10'000'000, 10'000'000}));
  // The floor is at most B / n: a floor fraction of 1 pays everyone equally.
  const auto all = budget_rewards(std::vector<double>{0.3, 0.1, -0.2}, {3.0, 1.0});
  EXPECT_EQ(all, (std::vector<std::int64_t>{1'000'000, 1'000'000, 1'000'000}));
}

TEST(Rewards, NoPositiveValueSplitsTheRestEqually) {
  const auto r = budget_rewards(std::vector<double>{-0.1, 0.0, -0.3}, {1.0, 0.0});
  // 1,000,000 micro-units among three: 333,334 to the largest value, 333,333 to the others.
  EXPECT_EQ(r, (std::vector<std::int64_t>{333'333, 333'334, 333'333}));
  expect_sound({-0.1, 0.0, -0.3}, {1.0, 0.0});
}

TEST(Rewards, RemaindersGoToTheLargestFractions) {
  // 10 micro-units over values 1, 1, 1: 4, 3, 3 (the tie goes to the earlier participant).
  const auto r = budget_rewards(std::vector<double>{1, 1, 1}, {1e-5, 0.0});
  EXPECT_EQ(r, (std::vector<std::int64_t>{4, 3, 3}));
  // Quotas 10 * (0.5, 0.3, 0.2) = 5, 3, 2 exactly: no remainder to place.
  EXPECT_EQ(budget_rewards(std::vector<double>{0.5, 0.3, 0.2}, {1e-5, 0.0}), (std::vector<std::int64_t>{5, 3, 2}));
}

TEST(Rewards, RefusesBadBudgetsAndValues) {
  EXPECT_THROW((void)budget_rewards(std::vector<double>{}, {1.0, 0.0}), std::invalid_argument);
  EXPECT_THROW((void)budget_rewards(std::vector<double>{0.1, std::nan("")}, {1.0, 0.0}), std::invalid_argument);
  for (const char* bad : {"", "0", "-1", "x", "1:2", "1:-0.1", "1:0.5:3", "2e12", "1e-9"})
    EXPECT_THROW((void)parse_reward_budget(bad), std::invalid_argument) << bad;
  const auto b = parse_reward_budget("100:0.2");
  EXPECT_DOUBLE_EQ(b.budget, 100.0);
  EXPECT_DOUBLE_EQ(b.floor_fraction, 0.2);
  EXPECT_DOUBLE_EQ(parse_reward_budget("5").floor_fraction, 0.0);
}

}  // namespace
}  // namespace troupe::federated
