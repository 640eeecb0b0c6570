#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include <troupe/federated/compress.hpp>

namespace {

using namespace troupe::federated;

std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(TopK, SendsTheLargestCoordinatesAndKeepsTheRestAsResidual) {
  std::vector<float> u{0.1f, -5, 2, 0.3f, 4}, residual(5, 0.0f);
  const auto s = top_k(u, 0.4, residual);  // k = 2
  EXPECT_EQ(s.index, (std::vector<std::uint32_t>{1, 4}));
  EXPECT_EQ(s.value, (std::vector<float>{-5, 4}));
  EXPECT_EQ(residual, (std::vector<float>{0.1f, 0, 2, 0.3f, 0}));
  EXPECT_EQ(s.wire_bytes(), 16u);
  // The next round adds the residual back: coordinate 2 (2 + 2 = 4) now wins.
  const auto t = top_k(u, 0.2, residual);
  EXPECT_EQ(t.index, (std::vector<std::uint32_t>{1}));
  const auto w = top_k(std::vector<float>(5, 0.0f), 0.2, residual);
  EXPECT_EQ(w.index, (std::vector<std::uint32_t>{2}));
  EXPECT_FLOAT_EQ(w.value[0], 4.0f);
}

TEST(TopK, ErrorFeedbackLosesNothingOverRounds) {
  // Sum of what was sent plus the final residual equals the sum of the updates.
  std::vector<float> residual(1000, 0.0f);
  std::vector<double> sent(1000, 0.0), total(1000, 0.0);
  for (std::uint32_t round = 0; round < 20; ++round) {
    const auto u = random_vector(1000, round);
    for (std::size_t i = 0; i < u.size(); ++i) total[i] += u[i];
    const auto s = top_k(u, 0.05, residual);
    for (std::size_t j = 0; j < s.index.size(); ++j) sent[s.index[j]] += s.value[j];
  }
  for (std::size_t i = 0; i < 1000; ++i) EXPECT_NEAR(sent[i] + residual[i], total[i], 1e-4);
}

TEST(TopK, RefusesBadFractionsAndResiduals) {
  std::vector<float> u{1, 2}, residual{1};
  EXPECT_THROW(top_k(u, 0, residual), std::invalid_argument);
  EXPECT_THROW(top_k(u, 1.5, residual), std::invalid_argument);
  EXPECT_THROW(top_k(u, 0.5, residual), std::invalid_argument);
}

TEST(Qsgd, IsUnbiasedAndBoundedByTheNorm) {
  const auto u = random_vector(64, 3);
  std::vector<double> mean(64, 0.0);
  std::vector<float> out(64);
  const int trials = 20000;
  for (int t = 0; t < trials; ++t) {
    const auto q = qsgd(u, 4, static_cast<std::uint64_t>(t));
    q.dequantize(out);
    for (std::size_t i = 0; i < 64; ++i) {
      ASSERT_LE(std::fabs(out[i]), q.norm * 1.0001f);
      mean[i] += out[i];
    }
  }
  double norm = 0;
  for (float x : u) norm += double(x) * x;
  norm = std::sqrt(norm);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_NEAR(mean[i] / trials, u[i], 0.02 * norm) << i;
}

TEST(Qsgd, KeepsSignsZerosAndReportsItsWireSize) {
  std::vector<float> u{3, 0, -4};
  const auto q = qsgd(u, 1, 9);
  EXPECT_FLOAT_EQ(q.norm, 5);
  EXPECT_EQ(q.level[1], 0);
  EXPECT_GE(q.level[0], 0);
  EXPECT_LE(q.level[2], 0);
  EXPECT_EQ(q.wire_bytes(), 4u + 1u);  // 3 levels in 2 bits each: 6 bits, one byte
  EXPECT_THROW(qsgd(u, 0, 1), std::invalid_argument);
  std::vector<float> bad{NAN};
  EXPECT_THROW(qsgd(bad, 2, 1), std::invalid_argument);
  EXPECT_EQ(qsgd(std::vector<float>(3, 0.0f), 2, 1).level, (std::vector<std::int8_t>(3, 0)));
}

TEST(SparseUpdate, DensifyRefusesAPositionOutsideTheVector) {
  sparse_update s{.index = {1, 4}, .value = {1, 2}, .dim = 4};
  std::vector<float> out(4, 7.0f);
  EXPECT_THROW(s.densify(out), std::invalid_argument);
  EXPECT_EQ(out, std::vector<float>(4, 7.0f)) << "nothing written";
  sparse_update uneven{.index = {1}, .value = {1, 2}, .dim = 4};
  EXPECT_THROW(uneven.densify(out), std::invalid_argument);
  sparse_update good{.index = {0, 3}, .value = {1, 2}, .dim = 4};
  good.densify(out);
  EXPECT_EQ(out, (std::vector<float>{1, 0, 0, 2}));
}

TEST(Qsgd, RefusesANormBeyondAFloatAndHandlesLargeFiniteOnes) {
  // The norm of {3e38, 3e38} is 4.2e38, beyond the float the wire carries: it came back as inf
  // and the dequantized update as NaN.
  const std::vector<float> beyond{3e38f, 3e38f};
  EXPECT_THROW(qsgd(beyond, 4, 1), std::invalid_argument);
  const std::vector<float> large{1e38f, -1e38f};
  const auto q = qsgd(large, 4, 1);
  std::vector<float> out(2);
  q.dequantize(out);
  EXPECT_NEAR(out[0], 1e38, 1e32 * 1e6);
  EXPECT_NEAR(out[1], -1e38, 1e32 * 1e6);
}

}  // namespace
