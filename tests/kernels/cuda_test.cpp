// The CUDA paths against the CPU: the fused optimizer step (every optimizer x state storage) and
// the layers (forward and both backward halves). Every test needs a CUDA device and skips
// without one; in a build without CUDA they compile and skip too.
//
// Tolerances: optim_cuda.cu is compiled without multiply-add contraction and performs the CPU's
// IEEE operations in order, so fp32 values are expected to agree to the bit; the tests allow
// 4 ulp. bf16 words may differ by one step, 8-bit codes by one code in at most 0.1% of the
// elements (a value that lands on a decision point after a 1-ulp difference). The layers reduce
// rows in a tree and cuBLAS orders its sums its own way: abs 1e-5 + rel 1e-4.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include <troupe/core/device.hpp>
#include <troupe/kernels/gemm.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>

namespace {

using namespace troupe;
using namespace troupe::kernels;

#define SKIP_WITHOUT_CUDA() \
  if (troupe::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

const device gpu = device::cuda(0);

tensor random_tensor(std::mt19937& rng, tensor::shape_type shape, float scale = 1) {
  std::normal_distribution<float> n(0, scale);
  tensor t = tensor::empty(std::move(shape));
  for (float& v : t.data<float>()) v = n(rng);
  return t;
}

/// Distance in representable floats (0 when equal, including +0 and -0).
std::int64_t ulps(float a, float b) {
  auto ordered = [](float x) {
    std::int32_t i;
    std::memcpy(&i, &x, 4);
    return i < 0 ? static_cast<std::int64_t>(std::numeric_limits<std::int32_t>::min()) - i : static_cast<std::int64_t>(i);
  };
  return std::llabs(ordered(a) - ordered(b));
}

/// Parameters on the host and the same values on the device.
struct twin {
  std::vector<parameter> host, dev;
  twin(std::uint32_t seed, const std::vector<std::int64_t>& sizes) {
    std::mt19937 rng(seed);
    for (auto size : sizes) {
      parameter p{"p" + std::to_string(size), random_tensor(rng, {size}), tensor::zeros({size})};
      dev.push_back({p.name, p.value.to(gpu), p.grad.to(gpu)});
      host.push_back(std::move(p));
    }
  }
  static std::vector<parameter*> ptrs(std::vector<parameter>& ps) {
    std::vector<parameter*> out;
    for (auto& p : ps) out.push_back(&p);
    return out;
  }
  /// Fresh gradients, the same on both sides.
  void fresh_grads(std::mt19937& rng, float scale) {
    for (std::size_t i = 0; i < host.size(); ++i) {
      host[i].grad = random_tensor(rng, host[i].grad.shape(), scale);
      copy(host[i].grad, dev[i].grad);
    }
  }
};

/// Compares one moment of a host optimizer with the device one.
void expect_same_moment(const optimizer::moment& h, const optimizer::moment& d, const std::string& what) {
  ASSERT_EQ(h.mode, d.mode) << what;
  if (h.mode == 0) return;
  ASSERT_FALSE(d.data.where().is_cpu()) << what << ": device state lives on the host";
  // Either side may live on the device (a loaded state against the one saved): compare host copies.
  const tensor hd = h.data.to(device::cpu()), dd = d.data.to(device::cpu());
  const std::int64_t n = hd.numel();
  ASSERT_EQ(n, dd.numel()) << what;
  if (h.mode == 1) {
    auto a = hd.data<float>();
    auto b = dd.data<float>();
    for (std::int64_t i = 0; i < n; ++i) ASSERT_LE(ulps(a[i], b[i]), 4) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  } else if (h.mode == 2) {
    auto a = hd.data<std::uint16_t>();
    auto b = dd.data<std::uint16_t>();
    for (std::int64_t i = 0; i < n; ++i) ASSERT_LE(std::abs(int{a[i]} - int{b[i]}), 1) << what << " element " << i;
  } else {
    auto a = hd.data<std::uint8_t>();
    auto b = dd.data<std::uint8_t>();
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::abs(int{a[i]} - int{b[i]}), 1) << what << " code " << i;
      differ += a[i] != b[i];
    }
    EXPECT_LE(differ, n / 1000) << what << ": " << differ << " of " << n << " codes differ";
    const tensor hs = h.scales.to(device::cpu()), ds = d.scales.to(device::cpu());
    auto sa = hs.data<float>();
    auto sb = ds.data<float>();
    for (std::size_t k = 0; k < sa.size(); ++k) ASSERT_LE(ulps(sa[k], sb[k]), 4) << what << " scale " << k;
  }
}

