#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <random>

#include <troupe/kernels/gemm.hpp>
#include <troupe/kernels/layers.hpp>

#include "dynamic_library.hpp"

namespace {

using namespace troupe;
using namespace troupe::kernels;

tensor random_tensor(tensor::shape_type shape, std::mt19937& rng, float lo = -1, float hi = 1) {
  auto t = tensor::empty(std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& v : t.data<float>()) v = u(rng);
  return t;
}

TEST(Gemm, MatchesTheReferenceForEveryTransposition) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_int_distribution<int> size(1, 40);
    const int m = size(rng), n = size(rng), k = size(rng);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        auto a = random_tensor(ta ? tensor::shape_type{k, m} : tensor::shape_type{m, k}, rng);
        auto b = random_tensor(tb ? tensor::shape_type{n, k} : tensor::shape_type{k, n}, rng);
        auto c0 = random_tensor({m, n}, rng);
        auto c1 = c0.clone();
        gemm(a, ta, b, tb, c0, 0.5f, 0.25f);
        gemm_reference(a, ta, b, tb, c1, 0.5f, 0.25f);
        auto x = c0.data<float>();
        auto y = c1.data<float>();
        for (std::size_t i = 0; i < x.size(); ++i)
          ASSERT_NEAR(x[i], y[i], 1e-5 + 1e-5 * std::abs(y[i])) << m << "x" << n << "x" << k;
      }
  }
  auto a = tensor::zeros({2, 3}), b = tensor::zeros({4, 5}), c = tensor::zeros({2, 5});
  EXPECT_THROW(gemm(a, false, b, false, c), std::invalid_argument);
}

/// sum(r * f(x)) in double: a scalar loss with d loss / d y = r.
double projected(layer& l, const tensor& x, const tensor& r) {
  saved_activations keep;
  tensor y = l.forward(x, keep, false);
  double s = 0;
  auto yd = y.data<float>();
  auto rd = r.data<float>();
  for (std::size_t i = 0; i < yd.size(); ++i) s += static_cast<double>(yd[i]) * rd[i];
  return s;
}

/// Checks both split halves against central differences of `projected`, element by element.
void check_gradients(layer& l, tensor x, std::mt19937& rng, double h = 1e-2, double tol = 2e-2) {
  saved_activations keep;
  tensor y = l.forward(x, keep, false);
  tensor r = random_tensor(y.shape(), rng);
  for (auto* p : l.parameters()) for (float& g : p->grad.data<float>()) g = 0;
  tensor dx = l.backward_input(r, keep);
  l.backward_weight(r, keep);
  EXPECT_EQ(keep.bytes(), 0u) << l.describe() << " keeps activations after backward_weight";

  auto fd = [&](float& v) {
    const float saved = v;
    v = saved + static_cast<float>(h);
    const double up = projected(l, x, r);
    v = saved - static_cast<float>(h);
    const double down = projected(l, x, r);
    v = saved;
    return (up - down) / (2 * h);
  };
  auto xd = x.data<float>();
  auto dxd = dx.data<float>();
  for (std::size_t i = 0; i < xd.size(); ++i) {
    const double numeric = fd(xd[i]);
    EXPECT_NEAR(dxd[i], numeric, tol * (1 + std::abs(numeric))) << l.describe() << " dx[" << i << "]";
  }
  for (auto* p : l.parameters()) {
    auto v = p->value.data<float>();
    auto g = p->grad.data<float>();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double numeric = fd(v[i]);
      EXPECT_NEAR(g[i], numeric, tol * (1 + std::abs(numeric))) << l.describe() << " " << p->name << "[" << i << "]";
    }
  }
}

/// Inputs away from ReLU's kink, so that finite differences are meaningful.
tensor away_from_zero(tensor x) {
  for (float& v : x.data<float>())
    if (std::abs(v) < 0.1f) v = v < 0 ? -0.1f - v : 0.1f + v;
  return x;
}

