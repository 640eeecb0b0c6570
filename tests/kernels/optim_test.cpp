#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <troupe/kernels/optim.hpp>

#include "quantize.hpp"

namespace {

using namespace troupe;
using namespace troupe::kernels;

struct fixture {
  std::vector<parameter> params;
  explicit fixture(std::uint32_t seed, std::vector<std::int64_t> sizes = {1, 1000, 4099}) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 1);
    for (auto size : sizes) {
      parameter p{"p" + std::to_string(size), tensor::empty({size}), tensor::empty({size})};
      for (float& v : p.value.data<float>()) v = n(rng);
      params.push_back(std::move(p));
    }
  }
  std::vector<parameter*> ptrs() {
    std::vector<parameter*> out;
    for (auto& p : params) out.push_back(&p);
    return out;
  }
  void fresh_grads(std::mt19937& rng) {
    std::normal_distribution<float> n(0, 1);
    for (auto& p : params)
      for (float& g : p.grad.data<float>()) g = n(rng);
  }
};

struct config {
  const char* name;
  optimizer_kind kind;
  hyperparameters hp;
};

std::vector<config> configs() {
  return {
      {"sgd", optimizer_kind::sgd, {.lr = 0.1}},
      {"sgd momentum dampening wd", optimizer_kind::sgd,
       {.lr = 0.05, .weight_decay = 0.01, .momentum = 0.9, .dampening = 0.1}},
      {"sgd nesterov", optimizer_kind::sgd, {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
      {"adam", optimizer_kind::adam, {.lr = 1e-2}},
      {"adam l2 amsgrad", optimizer_kind::adam, {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true}},
      {"adamw", optimizer_kind::adamw, {.lr = 1e-2, .weight_decay = 0.01}},
      {"adamw amsgrad", optimizer_kind::adamw,
       {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05, .amsgrad = true}},
  };
}

TEST(Optimizer, FusedStepsEqualTheReferenceBitForBit) {
  for (const auto& c : configs()) {
    fixture a(11), b(11);
    optimizer fast(c.kind, {{a.ptrs(), c.hp}}), ref(c.kind, {{b.ptrs(), c.hp}});
    std::mt19937 ga(5), gb(5);
    for (int step = 0; step < 5; ++step) {
      a.fresh_grads(ga);
      b.fresh_grads(gb);
      ASSERT_TRUE(fast.step());
      ASSERT_TRUE(ref.reference_step());
    }
    for (std::size_t i = 0; i < a.params.size(); ++i)
      EXPECT_EQ(std::memcmp(a.params[i].value.bytes(), b.params[i].value.bytes(), a.params[i].value.nbytes()), 0)
          << c.name << " tensor " << i;
    EXPECT_EQ(fast.steps(), 5);
  }
}

TEST(Optimizer, AdamsFirstStepMovesByLrAgainstTheGradientsSign) {
  fixture f(3, {64});
  const auto before = f.params[0].value.clone();
  std::mt19937 g(1);
  f.fresh_grads(g);
  optimizer opt(optimizer_kind::adam, {{f.ptrs(), {.lr = 0.01}}});
  opt.step();
  auto p0 = before.data<float>();
  auto p1 = f.params[0].value.data<float>();
  auto gr = f.params[0].grad.data<float>();
  for (std::size_t i = 0; i < p0.size(); ++i)
    EXPECT_NEAR(p1[i] - p0[i], -0.01 * (gr[i] > 0 ? 1 : -1), 1e-6 + 1e-4 * 0.01);
}

TEST(Optimizer, SgdMomentumFollowsTheTorchRecurrence) {
  parameter p{"w", tensor::from<float>({1.0f}, {1}), tensor::from<float>({0.5f}, {1})};
  optimizer opt(optimizer_kind::sgd, {{{&p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5}}});
  double w = 1.0, buf = 0;
  for (int t = 1; t <= 4; ++t) {
    const double g = 0.5;
    buf = t == 1 ? g : 0.9 * buf + 0.5 * g;
    w -= 0.1 * buf;
    opt.step();
    EXPECT_NEAR(p.value.data<float>()[0], w, 1e-6) << "step " << t;
  }
}

TEST(Optimizer, ANonFiniteGradientSkipsTheStepAndChangesNothing) {
  fixture f(4);
  std::mt19937 g(2);
  f.fresh_grads(g);
  optimizer opt(optimizer_kind::adamw, {{f.ptrs(), {.lr = 1e-2, .weight_decay = 0.1}}});
  ASSERT_TRUE(opt.step());
  const auto snapshot = f.params[2].value.clone();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    f.fresh_grads(g);
    f.params[2].grad.data<float>()[4000] = bad;
    EXPECT_FALSE(opt.step());
  }
  EXPECT_EQ(opt.skipped(), 2);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(std::memcmp(snapshot.bytes(), f.params[2].value.bytes(), snapshot.nbytes()), 0);
  f.fresh_grads(g);
  EXPECT_TRUE(opt.step());
}

TEST(Optimizer, EveryVectorPathFindsANonFiniteGradientAnywhere) {
  // The finiteness check reads 64 (AVX-512) or 32 (AVX2) values per iteration, then the rest one
  // at a time, in pieces of 65536: a bad value in any of those places skips the step, and the
  // largest finite values, subnormals and negative zeros do not.
  struct restore {
    int cap;
    ~restore() { troupe::kernels::quant::limit_simd(cap); }
  } guard{troupe::kernels::quant::limit_simd(2)};
  const float inf = std::numeric_limits<float>::infinity();
  for (int level = troupe::kernels::quant::simd_level(); level >= 0; --level) {
    troupe::kernels::quant::limit_simd(level);
    for (std::int64_t size : {7, 200, 65536 + 100}) {
      fixture f(9, {size});
      std::mt19937 g(4);
      f.fresh_grads(g);
      optimizer opt(optimizer_kind::sgd, {{f.ptrs(), {.lr = 1e-3}}});
      float* grad = f.params[0].grad.data<float>().data();
      const std::string what = "level " + std::to_string(level) + ", size " + std::to_string(size);
      for (float fine : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                         std::numeric_limits<float>::denorm_min(), -0.0f}) {
        for (std::int64_t at : {std::int64_t{0}, size / 2, size - 1}) {
          const float keep = grad[at];
          grad[at] = fine;
          EXPECT_TRUE(opt.step()) << what << ", " << fine << " at " << at;
          grad[at] = keep;
        }
      }
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
        for (std::int64_t at : {0, 15, 16, 31, 32, 63, 64, 191, 192, 199, 65535, 65536, 65635}) {
          if (at >= size) continue;
          const float keep = grad[at];
          grad[at] = bad;
          EXPECT_FALSE(opt.step()) << what << ", " << bad << " at " << at;
          grad[at] = keep;
        }
      }
    }
  }
}

