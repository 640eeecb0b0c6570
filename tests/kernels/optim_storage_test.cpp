// The optimizer's state storage modes (fp32, bf16, 8-bit; automatic by memory): every fast step
// and vector path equals the reference to the bit, and each mode's bytes, accuracy and edge cases.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>

#include "optim_support.hpp"
#include "quantize.hpp"

namespace {

using namespace troupe;
using namespace troupe::kernels;
using namespace optim_support;

struct config {
  const char* name;
  optimizer_kind kind;
  hyperparameters hp;
};

std::vector<config> configs() {
  return {
      {"sgd momentum", optimizer_kind::sgd, {.lr = 0.05, .weight_decay = 0.01, .momentum = 0.9, .dampening = 0.1}},
      {"sgd nesterov", optimizer_kind::sgd, {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
      {"adam", optimizer_kind::adam, {.lr = 1e-2, .weight_decay = 0.1}},
      {"adamw", optimizer_kind::adamw, {.lr = 1e-2, .weight_decay = 0.01}},
      {"adamw amsgrad", optimizer_kind::adamw, {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.05, .amsgrad = true}},
  };
}

TEST(OptimizerStorage, FastStepsEqualTheReferenceInEveryStorageMode) {
  const std::vector<std::int64_t> sizes{1, 1000, 33'001};
  // Every vector path the CPU has: AVX-512, AVX2, none.
  struct restore {
    int cap;
    ~restore() { troupe::kernels::quant::limit_simd(cap); }
  } guard{troupe::kernels::quant::limit_simd(2)};
  for (int level = troupe::kernels::quant::simd_level(); level >= 0; --level) {
    troupe::kernels::quant::limit_simd(level);
    for (const auto& c : configs()) {
      for (const auto& st : storages()) {
        model a(11, sizes), b(11, sizes);
        optimizer fast(c.kind, {{a.ptrs(), c.hp, st.state}}, {.threads = 3, .seed = 4});
        optimizer ref(c.kind, {{b.ptrs(), c.hp, st.state}}, {.threads = 1, .seed = 4});
        std::mt19937 ga(5), gb(5);
        for (int step = 0; step < 4; ++step) {
          a.fresh_grads(ga);
          b.fresh_grads(gb);
          ASSERT_TRUE(fast.step());
          ASSERT_TRUE(ref.reference_step());
        }
        EXPECT_TRUE(a.same_values(b)) << c.name << ", " << st.name << ", vector level " << level;
        EXPECT_EQ(fast.state_bytes(), ref.state_bytes()) << c.name << ", " << st.name;
      }
    }
  }
}

TEST(OptimizerStorage, ResultsAreIdenticalForAnyThreadCount) {
  for (auto storage : {state_storage::fp32, state_storage::bf16, state_storage::int8}) {
    std::vector<model> models;
    for (int t = 1; t <= 3; ++t) {
      models.emplace_back(3, std::vector<std::int64_t>{300'000, 4097});
      state_options so{.storage = storage};
      so.stochastic_rounding = storage != state_storage::fp32;
      optimizer opt(optimizer_kind::adamw, {{models.back().ptrs(), {.lr = 1e-2, .weight_decay = 0.1}, so}},
                    {.threads = t, .seed = 9});
      std::mt19937 g(1);
      for (int step = 0; step < 3; ++step) {
        models.back().fresh_grads(g);
        ASSERT_TRUE(opt.step());
      }
    }
    EXPECT_TRUE(models[0].same_values(models[1])) << name_of(storage);
    EXPECT_TRUE(models[0].same_values(models[2])) << name_of(storage);
  }
}

// tensor_keys: an optimizer of part of a model rounds each tensor as the whole model's does.
TEST(OptimizerStorage, TensorKeysRoundAPartAsTheWhole) {
  for (auto storage : {state_storage::bf16, state_storage::int8}) {
    const state_options so{.storage = storage, .min_8bit_elements = 1, .stochastic_rounding = true};
    model whole(4, {5000, 3000, 7000}), part(4, {5000, 3000, 7000});
    optimizer all(optimizer_kind::adamw, {{whole.ptrs(), {.lr = 1e-2}, so}}, {.threads = 1, .seed = 3});
    // The third and first tensors, in that order, with their places in the whole model.
    optimizer some(optimizer_kind::adamw, {{{&part.params[2], &part.params[0]}, {.lr = 1e-2}, so}},
                   {.threads = 1, .seed = 3, .tensor_keys = {2, 0}});
    optimizer unkeyed(optimizer_kind::adamw, {{{&part.params[1]}, {.lr = 1e-2}, so}}, {.threads = 1, .seed = 3});
    std::mt19937 g(2), h(2);
    for (int step = 0; step < 3; ++step) {
      whole.fresh_grads(g);
      part.fresh_grads(h);
      ASSERT_TRUE(all.step());
      ASSERT_TRUE(some.step());
      ASSERT_TRUE(unkeyed.step());
    }
    for (std::size_t i : {0, 2})
      EXPECT_EQ(std::memcmp(whole.params[i].value.bytes(), part.params[i].value.bytes(), whole.params[i].value.nbytes()), 0)
          << name_of(storage) << " tensor " << i;
    // Without keys the lone tensor rounds as the whole model's first one: not as its second.
    EXPECT_NE(std::memcmp(whole.params[1].value.bytes(), part.params[1].value.bytes(), whole.params[1].value.nbytes()), 0)
        << name_of(storage);
  }
  model m(1, {10, 10});
  auto refused = [&](std::vector<std::uint64_t> keys) {
    try {
      optimizer o(optimizer_kind::adam, {{m.ptrs(), {}}}, {.tensor_keys = std::move(keys)});
      return std::string();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(refused({1}).find("1 keys for 2 tensors"), std::string::npos) << refused({1});
  EXPECT_NE(refused({4, 4}).find("twice"), std::string::npos) << refused({4, 4});
  EXPECT_EQ(refused({7, 3}), "");
}

TEST(OptimizerStorage, CompressedStateFollowsFp32Closely) {
  // Relative gap of the parameters' movement to fp32 Adam after 30 steps.
  const std::vector<std::int64_t> sizes{20'000};
  model base(2, sizes), start(2, sizes);
  optimizer fp32(optimizer_kind::adam, {{base.ptrs(), {.lr = 1e-3}}});
  std::mt19937 g0(8);
  for (int s = 0; s < 30; ++s) {
    base.fresh_grads(g0);
    fp32.step();
  }
  for (auto storage : {state_storage::bf16, state_storage::int8}) {
    model m(2, sizes);
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-3}, {.storage = storage}}});
    std::mt19937 g(8);
    for (int s = 0; s < 30; ++s) {
      m.fresh_grads(g);
      opt.step();
    }
    double num = 0, den = 0;
    auto x = m.params[0].value.data<float>(), y = base.params[0].value.data<float>(),
         x0 = start.params[0].value.data<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * double(x[i] - y[i]);
      den += (y[i] - x0[i]) * double(y[i] - x0[i]);
    }
    EXPECT_LT(std::sqrt(num / den), storage == state_storage::bf16 ? 0.01 : 0.05) << name_of(storage);
  }
}

TEST(OptimizerStorage, EightBitAdamTakesAtMost2_05BytesPerParameter) {
  const std::int64_t n = 1 << 20;
  model m(1, {n, 100});
  optimizer opt(optimizer_kind::adam, {{m.ptrs(), {}, {.storage = state_storage::int8}}});
  const auto report = opt.state_report();
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[0].storage, state_storage::int8);
  EXPECT_EQ(report[0].bytes.codes, 2u * n);
  EXPECT_EQ(report[0].bytes.scales, 2u * 4 * (n / 256));
  EXPECT_EQ(report[0].bytes.fp32, 0u);
  EXPECT_LE(double(report[0].bytes.total()) / n, 2.05);
  // Small tensors stay fp32: 8 bytes per parameter.
  EXPECT_EQ(report[1].storage, state_storage::fp32);
  EXPECT_EQ(report[1].bytes.fp32, 800u);
  const auto total = opt.state_memory_total();
  EXPECT_EQ(total.total(), report[0].bytes.total() + 800);
  EXPECT_EQ(opt.state_bytes(), total.total());
  EXPECT_EQ(optimizer(optimizer_kind::adam, {{m.ptrs(), {}}}).state_bytes(), 8u * (n + 100));
  EXPECT_EQ(optimizer(optimizer_kind::adam, {{m.ptrs(), {}, {.storage = state_storage::bf16}}}).state_bytes(),
            4u * (n + 100));
}

TEST(OptimizerStorage, AZeroGradientCoordinateWithZeroStateStaysExactlyZero) {
  for (auto storage : {state_storage::bf16, state_storage::int8}) {
    model m(4, {8192});
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-2}, {.storage = storage}}});
    const float before = m.params[0].value.data<float>()[77];
    std::mt19937 g(3);
    for (int s = 0; s < 5; ++s) {
      m.fresh_grads(g, 1e-3f);
      m.params[0].grad.data<float>()[77] = 0;
      ASSERT_TRUE(opt.step());
    }
    EXPECT_EQ(m.params[0].value.data<float>()[77], before) << name_of(storage);
  }
}