TEST(Gemm, LibrariesLoadFromTheVariableTheBuildPathOrTheirName) {
  // How OpenBLAS and cuBLAS are found (a build moved to another machine must find them there),
  // shown with zlib, which every troupe process has loaded already.
  using troupe::kernels::detail::open_library;
  const char* var = "TROUPE_TEST_LIBRARY";
  unsetenv(var);
  EXPECT_NE(open_library("zlib", var, "/nonexistent/libz.so.1", {"libnonexistent.so", "libz.so.1"}, ""), nullptr);
  try {
    open_library("zlib", var, "/nonexistent/libz.so.1", {"libnonexistent.so"}, "install zlib");
    ADD_FAILURE() << "loaded a library that does not exist";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/libz.so.1"), std::string::npos) << what;
    EXPECT_NE(what.find("libnonexistent.so"), std::string::npos) << what;
    EXPECT_NE(what.find("install zlib"), std::string::npos) << what;
  }
  // A set variable wins over the build's path, and one that does not load is an error, not a
  // quiet fallback.
  setenv(var, "/nonexistent/chosen.so", 1);
  try {
    open_library("zlib", var, "libz.so.1", {"libz.so.1"}, "");
    ADD_FAILURE() << "fell back past the variable";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("TROUPE_TEST_LIBRARY=/nonexistent/chosen.so"), std::string::npos) << e.what();
  }
  setenv(var, "libz.so.1", 1);
  EXPECT_NE(open_library("zlib", var, "/nonexistent/libz.so.1", {}, ""), nullptr);
  unsetenv(var);
}

TEST(Layers, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(2);
  auto lin = make_linear(5, 4);
  lin->initialize(3);
  check_gradients(*lin, random_tensor({3, 5}, rng), rng);
  check_gradients(*make_relu(), away_from_zero(random_tensor({3, 6}, rng)), rng);
  check_gradients(*make_gelu(), random_tensor({3, 6}, rng, -3, 3), rng);
  auto ln = make_layer_norm(6);
  for (auto* p : ln->parameters()) p->value = random_tensor(p->value.shape(), rng, 0.5f, 1.5f);
  check_gradients(*ln, random_tensor({4, 6}, rng), rng, 1e-2, 3e-2);
  auto mlp = make_mlp("mlp:6-5-3");
  mlp->initialize(4);
  check_gradients(*mlp, random_tensor({4, 6}, rng), rng);
  auto res = make_residual(make_mlp("mlp:4-7-4"));
  res->initialize(5);
  check_gradients(*res, random_tensor({2, 4}, rng), rng);
}

TEST(Layers, TheSplitHalvesTogetherEqualTheFullBackward) {
  std::mt19937 rng(3);
  auto a = make_mlp("mlp:8-6-4");
  auto b = make_mlp("mlp:8-6-4");
  a->initialize(9);
  b->initialize(9);
  auto x = random_tensor({5, 8}, rng);
  saved_activations ka, kb;
  auto ya = a->forward(x, ka, true), yb = b->forward(x, kb, true);
  auto dy = random_tensor(ya.shape(), rng);
  auto dxa = a->backward(dy, ka);
  auto dxb = b->backward_input(dy, kb);
  EXPECT_GT(kb.bytes(), 0u);  // the linear layers' inputs wait for backward_weight
  b->backward_weight(dy, kb);
  EXPECT_EQ(std::memcmp(dxa.bytes(), dxb.bytes(), dxa.nbytes()), 0);
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(std::memcmp(pa[i]->grad.bytes(), pb[i]->grad.bytes(), pa[i]->grad.nbytes()), 0);
}

TEST(Layers, ActivationMemoryIsHeldUntilTheWeightGradient) {
  auto lin = make_linear(10, 3);
  auto x = tensor::zeros({4, 10});
  saved_activations keep;
  auto y = lin->forward(x, keep, true);
  EXPECT_EQ(keep.bytes(), x.nbytes());
  auto dy = tensor::zeros(y.shape());
  lin->backward_input(dy, keep);
  EXPECT_EQ(keep.bytes(), x.nbytes());  // x is needed by backward_weight
  lin->backward_weight(dy, keep);
  EXPECT_EQ(keep.bytes(), 0u);
  auto relu = make_relu();
  saved_activations k2;
  relu->forward(x, k2, true);
  relu->backward_input(tensor::zeros({4, 10}), k2);
  EXPECT_EQ(k2.bytes(), 0u);  // nothing for W
}

