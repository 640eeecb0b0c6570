// `troupe bench optim`: seconds per step of SGD (momentum), Adam and AdamW over `params`
// parameters in `tensors` tensors with fp32, bf16 and 8-bit state, and the machine's memory
// bandwidth measured in the same run on arrays of the same size: a STREAM triad
// (a = b + s c) and an in-place update shaped like a step (three arrays x = x s + y from a fourth),
// both on all cores; the fraction of bandwidth is taken against the in-place figure. With --device cuda the
// parameters and state live on the GPU and the anchor is a device-to-device copy of the same size.
// The three storages of one optimizer step in turn, and each reports the median of its steps.

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

#include <troupe/core/device.hpp>
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

/// The triad over three arrays of n floats; the in-place update shaped like an optimizer step:
/// three arrays updated in place from a fourth (x = x s + y), 28 bytes per element. One stream
/// alone does not fill this machine's memory system (a single in-place array measured about 15
/// GB/s on one thread where four streams reach 23), so a single-array loop would be no ceiling
/// for a step that streams four or five arrays.
bandwidth measure_bandwidth(std::size_t n, int threads, int repeats) {
  std::vector<float> a(n), b(n), c(n), d(n);
  // First touch from the same threads as the timed loops.
  parallel(n, threads, [&](std::size_t lo, std::size_t hi) {
    std::fill(a.data() + lo, a.data() + hi, 0.0f);
    std::fill(b.data() + lo, b.data() + hi, 1.0f);
    std::fill(c.data() + lo, c.data() + hi, 2.0f);
    std::fill(d.data() + lo, d.data() + hi, 0.5f);
  });
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
      float* __restrict x0 = a.data();
      float* __restrict x1 = b.data();
      float* __restrict x2 = c.data();
      const float* __restrict y = d.data();
      for (std::size_t i = lo; i < hi; ++i) {
        x0[i] = x0[i] * 0.999f + y[i];
        x1[i] = x1[i] * 0.999f + y[i];
        x2[i] = x2[i] * 0.999f + y[i];
      }
    });
    inplace.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  for (float v : {a[n / 2], b[n / 2], c[n / 2]})
    if (!std::isfinite(v)) throw std::runtime_error("bandwidth loop produced a non-finite value");
  return {12.0 * static_cast<double>(n) / median(triad), 28.0 * static_cast<double>(n) / median(inplace)};
}

/// Waits for the work queued on the device: a copy to the host is ordered after it.
void synchronize(const tensor& on_device) {
  if (!on_device.where().is_cpu()) (void)on_device.slice(0, 1).to(device::cpu());
}

/// Device-to-device copy bandwidth (read + write bytes per second) over n floats.
double measure_device_copy(std::size_t n, device where, int repeats) {
  const tensor src = tensor::zeros({static_cast<std::int64_t>(n)}, dtype::f32, where);
  tensor dst = tensor::empty({static_cast<std::int64_t>(n)}, dtype::f32, where);
  copy(src, dst);  // warm up
  synchronize(dst);
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
    copy(src, dst);
    synchronize(dst);
    times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return 8.0 * static_cast<double>(n) / median(times);
}

/// Bytes a step moves per parameter: the finiteness check reads the gradient, the update
/// reads it again, reads and writes the parameter and each moment (and 8-bit block scales).
double bytes_per_param(const kernels::optimizer& opt, std::int64_t params) {
  const auto mem = opt.state_memory_total();
  return 4 + 4 + 8 + 2.0 * static_cast<double>(mem.total()) / static_cast<double>(params);
}

/// One result line; `options` (the state options beyond the storage, --options rows) is left out
/// when empty, so that the default rows keep their form.
void row(const optim_options& o, std::ostream& out, const char* bench, const char* state, double seconds,
         double bpp, double fraction, const std::string& where, const std::string& options = "") {
  char buf[400];
  if (o.json) {
    const std::string extra = options.empty() ? "" : ",\"options\":\"" + options + "\"";
    std::snprintf(buf, sizeof buf,
                  "{\"suite\":\"optim\",\"bench\":\"%s\",\"state\":\"%s\"%s,\"device\":\"%s\",\"metric\":"
                  "\"seconds_per_step\",\"value\":%.7f,\"bytes_per_param\":%.2f,\"fraction_of_bandwidth\":%.2f}\n",
                  bench, state, extra.c_str(), where.c_str(), seconds, bpp, fraction);
  } else {
    std::snprintf(buf, sizeof buf, "%-6s %-5s %-22s %-7s %9.5f s/step  %6.2f bytes/param  %4.0f%% of %s bandwidth\n",
                  bench, state, options.c_str(), where.c_str(), seconds, bpp, 100 * fraction,
                  where == "cpu" ? "in-place" : "copy");
  }
  out << buf;
  out.flush();
}

/// The state options that --options measures for an optimizer, besides plain storages.
struct variant {
  const char* options;
  kernels::state_storage storage;
  kernels::state_options state;
  bool amsgrad = false;
};

std::vector<variant> variants(bool sgd) {
  using kernels::state_storage;
  std::vector<variant> v;
  v.push_back({"stochastic", state_storage::bf16, {.storage = state_storage::bf16, .stochastic_rounding = true}});
  v.push_back({"stochastic", state_storage::int8, {.storage = state_storage::int8, .stochastic_rounding = true}});
  // 99.9 is the absmax at blocks of 256; 99 is a selection of the 3 largest per block.
  v.push_back({"percentile_scale=99.9", state_storage::int8, {.storage = state_storage::int8, .percentile_scale = 99.9}});
  v.push_back({"percentile_scale=99", state_storage::int8, {.storage = state_storage::int8, .percentile_scale = 99}});
  v.push_back({"percentile_clipping=95", state_storage::int8, {.storage = state_storage::int8, .percentile_clipping = 95}});
  v.push_back({"block=2048", state_storage::int8, {.storage = state_storage::int8, .block_size = 2048}});
  if (sgd) return v;
  for (auto storage : {state_storage::bf16, state_storage::int8})
    v.push_back({"first_moment_fp32", storage, {.storage = storage, .first_moment_fp32 = true}});
  for (auto storage : {state_storage::fp32, state_storage::bf16, state_storage::int8})
    v.push_back({"amsgrad", storage, {.storage = storage}, true});
  return v;
}

}  // namespace

