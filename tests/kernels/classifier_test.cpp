// The classifier's fused MLP step against its reference (the kernels' layers, the gradient
// terms and the optimizer's SGD step), on fresh random data.

#include "troupe/kernels/classifier.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace {

using troupe::tensor;
using troupe::kernels::classifier;
using troupe::kernels::gradient_terms;
namespace k = troupe::kernels;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

std::vector<std::uint8_t> random_labels(std::size_t n, int classes, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(g() % static_cast<unsigned>(classes));
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double abs, double rel) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << "at " << i << ": " << got[i] << " vs " << want[i];
}

/// A model, its SGD optimizer and a classifier over them.
struct trained {
  std::unique_ptr<k::sequential> model;
  std::unique_ptr<k::optimizer> opt;
  std::unique_ptr<classifier> net;
  trained(const std::string& spec, std::uint64_t seed, double lr = 0.05, double momentum = 0) {
    model = spec.rfind("mlp:", 0) == 0 ? k::make_mlp(spec) : nullptr;
    if (!model) {
      model = std::make_unique<k::sequential>();
      model->add(k::make_layer(spec));
    }
    model->initialize(seed);
    k::hyperparameters hp;
    hp.lr = lr;
    hp.momentum = momentum;
    opt = std::make_unique<k::optimizer>(k::optimizer_kind::sgd, std::vector<k::param_group>{{model->parameters(), hp}});
    const std::int64_t in = model->parameters().front()->value.dim(model->parameters().front()->value.rank() - 1);
    net = std::make_unique<classifier>(*model, *opt, in);
  }
  std::vector<float> flat() const {
    std::vector<float> w(net->parameter_count());
    net->store_flat(w.data());
    return w;
  }
};

/// Restores the SIMD cap on leaving.
struct simd_cap {
  int saved = classifier::limit_simd(2);
  ~simd_cap() { classifier::limit_simd(saved); }
};

TEST(Classifier, LaysOutParametersAsTheSequentialModelDoes) {
  trained t("mlp:784-100-10", 3);
  EXPECT_EQ(t.net->parameter_count(), 784u * 100 + 100 + 100 * 10 + 10);
  EXPECT_EQ(t.net->inputs(), 784);
  EXPECT_EQ(t.net->classes(), 10);
  std::vector<float> want;
  for (auto* p : t.model->parameters())
    for (float v : p->value.data<float>()) want.push_back(v);
  EXPECT_EQ(t.flat(), want);
  auto changed = want;
  for (auto& v : changed) v += 1;
  t.net->load_flat(changed.data());
  EXPECT_EQ(t.flat(), changed);
  // The flat parameters are the parameters: writing them is writing the model's values.
  auto own = t.net->flat_parameters();
  ASSERT_EQ(own.size(), t.net->parameter_count());
  own[0] = 42.0f;
  own[own.size() - 1] = -7.0f;
  EXPECT_EQ(t.model->parameters().front()->value.data<float>()[0], 42.0f);
  EXPECT_EQ(t.model->parameters().back()->value.data<float>().back(), -7.0f);
  t.net->load_flat(own.data());  // itself: nothing to copy
  EXPECT_EQ(t.flat()[0], 42.0f);
}

TEST(Classifier, RefusesModelsThatDoNotFitTheInputs) {
  auto model = k::make_mlp("mlp:20-8-3");
  k::optimizer opt(k::optimizer_kind::sgd, {{model->parameters(), {}}});
  EXPECT_THROW(classifier(*model, opt, 21), std::invalid_argument);
  auto one = k::make_mlp("mlp:20-1");
  k::optimizer opt1(k::optimizer_kind::sgd, {{one->parameters(), {}}});
  EXPECT_THROW(classifier(*one, opt1, 20), std::invalid_argument);  // one class
}

TEST(Classifier, FusedStepAppliesOnlyToPlainSgdOverAnMlp) {
  simd_cap cap;
  if (classifier::simd_level() < 1) GTEST_SKIP() << "no AVX2 with FMA on this CPU";
  EXPECT_TRUE(trained("mlp:12-6-3", 1).net->fused_available());
  EXPECT_FALSE(trained("mlp:12-6-3", 1, 0.05, 0.9).net->fused_available());  // momentum keeps state
  EXPECT_FALSE(trained("sequential(linear(12->6), gelu, linear(6->3))", 1).net->fused_available());
  trained t("mlp:12-6-3", 1);
  t.opt->set_lr_schedule([](std::int64_t, double lr) { return lr; });
  EXPECT_FALSE(t.net->fused_available());
  classifier::limit_simd(0);
  EXPECT_FALSE(trained("mlp:12-6-3", 1).net->fused_available());
}

