// The layers only a transformer has: token + position embedding and causal self-attention (its
// kernels in attention.cpp). Host tensors only: a device input is refused.

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "troupe/kernels/attention.hpp"
#include "troupe/kernels/layers.hpp"

namespace troupe::kernels {

namespace {

double uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

/// Fills `t` with normal(0, stddev) draws (Box-Muller over 53-bit uniforms: the same on every
/// platform, unlike std::normal_distribution) and zeroes `grad`.
void fill_normal(parameter& p, std::mt19937_64& g, double stddev) {
  auto v = p.value.data<float>();
  for (std::size_t i = 0; i < v.size(); i += 2) {
    const double u1 = 1.0 - uniform01(g), u2 = uniform01(g);
    const double r = std::sqrt(-2.0 * std::log(u1)) * stddev;
    v[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
    if (i + 1 < v.size()) v[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
  }
  for (float& e : p.grad.data<float>()) e = 0;
}

void check_host(const tensor& t, const std::string& who) {
  if (!t.where().is_cpu()) throw std::invalid_argument(who + " computes on the host; got " + t.str());
}

class embedding final : public layer {
public:
  embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t embd)
      : vocab_(vocab), ctx_(ctx), embd_(embd),
        wte_{"wte", tensor::zeros({vocab, embd}), tensor::zeros({vocab, embd})},
        wpe_{"wpe", tensor::zeros({ctx, embd}), tensor::zeros({ctx, embd})} {
    if (vocab < 1 || ctx < 1 || embd < 1) throw std::invalid_argument("embedding needs positive vocab, ctx and embd");
    initialize(0);
  }
  std::string describe() const override {
    return "embedding(vocab=" + std::to_string(vocab_) + ", ctx=" + std::to_string(ctx_) + ", embd=" +
           std::to_string(embd_) + ")";
  }
  tensor forward(const tensor& x, saved_activations& keep, bool) override {
    check_host(x, describe());
    if (x.rank() != 2 || x.type() != dtype::f32 || x.dim(1) != 1 || x.dim(0) % ctx_ != 0)
      throw std::invalid_argument(describe() + " expects f32 [n, 1] token ids, n a multiple of " + std::to_string(ctx_) +
                                  ", got " + x.str());
    const std::int64_t n = x.dim(0);
    auto ids = x.data<float>();
    for (std::int64_t r = 0; r < n; ++r) {
      const float id = ids[r];
      if (!(id >= 0 && id < static_cast<float>(vocab_)) || id != std::floor(id))
        throw std::invalid_argument(describe() + ": row " + std::to_string(r) + " holds " + std::to_string(id) +
                                    ", not a token id in 0.." + std::to_string(vocab_ - 1));
    }
    tensor y = tensor::empty({n, embd_});
    float* yd = y.data<float>().data();
    const float* te = wte_.value.data<float>().data();
    const float* pe = wpe_.value.data<float>().data();
    for (std::int64_t r = 0; r < n; ++r) {
      const float* a = te + static_cast<std::int64_t>(ids[r]) * embd_;
      const float* b = pe + (r % ctx_) * embd_;
      for (std::int64_t k = 0; k < embd_; ++k) yd[r * embd_ + k] = a[k] + b[k];
    }
    keep.tensors = {x};
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    check_dy(dy, keep);
    return tensor::zeros({dy.dim(0), 1});  // token ids have no gradient
  }
  void backward_weight(const tensor& dy, saved_activations& keep) override {
    check_dy(dy, keep);
    auto ids = keep.tensors[0].data<float>();
    const float* d = dy.data<float>().data();
    float* te = wte_.grad.data<float>().data();
    float* pe = wpe_.grad.data<float>().data();
    for (std::int64_t r = 0; r < dy.dim(0); ++r) {  // in row order: the same sums every run
      float* a = te + static_cast<std::int64_t>(ids[r]) * embd_;
      float* b = pe + (r % ctx_) * embd_;
      for (std::int64_t k = 0; k < embd_; ++k) {
        a[k] += d[r * embd_ + k];
        b[k] += d[r * embd_ + k];
      }
    }
    keep.clear();
  }
  std::vector<parameter*> parameters() override { return {&wte_, &wpe_}; }
  void initialize(std::uint64_t seed) override {
    std::mt19937_64 g(seed);
    fill_normal(wte_, g, 0.02);
    fill_normal(wpe_, g, 0.02);
  }

private:
  void check_dy(const tensor& dy, const saved_activations& keep) const {
    if (keep.tensors.empty()) throw std::logic_error(describe() + ": backward without a matching forward");
    check_host(dy, describe() + " backward");
    if (dy.rank() != 2 || dy.type() != dtype::f32 || dy.dim(0) != keep.tensors[0].dim(0) || dy.dim(1) != embd_)
      throw std::invalid_argument(describe() + " backward: the gradient " + dy.str() + " does not match the output f32[" +
                                  std::to_string(keep.tensors[0].dim(0)) + ", " + std::to_string(embd_) + "]");
  }
  std::int64_t vocab_, ctx_, embd_;
  parameter wte_, wpe_;
};

/// keep: children {qkv linear, proj linear}; tensors {qkv, attention output, lse} from the
/// forward to backward_input; output_grads {d qkv} from backward_input to backward_weight.
class attention final : public layer {
public:
  attention(std::int64_t embd, std::int64_t heads, std::int64_t ctx)
      : embd_(embd), heads_(heads), ctx_(ctx), qkv_(make_linear(embd, 3 * embd)), proj_(make_linear(embd, embd)) {
    if (heads < 1 || ctx < 1 || embd % heads != 0)
      throw std::invalid_argument("attention(" + std::to_string(embd) + ", heads=" + std::to_string(heads) +
                                  "): embd must be a multiple of heads");
    for (auto* p : qkv_->parameters()) p->name.insert(0, "qkv.");
    for (auto* p : proj_->parameters()) p->name.insert(0, "proj.");
  }
  std::string describe() const override {
    return "attention(" + std::to_string(embd_) + ", heads=" + std::to_string(heads_) + ", ctx=" + std::to_string(ctx_) +
           ")";
  }
  tensor forward(const tensor& x, saved_activations& keep, bool training) override {
    check_host(x, describe());
    if (x.rank() != 2 || x.dim(0) % ctx_ != 0)
      throw std::invalid_argument(describe() + " expects rows in sequences of " + std::to_string(ctx_) + ", got " + x.str());
    keep.clear();
    keep.children.resize(2);
    tensor qkv = qkv_->forward(x, keep.children[0], training);
    tensor a, lse;
    causal_attention_forward(qkv, ctx_, heads_, a, lse);
    tensor y = proj_->forward(a, keep.children[1], training);
    keep.tensors = {qkv, a, lse};
    return y;
  }
  tensor backward_input(const tensor& dy, saved_activations& keep) override {
    if (keep.children.size() != 2 || keep.tensors.size() != 3)
      throw std::logic_error(describe() + ": backward without a matching forward (or after it was freed)");
    check_host(dy, describe() + " backward");
    tensor da = proj_->backward_input(dy, keep.children[1]);
    tensor dqkv;
    causal_attention_backward(da, keep.tensors[0], keep.tensors[1], keep.tensors[2], ctx_, heads_, dqkv);
    tensor dx = qkv_->backward_input(dqkv, keep.children[0]);
    keep.tensors.clear();  // the weight gradients need only the linears' inputs and d qkv
    keep.output_grads = {dqkv};
    return dx;
  }
  void backward_weight(const tensor& dy, saved_activations& keep) override {
    if (keep.children.size() != 2 || keep.output_grads.size() != 1)
      throw std::logic_error(describe() + ": backward_weight before backward_input");
    proj_->backward_weight(dy, keep.children[1]);
    qkv_->backward_weight(keep.output_grads[0], keep.children[0]);
    keep.clear();
  }
  std::vector<parameter*> parameters() override {
    auto out = qkv_->parameters();
    for (auto* p : proj_->parameters()) out.push_back(p);
    return out;
  }
  void initialize(std::uint64_t seed) override {
    qkv_->initialize(seed * 0x9E3779B97F4A7C15ull + 1);
    proj_->initialize(seed * 0x9E3779B97F4A7C15ull + 2);
  }

private:
  std::int64_t embd_, heads_, ctx_;
  std::unique_ptr<layer> qkv_, proj_;
};

}  // namespace

std::unique_ptr<layer> make_embedding(std::int64_t vocab, std::int64_t ctx, std::int64_t embd) {
  return std::make_unique<embedding>(vocab, ctx, embd);
}

std::unique_ptr<layer> make_attention(std::int64_t embd, std::int64_t heads, std::int64_t ctx) {
  return std::make_unique<attention>(embd, heads, ctx);
}

}  // namespace troupe::kernels