TEST(OptimizerStorage, ANonFiniteGradientLeavesCompressedStateUntouched) {
  model m(4, {10'000});
  optimizer opt(optimizer_kind::adamw, {{m.ptrs(), {.lr = 1e-2}, {.storage = state_storage::int8}}});
  std::mt19937 g(2);
  m.fresh_grads(g);
  ASSERT_TRUE(opt.step());
  const auto a = temp_path("nonfinite_a"), b = temp_path("nonfinite_b");
  opt.save(a);
  const auto values = m.params[0].value.clone();
  m.fresh_grads(g);
  m.params[0].grad.data<float>()[9999] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(opt.step());
  opt.save(b);
  // Everything after the header (magic, version, kind, steps, skipped) and before the checksum:
  // the state itself is unchanged.
  auto fa = file_bytes(a), fb = file_bytes(b);
  ASSERT_EQ(fa.size(), fb.size());
  EXPECT_TRUE(std::equal(fa.begin() + 25, fa.end() - 4, fb.begin() + 25));
  EXPECT_FALSE(std::equal(fa.begin(), fa.begin() + 25, fb.begin()));  // the skipped count moved
  EXPECT_EQ(std::memcmp(values.bytes(), m.params[0].value.bytes(), values.nbytes()), 0);
  EXPECT_EQ(opt.skipped(), 1);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// A finite gradient whose square is not: 8-bit moments made their block's scale infinite and
// the next step turned 255 parameters NaN; now the step is skipped as a non-finite one. fp32
// moments take the infinite second moment per element, as torch.optim does, and that state
// (and a percentile clipping history of such norms) saves and loads.
TEST(OptimizerStorage, AGradientWhoseSquareOverflowsIsSkippedFor8BitStateAndKeptByFp32) {
  for (auto storage : {state_storage::int8, state_storage::automatic, state_storage::fp32})
  for (double clip : {100.0, 95.0}) {
    model m(4, {8192});
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-3}, {.storage = storage, .percentile_clipping = clip}}});
    std::mt19937 g(5);
    m.fresh_grads(g);
    ASSERT_TRUE(opt.step());
    m.fresh_grads(g);
    m.params[0].grad.data<float>()[0] = 1e21f;
    const bool compressed = storage != state_storage::fp32;
    EXPECT_EQ(opt.step(), !compressed) << name_of(storage);
    EXPECT_EQ(opt.skipped(), compressed ? 1 : 0);
    m.fresh_grads(g);
    m.params[0].grad.data<float>()[1] = 5e18f;  // below 2^63: its square fits
    EXPECT_TRUE(opt.step()) << name_of(storage);
    for (int s = 0; s < 3; ++s) {
      m.fresh_grads(g);
      ASSERT_TRUE(opt.step());
    }
    int bad = 0;
    for (float x : m.params[0].value.data<float>()) bad += !std::isfinite(x);
    EXPECT_EQ(bad, 0) << name_of(storage);
    const auto path = temp_path("overflow");
    opt.save(path);
    optimizer back(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-3}, {.storage = storage, .percentile_clipping = clip}}});
    EXPECT_NO_THROW(back.load(path)) << name_of(storage) << " clip " << clip;
    std::filesystem::remove(path);
  }
}

