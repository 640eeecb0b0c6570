// `troupe bench pipeline`: steps of the pipeline runtime on random data (by default 2 ranks, a
// batch of 128 in 8 microbatches, an MLP of four linear layers, AdamW), each generated schedule
// with and without activation checkpointing, and the anchor: the same model stepped whole,
// microbatch by microbatch, in this thread (pipeline::whole_model_step). Every row checks that its weights
// after the timed steps equal the anchor's, bit for bit.

#include "pipeline_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>

namespace troupe::bench {
namespace {

/// What every row runs: the model, the batch and how it is split.
struct setup {
  std::vector<std::int64_t> sizes;
  std::string model;
  std::int64_t batch = 0;
  int microbatches = 0, ranks = 0;

  tensor random_batch(std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto x = tensor::empty({batch, sizes.front()});
    for (float& v : x.data<float>()) v = d(rng);
    return x;
  }
  tensor random_labels(std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    auto y = tensor::empty({batch}, dtype::i64);
    for (auto& v : y.data<std::int64_t>()) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(sizes.back()));
    return y;
  }
  std::unique_ptr<kernels::sequential> fresh_model() const {
    auto m = kernels::make_mlp(model);
    m->initialize(1);
    return m;
  }
};

kernels::hyperparameters hp() {
  kernels::hyperparameters h;
  h.lr = 1e-3;
  h.weight_decay = 0.01;
  return h;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct result {
  double seconds_per_step = 0;
  std::size_t peak_bytes = 0;  // the most any rank held
  double busy = 1;             // the ranks' mean share of a step spent in F, B, I, W and RECOMPUTE
  std::vector<tensor> weights;
};

/// The anchor: the whole model, microbatch by microbatch, in this thread.
result run_whole(const setup& u, int warmup, int timed) {
  auto m = u.fresh_model();
  kernels::optimizer opt(kernels::optimizer_kind::adamw, {{m->parameters(), hp()}},
                         kernels::optimizer_options{.threads = 1});
  result r;
  std::vector<double> steps;
  for (int i = 0; i < warmup + timed; ++i) {
    const tensor x = u.random_batch(static_cast<std::uint64_t>(i)), y = u.random_labels(static_cast<std::uint64_t>(i));
    const auto t0 = std::chrono::steady_clock::now();
    pipeline::whole_model_step(*m, opt, x, y, u.microbatches);
    if (i >= warmup) steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  r.seconds_per_step = median(steps);
  kernels::saved_activations keep;  // one microbatch in flight at a time
  m->forward(u.random_batch(0).split(u.microbatches)[0], keep, true);
  r.peak_bytes = keep.bytes();
  for (auto* p : m->parameters()) r.weights.push_back(p->value.clone());
  return r;
}

result run_schedule(const setup& u, actor_system& sys, const pipeline::schedule& s, int warmup, int timed) {
  auto whole = u.fresh_model();
  pipeline::trainer t(sys, s, pipeline::cut_mlp(*whole, u.sizes, s.stages()),
                      {.optimizer = kernels::optimizer_kind::adamw, .hp = hp()});
  result r;
  std::vector<double> steps, busy;
  for (int i = 0; i < warmup + timed; ++i) {
    const tensor x = u.random_batch(static_cast<std::uint64_t>(i)), y = u.random_labels(static_cast<std::uint64_t>(i));
    const auto t0 = std::chrono::steady_clock::now();
    const auto step = t.step(x, y);
    if (i >= warmup) {
      steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      double sum = 0;
      for (double b : step.busy_seconds) sum += b;
      busy.push_back(sum / static_cast<double>(step.busy_seconds.size()) / step.seconds);
    }
    for (auto b : step.peak_activation_bytes) r.peak_bytes = std::max(r.peak_bytes, b);
  }
  r.seconds_per_step = median(steps);
  r.busy = median(busy);
  r.weights = t.parameters();
  return r;
}

bool same_weights(const std::vector<tensor>& a, const std::vector<tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || std::memcmp(a[i].bytes(), b[i].bytes(), a[i].nbytes()) != 0) return false;
  return true;
}

void line(const setup& u, const options& o, std::ostream& out, const std::string& bench, bool recompute,
          const result& r, double whole_seconds) {
  char buf[512];
  const double sps = static_cast<double>(u.batch) / r.seconds_per_step;
  if (o.json)
    std::snprintf(buf, sizeof buf,
                  "{\"suite\":\"pipeline\",\"bench\":\"%s\",\"recompute\":%s,\"ranks\":%d,\"microbatches\":%d,"
                  "\"metric\":\"samples_per_s\",\"value\":%.1f,\"ratio_to_whole\":%.3f,"
                  "\"peak_activation_bytes\":%zu,\"busy\":%.3f}\n",
                  bench.c_str(), recompute ? "true" : "false", bench == "whole" ? 1 : u.ranks, u.microbatches, sps,
                  whole_seconds / r.seconds_per_step, r.peak_bytes, r.busy);
  else
    std::snprintf(buf, sizeof buf, "%-18s %-10s %10.0f samples/s  %5.2fx whole  peak %8zu activation bytes  busy %3.0f%%\n",
                  bench.c_str(), recompute ? "recompute" : "", sps, whole_seconds / r.seconds_per_step, r.peak_bytes,
                  100 * r.busy);
  out << buf;
  out.flush();
}

}  // namespace

int run_pipeline(const pipeline_options& o, std::ostream& out) {
  const auto names = pipeline::schedule_names();
  if (!o.only.empty() && o.only != "whole" && std::find(names.begin(), names.end(), o.only) == names.end()) {
    std::cerr << "troupe bench pipeline: unknown workload '" << o.only << "' (known: whole";
    for (const auto& n : names) std::cerr << ", " << n;
    std::cerr << ")\n";
    return 2;
  }
  setup u;
  try {
    u.sizes = kernels::mlp_sizes(o.model);
  } catch (const std::invalid_argument& e) {
    std::cerr << "troupe bench pipeline: " << e.what() << "\n";
    return 2;
  }
  u.model = o.model;
  u.batch = o.batch;
  u.microbatches = o.microbatches;
  u.ranks = o.ranks;
  if (u.batch < 1 || u.microbatches < 1 || u.ranks < 1 || u.batch % u.microbatches != 0) {
    std::cerr << "troupe bench pipeline: --batch must be a positive multiple of --microbatches, and --ranks positive\n";
    return 2;
  }
  const int warmup = 2, timed = o.quick ? 3 : 30;
  const result whole = run_whole(u, warmup, timed);
  if (o.only.empty() || o.only == "whole") line(u, o, out, "whole", false, whole, whole.seconds_per_step);
  actor_system sys{{.threads = o.threads}};
  int rc = 0;
  for (const auto& name : names) {
    if (!o.only.empty() && o.only != name) continue;
    // A schedule that does not fit these sizes (too few layers for its stages, a microbatch
    // count it refuses) is skipped with the reason.
    std::optional<pipeline::schedule> plain;
    try {
      plain = pipeline::generate(name, u.ranks, u.microbatches);
      if (static_cast<std::size_t>(plain->stages()) > u.sizes.size() - 1)
        throw std::invalid_argument(std::to_string(plain->stages()) + " stages for " +
                                    std::to_string(u.sizes.size() - 1) + " linear layers");
    } catch (const std::exception& e) {
      std::cerr << "troupe bench pipeline: " << name << " skipped: " << e.what() << "\n";
      if (o.only == name) rc = 2;  // the one workload asked for gave no row
      continue;
    }
    // Each stage recomputes: every:2 of 2 layers keeps one input, the stage's own.
    const auto checkpointed = pipeline::with_checkpointing(*plain, pipeline::checkpoint_policy::parse("every:2"), 2);
    for (const bool recompute : {false, true}) {
      const auto r = run_schedule(u, sys, recompute ? checkpointed : *plain, warmup, timed);
      if (!same_weights(r.weights, whole.weights)) {
        std::cerr << "troupe bench pipeline: " << name << (recompute ? " (recompute)" : "")
                  << " trained other weights than the whole model\n";
        rc = 1;
      }
      line(u, o, out, name, recompute, r, whole.seconds_per_step);
    }
  }
  return rc;
}

}  // namespace troupe::bench
