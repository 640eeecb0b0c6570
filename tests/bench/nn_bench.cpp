// `troupe bench nn`: GEMM throughput at the shapes one training step of the default MLP
// (784-256-128-10, batch 64) multiplies, and the training throughput of that MLP.

#include "nn_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>

#include <troupe/kernels/gemm.hpp>
#include <troupe/kernels/train.hpp>

namespace troupe::bench {
namespace {

void line(const options& o, std::ostream& out, const std::string& bench, const char* metric, double value,
          const char* unit) {
  char num[64];
  std::snprintf(num, sizeof num, "%.3f", value);
  if (o.json)
    out << "{\"suite\":\"nn\",\"bench\":\"" << bench << "\",\"metric\":\"" << metric << "\",\"value\":" << num
        << ",\"unit\":\"" << unit << "\"}\n";
  else
    out << bench << "  " << metric << "  " << num << " " << unit << "\n";
  out.flush();
}

tensor random_matrix(std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  auto t = tensor::empty({rows, cols});
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : t.data<float>()) v = u(rng);
  return t;
}

}  // namespace

int run_nn(const options& o, std::ostream& out) {
  struct shape {
    const char* name;
    std::int64_t m, n, k;
    bool ta, tb;
  };
  // Forward x W^T, backward dy W (inputs), dy^T x (weights), for each linear layer.
  const shape shapes[] = {
      {"gemm_fwd_64x256x784", 64, 256, 784, false, true},
      {"gemm_dx_64x784x256", 64, 784, 256, false, false},
      {"gemm_dw_256x784x64", 256, 784, 64, true, false},
      {"gemm_fwd_64x128x256", 64, 128, 256, false, true},
      {"gemm_fwd_64x10x128", 64, 10, 128, false, true},
  };
  if (!o.only.empty() && o.only != "gemm" && o.only != "train" &&
      std::none_of(std::begin(shapes), std::end(shapes), [&](const shape& s) { return o.only == s.name; })) {
    std::cerr << "troupe bench nn: unknown workload '" << o.only << "' (known: gemm, train";
    for (const auto& s : shapes) std::cerr << ", " << s.name;
    std::cerr << ")\n";
    return 2;
  }
  std::mt19937 rng(1);
  const double seconds = o.quick ? 0.05 : 0.3;
  for (const auto& s : shapes) {
    if (!o.only.empty() && o.only != s.name && o.only != "gemm") continue;
    auto a = s.ta ? random_matrix(s.k, s.m, rng) : random_matrix(s.m, s.k, rng);
    auto b = s.tb ? random_matrix(s.n, s.k, rng) : random_matrix(s.k, s.n, rng);
    auto c = tensor::zeros({s.m, s.n});
    kernels::gemm(a, s.ta, b, s.tb, c);  // warm up (and load the library)
    std::int64_t runs = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      kernels::gemm(a, s.ta, b, s.tb, c);
      ++runs;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    line(o, out, s.name, "gflops", 2.0 * s.m * s.n * s.k * runs / elapsed / 1e9, "GFLOP/s");
  }
  if (o.only.empty() || o.only == "train") {
    kernels::train_options t;
    t.epochs = 1;
    try {
      auto r = kernels::train(t);
      line(o, out, "train_mlp_784_256_128_10", "samples_per_s", r.samples_per_s, "samples/s");
    } catch (const std::exception& e) {
      std::cerr << "troupe bench nn: training failed: " << e.what() << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace troupe::bench
