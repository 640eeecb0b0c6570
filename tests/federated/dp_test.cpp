#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include <troupe/federated/dp.hpp>

namespace {

using namespace troupe::federated;

// A_α = E_{z ~ N(0, σ²)} [((1 - q) + q · N(z; 1, σ²) / N(z; 0, σ²))^α] by Simpson's rule: the
// definition the closed forms expand, computed without them.
double rdp_by_integration(double q, double sigma, double alpha) {
  const int n = 200000;
  const double lo = -30 * sigma, hi = 30 * sigma + 1, h = (hi - lo) / n;
  double sum = 0;
  for (int i = 0; i <= n; ++i) {
    const double z = lo + i * h;
    const double p0 = std::exp(-z * z / (2 * sigma * sigma)) / (sigma * std::sqrt(2 * std::numbers::pi));
    const double ratio = std::exp((2 * z - 1) / (2 * sigma * sigma));
    const double f = p0 * std::pow(1 - q + q * ratio, alpha);
    sum += f * (i == 0 || i == n ? 1 : (i % 2 ? 4 : 2));
  }
  return std::log(sum * h / 3) / (alpha - 1);
}

TEST(Rdp, ReproducesOpacusPublishedExample) {
  // Opacus' privacy analysis example: 10 steps at q = 1e-5, σ = 1, then 4 at q = 1e-4, σ = 3,
  // orders 2..32, δ = 1e-5: ε ≈ 0.336 at order 23.
  std::vector<double> orders;
  for (int a = 2; a <= 32; ++a) orders.push_back(a);
  rdp_accountant acc(orders);
  acc.compose(1e-5, 1.0, 10);
  acc.compose(1e-4, 3.0, 4);
  const auto spent = acc.epsilon(1e-5);
  EXPECT_NEAR(spent.epsilon, 0.336, 5e-4);
  EXPECT_EQ(spent.order, 23);
}

TEST(Rdp, IntegerAndFractionalOrdersAgreeWithNumericalIntegration) {
  for (double q : {0.01, 0.1, 0.5})
    for (double sigma : {0.8, 1.5, 4.0})
      for (double alpha : {1.5, 2.0, 3.7, 8.0, 12.25}) {
        const double closed = sampled_gaussian_rdp(q, sigma, alpha);
        const double numeric = rdp_by_integration(q, sigma, alpha);
        EXPECT_NEAR(closed, numeric, 1e-6 + 1e-6 * numeric) << "q=" << q << " sigma=" << sigma << " alpha=" << alpha;
      }
}

TEST(Rdp, EdgeCasesFollowTheDefinition) {
  EXPECT_EQ(sampled_gaussian_rdp(0, 1.0, 4), 0);
  EXPECT_DOUBLE_EQ(sampled_gaussian_rdp(1, 2.0, 4), 4 / (2 * 4.0));
  EXPECT_THROW(sampled_gaussian_rdp(1.5, 1, 2), std::invalid_argument);
  EXPECT_THROW(sampled_gaussian_rdp(0.1, 0, 2), std::invalid_argument);
  EXPECT_THROW(sampled_gaussian_rdp(0.1, 1, 1), std::invalid_argument);
  rdp_accountant acc;
  EXPECT_THROW(acc.epsilon(0), std::invalid_argument);
  EXPECT_THROW(acc.compose(0.1, 1, -1), std::invalid_argument);
}

TEST(Rdp, NextToNoNoiseIsInfiniteNotNaNAndRestores) {
  // Sigma so small that the sums overflow: the RDP is +infinity at those orders (it was NaN, which
  // a checkpoint could then not restore).
  for (double alpha : {1.5, 2.0, 32.0}) {
    const double r = sampled_gaussian_rdp(0.1, 1e-308, alpha);
    EXPECT_FALSE(std::isnan(r)) << alpha;
    EXPECT_GT(r, 1e300) << alpha;
  }
  rdp_accountant acc;
  acc.compose(0.1, 1e-308, 3);
  EXPECT_FALSE(std::isnan(acc.epsilon(1e-5).epsilon));
  rdp_accountant back;
  back.restore(acc.rdp());
  EXPECT_EQ(back.epsilon(1e-5).epsilon, acc.epsilon(1e-5).epsilon);
  std::vector<double> bad(acc.rdp().begin(), acc.rdp().end());
  bad[0] = std::nan("");
  EXPECT_THROW(back.restore(bad), std::invalid_argument);
}

TEST(Rdp, EpsilonGrowsWithStepsAndShrinksWithNoise) {
  rdp_accountant a, b, c;
  a.compose(0.01, 1.0, 100);
  b.compose(0.01, 1.0, 1000);
  c.compose(0.01, 2.0, 1000);
  EXPECT_LT(a.epsilon(1e-5).epsilon, b.epsilon(1e-5).epsilon);
  EXPECT_LT(c.epsilon(1e-5).epsilon, b.epsilon(1e-5).epsilon);
  EXPECT_GT(a.epsilon(1e-5).epsilon, 0);
}

TEST(ClipL2, ScalesOnlyUpdatesAboveTheBound) {
  std::vector<float> big{3, 4}, small{0.3f, 0.4f};
  EXPECT_DOUBLE_EQ(clip_l2(big, 1.0), 5.0);
  EXPECT_NEAR(big[0], 0.6, 1e-7);
  EXPECT_NEAR(big[1], 0.8, 1e-7);
  EXPECT_NEAR(clip_l2(small, 1.0), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);
  EXPECT_THROW(clip_l2(small, 0), std::invalid_argument);
  EXPECT_THROW(clip_l2(small, NAN), std::invalid_argument);
}

TEST(GaussianNoise, HasTheRequestedMomentsAndDependsOnlyOnTheSeed) {
  std::vector<float> a(200000, 1.0f), b(200000, 1.0f), c(200000, 1.0f);
  add_gaussian_noise(a, 2.0, 7);
  add_gaussian_noise(b, 2.0, 7);
  add_gaussian_noise(c, 2.0, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0, var = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) var += (x - mean) * (x - mean);
  var /= a.size();
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(var, 4.0, 0.05);
}

TEST(AdaptiveClipping, MovesTheBoundTowardTheTargetQuantile) {
  adaptive_clipping clip{.bound = 1.0, .target_quantile = 0.5, .learning_rate = 0.2};
  // The count is centred: Σ(b_i - ½) over 10 clients.
  clip.update(5, 10, 1);  // everybody unclipped: the bound is too large, it shrinks
  EXPECT_NEAR(clip.bound, std::exp(-0.2 * 0.5), 1e-12);
  clip.update(-5, 10, 2);  // everybody clipped: it grows
  EXPECT_NEAR(clip.bound, 1.0, 1e-12);
  clip.update(0, 10, 3);  // at the quantile: unchanged
  EXPECT_NEAR(clip.bound, 1.0, 1e-12);
  EXPECT_THROW(clip.update(std::nan(""), 10, 4), std::invalid_argument);
}

TEST(AdaptiveClipping, TakesTheCountsNoiseOutOfTheSumsMultiplier) {
  adaptive_clipping clip{.count_noise = 10.0};
  // z_Δ = (z⁻² - (2σ_b)⁻²)^(-1/2) with z = 1, σ_b = 10.
  EXPECT_NEAR(clip.sum_noise_multiplier(1.0), 1 / std::sqrt(1 - 1 / 400.0), 1e-12);
  adaptive_clipping noiseless{};
  EXPECT_THROW(noiseless.sum_noise_multiplier(1.0), std::invalid_argument);
}

TEST(ClipL2, RefusesUpdatesThatAreNotFinite) {
  // A NaN left the update unclipped (NaN > bound is false), an infinity made it NaN: either
  // breaks the bound the noise is calibrated to.
  std::vector<float> nan{std::numeric_limits<float>::quiet_NaN(), 1}, inf{std::numeric_limits<float>::infinity(), 1};
  EXPECT_THROW(clip_l2(nan, 1.0), std::invalid_argument);
  EXPECT_THROW(clip_l2(inf, 1.0), std::invalid_argument);
  std::vector<float> huge{3e38f, 3e38f};  // finite: its squares fit a double
  EXPECT_NEAR(clip_l2(huge, 1.0), 3e38 * std::sqrt(2.0), 1e32);
  EXPECT_NEAR(huge[0], 1 / std::sqrt(2.0), 1e-6);
}

TEST(Rdp, OrdersBeyondTheExactRangeGetThePlainGaussianBound) {
  // Whole orders above INT_MAX were cast to int (-inf came back); such orders now get the
  // plain Gaussian's alpha / (2 sigma^2), which bounds the sampled one from above.
  for (double a : {3e9, 1e15, 1e300, 10000.5}) {
    const double r = sampled_gaussian_rdp(0.01, 1.0, a);
    EXPECT_TRUE(std::isfinite(r)) << a;
    EXPECT_DOUBLE_EQ(r, a > largest_exact_rdp_order ? a / 2 : r) << a;
    EXPECT_GE(r, sampled_gaussian_rdp(0.01, 1.0, 64)) << "RDP does not fall with the order";
  }
  // Near the limit the exact value is already close to the bound (and below it).
  const double exact = sampled_gaussian_rdp(0.01, 1.0, largest_exact_rdp_order);
  EXPECT_LE(exact, largest_exact_rdp_order / 2);
  EXPECT_GT(exact, 0.9 * largest_exact_rdp_order / 2);
  rdp_accountant acc({3e9});
  acc.compose(0.5, 0.5, 1000);
  EXPECT_GT(acc.epsilon(1e-5).epsilon, 0);
}

}  // namespace