TEST(Classifier, FusedStepMatchesTheReferenceWithAndWithoutTerms) {
  simd_cap cap;
  const int best = classifier::simd_level();
  if (best < 1) GTEST_SKIP() << "no AVX2 with FMA on this CPU";
  for (int level = 1; level <= best; ++level) {
    classifier::limit_simd(level);
    // 784 and 100 inputs: full vectors; 37 and 19: masked tails; 7: only a tail.
    for (const std::string spec : {"mlp:784-100-10", "mlp:37-19-5", "mlp:50-33-21-10", "mlp:7-40-3"}) {
      for (int rows : {1, 7, 10, 16, 17, 32, 45}) {  // above 16: backward tiles
        for (int mode = 0; mode < 3; ++mode) {
          trained fused(spec, 5), ref(spec, 5);
          const int in = static_cast<int>(fused.net->inputs());
          const auto center = random_floats(fused.net->parameter_count(), 9, 0.1f);
          const auto correction = random_floats(fused.net->parameter_count(), 10, 0.01f);
          gradient_terms terms;
          if (mode == 1) terms = {.mu = 0.3f, .center = center.data()};
          if (mode == 2) terms = {.mu = 0.0f, .center = nullptr, .correction = correction.data()};
          for (int step = 0; step < 5; ++step) {
            auto x = random_floats(static_cast<std::size_t>(rows) * in, 1000 + step);
            auto y = random_labels(rows, static_cast<int>(fused.net->classes()), 2000 + step);
            const auto lf = fused.net->step_fused(x.data(), y.data(), rows, terms);
            const auto lr = ref.net->step_reference(x.data(), y.data(), rows, terms);
            EXPECT_TRUE(lf.applied && lr.applied);
            EXPECT_NEAR(lf.loss_sum, lr.loss_sum, 1e-4 * rows) << spec << " rows " << rows << " mode " << mode;
          }
          SCOPED_TRACE(spec + " rows " + std::to_string(rows) + " mode " + std::to_string(mode) + " level " +
                       std::to_string(level));
          expect_close(fused.flat(), ref.flat(), 1e-5, 1e-4);
          EXPECT_EQ(fused.opt->steps(), 5);
          EXPECT_EQ(ref.opt->steps(), 5);
        }
      }
    }
  }
}

TEST(Classifier, TermsAddToEveryGradient) {
  // With a correction k, one step moves the weights by a further -lr * k; with a proximal term
  // centred on the weights themselves, it changes nothing.
  simd_cap cap;
  const std::string spec = "mlp:12-6-3";
  const auto x = random_floats(4 * 12, 3);
  const auto y = random_labels(4, 3, 4);
  for (bool fused : {false, true}) {
    if (fused && classifier::simd_level() < 1) continue;
    auto after = [&](const gradient_terms& terms, bool centred_on_itself = false) {
      trained t(spec, 2, 0.1);
      gradient_terms tt = terms;
      const std::vector<float> w0 = t.flat();
      if (centred_on_itself) tt.center = w0.data();
      fused ? t.net->step_fused(x.data(), y.data(), 4, tt) : t.net->step_reference(x.data(), y.data(), 4, tt);
      return t.flat();
    };
    const auto k = random_floats(trained(spec, 2).net->parameter_count(), 5, 0.5f);
    const auto plain = after({});
    const auto corrected = after({.correction = k.data()});
    const auto proximal = after({.mu = 5.0f}, true);
    std::vector<float> want = plain;
    for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.1f * k[i];
    expect_close(corrected, want, 1e-6, 1e-5);
    expect_close(proximal, plain, 1e-7, 1e-6);
  }
}

TEST(Classifier, ANonFiniteStepChangesNothingOnEitherPath) {
  simd_cap cap;
  for (bool fused : {false, true}) {
    if (fused && classifier::simd_level() < 1) continue;
    trained t("mlp:12-6-3", 2);
    const auto before = t.flat();
    auto x = random_floats(4 * 12, 3);
    x[5] = std::numeric_limits<float>::infinity();
    const auto y = random_labels(4, 3, 4);
    const auto r = fused ? t.net->step_fused(x.data(), y.data(), 4) : t.net->step_reference(x.data(), y.data(), 4);
    EXPECT_FALSE(r.applied);
    EXPECT_EQ(t.flat(), before);
    EXPECT_EQ(t.opt->skipped(), 1);
    EXPECT_EQ(t.opt->steps(), 0);
  }
}

TEST(Classifier, StepsAnyModelTheLayersBuild) {
  // A model the fused step does not take goes through the reference: its loss falls.
  trained t("sequential(linear(12->16), gelu, layer_norm(16), linear(16->3))", 7, 0.1);
  EXPECT_FALSE(t.net->fused_available());
  const auto x = random_floats(8 * 12, 11);
  const auto y = random_labels(8, 3, 12);
  const double first = t.net->step(x.data(), y.data(), 8).loss_sum;
  double last = first;
  for (int i = 0; i < 50; ++i) last = t.net->step(x.data(), y.data(), 8).loss_sum;
  EXPECT_LT(last, first * 0.5);
}

TEST(Classifier, EvaluateMatchesTheSequentialModel) {
  simd_cap cap;
  for (int level : {0, 2}) {
    classifier::limit_simd(level);
    trained t("mlp:30-20-10", 4);
    const int rows = 53;  // several forward tiles and a partial one
    const auto x = random_floats(static_cast<std::size_t>(rows) * 30, 6, 2.0f);
    const auto y = random_labels(rows, 10, 7);
    double loss = 0;
    std::int64_t correct = 0;
    t.net->evaluate(x.data(), y.data(), rows, loss, correct);
    k::saved_activations keep;
    tensor dl;
    tensor logits = t.model->forward(tensor::from<float>(x, {rows, 30}), keep, false);
    tensor yt = tensor::from<std::uint8_t>(y, {rows});
    EXPECT_NEAR(loss / rows, k::softmax_cross_entropy(logits, yt, dl), 1e-5);
    EXPECT_EQ(correct, k::count_correct(logits, yt));
  }
}

}  // namespace