TEST(OptimizerStorage, ChangesBetweenStepsAreHonored) {
  model m(6, {10'000}), twin(6, {10'000});
  optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-2}}});
  std::mt19937 g(1);
  m.fresh_grads(g);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 8u * 10'000);
  // fp32 -> int8: the moments are converted, not reset.
  opt.groups()[0].state.storage = state_storage::int8;
  m.fresh_grads(g);
  opt.step();
  EXPECT_EQ(opt.state_report()[0].storage, state_storage::int8);
  // AMSGrad on: a maximum appears; a new block size requantizes.
  opt.groups()[0].hp.amsgrad = true;
  opt.groups()[0].state.block_size = 512;
  m.fresh_grads(g);
  opt.step();
  EXPECT_EQ(opt.state_report()[0].bytes.codes, 3u * 10'000);
  EXPECT_EQ(opt.state_report()[0].bytes.scales, 3u * 4 * 20);
  // Back to fp32.
  opt.groups()[0].state.storage = state_storage::fp32;
  m.fresh_grads(g);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 12u * 10'000);
  // A bad change is refused at the next step, before anything changes.
  opt.groups()[0].hp.beta1 = 1.5;
  m.fresh_grads(g);
  const auto before = m.params[0].value.clone();
  EXPECT_THROW(opt.step(), std::invalid_argument);
  EXPECT_EQ(std::memcmp(before.bytes(), m.params[0].value.bytes(), before.nbytes()), 0);
  opt.groups()[0].hp.beta1 = 0.9;
  EXPECT_TRUE(opt.step());

  // SGD: momentum switched on mid-run starts its buffer from the gradient, as torch does.
  parameter p{"w", tensor::from<float>({1.0f}, {1}), tensor::from<float>({0.5f}, {1})};
  optimizer sgd(optimizer_kind::sgd, {{{&p}, {.lr = 0.1}}});
  sgd.step();
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], 0.95f);
  sgd.groups()[0].hp.momentum = 0.9;
  sgd.step();  // buf = g
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], 0.90f);
  sgd.step();  // buf = 0.9 * 0.5 + 0.5
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], 0.90f - 0.1f * 0.95f);
}

