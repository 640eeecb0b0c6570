#include "troupe/kernels/optim.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

namespace troupe::kernels {

optimizer_kind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return optimizer_kind::sgd;
  if (name == "adam") return optimizer_kind::adam;
  if (name == "adamw") return optimizer_kind::adamw;
  throw std::invalid_argument("optimizer '" + name + "' is not one of: sgd, adam, adamw");
}

optimizer::optimizer(optimizer_kind kind, std::vector<param_group> groups)
    : kind_(kind), groups_(std::move(groups)) {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& hp = groups_[g].hp;
    auto bad = [](const std::string& why) { throw std::invalid_argument("optimizer: " + why); };
    if (!(hp.lr >= 0)) bad("lr must be >= 0");
    if (!(hp.weight_decay >= 0)) bad("weight_decay must be >= 0");
    if (kind == optimizer_kind::sgd) {
      if (!(hp.momentum >= 0)) bad("momentum must be >= 0");
      if (hp.nesterov && (hp.momentum <= 0 || hp.dampening != 0))
        bad("Nesterov momentum needs momentum > 0 and dampening 0");
    } else {
      if (!(hp.beta1 >= 0 && hp.beta1 < 1)) bad("beta1 must be in [0, 1)");
      if (!(hp.beta2 >= 0 && hp.beta2 < 1)) bad("beta2 must be in [0, 1)");
      if (!(hp.eps >= 0)) bad("eps must be >= 0");
    }
    for (auto* p : groups_[g].params) {
      if (!p || p->value.type() != dtype::f32 || p->grad.shape() != p->value.shape())
        bad("every parameter needs an f32 value and a gradient of the same shape");
      slot s{p, g, {}, {}, {}};
      const bool needs_m = kind != optimizer_kind::sgd || hp.momentum != 0;
      if (needs_m) s.m = tensor::zeros(p->value.shape());
      if (kind != optimizer_kind::sgd) s.v = tensor::zeros(p->value.shape());
      if (kind != optimizer_kind::sgd && hp.amsgrad) s.vmax = tensor::zeros(p->value.shape());
      slots_.push_back(std::move(s));
    }
  }
}

void optimizer::set_lr_schedule(std::function<double(std::int64_t, double)> schedule) {
  schedule_ = std::move(schedule);
}

std::size_t optimizer::state_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& s : slots_) n += s.m.nbytes() + s.v.nbytes() + s.vmax.nbytes();
  return n;
}

void optimizer::zero_grad() {
  for (auto& s : slots_)
    for (float& g : s.p->grad.data<float>()) g = 0;
}

bool optimizer::grads_finite() const {
  for (const auto& s : slots_) {
    float acc = 0;
    for (float g : s.p->grad.data<float>()) acc += g * 0.0f;  // NaN or inf poisons the sum
    if (acc != 0.0f) return false;
  }
  return true;
}

bool optimizer::step() { return do_step(false); }
bool optimizer::reference_step() { return do_step(true); }

namespace {

// PyTorch's lerp for weight w: a + w (b - a) when w < 0.5, else b - (b - a)(1 - w).
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

struct adam_constants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bias2_sqrt, decay, l2;
};

/// One fused pass: every element read and written once.
void adam_fused(float* __restrict p, const float* __restrict grad, float* __restrict m,
                float* __restrict v, float* __restrict vmax, std::size_t n, const adam_constants& c) {
  for (std::size_t i = 0; i < n; ++i) {
    float param = p[i];
    if (c.decay != 1.0f) param = param * c.decay;  // AdamW: decoupled decay first
    float g = grad[i];
    if (c.l2 != 0.0f) g = g + param * c.l2;        // Adam: L2 into the gradient
    const float mi = lerp(m[i], g, c.one_minus_beta1);
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * g * g;  // addcmul: (value * t1) * t2
    float second = vi;
    if (vmax) {
      second = std::max(vmax[i], vi);
      vmax[i] = second;
    }
    const float denom = std::sqrt(second) / c.bias2_sqrt + c.eps;
    p[i] = param + (-c.step_size) * mi / denom;  // addcdiv: (value * t1) / t2
    m[i] = mi;
    v[i] = vi;
  }
}