TEST(Optimizer, CountsItsStateBytesAndZeroesGradients) {
  fixture f(5, {100, 28});
  EXPECT_EQ(optimizer(optimizer_kind::adam, {{f.ptrs(), {}}}).state_bytes(), 2u * 128 * 4);
  EXPECT_EQ(optimizer(optimizer_kind::adamw, {{f.ptrs(), {.amsgrad = true}}}).state_bytes(), 3u * 128 * 4);
  EXPECT_EQ(optimizer(optimizer_kind::sgd, {{f.ptrs(), {}}}).state_bytes(), 0u);
  EXPECT_EQ(optimizer(optimizer_kind::sgd, {{f.ptrs(), {.momentum = 0.5}}}).state_bytes(), 128u * 4);
  optimizer opt(optimizer_kind::sgd, {{f.ptrs(), {}}});
  std::mt19937 g(3);
  f.fresh_grads(g);
  opt.zero_grad();
  for (float v : f.params[0].grad.data<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Optimizer, GroupsKeepTheirOwnHyperparametersAndTheScheduleSetsTheLr) {
  fixture f(6, {10, 10});
  for (auto& p : f.params)
    for (float& g : p.grad.data<float>()) g = 1;
  const float a0 = f.params[0].value.data<float>()[0], b0 = f.params[1].value.data<float>()[0];
  optimizer opt(optimizer_kind::sgd, {{{&f.params[0]}, {.lr = 0.1}}, {{&f.params[1]}, {.lr = 1.0}}});
  opt.set_lr_schedule([](std::int64_t step, double base) { return base * (step == 1 ? 0.5 : 1.0); });
  opt.step();
  EXPECT_FLOAT_EQ(f.params[0].value.data<float>()[0], a0 - 0.05f);
  EXPECT_FLOAT_EQ(f.params[1].value.data<float>()[0], b0 - 0.5f);
  // The cosine schedule: the base at step 1, half of it half way, over at least one step.
  const auto cosine = cosine_lr(10);
  EXPECT_DOUBLE_EQ(cosine(1, 0.2), 0.2);
  EXPECT_NEAR(cosine(6, 0.2), 0.1, 1e-12);
  for (double steps : {0.0, 0.5, -5.0, std::nan(""), std::numeric_limits<double>::infinity()})
    EXPECT_THROW(cosine_lr(steps), std::invalid_argument) << steps;
}

TEST(Optimizer, RefusesHyperparametersTorchRefuses) {
  fixture f(7, {4});
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{f.ptrs(), {.lr = -1}}}), std::invalid_argument);
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{f.ptrs(), {.beta1 = 1.0}}}), std::invalid_argument);
  EXPECT_THROW(optimizer(optimizer_kind::sgd, {{f.ptrs(), {.nesterov = true}}}), std::invalid_argument);
  EXPECT_THROW(optimizer(optimizer_kind::sgd, {{f.ptrs(), {.momentum = 0.9, .dampening = 0.1, .nesterov = true}}}),
               std::invalid_argument);
  EXPECT_THROW(parse_optimizer_kind("lamb"), std::invalid_argument);
  EXPECT_EQ(parse_optimizer_kind("adamw"), optimizer_kind::adamw);
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{f.ptrs(), {.lr = std::numeric_limits<double>::infinity()}}}),
               std::invalid_argument);
  EXPECT_THROW(optimizer(optimizer_kind::sgd, {{f.ptrs(), {.momentum = 0.9, .dampening = std::nan("")}}}),
               std::invalid_argument);
  // A kind that is none of the three (a cast, a damaged message) used to step as Adam.
  EXPECT_THROW(optimizer(static_cast<optimizer_kind>(7), {{f.ptrs(), {}}}), std::invalid_argument);
  EXPECT_THROW((void)troupe::decode<optimizer_kind>(troupe::encode(static_cast<optimizer_kind>(3))), troupe::error);
  EXPECT_THROW((void)troupe::decode<state_storage>(troupe::encode(static_cast<state_storage>(4))), troupe::error);
  EXPECT_EQ(troupe::decode<state_storage>(troupe::encode(state_storage::automatic)), state_storage::automatic);
}

