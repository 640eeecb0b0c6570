#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "troupe/kernels/svd.hpp"

using troupe::kernels::svd;

namespace {

std::vector<double> random_matrix(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> a(static_cast<std::size_t>(rows * cols));
  for (double& v : a) v = n(g);
  return a;
}

void expect_decomposes(std::int64_t rows, std::int64_t cols, unsigned seed) {
  const auto a = random_matrix(rows, cols, seed);
  const auto r = svd(a, rows, cols);
  const std::int64_t k = std::min(rows, cols);
  ASSERT_EQ(r.k, k);
  for (std::int64_t i = 0; i + 1 < k; ++i) EXPECT_GE(r.s[i], r.s[i + 1]);
  EXPECT_GE(r.s[k - 1], 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      double v = 0;
      for (std::int64_t t = 0; t < k; ++t) v += r.u[i * k + t] * r.s[t] * r.vt[t * cols + j];
      EXPECT_NEAR(v, a[i * cols + j], 1e-10) << i << "," << j;
    }
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t q = 0; q < k; ++q) {
      double uu = 0, vv = 0;
      for (std::int64_t i = 0; i < rows; ++i) uu += r.u[i * k + p] * r.u[i * k + q];
      for (std::int64_t j = 0; j < cols; ++j) vv += r.vt[p * cols + j] * r.vt[q * cols + j];
      EXPECT_NEAR(uu, p == q ? 1.0 : 0.0, 1e-10);
      EXPECT_NEAR(vv, p == q ? 1.0 : 0.0, 1e-10);
    }
}

}  // namespace

TEST(Svd, RebuildsATallMatrixFromOrthonormalFactors) { expect_decomposes(23, 7, 1); }
TEST(Svd, RebuildsAWideMatrixFromOrthonormalFactors) { expect_decomposes(6, 31, 2); }

TEST(Svd, FindsTheSingularValuesOfADiagonalMatrix) {
  const std::vector<double> a = {2, 0, 0, 0,  //
                                 0, -3, 0, 0,  //
                                 0, 0, 0.5, 0};  // 3 x 4
  const auto r = svd(a, 3, 4);
  EXPECT_NEAR(r.s[0], 3.0, 1e-14);
  EXPECT_NEAR(r.s[1], 2.0, 1e-14);
  EXPECT_NEAR(r.s[2], 0.5, 1e-14);
}

TEST(Svd, RefusesAWrongLengthAndValuesThatAreNotFinite) {
  std::vector<double> a(6, 1.0);
  EXPECT_THROW(svd(a, 2, 4), std::invalid_argument);
  EXPECT_THROW(svd(a, 0, 6), std::invalid_argument);
  a[3] = std::nan("");
  EXPECT_THROW(svd(a, 2, 3), std::invalid_argument);
}
