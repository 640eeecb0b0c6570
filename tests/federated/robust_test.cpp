#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <troupe/federated/robust.hpp>

namespace {

using namespace troupe::federated;

struct round_updates {
  std::vector<std::vector<float>> data;
  std::vector<update_view> views() const { return {data.begin(), data.end()}; }
};

round_updates random_updates(std::size_t n, std::size_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  round_updates r;
  for (std::size_t i = 0; i < n; ++i) {
    r.data.emplace_back(dim);
    for (float& x : r.data.back()) x = normal(rng);
  }
  return r;
}

TEST(CoordinateMedian, TakesTheMiddleValueOrTheMeanOfTheTwoMiddleOnes) {
  round_updates odd{{{1, 10}, {5, -3}, {3, 100}}};
  EXPECT_EQ(coordinate_median(odd.views()), (std::vector<float>{3, 10}));
  round_updates even{{{1, 10}, {5, -3}, {3, 100}, {4, 0}}};
  EXPECT_EQ(coordinate_median(even.views()), (std::vector<float>{3.5f, 5}));
}

TEST(CoordinateMedian, EqualsTheSortedReferenceOnRandomData) {
  for (std::size_t n : {1, 2, 7, 10}) {
    auto u = random_updates(n, 300, static_cast<std::uint32_t>(n));
    const auto fast = coordinate_median(u.views());
    for (std::size_t j = 0; j < 300; ++j) {
      std::vector<float> column;
      for (const auto& v : u.data) column.push_back(v[j]);
      std::sort(column.begin(), column.end());
      const float expect = n % 2 ? column[n / 2]
                                 : static_cast<float>((double(column[n / 2 - 1]) + column[n / 2]) / 2);
      ASSERT_EQ(fast[j], expect) << "n=" << n << " j=" << j;
    }
  }
}

TEST(TrimmedMean, DropsTheExtremesOfEachCoordinate) {
  round_updates u{{{1, 0}, {2, 0}, {3, 0}, {1000, -1000}, {-1000, 6}}};
  EXPECT_EQ(trimmed_mean(u.views(), 1), (std::vector<float>{2, 0}));
  EXPECT_EQ(trimmed_mean(u.views(), 0)[0], (1 + 2 + 3 + 1000 - 1000) / 5.0f);
  EXPECT_THROW(trimmed_mean(u.views(), 3), std::invalid_argument);
}

/// Σ ‖z − u_i‖, in double.
double distance_sum(const std::vector<double>& z, const round_updates& u) {
  double total = 0;
  for (const auto& v : u.data) {
    double d = 0;
    for (std::size_t j = 0; j < z.size(); ++j) d += (z[j] - v[j]) * (z[j] - v[j]);
    total += std::sqrt(d);
  }
  return total;
}

TEST(GeometricMedian, FindsTheKnownMedians) {
  // On a line with an odd count it is the median; of a square's corners, its centre.
  round_updates line{{{0}, {1}, {10}}};
  EXPECT_NEAR(geometric_median(line.views())[0], 1.0, 1e-4);
  round_updates square{{{0, 0}, {2, 0}, {0, 2}, {2, 2}}};
  const auto centre = geometric_median(square.views());
  EXPECT_NEAR(centre[0], 1.0, 1e-6);
  EXPECT_NEAR(centre[1], 1.0, 1e-6);
  // Three points whose angles are all below 120 degrees: the Fermat point, where the unit
  // vectors towards the three sum to zero.
  // (Weiszfeld converges linearly: tightly, to check the iteration; by default, near it.)
  round_updates triangle{{{0, 0}, {4, 0}, {1, 3}}};
  const auto f = geometric_median(triangle.views(), 10'000, 1e-9, 1e-15);
  double gx = 0, gy = 0;
  for (const auto& v : triangle.data) {
    const double dx = v[0] - f[0], dy = v[1] - f[1], n = std::hypot(dx, dy);
    gx += dx / n, gy += dy / n;
  }
  EXPECT_LT(std::hypot(gx, gy), 1e-4);
  const auto near = geometric_median(triangle.views());
  EXPECT_LT(std::hypot(near[0] - f[0], near[1] - f[1]), 1e-2);
}

TEST(GeometricMedian, MinimizesTheSumOfDistancesAndIgnoresAFarMinority) {
  auto u = random_updates(9, 50, 5);
  const auto gm = geometric_median(u.views());
  const std::vector<double> z(gm.begin(), gm.end());
  const double best = distance_sum(z, u);
  // No better point nearby, nor the mean or the coordinate-wise median.
  const auto median = coordinate_median(u.views());
  EXPECT_LE(best, distance_sum(std::vector<double>(median.begin(), median.end()), u) + 1e-9);
  std::mt19937 rng(3);
  std::normal_distribution<double> step(0, 1e-2);
  for (int t = 0; t < 20; ++t) {
    auto moved = z;
    for (double& x : moved) x += step(rng);
    EXPECT_LE(best, distance_sum(moved, u) + 1e-6);
  }
  // Four of ten far away: the median stays with the six.
  round_updates attacked{{}};
  for (int i = 0; i < 6; ++i) attacked.data.push_back({float(i % 3) * 0.1f, float(i % 2) * 0.1f});
  for (int i = 0; i < 4; ++i) attacked.data.push_back({1000, -1000});
  const auto robust = geometric_median(attacked.views());
  EXPECT_LT(std::hypot(robust[0], robust[1]), 1.0);
  EXPECT_THROW(geometric_median(u.views(), 0), std::invalid_argument);
  EXPECT_THROW(geometric_median(u.views(), 10, 0.0), std::invalid_argument);
}

TEST(NormBoundedMean, ScalesLongUpdatesDownToTheBoundBeforeTheMean) {
  round_updates u{{{0.3f, 0.4f}, {6, 8}}};  // norms 0.5 and 10
  const auto mean = norm_bounded_mean(u.views(), 1.0);
  EXPECT_FLOAT_EQ(mean[0], (0.3f + 0.6f) / 2);
  EXPECT_FLOAT_EQ(mean[1], (0.4f + 0.8f) / 2);
  EXPECT_EQ(norm_bounded_mean(u.views(), 100.0), (std::vector<float>{3.15f, 4.2f}));
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    EXPECT_THROW(norm_bounded_mean(u.views(), bad), std::invalid_argument) << bad;
}

TEST(Krum, ScoresBySquaredDistancesToTheNearestNeighbours) {
  // n = 5, f = 1: each score sums the n - f - 2 = 2 smallest squared distances.
  round_updates u{{{0}, {1}, {2}, {3}, {100}}};
  const auto c = krum_select(u.views(), 1);
  EXPECT_EQ(c.scores, (std::vector<double>{1 + 4, 1 + 1, 1 + 1, 1 + 4, 97.0 * 97 + 98.0 * 98}));
  EXPECT_EQ(c.selected, (std::vector<std::size_t>{1}));  // ties go to the first position
  EXPECT_EQ(multi_krum(u.views(), 1, 2), (std::vector<float>{1.5f}));
}

TEST(Krum, IgnoresByzantineUpdatesThatAMeanWouldFollow) {
  auto u = random_updates(10, 50, 3);
  for (int b = 0; b < 3; ++b) apply_update_attack(update_attack::scale, u.data[b], 100.0);
  const auto c = krum_select(u.views(), 3, 4);
  for (std::size_t s : c.selected) EXPECT_GE(s, 3u);
  EXPECT_THROW(krum_select(u.views(), 4), std::invalid_argument);  // 10 <= 2 * 4 + 2
  EXPECT_THROW(krum_select(u.views(), 1, 11), std::invalid_argument);
}

TEST(RobustAggregation, RefusesMismatchedOrMissingUpdates) {
  round_updates bad{{{1, 2}, {3}}};
  EXPECT_THROW(coordinate_median(bad.views()), std::invalid_argument);
  EXPECT_THROW(trimmed_mean(std::span<const update_view>{}, 0), std::invalid_argument);
}

TEST(RobustAggregation, RefusesCountsWhoseProductsWouldWrap) {
  // 2 trim and 2 f + 2 wrap around for counts near 2^63: the checks must not multiply.
  round_updates r{{{1}, {2}, {3}, {4}, {5}}};
  const auto v = r.views();
  EXPECT_THROW(trimmed_mean(v, 1ull << 63), std::invalid_argument);
  EXPECT_THROW(trimmed_mean(v, ~0ull), std::invalid_argument);
  EXPECT_THROW(trimmed_mean(v, 3), std::invalid_argument);
  EXPECT_NO_THROW(trimmed_mean(v, 2));
  EXPECT_THROW(multi_krum(v, (1ull << 63) - 1, 1), std::invalid_argument);
  EXPECT_THROW(krum_select(v, ~0ull, 1), std::invalid_argument);
  EXPECT_THROW(krum_select(v, 2, 1), std::invalid_argument);
  EXPECT_NO_THROW(krum_select(v, 1, 1));
  round_updates two{{{1}, {2}}};
  EXPECT_THROW(krum_select(two.views(), 0, 1), std::invalid_argument);
}

TEST(RobustAggregation, RefusesUpdatesThatAreNotFinite) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    round_updates r{{{1, 1}, {2, 2}, {3, bad}, {4, 4}, {5, 5}}};
    const auto v = r.views();
    EXPECT_THROW(coordinate_median(v), std::invalid_argument);
    EXPECT_THROW(trimmed_mean(v, 1), std::invalid_argument);
    EXPECT_THROW(krum_select(v, 1, 1), std::invalid_argument);
    EXPECT_THROW(multi_krum(v, 1, 2), std::invalid_argument);
  }
}

TEST(Attacks, FlipSignsScaleUpdatesFlipLabelsAndStampTheTrigger) {
  std::vector<float> u{1, -2};
  apply_update_attack(update_attack::sign_flip, u, 1.0);
  EXPECT_EQ(u, (std::vector<float>{-1, 2}));
  apply_update_attack(update_attack::scale, u, 10.0);
  EXPECT_EQ(u, (std::vector<float>{-10, 20}));
  EXPECT_EQ(flip_label(0), 9);
  EXPECT_EQ(flip_label(7), 2);
  std::vector<std::uint8_t> image(28 * 28, 0);
  stamp_backdoor(image);
  EXPECT_EQ(std::count(image.begin(), image.end(), 255), 16);
  EXPECT_EQ(image[26 * 28 + 26], 255);
  EXPECT_EQ(image[27 * 28 + 27], 0);
  EXPECT_THROW(stamp_backdoor(image, 28, 30), std::invalid_argument);
}

}  // namespace
