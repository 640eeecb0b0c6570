#include <gtest/gtest.h>

#include <algorithm>
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