state_options stored(state_storage storage, std::int64_t min_8bit_elements) {
  state_options so;
  so.storage = storage;
  so.min_8bit_elements = min_8bit_elements;
  return so;
}

struct optim_case {
  const char* name;
  optimizer_kind kind;
  hyperparameters hp;
};

std::vector<optim_case> optim_cases() {
  return {
      {"sgd", optimizer_kind::sgd, {.lr = 0.05}},
      {"sgd momentum", optimizer_kind::sgd, {.lr = 0.05, .weight_decay = 0.01, .momentum = 0.9, .dampening = 0.1}},
      {"sgd nesterov", optimizer_kind::sgd, {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
      {"adam", optimizer_kind::adam, {.lr = 1e-2, .weight_decay = 0.1}},
      {"adam low beta1", optimizer_kind::adam, {.lr = 1e-2, .beta1 = 0.3}},
      {"adamw", optimizer_kind::adamw, {.lr = 1e-2, .weight_decay = 0.01}},
      {"adamw amsgrad", optimizer_kind::adamw, {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.05, .amsgrad = true}},
  };
}

std::vector<std::pair<const char*, state_options>> storages() {
  state_options fp32{};
  state_options bf16 = stored(state_storage::bf16, 4096);
  state_options bf16_sr = bf16;
  bf16_sr.stochastic_rounding = true;
  state_options int8 = stored(state_storage::int8, 1000);
  state_options int8_2048 = int8;
  int8_2048.block_size = 2048;
  // Blocks that are not a multiple of a thread's 8 elements (scalar accesses), and one that
  // takes a group of 64 threads (a thread block per quantization block).
  state_options int8_36 = int8;
  int8_36.block_size = 36;
  state_options int8_300 = int8;
  int8_300.block_size = 300;
  state_options int8_m32 = int8;
  int8_m32.first_moment_fp32 = true;
  state_options int8_sr = int8;
  int8_sr.stochastic_rounding = true;
  // Percentile scales selected in a warp (blocks of 36: the 4th largest) and across a thread block
  // of 64 threads (blocks of 300: the 4th), with percentile clipping (the norms summed on the
  // device as on the host) and stochastic rounding; clipping alone on bf16 state.
  state_options int8_pct_36 = int8_36;
  int8_pct_36.percentile_scale = 90;
  state_options int8_pct = int8_300;
  int8_pct.percentile_scale = 99;
  int8_pct.percentile_clipping = 90;
  int8_pct.stochastic_rounding = true;
  state_options bf16_clip = bf16;
  bf16_clip.percentile_clipping = 95;
  return {{"fp32", fp32},           {"bf16", bf16},         {"bf16 stochastic", bf16_sr}, {"int8", int8},
          {"int8 blocks of 2048", int8_2048}, {"int8 blocks of 36", int8_36}, {"int8 blocks of 300", int8_300},
          {"int8 fp32 m", int8_m32}, {"int8 stochastic", int8_sr}, {"int8 percentile 90, blocks of 36", int8_pct_36},
          {"int8 percentile 99, blocks of 300, clipping 90, stochastic", int8_pct}, {"bf16 clipping 95", bf16_clip}};
}

TEST(CudaOptimizer, StepsLikeTheCpuForEveryOptimizerAndStorage) {
  SKIP_WITHOUT_CUDA();
  // Sizes: a tail that fills no vector, one under min_8bit_elements (stays fp32), partial blocks,
  // several chunks of the elementwise kernel.
  const std::vector<std::int64_t> sizes{3, 999, 4099, 70'001};
  for (const auto& c : optim_cases()) {
    for (const auto& [sname, so] : storages()) {
      const std::string what = std::string(c.name) + ", " + sname;
      twin t(5, sizes);
      optimizer cpu(c.kind, {{twin::ptrs(t.host), c.hp, so}}, {.threads = 1, .seed = 3});
      optimizer cuda(c.kind, {{twin::ptrs(t.dev), c.hp, so}}, {.seed = 3});
      ASSERT_EQ(cuda.where(), gpu);
      std::mt19937 rng(17);
      for (int step = 0; step < 3; ++step) {
        t.fresh_grads(rng, step == 1 ? 1e-3f : 1.0f);
        ASSERT_TRUE(cpu.step()) << what;
        ASSERT_TRUE(cuda.step()) << what;
      }
      EXPECT_EQ(cuda.steps(), 3);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const tensor dv = t.dev[i].value.to(device::cpu());
        auto a = t.host[i].value.data<float>();
        auto b = dv.data<float>();
        std::int64_t worst = 0;
        for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, ulps(a[j], b[j]));
        EXPECT_LE(worst, 4) << what << ", tensor " << i;
        const auto& hs = cpu.slots()[i];
        const auto& ds = cuda.slots()[i];
        expect_same_moment(hs.m, ds.m, what + ", tensor " + std::to_string(i) + ", m");
        expect_same_moment(hs.v, ds.v, what + ", tensor " + std::to_string(i) + ", v");
        expect_same_moment(hs.vmax, ds.vmax, what + ", tensor " + std::to_string(i) + ", vmax");
      }
      EXPECT_EQ(cpu.state_bytes(), cuda.state_bytes()) << what;
    }
  }
}

/// Steps an optimizer over `host` and one over `dev` (the same values) with the same fresh
/// gradients, and expects the same parameters and state.
void expect_steps_like_the_cpu(optimizer_kind kind, const hyperparameters& hp, const state_options& so,
                               std::vector<parameter>& host, std::vector<parameter>& dev, const std::string& what) {
  optimizer cpu(kind, {{twin::ptrs(host), hp, so}}, {.threads = 1, .seed = 3});
  optimizer cuda(kind, {{twin::ptrs(dev), hp, so}}, {.seed = 3});
  ASSERT_EQ(cuda.where(), gpu) << what;
  std::mt19937 rng(23);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < host.size(); ++i) {
      host[i].grad = random_tensor(rng, host[i].grad.shape(), step == 1 ? 1e-3f : 1.0f);
      copy(host[i].grad, dev[i].grad);
    }
    ASSERT_TRUE(cpu.step()) << what;
    ASSERT_TRUE(cuda.step()) << what;
  }
  for (std::size_t i = 0; i < host.size(); ++i) {
    const tensor dv = dev[i].value.to(device::cpu());
    auto a = host[i].value.data<float>();
    auto b = dv.data<float>();
    ASSERT_EQ(a.size(), b.size()) << what;
    std::int64_t worst = 0;
    for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, ulps(a[j], b[j]));
    EXPECT_LE(worst, 4) << what << ", tensor " << i;
    const std::string t = what + ", tensor " + std::to_string(i);
    expect_same_moment(cpu.slots()[i].m, cuda.slots()[i].m, t + ", m");
    expect_same_moment(cpu.slots()[i].v, cuda.slots()[i].v, t + ", v");
    expect_same_moment(cpu.slots()[i].vmax, cuda.slots()[i].vmax, t + ", vmax");
  }
  EXPECT_EQ(cpu.state_bytes(), cuda.state_bytes()) << what;
}

