// `troupe bench gpt`: the training throughput of nanoGPT's CPU configuration (gpt:layers=4,
// heads=4,embd=128,ctx=64, batch 12, AdamW, warmup + cosine, clipping: `troupe train`'s defaults
// for a GPT) over a fixed number of steps, and the time of each kernel of one step at that
// configuration's shapes (768 rows of 128 channels, 4 heads, a vocabulary of 65 characters).
// tests/bench/gpt_compare.sh runs it beside PyTorch (tests/bench/torch_gpt.py).

#include "gpt_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <string>

#include <troupe/kernels/attention.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/lm.hpp>
#include <troupe/kernels/optim.hpp>

namespace troupe::bench {
namespace {

constexpr std::int64_t batch = 12, ctx = 64, embd = 128, heads = 4, vocab = 65, rows = batch * ctx;
const char* const kernel_names[] = {"embedding", "layer_norm", "attention_forward", "attention_backward",
                                    "gelu",      "cross_entropy", "adamw_step", nullptr};

void line(const gpt_options& o, std::ostream& out, const std::string& bench, const std::string& metric, double value,
          const char* unit) {
  char num[64];
  std::snprintf(num, sizeof num, "%.3f", value);
  if (o.json)
    out << "{\"suite\":\"gpt\",\"bench\":\"" << bench << "\",\"metric\":\"" << metric << "\",\"value\":" << num
        << ",\"unit\":\"" << unit << "\"}\n";
  else
    out << bench << "  " << metric << "  " << num << " " << unit << "\n";
  out.flush();
}

tensor random_tensor(tensor::shape_type shape, std::mt19937& rng, float scale = 1.0f) {
  auto t = tensor::empty(std::move(shape));
  std::uniform_real_distribution<float> u(-scale, scale);
  for (float& v : t.data<float>()) v = u(rng);
  return t;
}

/// Microseconds per call of `f`: after one warm-up call, calls until `seconds` have passed.
double microseconds_per_call(const std::function<void()>& f, double seconds) {
  f();
  std::int64_t runs = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds || runs < 3) {
    f();
    ++runs;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return elapsed / static_cast<double>(runs) * 1e6;
}

/// One layer's forward and both halves of its backward on `x`.
std::function<void()> layer_step(kernels::layer& l, const tensor& x, const tensor& dy) {
  return [&l, x, dy] {
    kernels::saved_activations keep;
    l.forward(x, keep, true);
    l.backward_input(dy, keep);
    l.backward_weight(dy, keep);
  };
}

}  // namespace

const char* const* gpt_kernel_names() { return kernel_names; }

int run_gpt(const gpt_options& o, std::ostream& out) {
  const bool known = o.only.empty() || o.only == "train" || o.only == "pipeline" || o.only == "kernels" ||
                     std::any_of(kernel_names, kernel_names + 7, [&](const char* n) { return o.only == n; });
  if (!known) {
    std::cerr << "troupe bench gpt: unknown workload '" << o.only << "' (known: train, pipeline, kernels";
    for (auto* n = kernel_names; *n; ++n) std::cerr << ", " << *n;
    std::cerr << ")\n";
    return 2;
  }
  if (o.steps < 1) {
    std::cerr << "troupe bench gpt: --steps must be at least 1\n";
    return 2;
  }
  if (o.only.empty() || o.only == "train") {
    kernels::lm_options t;  // the defaults are nanoGPT's CPU configuration
    t.steps = o.quick ? std::min<std::int64_t>(o.steps, 20) : o.steps;
    t.eval_every = t.steps;
    t.eval_batches = 4;
    if (!o.text.empty()) {
      t.text = o.text;
      t.dataset.clear();
    }
    try {
      const auto r = kernels::train_lm(t);
      line(o, out, "train_nanogpt_cpu", "tokens_per_s", r.tokens_per_s, "tokens/s");
      line(o, out, "train_nanogpt_cpu", "ms_per_step", 1e3 * static_cast<double>(t.batch * ctx) / r.tokens_per_s, "ms");
      line(o, out, "train_nanogpt_cpu", "val_loss_after_" + std::to_string(t.steps) + "_steps", r.val_loss, "nats");
    } catch (const std::exception& e) {
      std::cerr << "troupe bench gpt: training failed: " << e.what() << "\n";
      return 1;
    }
  }
  if (o.only.empty() || o.only == "pipeline") {
    const int rc = run_gpt_pipeline(o, [&](const std::string& bench, const std::string& metric, double v, const char* unit) {
      line(o, out, bench, metric, v, unit);
    });
    if (rc != 0) return rc;
  }
  if (o.only == "pipeline") return 0;
  const double seconds = o.quick ? 0.05 : 0.5;
  const auto wanted = [&](const char* name) { return o.only.empty() || o.only == "kernels" || o.only == name; };
  std::mt19937 rng(1);
  const auto report = [&](const char* name, const std::function<void()>& f) {
    if (wanted(name)) line(o, out, name, "us_per_call", microseconds_per_call(f, seconds), "us");
  };
  try {
    if (wanted("embedding")) {
      auto emb = kernels::make_embedding(vocab, ctx, embd);
      tensor ids = tensor::empty({rows, 1});
      for (std::int64_t r = 0; r < rows; ++r) ids.data<float>()[r] = static_cast<float>(rng() % vocab);
      report("embedding", layer_step(*emb, ids, random_tensor({rows, embd}, rng)));
    }
    if (wanted("layer_norm")) {
      auto ln = kernels::make_layer_norm(embd);
      report("layer_norm", layer_step(*ln, random_tensor({rows, embd}, rng), random_tensor({rows, embd}, rng)));
    }
    if (wanted("attention_forward") || wanted("attention_backward")) {
      const tensor qkv = random_tensor({rows, 3 * embd}, rng), dout = random_tensor({rows, embd}, rng);
      tensor a, lse, dqkv;
      kernels::causal_attention_forward(qkv, ctx, heads, a, lse);
      report("attention_forward", [&] { kernels::causal_attention_forward(qkv, ctx, heads, a, lse); });
      report("attention_backward", [&] { kernels::causal_attention_backward(dout, qkv, a, lse, ctx, heads, dqkv); });
    }
    if (wanted("gelu")) {
      auto g = kernels::make_gelu();
      report("gelu", layer_step(*g, random_tensor({rows, 4 * embd}, rng, 3), random_tensor({rows, 4 * embd}, rng)));
    }
    if (wanted("cross_entropy")) {
      const tensor logits = random_tensor({rows, vocab}, rng, 4);
      tensor labels = tensor::empty({rows}, dtype::i32), dlogits;
      for (std::int64_t r = 0; r < rows; ++r) labels.data<std::int32_t>()[r] = static_cast<std::int32_t>(rng() % vocab);
      report("cross_entropy", [&] { kernels::softmax_cross_entropy(logits, labels, dlogits); });
    }
    if (wanted("adamw_step")) {
      auto model = kernels::make_gpt("gpt:layers=4,heads=4,embd=128,ctx=64", vocab);
      kernels::param_group decay, plain;
      decay.hp.beta2 = plain.hp.beta2 = 0.99;
      decay.hp.weight_decay = 0.1;
      for (auto* p : model->parameters()) {
        std::uniform_real_distribution<float> u(-1e-2f, 1e-2f);
        for (float& v : p->grad.data<float>()) v = u(rng);
        (p->value.dim(0) > 1 ? decay : plain).params.push_back(p);
      }
      kernels::optimizer opt(kernels::optimizer_kind::adamw, {decay, plain});
      report("adamw_step", [&] { opt.step(); });
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe bench gpt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace troupe::bench
