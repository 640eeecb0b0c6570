// Split learning (vertical federated learning): one step's gradients against the block-diagonal
// whole model, the AUC routine of the label-leakage attack, training against the centralised
// model, and the refusals.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "support.hpp"
#include "troupe/federated/vertical.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;

std::vector<float> values(const tensor& t) { return {t.data<float>().begin(), t.data<float>().end()}; }

/// Whether two float vectors hold the same bits.
bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

/// Rows [first, first + rows) of the Fashion-MNIST subset, the features `features` of each, as
/// pixel / 256 (exact binary fractions) or normalized as training does.
tensor features_of(const std::vector<std::int64_t>& features, std::int64_t first, std::int64_t rows, bool dyadic) {
  const auto& d = *test_support::fashion();
  auto px = d.train.images.data<std::uint8_t>();
  tensor out = tensor::empty({rows, static_cast<std::int64_t>(features.size())});
  auto o = out.data<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < features.size(); ++j) {
      const std::uint8_t v = px[(first + r) * 784 + features[j]];
      o[r * features.size() + j] = dyadic ? v / 256.0f : (v / 255.0f - d.mean) / d.stddev;
    }
  return out;
}

/// Rounds a layer's parameters to multiples of 2^-10 (they stay in ±1/sqrt(392)).
void round_to_binary_fractions(kernels::sequential& m) {
  for (auto* p : m.parameters())
    for (float& v : p->value.data<float>()) v = std::ldexp(std::nearbyint(std::ldexp(v, 10)), -10);
}

struct step_gradients {
  std::vector<float> wa, ba, wb, bb;
  std::vector<std::vector<float>> top;
  double loss = 0;
};

/// One step of the split model and of the block-diagonal whole model from the same weights, on
/// rows [first, first + rows), gradients only.
std::pair<step_gradients, step_gradients> one_step(std::int64_t first, std::int64_t rows, bool dyadic) {
  const auto fs = split_features(*test_support::fashion());
  const auto shape = split_shape("mlp:784-64-32-10", 784);
  split_bottom a(shape.in_a, shape.cut, 11, 0.1), b(shape.in_b, shape.cut, 12, 0.1);
  split_top top(shape, 13, 0.1);
  if (dyadic) {
    round_to_binary_fractions(a.model());
    round_to_binary_fractions(b.model());
  }
  auto whole = block_diagonal_model(shape, a, b, top);
  const tensor xa = features_of(fs.a, first, rows, dyadic), xb = features_of(fs.b, first, rows, dyadic);
  const tensor labels = test_support::fashion()->train.labels.slice(first, first + rows);

  // The split model, as the parties run it.
  step_gradients split;
  auto out = top.forward_backward(concat_columns(a.forward(xa), b.forward(xb)), labels);
  a.backward(columns_of(out.dh, 0, shape.cut));
  b.backward(columns_of(out.dh, shape.cut, 2 * shape.cut));
  split.loss = out.loss_sum;
  split.wa = values(a.model().parameters()[0]->grad);
  split.ba = values(a.model().parameters()[1]->grad);
  split.wb = values(b.model().parameters()[0]->grad);
  split.bb = values(b.model().parameters()[1]->grad);
  for (auto* p : top.model().parameters()) split.top.push_back(values(p->grad));

  // The whole model on A's features then B's.
  step_gradients one;
  kernels::saved_activations keep;
  const tensor logits = whole->forward(concat_columns(xa, xb), keep, true);
  tensor dl;
  one.loss = kernels::softmax_cross_entropy(logits, labels, dl) * static_cast<double>(rows);
  whole->backward(dl, keep);
  auto wp = whole->parameters();
  const auto w = values(wp[0]->grad), bias = values(wp[1]->grad);
  const std::int64_t in = 784, c = shape.cut;
  for (std::int64_t i = 0; i < c; ++i) {
    one.wa.insert(one.wa.end(), w.begin() + i * in, w.begin() + i * in + 392);
  }
  for (std::int64_t i = 0; i < c; ++i) one.wb.insert(one.wb.end(), w.begin() + (c + i) * in + 392, w.begin() + (c + i + 1) * in);
  one.ba.assign(bias.begin(), bias.begin() + c);
  one.bb.assign(bias.begin() + c, bias.end());
  for (std::size_t k = 2; k < wp.size(); ++k) one.top.push_back(values(wp[k]->grad));
  return {split, one};
}