struct env_guard {
  explicit env_guard(const char* value) { ::setenv("TROUPE_OPTIM_STATE", value, 1); }
  ~env_guard() { ::unsetenv("TROUPE_OPTIM_STATE"); }
};

TEST(OptimizerStorage, AutomaticStorageFollowsAvailableMemory) {
  const std::int64_t n = 9 << 20;  // 72 MiB of fp32 Adam state: above the small-model floor
  model m(1, {n});
  const std::size_t fp32 = 8u * n;
  auto chosen = [&](std::size_t available) {
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {}, {.storage = state_storage::automatic}}},
                  {.available_memory = available});
    return opt.state_report()[0].storage;
  };
  EXPECT_EQ(chosen(4 * fp32), state_storage::fp32);
  EXPECT_EQ(chosen(3 * fp32), state_storage::bf16);
  EXPECT_EQ(chosen(fp32), state_storage::int8);
  // Small models stay fp32 whatever the memory.
  model small(1, {1000});
  optimizer opt(optimizer_kind::adam, {{small.ptrs(), {}, {.storage = state_storage::automatic}}}, {.available_memory = 1});
  EXPECT_EQ(opt.state_report()[0].storage, state_storage::fp32);
}

TEST(OptimizerStorage, TheEnvironmentForcesAutomaticGroupsAndRefusesBadValues) {
  model m(1, {5000});
  {
    env_guard e("int8");
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {}, {.storage = state_storage::automatic}}});
    EXPECT_EQ(opt.state_report()[0].storage, state_storage::int8);
    // An explicit choice wins.
    optimizer explicit_fp32(optimizer_kind::adam, {{m.ptrs(), {}}});
    EXPECT_EQ(explicit_fp32.state_report()[0].storage, state_storage::fp32);
  }
  {
    env_guard e("fp8");
    try {
      optimizer opt(optimizer_kind::adam, {{m.ptrs(), {}, {.storage = state_storage::automatic}}});
      FAIL() << "accepted TROUPE_OPTIM_STATE=fp8";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("TROUPE_OPTIM_STATE"), std::string::npos);
    }
  }
  EXPECT_THROW(parse_state_storage("fp16"), std::invalid_argument);
  EXPECT_EQ(parse_state_storage("auto"), state_storage::automatic);
}

