// `troupe bench optim`: seconds per step of SGD (momentum), Adam and AdamW over `params`
// parameters in `tensors` tensors with fp32, bf16 and 8-bit state, and the machine's memory
// bandwidth measured in the same run on arrays of the same size: a STREAM triad
// (a = b + s c) and an in-place update (x = x s + y), both on all cores.

#include "optim_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <troupe/kernels/optim.hpp>

namespace troupe::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
void parallel(std::size_t n, int threads, F&& fn) {
  std::vector<std::thread> pool;
  const std::size_t per = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&, t] { fn(std::min(n, t * per), std::min(n, (t + 1) * per)); });
  fn(0, std::min(n, per));
  for (auto& t : pool) t.join();
}

struct bandwidth {
  double triad = 0, inplace = 0;  // bytes per second
};

bandwidth measure_bandwidth(std::size_t n, int threads, int repeats) {
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  // First touch from the same threads as the timed loops.
  parallel(n, threads, [&](std::size_t lo, std::size_t hi) { std::fill(a.data() + lo, a.data() + hi, 0.0f); });
  std::vector<double> triad, inplace;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = clock_type::now();
    parallel(n, threads, [&](std::size_t lo, std::size_t hi) {
      float* __restrict x = a.data();
      const float* __restrict y = b.data();
      const float* __restrict z = c.data();
      for (std::size_t i = lo; i < hi; ++i) x[i] = y[i] + 0.5f * z[i];
    });
    triad.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    t0 = clock_type::now();
    parallel(n, threads, [&](std::size_t lo, std::size_t hi) {
      float* __restrict x = a.data();
      const float* __restrict y = b.data();
      for (std::size_t i = lo; i < hi; ++i) x[i] = x[i] * 0.999f + y[i];
    });
    inplace.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  if (!std::isfinite(a[n / 2])) throw std::runtime_error("bandwidth loop produced a non-finite value");
  return {12.0 * n / median(triad), 12.0 * n / median(inplace)};
}

/// Bytes a step moves per parameter: the finiteness check reads the gradient, the update
/// reads it again, reads and writes the parameter and each moment (and 8-bit block scales).
double bytes_per_param(const kernels::optimizer& opt, std::int64_t params) {
  const auto mem = opt.state_memory_total();
  return 4 + 4 + 8 + 2.0 * static_cast<double>(mem.total()) / static_cast<double>(params);
}

void row(const optim_options& o, std::ostream& out, const char* bench, const char* state, double seconds,
         double bpp, double fraction) {
  char buf[320];
  if (o.json)
    std::snprintf(buf, sizeof buf,
                  "{\"suite\":\"optim\",\"bench\":\"%s\",\"state\":\"%s\",\"device\":\"cpu\",\"metric\":"
                  "\"seconds_per_step\",\"value\":%.5f,\"bytes_per_param\":%.2f,\"fraction_of_bandwidth\":%.2f}\n",
                  bench, state, seconds, bpp, fraction);
  else
    std::snprintf(buf, sizeof buf, "%-6s %-5s %9.5f s/step  %6.2f bytes/param  %4.0f%% of in-place bandwidth\n", bench,
                  state, seconds, bpp, 100 * fraction);
  out << buf;
  out.flush();
}

}  // namespace

int run_optim(const optim_options& o, std::ostream& out) {
  if (o.params < o.tensors || o.tensors < 1 || o.steps < 1) {
    std::cerr << "troupe bench optim: need params >= tensors >= 1 and steps >= 1\n";
    return 1;
  }
  if (!o.only.empty() && o.only != "sgd" && o.only != "adam" && o.only != "adamw") {
    std::cerr << "troupe bench optim: --only '" << o.only << "' is not one of: sgd, adam, adamw\n";
    return 1;
  }
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto bw = measure_bandwidth(static_cast<std::size_t>(o.params), threads, std::max(3, o.steps));
  char buf[256];
  for (auto [name, value] : {std::pair{"triad", bw.triad}, std::pair{"inplace", bw.inplace}}) {
    if (o.json)
      std::snprintf(buf, sizeof buf,
                    "{\"suite\":\"optim\",\"bench\":\"%s\",\"device\":\"cpu\",\"metric\":\"bandwidth\",\"value\":%.2f,"
                    "\"unit\":\"GB/s\",\"threads\":%d}\n",
                    name, value / 1e9, threads);
    else
      std::snprintf(buf, sizeof buf, "%-7s bandwidth %.2f GB/s on %d threads\n", name, value / 1e9, threads);
    out << buf;
  }

  const std::int64_t per = o.params / o.tensors;
  std::vector<kernels::parameter> params;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 1);
  for (int t = 0; t < o.tensors; ++t) {
    kernels::parameter p{"t" + std::to_string(t), tensor::empty({per}), tensor::empty({per})};
    auto v = p.value.data<float>();
    auto g = p.grad.data<float>();
    for (std::int64_t i = 0; i < per; ++i) {
      v[i] = dist(rng);
      g[i] = 1e-3f * dist(rng);
    }
    params.push_back(std::move(p));
  }
  std::vector<kernels::parameter*> ptrs;
  for (auto& p : params) ptrs.push_back(&p);
  const std::int64_t total = per * o.tensors;

  const struct {
    const char* name;
    kernels::optimizer_kind kind;
    kernels::hyperparameters hp;
  } benches[] = {
      {"sgd", kernels::optimizer_kind::sgd, {.lr = 1e-3, .momentum = 0.9}},
      {"adam", kernels::optimizer_kind::adam, {.lr = 1e-4, .weight_decay = 1e-4}},
      {"adamw", kernels::optimizer_kind::adamw, {.lr = 1e-4, .weight_decay = 1e-2}},
  };
  for (const auto& b : benches) {
    if (!o.only.empty() && o.only != b.name) continue;
    for (auto storage : {kernels::state_storage::fp32, kernels::state_storage::bf16, kernels::state_storage::int8}) {
      kernels::optimizer opt(b.kind, {{ptrs, b.hp, {.storage = storage}}}, {.threads = o.threads});
      opt.step();  // first touch of the state
      std::vector<double> times;
      for (int s = 0; s < o.steps; ++s) {
        const auto t0 = clock_type::now();
        if (!opt.step()) {
          std::cerr << "troupe bench optim: a step was skipped\n";
          return 1;
        }
        times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      }
      const double seconds = median(times);
      const double bpp = bytes_per_param(opt, total);
      row(o, out, b.name, kernels::name_of(storage), seconds, bpp, bpp * static_cast<double>(total) / seconds / bw.inplace);
    }
  }
  for (const auto& p : params)
    for (float v : p.value.data<float>())
      if (!std::isfinite(v)) {
        std::cerr << "troupe bench optim: a parameter became non-finite\n";
        return 1;
      }
  return 0;
}

}  // namespace troupe::bench