TEST(Optimizer, RefusesAParameterListedTwice) {
  fixture f(8, {4});
  EXPECT_THROW(optimizer(optimizer_kind::sgd, {{{&f.params[0], &f.params[0]}, {.lr = 0.1}}}), std::invalid_argument);
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{{&f.params[0]}, {}}, {{&f.params[0]}, {}}}), std::invalid_argument);
}

TEST(Optimizer, FollowsItsGroupsMembershipAndRefusesResizedTensors) {
  fixture f(9, {4, 6});
  for (auto& p : f.params)
    for (float& g : p.grad.data<float>()) g = 1;
  optimizer opt(optimizer_kind::sgd, {{{&f.params[0]}, {.lr = 0.5}}});
  ASSERT_TRUE(opt.step());
  // A parameter added to a group, and a group added, are stepped from the next step on.
  const float b0 = f.params[1].value.data<float>()[0];
  opt.groups()[0].params.push_back(&f.params[1]);
  ASSERT_TRUE(opt.step());
  EXPECT_FLOAT_EQ(f.params[1].value.data<float>()[0], b0 - 0.5f);
  parameter extra{"extra", tensor::zeros({3}), tensor::zeros({3})};
  for (float& g : extra.grad.data<float>()) g = 1;
  opt.groups().push_back({{&extra}, {.lr = 0.25}});
  ASSERT_TRUE(opt.step());
  EXPECT_FLOAT_EQ(extra.value.data<float>()[0], -0.25f);
  // A gradient or value of another size: an error before anything changes.
  const float a = f.params[0].value.data<float>()[0];
  f.params[0].grad = tensor::zeros({2});
  EXPECT_THROW(opt.step(), std::invalid_argument);
  f.params[0].value = tensor::zeros({8});
  f.params[0].grad = tensor::zeros({8});
  EXPECT_THROW(opt.step(), std::invalid_argument);
  EXPECT_EQ(opt.steps(), 3);
  f.params[0].value = tensor::zeros({4});
  (void)a;
}