TEST(OptimizerStorage, RunningOutOfMemoryConvertsStateOneLevelDownAndKeepsIt) {
  // Three tensors of 8192: fp32 Adam state 192 KiB; the limit admits bf16 (96 KiB) only.
  model m(2, {8192, 8192, 8192});
  optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-2}, {.storage = state_storage::automatic}}},
                {.state_memory_limit = 150'000});
  for (const auto& t : opt.state_report()) EXPECT_EQ(t.storage, state_storage::bf16);

  // Mid-run: two tensors fit as fp32 until AMSGrad needs a third moment; then the existing
  // state goes to bf16, values kept, and the step goes on.
  model n2(2, {8192, 8192}), twin(2, {8192, 8192});
  optimizer lean(optimizer_kind::adam, {{n2.ptrs(), {.lr = 1e-2}, {.storage = state_storage::automatic}}},
                 {.state_memory_limit = 150'000});
  optimizer free(optimizer_kind::adam, {{twin.ptrs(), {.lr = 1e-2}}});
  std::mt19937 g(4), h(4);
  for (int s = 0; s < 3; ++s) {
    n2.fresh_grads(g);
    twin.fresh_grads(h);
    ASSERT_TRUE(lean.step());
    ASSERT_TRUE(free.step());
  }
  EXPECT_TRUE(n2.same_values(twin));
  EXPECT_EQ(lean.state_report()[0].storage, state_storage::fp32);
  lean.groups()[0].hp.amsgrad = true;
  free.groups()[0].hp.amsgrad = true;
  n2.fresh_grads(g);
  twin.fresh_grads(h);
  ASSERT_TRUE(lean.step());
  ASSERT_TRUE(free.step());
  for (const auto& t : lean.state_report()) EXPECT_EQ(t.storage, state_storage::bf16);
  EXPECT_EQ(lean.state_bytes(), 2u * 3 * 2 * 8192);
  // The bf16 copy of the moments steps like the fp32 one, to bf16 precision.
  auto x = n2.params[0].value.data<float>(), y = twin.params[0].value.data<float>();
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 1e-4) << i;

  // Explicit storage is not lowered: the allocation failure reaches the caller.
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{m.ptrs(), {}}}, {.state_memory_limit = 150'000}), std::bad_alloc);
}

TEST(OptimizerStorage, AutomaticStorageStepsDownToTheLevelThatFits) {
  // Three Adam tensors of 10,000: fp32 state 240,000 bytes, bf16 120,000, int8 about 61,000.
  // Converting a moment frees its old storage, so each level down is judged by what it keeps.
  for (const auto& [limit, want] : {std::pair{200'000u, state_storage::bf16}, {100'000u, state_storage::int8}}) {
    model m(3, {10'000, 10'000, 10'000});
    optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-2}, {.storage = state_storage::automatic}}},
                  {.state_memory_limit = limit});
    for (const auto& t : opt.state_report()) EXPECT_EQ(t.storage, want) << limit;
    EXPECT_LE(opt.state_bytes(), limit);
    std::mt19937 g(1);
    m.fresh_grads(g);
    EXPECT_TRUE(opt.step());
  }
}