TEST(CudaOptimizer, StepsUnalignedViewsAndEmptyTensorsLikeTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Device parameters that are views into one buffer at offsets of 5, 4104 and 4107 floats (the
  // 16-byte path must not be taken where it would fault), and an empty tensor between them.
  const std::vector<std::int64_t> sizes{5, 0, 4099, 3, 9000};
  std::int64_t total = 0;
  for (auto n : sizes) total += n;
  std::mt19937 rng(31);
  const tensor values = random_tensor(rng, {total});
  for (const auto& c : optim_cases()) {
    for (const auto& [sname, so] : storages()) {
      const std::string what = std::string(c.name) + ", " + sname + ", views";
      std::vector<parameter> host, dev;
      const tensor dev_values = values.to(gpu), dev_grads = tensor::zeros({total}, dtype::f32, gpu);
      std::int64_t at = 0;
      for (auto n : sizes) {
        const std::string name = "v" + std::to_string(at) + "_" + std::to_string(n);
        host.push_back({name, values.slice(at, at + n).clone(), tensor::zeros({n})});
        dev.push_back({name, dev_values.slice(at, at + n), dev_grads.slice(at, at + n)});
        at += n;
      }
      expect_steps_like_the_cpu(c.kind, c.hp, so, host, dev, what);
    }
  }
}

TEST(CudaOptimizer, StepsTheLargest8BitBlockAndRefusesALargerOne) {
  SKIP_WITHOUT_CUDA();
  // AMSGrad with three 8-bit moments in blocks of 4096: a thread block of 512 threads per
  // quantization block, the largest group.
  state_options so = stored(state_storage::int8, 0);
  so.block_size = 4096;
  twin t(13, {3 * 4096 + 17, 4096});
  expect_steps_like_the_cpu(optimizer_kind::adamw, {.lr = 3e-3, .weight_decay = 0.05, .amsgrad = true}, so, t.host,
                            t.dev, "amsgrad, int8 blocks of 4096");
  so.block_size = 4097;
  try {
    optimizer o(optimizer_kind::adam, {{twin::ptrs(t.dev), {}, so}});
    FAIL() << "8-bit blocks of 4097 were accepted on the device";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos) << e.what();
  }
}

