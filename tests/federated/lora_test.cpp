// The LoRA aggregation rules (lora.hpp) against their papers' definitions.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "troupe/federated/lora.hpp"

namespace lora = troupe::federated::lora;

namespace {

constexpr lora::layer_shape shape{12, 9};  // W [out 12, in 9]

lora::adapter random_adapter(std::int64_t rank, unsigned seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  lora::adapter x{rank, std::vector<float>(static_cast<std::size_t>(rank * shape.in)),
                  std::vector<float>(static_cast<std::size_t>(shape.out * rank))};
  for (float& v : x.a) v = n(g);
  for (float& v : x.b) v = n(g);
  return x;
}

double squared_norm(const std::vector<double>& m) {
  double s = 0;
  for (double v : m) s += v * v;
  return s;
}

}  // namespace

TEST(LoraAggregation, FedExMakesTheModelExactlyTheWeightedMeanOfTheProducts) {
  const std::vector<lora::adapter> clients = {random_adapter(3, 1), random_adapter(3, 2), random_adapter(3, 3)};
  const std::vector<double> weights = {10, 30, 60};
  const auto r = lora::fedex(clients, weights, shape);
  // The paper's definition, computed on its own: W0 + sum_k w_k B_k A_k.
  std::vector<double> want(static_cast<std::size_t>(shape.out * shape.in), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) {
    const auto p = lora::product(clients[k], shape);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += weights[k] / 100.0 * p[i];
  }
  std::mt19937_64 g(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const auto mean_product = lora::product(r.mean, shape);
  double largest = 0, largest_float = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float w0 = n(g);
    // In double (the residual's own precision) the identity holds to the sums' rounding.
    const double exact = w0 + r.residual[i] + mean_product[i];
    largest = std::max(largest, std::abs(exact - (w0 + want[i])));
    // As the model stores it: W0 + residual rounded to a float, then + B̄Ā.
    const double stored = static_cast<double>(static_cast<float>(w0 + r.residual[i])) + mean_product[i];
    largest_float = std::max(largest_float, std::abs(stored - (w0 + want[i])) / (1.0 + std::abs(w0 + want[i])));
  }
  EXPECT_LT(largest, 1e-12);
  EXPECT_LT(largest_float, 2e-7);  // one float rounding of W0 + residual
  // And the residual is not zero: FedIT's mean(B) mean(A) alone would be off.
  EXPECT_GT(std::sqrt(squared_norm(r.residual)), 1.0);
}

TEST(LoraAggregation, TruncationErrorEqualsTheDroppedSquaredSingularValues) {
  const std::vector<lora::adapter> clients = {random_adapter(2, 4), random_adapter(4, 5), random_adapter(3, 6)};
  const std::vector<double> weights = {1, 2, 3};
  const auto delta = lora::weighted_product_sum(clients, weights, shape);  // rank <= 9
  for (std::int64_t rank : {1, 2, 4, 6}) {
    const auto t = lora::truncate(delta, shape, rank);
    const auto approx = lora::product(t.factors, shape);
    std::vector<double> diff(delta.size());
    for (std::size_t i = 0; i < delta.size(); ++i) diff[i] = delta[i] - approx[i];
    double dropped = 0;
    for (std::size_t r = static_cast<std::size_t>(rank); r < t.singular_values.size(); ++r)
      dropped += t.singular_values[r] * t.singular_values[r];
    EXPECT_NEAR(t.dropped, dropped, 1e-12 * squared_norm(delta));
    // The factors are floats: ||dW - BA||_F^2 matches to their rounding.
    EXPECT_NEAR(squared_norm(diff), t.dropped, 1e-6 * squared_norm(delta)) << "rank " << rank;
    EXPECT_GT(t.dropped, 1e-3 * squared_norm(delta)) << "rank " << rank << " drops nothing: the test cannot fail";
  }
}

TEST(LoraAggregation, FlexLoraAtFullRankReproducesTheExactWeightedMean) {
  const std::vector<lora::adapter> clients = {random_adapter(2, 7), random_adapter(2, 8), random_adapter(1, 10)};
  const std::vector<double> weights = {5, 1, 4};
  const auto delta = lora::weighted_product_sum(clients, weights, shape);
  std::vector<double> want(delta.size(), 0.0);
  for (std::size_t k = 0; k < clients.size(); ++k) {
    const auto p = lora::product(clients[k], shape);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += weights[k] / 10.0 * p[i];
  }
  const auto t = lora::truncate(delta, shape, 9);  // min(out, in): every singular value kept
  const auto back = lora::product(t.factors, shape);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(back[i], want[i], 1e-5 * (1 + std::abs(want[i])));
  EXPECT_EQ(t.dropped, 0.0);
  // Sigma is split evenly: row t of A and column t of B both have norm sqrt(sigma_t).
  for (std::int64_t p = 0; p < 5; ++p) {
    double na = 0, nb = 0;
    for (std::int64_t j = 0; j < shape.in; ++j) na += double(t.factors.a[p * shape.in + j]) * t.factors.a[p * shape.in + j];
    for (std::int64_t i = 0; i < shape.out; ++i) nb += double(t.factors.b[i * 9 + p]) * t.factors.b[i * 9 + p];
    EXPECT_NEAR(na, t.singular_values[p], 1e-5 * (1 + t.singular_values[p]));
    EXPECT_NEAR(nb, t.singular_values[p], 1e-5 * (1 + t.singular_values[p]));
  }
}