TEST(OptimizerStorage, ARefusedOrSkippedStepConvertsNothingAndKeepsTheMembership) {
  model m(4, {5000, 5000});
  optimizer opt(optimizer_kind::adam, {{m.ptrs(), {.lr = 1e-2}}});
  std::mt19937 g(2);
  m.fresh_grads(g);
  ASSERT_TRUE(opt.step());
  const auto b_moment = opt.slots()[1].m.data.data<float>()[7];

  // A membership change and a bad value in one edit: refused, the removed tensor keeps its state.
  opt.groups()[0].params = {&m.params[0]};
  opt.groups()[0].hp.lr = -1;
  EXPECT_THROW(opt.step(), std::invalid_argument);
  ASSERT_EQ(opt.slots().size(), 2u);
  EXPECT_EQ(opt.slots()[1].m.data.data<float>()[7], b_moment);
  opt.groups()[0].params = {&m.params[0], &m.params[1]};
  opt.groups()[0].hp.lr = 1e-2;

  // A new storage and a schedule that fails: refused before the state is converted.
  opt.groups()[0].state.storage = state_storage::int8;
  opt.groups()[0].state.min_8bit_elements = 0;
  opt.set_lr_schedule([](std::int64_t, double) { return std::nan(""); });
  EXPECT_THROW(opt.step(), std::invalid_argument);
  for (const auto& t : opt.state_report()) EXPECT_EQ(t.storage, state_storage::fp32);
  opt.set_lr_schedule({});

  // The same with a non-finite gradient: skipped, nothing converted.
  m.params[1].grad.data<float>()[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(opt.step());
  for (const auto& t : opt.state_report()) EXPECT_EQ(t.storage, state_storage::fp32);
  EXPECT_EQ(opt.slots()[1].m.data.data<float>()[7], b_moment);
  EXPECT_EQ(opt.steps(), 1);
  m.fresh_grads(g);
  EXPECT_TRUE(opt.step());
  for (const auto& t : opt.state_report()) EXPECT_EQ(t.storage, state_storage::int8);
}

TEST(OptimizerStorage, EveryVectorPathGivesTheSameBits) {
  // Not only each path against the reference at its own level: the same steps on AVX-512, AVX2
  // and the portable path give the same parameters and state, percentile clipping's norm
  // (partial sums in a fixed order) and stochastic rounding's draws included.
  struct restore {
    int cap;
    ~restore() { troupe::kernels::quant::limit_simd(cap); }
  } guard{troupe::kernels::quant::limit_simd(2)};
  const std::vector<std::int64_t> sizes{1, 1000, 33'001};
  for (const auto& c : configs()) {
    for (const auto& st : storages()) {
      std::vector<std::vector<char>> saved;
      std::vector<model> models;
      const int top = troupe::kernels::quant::simd_level();
      for (int level = top; level >= 0; --level) {
        troupe::kernels::quant::limit_simd(level);
        models.emplace_back(11, sizes);
        optimizer opt(c.kind, {{models.back().ptrs(), c.hp, st.state}}, {.threads = 2, .seed = 4});
        std::mt19937 g(5);
        for (int step = 0; step < 3; ++step) {
          models.back().fresh_grads(g);
          ASSERT_TRUE(opt.step());
        }
        const auto path = temp_path("levels");
        opt.save(path);
        saved.push_back(file_bytes(path));
        std::filesystem::remove(path);
        troupe::kernels::quant::limit_simd(top);
      }
      for (std::size_t k = 1; k < models.size(); ++k) {
        EXPECT_TRUE(models[k].same_values(models[0])) << c.name << ", " << st.name << ", level " << top - static_cast<int>(k);
        EXPECT_EQ(saved[k], saved[0]) << c.name << ", " << st.name << ", level " << top - static_cast<int>(k);
      }
    }
  }
}

// Gradients of 1e-20 make second moments of 1e-43, subnormal, whose 1/scale is infinite: the
// AVX-512 quantizer coded a zero as 255 (0 x inf is NaN) where the others coded 0. A block whose
// scale is below the smallest normal float is stored as zeros (scale 0) on every path.
TEST(OptimizerStorage, BlocksOfSubnormalMomentsAreZerosOnEveryPath) {
  struct restore {
    int cap;
    ~restore() { troupe::kernels::quant::limit_simd(cap); }
  } guard{troupe::kernels::quant::limit_simd(2)};
  const int top = troupe::kernels::quant::simd_level();
  for (const auto kind : {optimizer_kind::adam, optimizer_kind::sgd}) {
    std::vector<std::vector<char>> saved;
    for (int level = top; level >= 0; --level) {
      troupe::kernels::quant::limit_simd(level);
      for (const bool reference : {false, true}) {
        model m(3, {8192});
        const hyperparameters hp = kind == optimizer_kind::sgd ? hyperparameters{.lr = 1e-2, .momentum = 0.9}
                                                               : hyperparameters{.lr = 1e-2};
        optimizer opt(kind, {{m.ptrs(), hp, {.storage = state_storage::int8}}}, {.threads = 1});
        const auto before = m.params[0].value.clone();
        for (int step = 0; step < 3; ++step) {
          auto g = m.params[0].grad.data<float>();
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = i % 2 ? (kind == optimizer_kind::sgd ? 1e-41f : 1e-20f) : 0.0f;
          ASSERT_TRUE(reference ? opt.reference_step() : opt.step());
        }
        // A coordinate whose gradient was always zero has not moved.
        EXPECT_EQ(m.params[0].value.data<float>()[0], before.data<float>()[0]);
        const auto path = temp_path("subnormal");
        opt.save(path);
        saved.push_back(file_bytes(path));
        std::filesystem::remove(path);
      }
      troupe::kernels::quant::limit_simd(top);
    }
    for (std::size_t k = 1; k < saved.size(); ++k) EXPECT_EQ(saved[k], saved[0]) << "run " << k;
  }
}

TEST(OptimizerStorage, FusedCompressedAdamEqualsTheReferenceStateToTheBit) {
  // The bf16 and 8-bit Adam kernels that convert moments in registers, against the reference
  // step: parameters and the saved state (codes, scales, bf16 words) must be identical. Sizes
  // leave partial vectors and partial blocks; beta1 < 0.5 takes the other lerp form; percentile
  // clipping scales the gradient; stochastic rounding draws.
  const std::vector<std::int64_t> sizes{1, 7, 1000, 70'003};
  std::vector<config> cases = configs();
  cases.push_back({"adam low beta1", optimizer_kind::adam, {.lr = 1e-2, .beta1 = 0.3, .weight_decay = 0.1}});
  for (const auto& c : cases) {
    if (c.kind == optimizer_kind::sgd) continue;
    for (auto storage : {state_storage::bf16, state_storage::int8}) {
      // Variants: plain, percentile clipping, stochastic rounding, the first moment in fp32, a
      // percentile scale that is not the absmax (8-bit), all of those together.
      for (int variant = 0; variant < 6; ++variant) {
        const double clip = variant == 1 || variant == 5 ? 80.0 : 100.0;
        state_options so{.storage = storage, .block_size = storage == state_storage::int8 ? 256 : 2048,
                         .min_8bit_elements = 0};
        so.percentile_clipping = clip;
        so.stochastic_rounding = variant == 2 || variant == 5;
        so.first_moment_fp32 = variant == 3 || variant == 5;
        if (variant >= 4) so.percentile_scale = 99.0;
        model a(21, sizes), b(21, sizes);
        optimizer fast(c.kind, {{a.ptrs(), c.hp, so}}, {.threads = 2, .seed = 1});
        optimizer ref(c.kind, {{b.ptrs(), c.hp, so}}, {.threads = 1, .seed = 1});
        std::mt19937 ga(8), gb(8);
        for (int step = 0; step < 3; ++step) {
          a.fresh_grads(ga, step == 1 ? 1e-3f : 1.0f);
          b.fresh_grads(gb, step == 1 ? 1e-3f : 1.0f);
          ASSERT_TRUE(fast.step());
          ASSERT_TRUE(ref.reference_step());
        }
        const std::string what = std::string(c.name) + ", " + name_of(storage) + ", variant " + std::to_string(variant);
        EXPECT_TRUE(a.same_values(b)) << what;
        const auto pa = temp_path("fused_a"), pb = temp_path("fused_b");
        fast.save(pa);
        ref.save(pb);
        EXPECT_EQ(file_bytes(pa), file_bytes(pb)) << what;
        std::filesystem::remove(pa);
        std::filesystem::remove(pb);
      }
    }
  }
}

TEST(OptimizerStorage, TheFused8BitStepEqualsTheReferenceForBlocksOfAnySize) {
  // The AVX-512 kernels write one block's codes while they update the next (AdamW's also decode
  // the block after), 16 values at a time: blocks shorter than a vector, not a multiple of 16, and
  // a last block shorter than the others must all give the reference's parameters and state, on
  // every vector path.
  struct restore {
    int cap;
    ~restore() { troupe::kernels::quant::limit_simd(cap); }
  } guard{troupe::kernels::quant::limit_simd(2)};
  const std::pair<optimizer_kind, hyperparameters> kinds[] = {
      {optimizer_kind::adamw, {.lr = 1e-2, .weight_decay = 0.01}},
      {optimizer_kind::sgd, {.lr = 1e-2, .weight_decay = 0.01, .momentum = 0.9, .nesterov = true}}};
  for (int level = troupe::kernels::quant::simd_level(); level >= 0; --level) {
    troupe::kernels::quant::limit_simd(level);
    for (const auto& [kind, hp] : kinds) {
      for (std::int64_t block : {1, 5, 16, 17, 40, 64, 100}) {
        state_options so{.storage = state_storage::int8, .block_size = block, .min_8bit_elements = 0};
        model a(31, {3001, 2}), b(31, {3001, 2});
        optimizer fast(kind, {{a.ptrs(), hp, so}}, {.threads = 2, .seed = 1});
        optimizer ref(kind, {{b.ptrs(), hp, so}}, {.threads = 1, .seed = 1});
        std::mt19937 ga(3), gb(3);
        for (int step = 0; step < 3; ++step) {
          a.fresh_grads(ga);
          b.fresh_grads(gb);
          ASSERT_TRUE(fast.step());
          ASSERT_TRUE(ref.reference_step());
        }
        const std::string what = std::string(kind == optimizer_kind::sgd ? "sgd" : "adamw") + ", block " +
                                 std::to_string(block) + ", vector level " + std::to_string(level);
        EXPECT_TRUE(a.same_values(b)) << what;
        const auto pa = temp_path("blocks_a"), pb = temp_path("blocks_b");
        fast.save(pa);
        ref.save(pb);
        EXPECT_EQ(file_bytes(pa), file_bytes(pb)) << what;
        std::filesystem::remove(pa);
        std::filesystem::remove(pb);
      }
    }
  }
}

TEST(OptimizerStorage, Fp32ParamsSinglesOutOneLayerOfAModelByItsName) {
  auto mlp = make_mlp("mlp:128-64-64-10");  // 0.weight 8192 values, 2.weight 4096, 4.weight 640
  for (auto* p : mlp->parameters())
    for (float& v : p->grad.data<float>()) v = 0.5f;
  optimizer opt(optimizer_kind::adamw, {{mlp->parameters(), {}, {.storage = state_storage::int8, .fp32_params = {"2.weight"}}}});
  ASSERT_TRUE(opt.step());
  std::map<std::string, state_storage> storage;
  for (const auto& t : opt.state_report()) storage[t.name] = t.storage;
  EXPECT_EQ(storage.at("0.weight"), state_storage::int8);
  EXPECT_EQ(storage.at("2.weight"), state_storage::fp32);
  // A name that is no parameter of the group would change nothing: refused.
  for (const char* typo : {"weight", "2.Weight", "1.weight"}) {
    try {
      optimizer bad(optimizer_kind::adamw, {{mlp->parameters(), {}, {.storage = state_storage::int8, .fp32_params = {typo}}}});
      ADD_FAILURE() << typo << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fp32_params names '" + std::string(typo) + "', which is no parameter of this optimizer (the first is '0.weight')"),
                std::string::npos) << e.what();
    }
  }
  // Also when it comes as a change between steps, before anything changes.
  opt.groups()[0].state.fp32_params = {"4.wieght"};
  EXPECT_THROW(opt.step(), std::invalid_argument);
  EXPECT_EQ(opt.steps(), 1);
}

// A block longer than its tensor is the tensor (and the scratch a step needs is no longer);
// blocks above 65,536 are refused. SGD's 8-bit momentum refuses a gradient that would make it
// infinite (its block would decode to NaN), as Adam's second moment does.
TEST(OptimizerStorage, BlocksLongerThanTheTensorAndHugeSgdGradients) {
  model a(6, {5000}), b(6, {5000});
  optimizer wide(optimizer_kind::adamw, {{a.ptrs(), {.lr = 1e-2}, {.storage = state_storage::int8, .block_size = 65536, .min_8bit_elements = 1}}});
  optimizer exact(optimizer_kind::adamw, {{b.ptrs(), {.lr = 1e-2}, {.storage = state_storage::int8, .block_size = 5000, .min_8bit_elements = 1}}});
  std::mt19937 ga(3), gb(3);
  for (int i = 0; i < 3; ++i) {
    a.fresh_grads(ga);
    b.fresh_grads(gb);
    ASSERT_TRUE(wide.step());
    ASSERT_TRUE(exact.step());
  }
  EXPECT_TRUE(a.same_values(b));
  EXPECT_EQ(wide.state_bytes(), exact.state_bytes());
  EXPECT_THROW(optimizer(optimizer_kind::adam, {{a.ptrs(), {}, {.storage = state_storage::int8, .block_size = 65537}}}),
               std::invalid_argument);

  model m(2, {4096});
  optimizer sgd(optimizer_kind::sgd, {{m.ptrs(), {.lr = 1e-3, .momentum = 0.9}, {.storage = state_storage::int8}}});
  auto g = m.params[0].grad.data<float>();
  std::fill(g.begin(), g.end(), 0.0f);
  g[0] = 3e38f;
  EXPECT_FALSE(sgd.step());  // skipped: nothing changes
  EXPECT_EQ(sgd.skipped(), 1);
  g[0] = 1.0f;
  EXPECT_TRUE(sgd.step());
  for (float v : m.params[0].value.data<float>()) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