TEST(CudaOptimizer, StepsFromTwoThreadsAtOnceLikeTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Two optimizers on one device stepped at the same time from two threads, with 8-bit blocks of
  // different sizes: staging buffers from the shared cache, and the 8-bit kernel's shared memory
  // limit set by both.
  std::vector<std::thread> threads;
  for (std::int64_t block : {256, 4096})
    threads.emplace_back([block] {
      state_options so = stored(state_storage::int8, 0);
      so.block_size = block;
      for (int round = 0; round < 4; ++round) {
        twin t(static_cast<std::uint32_t>(block + round), {70'001, 4096});
        expect_steps_like_the_cpu(optimizer_kind::adamw, {.lr = 1e-2, .weight_decay = 0.01, .amsgrad = true}, so,
                                  t.host, t.dev, "thread with blocks of " + std::to_string(block));
      }
    });
  for (auto& th : threads) th.join();
}

TEST(CudaOptimizer, SkipsAStepWithANonFiniteGradientAndChangesNothing) {
  SKIP_WITHOUT_CUDA();
  // 2^63: finite, but its square is not, which 8-bit second moments refuse (as on the CPU).
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 0x1p63f}) {
    for (auto storage : {state_storage::fp32, state_storage::int8}) {
      if (std::isfinite(poison) && storage == state_storage::fp32) continue;
      twin t(9, {5000, 70'001});
      const state_options so = stored(storage, 0);
      const hyperparameters hp{.lr = 1e-2, .weight_decay = 0.01};
      // A step after a change of hyperparameters (the check runs first and the host waits for
      // its answer) ...
      {
        twin other(9, {5000, 70'001});
        optimizer changed(optimizer_kind::adamw, {{twin::ptrs(other.dev), hp, so}});
        std::mt19937 rng(2);
        other.fresh_grads(rng, 1);
        ASSERT_TRUE(changed.step());
        changed.groups()[0].hp.lr = 5e-3;
        tensor g = other.dev[1].grad.to(device::cpu());
        g.data<float>()[70'000] = poison;
        copy(g, other.dev[1].grad);
        EXPECT_FALSE(changed.step());
        EXPECT_EQ(changed.steps(), 1);
        EXPECT_EQ(changed.skipped(), 1);
        for (const auto& slot : changed.slots()) EXPECT_EQ(slot.steps, 1);
      }
      // ... and a step of unchanged state (check and step go to the device together, the step
      // skips itself).
      optimizer cpu(optimizer_kind::adamw, {{twin::ptrs(t.host), hp, so}}, {.threads = 1});
      optimizer cuda(optimizer_kind::adamw, {{twin::ptrs(t.dev), hp, so}});
      std::mt19937 rng(2);
      t.fresh_grads(rng, 1);
      ASSERT_TRUE(cpu.step());
      ASSERT_TRUE(cuda.step());
      std::vector<tensor> before;
      for (auto& p : t.dev) before.push_back(p.value.to(device::cpu()));
      const auto& s = cuda.slots()[1];
      const tensor m_before = s.m.data.to(device::cpu()), v_before = s.v.data.to(device::cpu());
      t.fresh_grads(rng, 1);
      // One poisoned element deep inside the last tensor.
      tensor g = t.dev[1].grad.to(device::cpu());
      g.data<float>()[65'537] = poison;
      copy(g, t.dev[1].grad);
      EXPECT_FALSE(cuda.step());
      EXPECT_EQ(cuda.steps(), 1);
      EXPECT_EQ(cuda.skipped(), 1);
      for (std::size_t i = 0; i < t.dev.size(); ++i) {
        const tensor now = t.dev[i].value.to(device::cpu());
        EXPECT_EQ(std::memcmp(now.bytes(), before[i].bytes(), now.nbytes()), 0) << "tensor " << i << " changed";
      }
      const tensor m_now = s.m.data.to(device::cpu()), v_now = s.v.data.to(device::cpu());
      EXPECT_EQ(std::memcmp(m_now.bytes(), m_before.bytes(), m_now.nbytes()), 0);
      EXPECT_EQ(std::memcmp(v_now.bytes(), v_before.bytes(), v_now.nbytes()), 0);
      for (const auto& slot : cuda.slots()) EXPECT_EQ(slot.steps, 1);
      // The step after it counts from 2 again, as the host's does.
      t.fresh_grads(rng, 1);
      ASSERT_TRUE(cpu.step());
      ASSERT_TRUE(cuda.step());
      for (std::size_t i = 0; i < t.dev.size(); ++i) {
        const tensor dv = t.dev[i].value.to(device::cpu());
        auto a = t.host[i].value.data<float>();
        auto b = dv.data<float>();
        std::int64_t worst = 0;
        for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, ulps(a[j], b[j]));
        EXPECT_LE(worst, 4) << "tensor " << i << " after the skipped step";
      }
    }
  }
}

TEST(CudaOptimizer, RefusesParametersOnTwoDevices) {
  SKIP_WITHOUT_CUDA();
  twin t(1, {10, 20});
  std::vector<parameter*> mixed{&t.host[0], &t.dev[1]};
  try {
    optimizer o(optimizer_kind::adam, {{mixed, {}}});
    FAIL() << "mixed devices were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
  }
  optimizer o(optimizer_kind::adam, {{twin::ptrs(t.dev), {}}});
  EXPECT_THROW(o.reference_step(), std::invalid_argument);
}

TEST(CudaOptimizer, LoadRefuses8BitBlocksLargerThanTheDeviceStepTakes) {
  SKIP_WITHOUT_CUDA();
  // Host state in 8-bit blocks of 8192 (allowed on the host) cannot be stepped on the device:
  // load() says so and leaves the device optimizer as it was.
  twin t(12, {20000});
  state_options big = stored(state_storage::int8, 0);
  big.block_size = 8192;
  optimizer host(optimizer_kind::adam, {{twin::ptrs(t.host), {.lr = 1e-2}, big}});
  std::mt19937 rng(2);
  t.fresh_grads(rng, 1);
  ASSERT_TRUE(host.step());
  const std::string path = ::testing::TempDir() + "/cuda_optim_big_blocks.bin";
  host.save(path);
  optimizer dev(optimizer_kind::adam, {{twin::ptrs(t.dev), {.lr = 1e-2}, stored(state_storage::int8, 0)}});
  try {
    dev.load(path);
    ADD_FAILURE() << "loaded blocks of 8192 onto the device";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("8-bit blocks of 8192"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev.steps(), 0);
  ASSERT_TRUE(dev.step());
  EXPECT_EQ(dev.steps(), 1);
}

TEST(CudaOptimizer, ZeroGradClearsDeviceGradientsAndStateSurvivesSaveAndLoad) {
  SKIP_WITHOUT_CUDA();
  twin t(4, {3000, 5000});
  const state_options so = stored(state_storage::int8, 0);
  optimizer o(optimizer_kind::adam, {{twin::ptrs(t.dev), {.lr = 1e-2}, so}});
  std::mt19937 rng(6);
  t.fresh_grads(rng, 1);
  ASSERT_TRUE(o.step());
  o.zero_grad();
  for (auto& p : t.dev) {
    const tensor g = p.grad.to(device::cpu());  // named: a temporary would die before the loop runs
    for (float x : g.data<float>()) ASSERT_EQ(x, 0.0f);
  }
  const std::string path = ::testing::TempDir() + "/cuda_optim_state.bin";
  o.save(path);
  optimizer back(optimizer_kind::adam, {{twin::ptrs(t.dev), {.lr = 1e-2}, so}});
  back.load(path);
  EXPECT_EQ(back.steps(), 1);
  expect_same_moment(o.slots()[1].m, back.slots()[1].m, "loaded m");
  EXPECT_FALSE(back.slots()[1].v.data.where().is_cpu());
}

// ---- layers ------------------------------------------------------------------------------------

void expect_close(const tensor& cpu, const tensor& dev, const std::string& what) {
  ASSERT_EQ(cpu.shape(), dev.shape()) << what;
  ASSERT_EQ(dev.where(), gpu) << what << " is not on the device";
  const tensor d = dev.to(device::cpu());
  auto a = cpu.data<float>();
  auto b = d.data<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5 + 1e-4 * std::fabs(a[i])) << what << " element " << i;
}

TEST(CudaGemm, MatchesTheReferenceForEveryTransposition) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(3);
  const std::int64_t m = 37, n = 53, k = 71;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      tensor a = random_tensor(rng, ta ? tensor::shape_type{k, m} : tensor::shape_type{m, k});
      tensor b = random_tensor(rng, tb ? tensor::shape_type{n, k} : tensor::shape_type{k, n});
      tensor c = random_tensor(rng, {m, n});
      tensor ref = c.clone();
      gemm_reference(a, ta, b, tb, ref, 0.5f, 2.0f);
      tensor dc = c.to(gpu);
      gemm(a.to(gpu), ta, b.to(gpu), tb, dc, 0.5f, 2.0f);
      expect_close(ref, dc, std::string("gemm ") + (ta ? "T" : "N") + (tb ? "T" : "N"));
    }
  tensor host = tensor::zeros({m, n});
  EXPECT_THROW(gemm(tensor::zeros({m, k}).to(gpu), false, tensor::zeros({k, n}), false, host), std::invalid_argument);
}

/// The same model twice: one on the host, one moved to the device after the same initialization.
void check_model_against_cpu(const std::function<std::unique_ptr<layer>()>& make, std::int64_t in, std::int64_t out,
                             const std::string& what) {
  auto cpu = make(), dev = make();
  cpu->initialize(11);
  dev->initialize(11);
  move_to(*dev, gpu);
  // Non-trivial gamma and beta (and biases): perturb every parameter the same way.
  std::mt19937 rng(12);
  auto cp = cpu->parameters(), dp = dev->parameters();
  ASSERT_EQ(cp.size(), dp.size());
  for (std::size_t i = 0; i < cp.size(); ++i) {
    tensor noise = random_tensor(rng, cp[i]->value.shape(), 0.1f);
    auto v = cp[i]->value.data<float>();
    for (std::size_t j = 0; j < v.size(); ++j) v[j] += noise.data<float>()[j];
    copy(cp[i]->value, dp[i]->value);
  }
  const std::int64_t batch = 19;
  const tensor x = random_tensor(rng, {batch, in});
  tensor labels = tensor::empty({batch}, dtype::i32);
  for (auto& y : labels.data<std::int32_t>()) y = static_cast<std::int32_t>(rng() % out);
  saved_activations kc, kd;
  const tensor yc = cpu->forward(x, kc, true);
  const tensor yd = dev->forward(x.to(gpu), kd, true);
  expect_close(yc, yd, what + " forward");
  EXPECT_EQ(kc.bytes(), kd.bytes()) << what;
  tensor gc, gd;
  const double lc = softmax_cross_entropy(yc, labels, gc);
  const double ld = softmax_cross_entropy(yd, labels, gd);
  EXPECT_NEAR(lc, ld, 1e-5 * std::fabs(lc)) << what << " loss";
  expect_close(gc, gd, what + " d logits");
  EXPECT_EQ(count_correct(yc, labels), count_correct(yd, labels)) << what;
  const tensor dxc = cpu->backward_input(gc, kc);
  const tensor dxd = dev->backward_input(gd, kd);
  expect_close(dxc, dxd, what + " backward_input");
  cpu->backward_weight(gc, kc);
  dev->backward_weight(gd, kd);
  for (std::size_t i = 0; i < cp.size(); ++i) expect_close(cp[i]->grad, dp[i]->grad, what + " grad of " + cp[i]->name);
}

TEST(CudaLayers, MatchTheCpuLayersForwardAndBothBackwardHalves) {
  SKIP_WITHOUT_CUDA();
  check_model_against_cpu([] { return make_mlp("mlp:37-64-33-10"); }, 37, 10, "mlp");
  check_model_against_cpu(
      [] {
        auto s = std::make_unique<sequential>();
        s->add(make_linear(29, 300));
        s->add(make_gelu());
        s->add(make_layer_norm(300));
        s->add(make_residual(make_relu()));
        s->add(make_dropout(0.3f));
        s->add(make_linear(300, 7));
        return s;
      },
      29, 7, "linear-gelu-layer_norm-residual(relu)-dropout-linear");
}

TEST(CudaTraining, StepsOfAnMlpOnTheDeviceFollowTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Forward, loss, backward, AdamW with 8-bit state and zero_grad, all on the device, against the
  // same loop on the host: the parameters stay close after a few steps.
  auto cpu = make_mlp("mlp:20-4096-10"), dev = make_mlp("mlp:20-4096-10");
  cpu->initialize(5);
  dev->initialize(5);
  move_to(*dev, gpu);
  state_options so = stored(state_storage::int8, 4096);
  optimizer oc(optimizer_kind::adamw, {{cpu->parameters(), {.lr = 1e-3, .weight_decay = 0.01}, so}});
  optimizer od(optimizer_kind::adamw, {{dev->parameters(), {.lr = 1e-3, .weight_decay = 0.01}, so}});
  ASSERT_EQ(od.where(), gpu);
  std::mt19937 rng(8);
  for (int step = 0; step < 3; ++step) {
    const tensor x = random_tensor(rng, {16, 20});
    tensor labels = tensor::empty({16}, dtype::i64);
    for (auto& y : labels.data<std::int64_t>()) y = static_cast<std::int64_t>(rng() % 10);
    saved_activations kc, kd;
    tensor gc, gd;
    const double lc = softmax_cross_entropy(cpu->forward(x, kc, true), labels, gc);
    const double ld = softmax_cross_entropy(dev->forward(x.to(gpu), kd, true), labels.to(gpu), gd);
    EXPECT_NEAR(lc, ld, 1e-4 * std::fabs(lc)) << "step " << step;
    cpu->backward(gc, kc);
    dev->backward(gd, kd);
    ASSERT_TRUE(oc.step());
    ASSERT_TRUE(od.step());
    oc.zero_grad();
    od.zero_grad();
  }
  auto cp = cpu->parameters(), dp = dev->parameters();
  for (std::size_t i = 0; i < cp.size(); ++i) {
    const tensor d = dp[i]->value.to(device::cpu());
    auto a = cp[i]->value.data<float>();
    auto b = d.data<float>();
    std::size_t far = 0;
    for (std::size_t j = 0; j < a.size(); ++j) far += std::fabs(a[j] - b[j]) > 1e-5 + 1e-3 * std::fabs(a[j]);
    // A near-tie can move an 8-bit code by one and an element by one code step; only a few may.
    EXPECT_LE(far, a.size() / 1000 + 1) << "parameter " << i;
    const tensor g = dp[i]->grad.to(device::cpu());
    for (float x : g.data<float>()) ASSERT_EQ(x, 0.0f);
  }
}

TEST(CudaLayers, InputsOnAnotherDeviceAndBadLabelsAreRefused) {
  SKIP_WITHOUT_CUDA();
  auto m = make_mlp("mlp:4-3");
  move_to(*m, gpu);
  saved_activations keep;
  EXPECT_THROW(m->forward(tensor::zeros({2, 4}), keep, false), std::invalid_argument);
  const tensor logits = tensor::zeros({2, 3}).to(gpu);
  tensor labels = tensor::from<std::int32_t>({0, 3}, {2}), grad;
  try {
    softmax_cross_entropy(logits, labels, grad);
    FAIL() << "label 3 of 3 classes was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