TEST(Layers, DropoutIsSeededAndScales) {
  auto d1 = make_dropout(0.5f), d2 = make_dropout(0.5f);
  d1->initialize(7);
  d2->initialize(7);
  auto x = tensor::zeros({10, 100});
  for (float& v : x.data<float>()) v = 1;
  saved_activations k1, k2;
  auto y1 = d1->forward(x, k1, true), y2 = d2->forward(x, k2, true);
  EXPECT_EQ(std::memcmp(y1.bytes(), y2.bytes(), y1.nbytes()), 0);
  int zeros = 0;
  for (float v : y1.data<float>()) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f);
    zeros += v == 0.0f;
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  saved_activations k3;
  auto eval = d1->forward(x, k3, false);
  EXPECT_EQ(eval.bytes(), x.bytes());
  EXPECT_THROW(make_dropout(1.0f), std::invalid_argument);
  // The backward draws the forward's mask again (it keeps 8 bytes per dimension and which
  // forward it was, not the mask), also after later forwards.
  EXPECT_EQ(k1.bytes(), 3 * sizeof(std::int64_t));
  saved_activations later;
  d1->forward(x, later, true);
  const tensor dx = d1->backward_input(x, k1);
  EXPECT_EQ(std::memcmp(dx.bytes(), y1.bytes(), y1.nbytes()), 0);
  EXPECT_THROW(d1->backward_input(tensor::zeros({10, 99}), later), std::invalid_argument);
  // Each forward draws a fresh mask; a NaN input stays NaN where its unit is dropped.
  const tensor y3 = d1->forward(x, later, true);
  EXPECT_NE(std::memcmp(y1.bytes(), y3.bytes(), y1.nbytes()), 0);
  auto nan = tensor::zeros({10, 100});
  for (float& v : nan.data<float>()) v = std::numeric_limits<float>::quiet_NaN();
  const tensor y_nan = d1->forward(nan, later, true);
  for (float v : y_nan.data<float>()) EXPECT_TRUE(std::isnan(v));
}