/// The same arithmetic, one tensor-wide operation at a time (as torch.optim's single-tensor path).
void adam_reference(std::span<float> p, std::span<const float> grad, std::span<float> m,
                    std::span<float> v, std::span<float> vmax, const adam_constants& c) {
  const std::size_t n = p.size();
  if (c.decay != 1.0f)
    for (std::size_t i = 0; i < n; ++i) p[i] = p[i] * c.decay;                 // param.mul_(1 - lr*wd)
  std::vector<float> g(grad.begin(), grad.end());
  if (c.l2 != 0.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] + p[i] * c.l2;             // grad.add(param, alpha=wd)
  for (std::size_t i = 0; i < n; ++i) m[i] = lerp(m[i], g[i], c.one_minus_beta1);  // exp_avg.lerp_
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] * c.beta2;                 // exp_avg_sq.mul_(beta2)
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] + c.one_minus_beta2 * g[i] * g[i];  // .addcmul_
  std::vector<float> denom(n);
  for (std::size_t i = 0; i < n; ++i) {
    float second = v[i];
    if (!vmax.empty()) second = vmax[i] = std::max(vmax[i], v[i]);            // torch.maximum
    denom[i] = std::sqrt(second) / c.bias2_sqrt + c.eps;                       // .sqrt() / bc2_sqrt + eps
  }
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] + (-c.step_size) * m[i] / denom[i];  // addcdiv_
}

struct sgd_constants {
  float lr, momentum, one_minus_dampening, wd;
  bool nesterov, first;
};

void sgd_fused(float* __restrict p, const float* __restrict grad, float* __restrict buf,
               std::size_t n, const sgd_constants& c) {
  for (std::size_t i = 0; i < n; ++i) {
    float g = grad[i];
    if (c.wd != 0.0f) g = g + p[i] * c.wd;
    if (buf) {
      const float b = c.first ? g : buf[i] * c.momentum + g * c.one_minus_dampening;
      buf[i] = b;
      g = c.nesterov ? g + b * c.momentum : b;
    }
    p[i] = p[i] + g * (-c.lr);
  }
}

void sgd_reference(std::span<float> p, std::span<const float> grad, std::span<float> buf,
                   const sgd_constants& c) {
  const std::size_t n = p.size();
  std::vector<float> g(grad.begin(), grad.end());
  if (c.wd != 0.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] + p[i] * c.wd;             // d_p.add(param, alpha=wd)
  if (!buf.empty()) {
    if (c.first) {
      for (std::size_t i = 0; i < n; ++i) buf[i] = g[i];                       // buf = clone(d_p)
    } else {
      for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] * c.momentum;        // buf.mul_(momentum)
      for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] + g[i] * c.one_minus_dampening;  // .add_
    }
    for (std::size_t i = 0; i < n; ++i) g[i] = c.nesterov ? g[i] + buf[i] * c.momentum : buf[i];
  }
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] + g[i] * (-c.lr);           // param.add_(d_p, alpha=-lr)
}

}  // namespace

bool optimizer::do_step(bool reference) {
  if (!grads_finite()) {
    ++skipped_;
    return false;
  }
  const std::int64_t t = ++steps_;
  for (auto& s : slots_) {
    const auto& hp = groups_[s.group].hp;
    const double lr = schedule_ ? schedule_(t, hp.lr) : hp.lr;
    auto p = s.p->value.data<float>();
    auto g = std::as_const(s.p->grad).data<float>();
    if (kind_ == optimizer_kind::sgd) {
      sgd_constants c{static_cast<float>(lr), static_cast<float>(hp.momentum),
                      static_cast<float>(1 - hp.dampening), static_cast<float>(hp.weight_decay),
                      hp.nesterov, t == 1};
      if (reference) sgd_reference(p, g, s.m.defined() ? s.m.data<float>() : std::span<float>{}, c);
      else sgd_fused(p.data(), g.data(), s.m.defined() ? s.m.data<float>().data() : nullptr, p.size(), c);
      continue;
    }
    // Bias corrections in double, as torch.optim computes them from Python floats.
    const double bc1 = 1 - std::pow(hp.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(hp.beta2, static_cast<double>(t));
    adam_constants c{static_cast<float>(hp.beta1),
                     static_cast<float>(hp.beta2),
                     static_cast<float>(1 - hp.beta1),
                     static_cast<float>(1 - hp.beta2),
                     static_cast<float>(hp.eps),
                     static_cast<float>(lr / bc1),
                     static_cast<float>(std::sqrt(bc2)),
                     kind_ == optimizer_kind::adamw ? static_cast<float>(1 - lr * hp.weight_decay) : 1.0f,
                     kind_ == optimizer_kind::adam ? static_cast<float>(hp.weight_decay) : 0.0f};
    auto vmax = s.vmax.defined() ? s.vmax.data<float>() : std::span<float>{};
    if (reference) adam_reference(p, g, s.m.data<float>(), s.v.data<float>(), vmax, c);
    else adam_fused(p.data(), g.data(), s.m.data<float>().data(), s.v.data<float>().data(),
                    vmax.empty() ? nullptr : vmax.data(), p.size(), c);
  }
  return true;
}

}  // namespace troupe::kernels