TEST(LoraAggregation, FedItWithOneClientReturnsThatClientsAdapters) {
  const auto x = random_adapter(4, 11);
  const auto m = lora::mean(std::vector<lora::adapter>{x}, std::vector<double>{37}, shape);
  EXPECT_EQ(m.rank, 4);
  EXPECT_EQ(m.a, x.a);
  EXPECT_EQ(m.b, x.b);
}

TEST(LoraAggregation, FedItAveragesAAndBSeparately) {
  const auto x = random_adapter(2, 12), y = random_adapter(2, 13);
  const auto m = lora::mean(std::vector<lora::adapter>{x, y}, std::vector<double>{1, 3}, shape);
  for (std::size_t i = 0; i < x.a.size(); ++i) EXPECT_FLOAT_EQ(m.a[i], 0.25f * x.a[i] + 0.75f * y.a[i]);
  for (std::size_t i = 0; i < x.b.size(); ++i) EXPECT_FLOAT_EQ(m.b[i], 0.25f * x.b[i] + 0.75f * y.b[i]);
}

TEST(LoraAggregation, FedItAndFedExRefuseMixedRanks) {
  const std::vector<lora::adapter> clients = {random_adapter(2, 14), random_adapter(4, 15)};
  const std::vector<double> w = {1, 1};
  EXPECT_THROW(lora::mean(clients, w, shape), std::invalid_argument);
  EXPECT_THROW(lora::fedex(clients, w, shape), std::invalid_argument);
  try {
    lora::mean(clients, w, shape);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("one rank"), std::string::npos) << e.what();
  }
}

TEST(LoraAggregation, HetLoraZeroPadsAndWeighsByTheProductsNorms) {
  const auto x = random_adapter(2, 16), y = random_adapter(4, 17);
  std::vector<double> w;
  const auto m = lora::hetlora(std::vector<lora::adapter>{x, y}, 4, shape, &w);
  const double nx = std::sqrt(squared_norm(lora::product(x, shape))), ny = std::sqrt(squared_norm(lora::product(y, shape)));
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NEAR(w[0], nx / (nx + ny), 1e-12);
  EXPECT_NEAR(w[1], ny / (nx + ny), 1e-12);
  EXPECT_EQ(m.rank, 4);
  for (std::int64_t t = 0; t < 4; ++t)
    for (std::int64_t j = 0; j < shape.in; ++j) {
      const double xa = t < 2 ? x.a[t * shape.in + j] : 0.0;  // x zero-padded past its rank
      EXPECT_NEAR(m.a[t * shape.in + j], w[0] * xa + w[1] * y.a[t * shape.in + j], 1e-5);
    }
  for (std::int64_t i = 0; i < shape.out; ++i)
    for (std::int64_t t = 0; t < 4; ++t) {
      const double xb = t < 2 ? x.b[i * 2 + t] : 0.0;
      EXPECT_NEAR(m.b[i * 4 + t], w[0] * xb + w[1] * y.b[i * 4 + t], 1e-5);
    }
  // Each client gets its first ranks back.
  const auto back = lora::resize(m, 2, shape);
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.a[shape.in + 3], m.a[shape.in + 3]);
  EXPECT_EQ(back.b[5 * 2 + 1], m.b[5 * 4 + 1]);
}

TEST(LoraAggregation, RanksAndRulesAreParsedOrRefusedByName) {
  EXPECT_EQ(lora::parse_ranks("4"), (std::vector<std::int64_t>{4}));
  EXPECT_EQ(lora::parse_ranks("2,4,8"), (std::vector<std::int64_t>{2, 4, 8}));
  for (const char* bad : {"", "0", "2,,4", "x", "4,", "-2", "5000", "2.5"})
    EXPECT_THROW(lora::parse_ranks(bad), std::invalid_argument) << bad;
  EXPECT_EQ(lora::parse_rule("flexlora"), lora::rule::flexlora);
  EXPECT_THROW(lora::parse_rule("fedavg"), std::invalid_argument);
}