TEST(SplitNn, OneStepsGradientsEqualTheBlockDiagonalModelsBitForBit) {
  // Why the float operations are the same. The top model sees the same input in both (the two
  // cut layers side by side are the whole model's first-layer output) and is the same layers
  // with the same shapes, so its products are the same calls on the same bits. The first
  // layer's forward differs in shape: the whole model sums 784 products per unit where a bottom
  // sums 392, and a BLAS blocks and orders such sums by their length. With the pixels as
  // x / 256 and the weights and biases rounded to multiples of 2^-10, every product is a
  // multiple of 2^-18 below 2^-4 and every partial sum (bias included) stays below 2^5: all
  // are exact in a float, so the sum is the same in any order and the whole model's 392 zero
  // products add exact zeros. The ReLU, the column split and the bias gradients (a plain loop
  // over the rows) are elementwise or in the same order. The first layer's weight gradient
  // sums over the batch rows, and how a BLAS orders that sum depends on the matrix's other
  // sizes (OpenBLAS's Haswell kernels differ there, its SkylakeX ones do not): with one row it
  // is a single product, the same bits on any BLAS; with 32 rows it is compared within float
  // rounding.
  for (std::int64_t example : {100, 101, 250, 777, 1234, 2999}) {
    const auto [split, one] = one_step(example, 1, true);
    EXPECT_EQ(split.loss, one.loss) << "example " << example;
    EXPECT_TRUE(same_bits(split.wa, one.wa)) << "example " << example;
    EXPECT_TRUE(same_bits(split.ba, one.ba)) << "example " << example;
    EXPECT_TRUE(same_bits(split.wb, one.wb)) << "example " << example;
    EXPECT_TRUE(same_bits(split.bb, one.bb)) << "example " << example;
    ASSERT_EQ(split.top.size(), one.top.size());
    for (std::size_t k = 0; k < split.top.size(); ++k) EXPECT_TRUE(same_bits(split.top[k], one.top[k])) << "top parameter " << k;
    double norm = 0;  // the gradients are not trivially zero
    for (float v : split.wb) norm += v * v;
    EXPECT_GT(norm, 0);
  }
  const auto [split, one] = one_step(100, 32, true);
  EXPECT_EQ(split.loss, one.loss);
  EXPECT_TRUE(same_bits(split.ba, one.ba));
  EXPECT_TRUE(same_bits(split.bb, one.bb));
  for (std::size_t k = 0; k < split.top.size(); ++k) EXPECT_TRUE(same_bits(split.top[k], one.top[k])) << "top parameter " << k;
  for (std::size_t i = 0; i < split.wa.size(); ++i) EXPECT_NEAR(split.wa[i], one.wa[i], 1e-7 + 1e-5 * std::fabs(one.wa[i]));
  for (std::size_t i = 0; i < split.wb.size(); ++i) EXPECT_NEAR(split.wb[i], one.wb[i], 1e-7 + 1e-5 * std::fabs(one.wb[i]));
}

TEST(SplitNn, GradientsAgreeWithTheBlockDiagonalModelOnNormalizedPixels) {
  // Without the exact fractions the first layer's sums round in another order: equal within
  // float rounding.
  const auto [split, one] = one_step(200, 32, false);
  auto close = [](const std::vector<float>& x, const std::vector<float>& y) {
    ASSERT_EQ(x.size(), y.size());
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-6 + 1e-4 * std::fabs(y[i])) << i;
  };
  close(split.wa, one.wa);
  close(split.wb, one.wb);
  close(split.bb, one.bb);
  for (std::size_t k = 0; k < split.top.size(); ++k) close(split.top[k], one.top[k]);
}

TEST(RocAuc, GivesTheKnownValues) {
  const std::vector<std::uint8_t> l = {0, 0, 1, 1};
  EXPECT_EQ(roc_auc(std::vector<double>{1, 2, 3, 4}, l), 1.0);
  EXPECT_EQ(roc_auc(std::vector<double>{4, 3, 2, 1}, l), 0.0);
  EXPECT_EQ(roc_auc(std::vector<double>{5, 5, 5, 5}, l), 0.5);
  // Positives 0.35 and 0.8 against negatives 0.1 and 0.4: three of four pairs ordered right.
  EXPECT_EQ(roc_auc(std::vector<double>{0.1, 0.4, 0.35, 0.8}, l), 0.75);
  // A tie between a positive and a negative counts one half: (0.5 + 1) / 2.
  EXPECT_EQ(roc_auc(std::vector<double>{1, 1, 2}, std::vector<std::uint8_t>{1, 0, 1}), 0.75);
}

TEST(RocAuc, EqualsThePairCountOnRandomScoresWithTies) {
  std::mt19937_64 g(7);
  std::vector<double> s(500);
  std::vector<std::uint8_t> l(500);
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<double>(g() % 40);  // many ties
    l[i] = g() % 3 == 0;
  }
  double pairs = 0, wins = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < s.size(); ++j)
      if (l[i] && !l[j]) {
        pairs += 1;
        wins += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
      }
  EXPECT_NEAR(roc_auc(s, l), wins / pairs, 1e-12);
}

TEST(RocAuc, RefusesMismatchedOrOneClassLabels) {
  expect_error<std::invalid_argument>([] { roc_auc(std::vector<double>{1, 2}, std::vector<std::uint8_t>{1}); }, "labels");
  expect_error<std::invalid_argument>([] { roc_auc(std::vector<double>{1, 2}, std::vector<std::uint8_t>{1, 1}); },
                                      "both a positive and a negative");
  expect_error<std::invalid_argument>([] { roc_auc(std::vector<double>{NAN, 2}, std::vector<std::uint8_t>{0, 1}); }, "NaN");
}