// Activation checkpointing replays a forward: the saved random state draws the same masks again.
TEST(Layers, ASavedRandomStateReplaysTheSameDropoutMasks) {
  sequential s;
  s.add(make_linear(6, 8));
  s.add(make_dropout(0.4f));
  s.add(make_residual(make_dropout(0.2f)));
  s.initialize(3);
  tensor x = tensor::zeros({5, 6});
  auto xd = x.data<float>();
  for (std::size_t i = 0; i < xd.size(); ++i) xd[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<std::string> state;
  s.save_random_state(state);
  ASSERT_EQ(state.size(), 2u);  // one per dropout, the one inside the residual too
  saved_activations k1, k2, k3;
  const tensor y1 = s.forward(x, k1, true);
  const tensor y2 = s.forward(x, k2, true);  // fresh masks
  EXPECT_NE(std::memcmp(y1.bytes(), y2.bytes(), y1.nbytes()), 0);
  std::size_t next = 0;
  s.load_random_state(state, next);
  EXPECT_EQ(next, state.size());
  const tensor y3 = s.forward(x, k3, true);
  EXPECT_EQ(std::memcmp(y1.bytes(), y3.bytes(), y1.nbytes()), 0);

  // A bad or missing entry is refused and changes nothing.
  std::vector<std::string> after;
  s.save_random_state(after);
  std::vector<std::string> bad{state[0], "not a generator"};
  next = 0;
  EXPECT_THROW(s.load_random_state(bad, next), std::invalid_argument);
  EXPECT_EQ(next, 0u);
  for (const char* wrong : {"dropout", "dropout 1", "dropout 1 ", "dropout x 2", "dropout 1 2 3", "dropout -1 2",
                            "dropout 1 99999999999999999999", "1 2", " dropout 1 2"}) {
    std::vector<std::string> one{state[0], wrong};
    EXPECT_THROW(s.load_random_state(one, next), std::invalid_argument) << wrong;
    EXPECT_EQ(next, 0u);
  }
  EXPECT_LT(state[0].size(), 48u);  // two numbers, not a generator's 312 words
  std::vector<std::string> short_one{state[0]};
  EXPECT_THROW(s.load_random_state(short_one, next), std::invalid_argument);
  std::vector<std::string> unchanged;
  s.save_random_state(unchanged);
  EXPECT_EQ(unchanged, after);
  // Layers that draw nothing save nothing.
  std::vector<std::string> none;
  make_linear(2, 2)->save_random_state(none);
  EXPECT_TRUE(none.empty());
}

TEST(Layers, ABackwardNeedsItsForwardAndItsBatch) {
  // Dropout: a second backward (or one without a forward) is refused, as for every layer; in
  // evaluation mode the backward is the identity, once.
  auto d = make_dropout(0.5f);
  const tensor ones = tensor::from<float>({1, 1, 1, 1, 1, 1, 1, 1}, {2, 4});
  saved_activations k;
  EXPECT_THROW(d->backward(ones, k), std::logic_error);
  d->forward(ones, k, true);
  (void)d->backward(ones, k);
  EXPECT_THROW(d->backward(ones, k), std::logic_error);
  d->forward(ones, k, false);
  EXPECT_EQ(d->backward(ones, k).data<float>()[0], 1.0f);
  EXPECT_THROW(d->backward(ones, k), std::logic_error);
  // Linear: a gradient for another number of rows than the forward had.
  auto l = make_linear(4, 3);
  saved_activations kl;
  l->forward(tensor::zeros({2, 4}), kl, true);
  EXPECT_THROW(l->backward_input(tensor::zeros({5, 3}), kl), std::invalid_argument);
  EXPECT_THROW(l->backward_weight(tensor::zeros({5, 3}), kl), std::invalid_argument);
  EXPECT_EQ(l->backward(tensor::zeros({2, 3}), kl).dim(0), 2);
}

// make_layer reads back what describe() writes, exactly (numbers included), and nothing else.
TEST(Layers, MakeLayerRebuildsWhatDescribeWrites) {
  sequential s;
  s.add(make_linear(6, 8));
  s.add(make_layer_norm(8, 1e-6f));
  s.add(make_gelu());
  s.add(make_dropout(0.123456789f));
  auto inner = std::make_unique<sequential>();
  inner->add(make_layer_norm(8));
  inner->add(make_relu());
  s.add(make_residual(std::move(inner)));
  s.add(make_residual(make_dropout(0.3f)));
  s.add(std::make_unique<sequential>());
  s.add(make_linear(8, 3));
  const std::string d = s.describe();
  EXPECT_EQ(d,
            "sequential(linear(6->8), layer_norm(8, eps=1e-06), gelu, dropout(0.12345679), "
            "residual(sequential(layer_norm(8), relu)), residual(dropout(0.3)), sequential(), linear(8->3))");
  auto back = make_layer(d);
  EXPECT_EQ(back->describe(), d);
  EXPECT_EQ(back->parameters().size(), s.parameters().size());
  EXPECT_EQ(make_layer("relu")->describe(), "relu");
  // parameter_count counts what make_layer would build, without building it.
  std::int64_t held = 0;
  for (const auto* p : back->parameters()) held += static_cast<std::int64_t>(p->value.numel());
  EXPECT_EQ(parameter_count(d), held);
  EXPECT_EQ(parameter_count("relu"), 0);
  EXPECT_EQ(parameter_count("sequential(linear(1048576->255))"), 267387135);
  EXPECT_THROW(parameter_count("conv(3)"), std::invalid_argument);

  for (const char* bad : {"", "relu ", "linear(0->3)", "linear(3->)", "linear(2000000->1)", "linear(1048576->1048576)",
                          "dropout(1)", "dropout(nan)", "layer_norm(4, eps=0)", "sequential(relu,gelu)",
                          "sequential(relu", "residual()", "conv(3)", "Relu"}) {
    EXPECT_THROW(make_layer(bad), std::invalid_argument) << bad;
  }
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "residual(";
  deep += "relu" + std::string(100, ')');
  try {
    make_layer(deep);
    ADD_FAILURE() << "nesting 100 deep was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nested more than 64 deep"), std::string::npos) << e.what();
  }
  // Each layer within the limit, the whole not: refused before anything is allocated (54 bytes
  // of text used to allocate 6 GB, the second layer being refused only after the first was made).
  try {
    make_layer("sequential(linear(16384->8192), layer_norm(8), linear(16384->8192))");
    ADD_FAILURE() << "2^28 parameters and more were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 268435456 parameters in all"), std::string::npos) << e.what();
  }
}

std::vector<std::string> names_of(layer& l) {
  std::vector<std::string> out;
  for (const auto* p : l.parameters()) out.push_back(p->name);
  return out;
}