int run_optim(const optim_options& o, std::ostream& out) {
  if (o.params < o.tensors || o.tensors < 1 || o.steps < 1) {
    std::cerr << "troupe bench optim: need params >= tensors >= 1 and steps >= 1\n";
    return 1;
  }
  if (o.tensors > 100000) {  // each holds a few KiB of bookkeeping besides its elements
    std::cerr << "troupe bench optim: --tensors " << o.tensors << " is more than 100000\n";
    return 1;
  }
  if (!o.only.empty() && o.only != "sgd" && o.only != "adam" && o.only != "adamw") {
    std::cerr << "troupe bench optim: --only '" << o.only << "' is not one of: sgd, adam, adamw\n";
    return 1;
  }
  device where = device::cpu();
  if (o.device != "cpu") {
    const std::string prefix = "cuda";
    int index = 0;
    bool ok = o.device.rfind(prefix, 0) == 0;
    if (ok && o.device.size() > prefix.size()) {
      const std::string rest = o.device.substr(prefix.size());
      ok = rest.size() > 1 && rest[0] == ':' && rest.find_first_not_of("0123456789", 1) == std::string::npos &&
           rest.size() < 6;
      if (ok) index = std::stoi(rest.substr(1));
    }
    if (!ok) {
      std::cerr << "troupe bench optim: --device '" << o.device << "' is not one of: cpu, cuda, cuda:N\n";
      return 1;
    }
    if (index >= cuda_device_count()) {
      std::cerr << "troupe bench optim: --device " << o.device << ": "
                << (built_with_cuda() ? std::to_string(cuda_device_count()) + " CUDA device(s) found"
                                      : std::string("troupe was built without CUDA"))
                << "\n";
      return 1;
    }
    where = device::cuda(index);
  }
  const std::string where_name = where.str();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bandwidth bw;
  double anchor = 0;  // the bandwidth the fraction is taken against
  char buf[256];
  if (!where.is_cpu()) {
    anchor = measure_device_copy(static_cast<std::size_t>(o.params), where, std::max(5, o.steps));
    if (o.json)
      std::snprintf(buf, sizeof buf,
                    "{\"suite\":\"optim\",\"bench\":\"copy\",\"device\":\"%s\",\"metric\":\"bandwidth\",\"value\":%.2f,"
                    "\"unit\":\"GB/s\"}\n",
                    where_name.c_str(), anchor / 1e9);
    else
      std::snprintf(buf, sizeof buf, "copy    bandwidth %.2f GB/s on %s (device to device)\n", anchor / 1e9,
                    where_name.c_str());
    out << buf;
  } else {
    bw = measure_bandwidth(static_cast<std::size_t>(o.params), threads, std::max(3, o.steps));
    anchor = bw.inplace;
  }
  for (auto [name, value] : {std::pair{"triad", bw.triad}, std::pair{"inplace", bw.inplace}}) {
    if (!where.is_cpu()) break;
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
    if (!where.is_cpu()) {
      p.value = p.value.to(where);
      p.grad = p.grad.to(where);
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
    // The three storages (then, with --options, the state options) step in turn (fp32, bf16,
    // int8, fp32, ...), so that a slow spell of a shared machine falls on all of them and their
    // ratios hold.
    std::vector<variant> vs;
    for (auto storage : {kernels::state_storage::fp32, kernels::state_storage::bf16, kernels::state_storage::int8})
      vs.push_back({"", storage, {.storage = storage}});
    if (o.options)
      for (const auto& v : variants(b.kind == kernels::optimizer_kind::sgd)) vs.push_back(v);
    std::vector<kernels::optimizer> opts;
    for (const auto& v : vs) {
      kernels::hyperparameters hp = b.hp;
      hp.amsgrad = v.amsgrad;
      opts.emplace_back(b.kind, std::vector<kernels::param_group>{{ptrs, hp, v.state}},
                        kernels::optimizer_options{.threads = o.threads});
      opts.back().step();  // first touch of the state
    }
    synchronize(params[0].value);
    std::vector<std::vector<double>> times(opts.size());
    for (int s = 0; s < o.steps; ++s) {
      for (std::size_t k = 0; k < opts.size(); ++k) {
        const auto t0 = clock_type::now();
        if (!opts[k].step()) {
          std::cerr << "troupe bench optim: a step was skipped\n";
          return 1;
        }
        synchronize(params[0].value);  // the device step returns when queued
        times[k].push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      }
    }
    for (std::size_t k = 0; k < opts.size(); ++k) {
      const double seconds = median(times[k]);
      const double bpp = bytes_per_param(opts[k], total);
      row(o, out, b.name, kernels::name_of(vs[k].storage), seconds, bpp,
          bpp * static_cast<double>(total) / seconds / anchor, where_name, vs[k].options);
    }
  }
  for (const auto& p : params) {
    const tensor host = p.value.to(device::cpu());  // named: a temporary would die before the loop runs
    for (float v : host.data<float>())
      if (!std::isfinite(v)) {
        std::cerr << "troupe bench optim: a parameter became non-finite\n";
        return 1;
      }
  }
  return 0;
}

}  // namespace troupe::bench