TEST(SplitShape, RefusesModelsThatDoNotSplit) {
  expect_error<std::invalid_argument>([] { split_shape("sequential(linear(784->10))", 784); }, "needs an MLP");
  expect_error<std::invalid_argument>([] { split_shape("mlp:784-10", 784); }, "hidden layer");
  expect_error<std::invalid_argument>([] { split_shape("mlp:784-33-10", 784); }, "even");
  expect_error<std::invalid_argument>([] { split_shape("mlp:100-32-10", 784); }, "784 features");
  const auto s = split_shape("mlp:784-100-10", 784);
  EXPECT_EQ(s.in_a, 392);
  EXPECT_EQ(s.cut, 50);
  EXPECT_EQ(s.top, "mlp:100-10");
}

TEST(Vertical, SplitsEachImagesColumnsInHalves) {
  const auto fs = split_features(*test_support::fashion());
  ASSERT_EQ(fs.a.size(), 392u);
  ASSERT_EQ(fs.b.size(), 392u);
  EXPECT_EQ(fs.a[0], 0);
  EXPECT_EQ(fs.a[13], 13);
  EXPECT_EQ(fs.a[14], 28);
  EXPECT_EQ(fs.b[0], 14);
  EXPECT_EQ(fs.b.back(), 783);
}

TEST(Vertical, TrainsOnTheIntersectionWithinOnePointOfCentralisedTraining) {
  vertical_options o;
  o.model = "mlp:784-64-10";
  o.epochs = 2;
  o.batch = 10;
  o.train_limit = 3000;
  o.test_limit = 2000;
  o.seed = 3;
  o.threads = 2;
  const auto s = run_vertical(o);
  // Each party holds about 90% of the 3,000 examples, the intersection about 81%.
  EXPECT_NEAR(static_cast<double>(s.ids_a), 2700, 120);
  EXPECT_NEAR(static_cast<double>(s.psi_intersection), 2430, 150);
  EXPECT_LE(s.psi_intersection, std::min(s.ids_a, s.ids_b));
  EXPECT_EQ(s.psi_bytes, 64 * (s.ids_a + s.ids_b));
  // Per step: the batch positions (4 bytes a row), the activations and their gradient (32
  // floats a row each way).
  const double rows_per_step = 2.0 * static_cast<double>(s.psi_intersection) / static_cast<double>(s.steps);
  EXPECT_NEAR(s.bytes_per_step, rows_per_step * (4 + 2 * 32 * 4), 1e-6);
  EXPECT_GT(s.final_accuracy, 0.6);
  EXPECT_NEAR(s.final_accuracy, s.centralised_accuracy, 0.01);
  EXPECT_GE(s.label_leakage_auc, 0);
  EXPECT_LE(s.label_leakage_auc, 1);
  EXPECT_LT(s.label_leakage_auc_noised, 0);  // no noise, no second figure
  std::printf("split %.4f, centralised %.4f, norm attack AUC %.3f\n", s.final_accuracy, s.centralised_accuracy,
              s.label_leakage_auc);
}

TEST(Vertical, NoiseOnTheCutGradientsLowersTheNormAttacksAuc) {
  vertical_options o;
  o.model = "mlp:784-64-10";
  o.epochs = 1;
  o.train_limit = 3000;
  o.test_limit = 500;
  o.seed = 4;
  o.threads = 2;
  o.centralised = false;
  o.leakage_class = 6;  // shirts: the class the attack finds best here (their gradients are large)
  o.cut_noise = 0.5;
  const auto s = run_vertical(o);
  ASSERT_GE(s.label_leakage_auc_noised, 0);
  std::printf("norm attack AUC %.3f, with noise 0.5 on the cut gradients %.3f\n", s.label_leakage_auc, s.label_leakage_auc_noised);
  EXPECT_GT(s.label_leakage_auc, 0.6);
  EXPECT_LT(std::fabs(s.label_leakage_auc_noised - 0.5), 0.05);
  EXPECT_LT(s.centralised_accuracy, 0);  // not trained
}

TEST(Vertical, RefusesOptionsThatCannotRun) {
  vertical_options o;
  o.train_limit = 100;
  o.overlap = 0;
  expect_error<std::invalid_argument>([&] { run_vertical(o); }, "--vertical-overlap");
  o.overlap = 0.9;
  o.cut_noise = -1;
  expect_error<std::invalid_argument>([&] { run_vertical(o); }, "--cut-noise");
  o.cut_noise = 0;
  o.model = "mlp:784-33-10";
  expect_error<std::invalid_argument>([&] { run_vertical(o); }, "even");
  o.model = "mlp:784-32-10";
  o.leakage_class = 10;
  expect_error<std::invalid_argument>([&] { run_vertical(o); }, "--leakage-class");
}

}  // namespace
}  // namespace troupe::federated