TEST(Layers, ParametersAreNamedByTheirPathAsPyTorchNamesThem) {
  auto mlp = make_mlp("mlp:12-8-6-3");
  EXPECT_EQ(names_of(*mlp), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  auto nested = make_layer("sequential(layer_norm(4), residual(sequential(relu, linear(4->4))), linear(4->2))");
  EXPECT_EQ(names_of(*nested),
            (std::vector<std::string>{"0.gamma", "0.beta", "1.1.weight", "1.1.bias", "2.weight", "2.bias"}));
  // A layer alone keeps the name its kind gives it.
  auto alone = make_linear(2, 2);
  EXPECT_EQ(names_of(*alone), (std::vector<std::string>{"weight", "bias"}));
}

TEST(Loss, SoftmaxCrossEntropyMatchesItsDefinitionAndGradient) {
  auto logits = tensor::from<float>({1, 2, 3, 0, 0, 0}, {2, 3});
  auto labels = tensor::from<std::int64_t>({2, 0}, {2});
  tensor d;
  const double loss = softmax_cross_entropy(logits, labels, d);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double l1 = std::log(3.0);
  EXPECT_NEAR(loss, (l0 + l1) / 2, 1e-6);
  EXPECT_NEAR(d.data<float>()[3], (1.0 / 3 - 1) / 2, 1e-6);
  EXPECT_EQ(count_correct(logits, labels), 2);  // row 1 ties: the first class wins
  auto bad = tensor::from<std::int64_t>({3, 0}, {2});
  EXPECT_THROW(softmax_cross_entropy(logits, bad, d), std::invalid_argument);
  // count_correct checks what the loss checks: labels per row, in range, logits with classes.
  EXPECT_THROW(count_correct(logits, bad), std::invalid_argument);
  EXPECT_THROW(count_correct(logits, tensor::from<std::int64_t>({0}, {1})), std::invalid_argument);
  EXPECT_THROW(count_correct(tensor::zeros({2, 0}), labels), std::invalid_argument);
}

TEST(Layers, RefuseNullLayersBadEpsAndAliasedProducts) {
  EXPECT_THROW(make_residual(nullptr), std::invalid_argument);
  sequential s;
  EXPECT_THROW(s.add(nullptr), std::invalid_argument);
  EXPECT_THROW(make_layer_norm(4, -1.0f), std::invalid_argument);
  EXPECT_THROW(make_layer_norm(4, std::nanf("")), std::invalid_argument);
  auto a = tensor::from<float>({1, 2, 3, 4}, {2, 2});
  auto eye = tensor::from<float>({1, 0, 0, 1}, {2, 2});
  EXPECT_THROW(gemm(a, false, eye, false, a), std::invalid_argument);  // C is A
  auto c = tensor::zeros({2, 2});
  gemm(a, false, eye, false, c);
  EXPECT_EQ(c.data<float>()[3], 4.0f);
}

TEST(Layers, MlpSpecsAreParsedOrRefused) {
  auto m = make_mlp("mlp:784-256-128-10");
  EXPECT_EQ(m->describe(), "sequential(linear(784->256), relu, linear(256->128), relu, linear(128->10))");
  EXPECT_EQ(m->parameters().size(), 6u);
  for (auto bad : {"mlp:", "mlp:784", "cnn:1-2", "mlp:784-x-10", "mlp:784-0-10"})
    EXPECT_THROW(make_mlp(bad), std::invalid_argument) << bad;
  EXPECT_THROW(m->forward(tensor::zeros({2, 783}), *std::make_unique<saved_activations>(), false),
               std::invalid_argument);
}

TEST(Mlp, SpecsAreDecimalSizesWithinLimits) {
  EXPECT_EQ(mlp_sizes("mlp:784-256-128-10"), (std::vector<std::int64_t>{784, 256, 128, 10}));
  for (const char* bad : {"mlp:", "mlp:784", "mlp:784-", "mlp:-784-10", "mlp: 784-10", "mlp:784-+10", "mlp:784-0-10",
                          "mlp:a-b", "mlp:784-2000000-10", "mlp:784-70000-70000-10", "mlp:99999999999999999999-1",
                          "784-10"})
    EXPECT_THROW(mlp_sizes(bad), std::invalid_argument) << bad;
  EXPECT_THROW(make_mlp("mlp:784-70000-70000-10"), std::invalid_argument);  // refused before allocating
}

}  // namespace
