// The fast MLP step against its plain reference, and the reference against the kernels'
// layers and SGD (the definition of correctness for the layers).

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "mlp.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace {

using troupe::tensor;
using troupe::federated::detail::flat_mlp;
using troupe::federated::detail::gradient_extras;

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

std::vector<float> initial_weights(const std::string& spec, std::uint64_t seed) {
  auto m = troupe::kernels::make_mlp(spec);
  m->initialize(seed);
  std::vector<float> w;
  for (auto* p : m->parameters())
    for (float v : p->value.data<float>()) w.push_back(v);
  return w;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double abs, double rel) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << "at " << i << ": " << got[i] << " vs " << want[i];
}

TEST(FlatMlp, LaysOutParametersAsTheSequentialModelDoes) {
  flat_mlp net = flat_mlp::from_spec("mlp:784-100-10");
  EXPECT_EQ(net.dim(), 784u * 100 + 100 + 100 * 10 + 10);
  EXPECT_EQ(initial_weights("mlp:784-100-10", 3).size(), net.dim());
  EXPECT_THROW(flat_mlp::from_spec("cnn:1-2"), std::invalid_argument);
}

TEST(FlatMlp, ReferenceStepMatchesTheKernelsLayersAndSgd) {
  const std::string spec = "mlp:40-24-16-7";
  const int rows = 6;
  auto model = troupe::kernels::make_mlp(spec);
  model->initialize(11);
  flat_mlp net = flat_mlp::from_spec(spec);
  std::vector<float> w = initial_weights(spec, 11);
  troupe::kernels::hyperparameters hp;
  hp.lr = 0.1;
  troupe::kernels::optimizer sgd(troupe::kernels::optimizer_kind::sgd, {{model->parameters(), hp}});
  for (int step = 0; step < 4; ++step) {
    auto x = random_floats(static_cast<std::size_t>(rows) * 40, 100 + step);
    auto y = random_labels(rows, 7, 200 + step);
    tensor xt = tensor::from<float>(x, {rows, 40});
    tensor yt = tensor::from<std::uint8_t>(y, {rows});
    troupe::kernels::saved_activations keep;
    tensor dlogits;
    sgd.zero_grad();
    const double want_loss = troupe::kernels::softmax_cross_entropy(model->forward(xt, keep, true), yt, dlogits);
    model->backward(dlogits, keep);
    sgd.step();
    const double loss = net.step_reference(w.data(), x.data(), y.data(), rows, 0.1f);
    EXPECT_NEAR(loss / rows, want_loss, 1e-5);
  }
  std::vector<float> want;
  for (auto* p : model->parameters())
    for (float v : p->value.data<float>()) want.push_back(v);
  expect_close(w, want, 1e-5, 1e-4);
}

TEST(FlatMlp, FastStepMatchesTheReferenceWithAndWithoutExtras) {
  if (!flat_mlp::fast_available()) GTEST_SKIP() << "no AVX2 with FMA on this CPU";
  // Every instruction set this CPU has: AVX2, then AVX-512 where present.
  struct restore {
    int cap;
    ~restore() { flat_mlp::limit_simd(cap); }
  } restore_cap{flat_mlp::limit_simd(2)};
  const int best = flat_mlp::simd_level();
  for (int level = 1; level <= best; ++level) {
    flat_mlp::limit_simd(level);
    // 784 and 100 inputs: full vectors; 37 and 19: masked tails; 7: only a tail.
    for (const std::string spec : {"mlp:784-100-10", "mlp:37-19-5", "mlp:50-33-21-10", "mlp:7-40-3"}) {
      flat_mlp fast = flat_mlp::from_spec(spec), ref = flat_mlp::from_spec(spec);
      const int in = fast.inputs();
      for (int rows : {1, 7, 10, 16, 17, 32, 45}) {  // above 16: backward tiles
        for (int mode = 0; mode < 3; ++mode) {
          std::vector<float> wf = initial_weights(spec, 5), wr = wf;
          const auto center = random_floats(wf.size(), 9, 0.1f);
          const auto correction = random_floats(wf.size(), 10, 0.01f);
          gradient_extras extras;
          if (mode == 1) extras = {.mu = 0.3f, .center = center.data()};
          if (mode == 2) extras = {.mu = 0.0f, .center = nullptr, .correction = correction.data()};
          for (int step = 0; step < 5; ++step) {
            auto x = random_floats(static_cast<std::size_t>(rows) * in, 1000 + step);
            auto y = random_labels(rows, fast.outputs(), 2000 + step);
            const double lf = fast.step_fast(wf.data(), x.data(), y.data(), rows, 0.05f, extras);
            const double lr = ref.step_reference(wr.data(), x.data(), y.data(), rows, 0.05f, extras);
            EXPECT_NEAR(lf, lr, 1e-4 * rows) << spec << " rows " << rows << " mode " << mode;
          }
          SCOPED_TRACE(spec + " rows " + std::to_string(rows) + " mode " + std::to_string(mode) + " level " +
                       std::to_string(level));
          expect_close(wf, wr, 1e-5, 1e-4);
        }
      }
    }
  }
}

TEST(FlatMlp, ExtrasAddToEveryGradient) {
  // With a correction k, one step moves the weights by a further -lr * k; with a proximal
  // term centred on the weights themselves, it changes nothing.
  const std::string spec = "mlp:12-6-3";
  flat_mlp net = flat_mlp::from_spec(spec);
  const auto w0 = initial_weights(spec, 2);
  const auto x = random_floats(4 * 12, 3);
  const auto y = random_labels(4, 3, 4);
  const auto k = random_floats(w0.size(), 5, 0.5f);
  for (bool fast : {false, true}) {
    if (fast && !flat_mlp::fast_available()) continue;
    auto step = [&](std::vector<float>& w, const gradient_extras& e) {
      fast ? net.step_fast(w.data(), x.data(), y.data(), 4, 0.1f, e) : net.step_reference(w.data(), x.data(), y.data(), 4, 0.1f, e);
    };
    std::vector<float> plain = w0, corrected = w0, proximal = w0;
    step(plain, {});
    step(corrected, {.correction = k.data()});
    step(proximal, {.mu = 5.0f, .center = w0.data()});
    std::vector<float> want = plain;
    for (std::size_t i = 0; i < want.size(); ++i) want[i] -= 0.1f * k[i];
    expect_close(corrected, want, 1e-6, 1e-5);
    expect_close(proximal, plain, 1e-7, 1e-6);
  }
}

TEST(FlatMlp, EvaluateMatchesTheSequentialModel) {
  const std::string spec = "mlp:30-20-10";
  auto model = troupe::kernels::make_mlp(spec);
  model->initialize(4);
  flat_mlp net = flat_mlp::from_spec(spec);
  const auto w = initial_weights(spec, 4);
  const int rows = 53;  // several forward tiles and a partial one
  const auto x = random_floats(static_cast<std::size_t>(rows) * 30, 6, 2.0f);
  const auto y = random_labels(rows, 10, 7);
  double loss = 0;
  std::int64_t correct = 0;
  net.evaluate(w.data(), x.data(), y.data(), rows, loss, correct);
  troupe::kernels::saved_activations keep;
  tensor dl;
  tensor logits = model->forward(tensor::from<float>(x, {rows, 30}), keep, false);
  tensor yt = tensor::from<std::uint8_t>(y, {rows});
  EXPECT_NEAR(loss / rows, troupe::kernels::softmax_cross_entropy(logits, yt, dl), 1e-5);
  EXPECT_EQ(correct, troupe::kernels::count_correct(logits, yt));
}

}  // namespace