TEST(Optimizer, ARefusedResizeKeepsTheStateOfEveryOtherTensor) {
  // Two runs with momentum from the same start; in one, a later tensor is resized (a refused
  // step) and then restored. The earlier tensor's momentum must survive the refusal.
  fixture a(11, {5, 7}), b(11, {5, 7});
  optimizer oa(optimizer_kind::sgd, {{a.ptrs(), {.lr = 0.1, .momentum = 0.9}}});
  optimizer ob(optimizer_kind::sgd, {{b.ptrs(), {.lr = 0.1, .momentum = 0.9}}});
  std::mt19937 ra(3), rb(3);
  for (int s = 0; s < 2; ++s) {
    a.fresh_grads(ra);
    b.fresh_grads(rb);
    ASSERT_TRUE(oa.step());
    ASSERT_TRUE(ob.step());
  }
  tensor kept = b.params[1].grad;
  b.params[1].grad = tensor::zeros({3});
  b.params[1].value = tensor::zeros({3});
  tensor kept_value = a.params[1].value.clone();
  EXPECT_THROW(ob.step(), std::invalid_argument);
  b.params[1].value = kept_value.clone();
  b.params[1].grad = kept;
  a.fresh_grads(ra);
  b.fresh_grads(rb);
  ASSERT_TRUE(oa.step());
  ASSERT_TRUE(ob.step());
  for (int k = 0; k < 2; ++k)
    for (std::int64_t i = 0; i < a.params[k].value.numel(); ++i)
      ASSERT_EQ(a.params[k].value.data<float>()[i], b.params[k].value.data<float>()[i]) << "tensor " << k << " element " << i;
}

// The schedule is asked once per group and step, and the lr it gave is the one checked and used
// (it was asked again per tensor: a counting schedule gave three tensors three lrs, and one
// that went bad after its first answer passed the check and wrote NaN).
TEST(Optimizer, AsksTheScheduleOncePerGroupAndStep) {
  fixture f(12, {4, 4, 4});
  for (auto& p : f.params)
    for (float& g : p.grad.data<float>()) g = 1;
  std::vector<float> before;
  for (auto& p : f.params) before.push_back(p.value.data<float>()[0]);
  optimizer opt(optimizer_kind::sgd, {{f.ptrs(), {.lr = 0.1}}});
  int calls = 0;
  opt.set_lr_schedule([&](std::int64_t, double base) { return calls++ == 0 ? base : std::nan(""); });
  ASSERT_TRUE(opt.step());
  EXPECT_EQ(calls, 1);
  for (std::size_t k = 0; k < f.params.size(); ++k) EXPECT_FLOAT_EQ(f.params[k].value.data<float>()[0], before[k] - 0.1f);
  EXPECT_THROW(opt.step(), std::invalid_argument);  // the second step's lr is NaN: refused
}

// bitsandbytes clips to the sorted history's entry at index p of 100 (0-based): with norms 2 to
// 100 and 1000, p = 90 clips the 1000 to 92 (it clipped to 91), p = 99 leaves it.
TEST(Optimizer, PercentileClippingPicksBitsandbytesEntry) {
  for (const auto& [percentile, expected] : {std::pair{90.0, 92.0}, {5.0, 7.0}, {99.0, 1000.0}}) {
    fixture f(13, {1});
    optimizer opt(optimizer_kind::sgd, {{f.ptrs(), {.lr = 1.0}, {.percentile_clipping = percentile}}});
    float& g = f.params[0].grad.data<float>()[0];
    float& x = f.params[0].value.data<float>()[0];
    for (int norm = 1; norm <= 100; ++norm) {
      g = static_cast<float>(norm);
      ASSERT_TRUE(opt.step());
    }
    g = 1000;
    const float start = x;
    ASSERT_TRUE(opt.step());
    EXPECT_NEAR(start - x, expected, 1e-3) << "percentile " << percentile;
  }
}

TEST(Optimizer, RefusesAScheduleThatGivesABadLrAndChangesNothing) {
  fixture f(10, {4});
  for (float& g : f.params[0].grad.data<float>()) g = 1;
  optimizer opt(optimizer_kind::sgd, {{f.ptrs(), {.lr = 0.1}}});
  opt.set_lr_schedule([](std::int64_t, double) { return std::nan(""); });
  const float before = f.params[0].value.data<float>()[0];
  EXPECT_THROW(opt.step(), std::invalid_argument);
  EXPECT_EQ(opt.steps(), 0);
  EXPECT_EQ(f.params[0].value.data<float>()[0], before);
}

}  // namespace
