// The optimizer's reference step (optimizer::reference_step): the update rules one tensor-wide
// operation at a time, as torch.optim's single-tensor code performs them, each line naming the
// torch operation it stands for. It is the definition of correctness: every fast path
// (optim_fast.cpp and the kernels it picks, optim_cuda*.cu on a device) is tested against it,
// bit for bit on the host.
//
// Compressed moments are decoded to fp32 first and rounded back after the update; 8-bit codes
// then come from the nearest-entry search (quant::qmap::quantize_reference), not the table.

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "optim_step.hpp"

namespace troupe::kernels::optim {

namespace {

// PyTorch's lerp for weight w: a + w (b - a) when w < 0.5, else b - (b - a)(1 - w).
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

void adam_reference(std::span<float> p, std::span<const float> grad, std::span<float> m, std::span<float> v,
                    std::span<float> vmax, const adam_constants& c) {
  const std::size_t n = p.size();
  if (c.decay != 1.0f)
    for (std::size_t i = 0; i < n; ++i) p[i] = p[i] * c.decay;                 // param.mul_(1 - lr*wd)
  std::vector<float> g(grad.begin(), grad.end());
  if (c.gscale != 1.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] * c.gscale;                // grad * gnorm_scale
  if (c.l2 != 0.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] + p[i] * c.l2;             // grad.add(param, alpha=wd)
  for (std::size_t i = 0; i < n; ++i) m[i] = lerp(m[i], g[i], c.one_minus_beta1);  // exp_avg.lerp_
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] * c.beta2;                 // exp_avg_sq.mul_(beta2)
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] + c.one_minus_beta2 * g[i] * g[i];  // .addcmul_
  std::vector<float> denom(n);
  for (std::size_t i = 0; i < n; ++i) {
    float second = v[i];
    if (!vmax.empty()) second = vmax[i] = std::max(vmax[i], v[i]);            // torch.maximum
    denom[i] = std::sqrt(second) * c.inv_bias2_sqrt + c.eps;  // .sqrt() / bc2_sqrt + eps (see docs/OPTIMIZERS.md)
  }
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] + (-c.step_size) * m[i] / denom[i];  // addcdiv_
}

void sgd_reference(std::span<float> p, std::span<const float> grad, std::span<float> buf, const sgd_constants& c,
                   bool first) {
  const std::size_t n = p.size();
  std::vector<float> g(grad.begin(), grad.end());
  if (c.gscale != 1.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] * c.gscale;                // grad * gnorm_scale
  if (c.wd != 0.0f)
    for (std::size_t i = 0; i < n; ++i) g[i] = g[i] + p[i] * c.wd;             // d_p.add(param, alpha=wd)
  if (!buf.empty()) {
    if (first) {
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

void reference_step(optimizer_kind kind, optimizer::slot& s, const tensor_plan& pl) {
  const std::size_t n = numel_of(s);
  auto p = s.p->value.data<float>();
  auto g = std::as_const(*s.p).grad.data<float>();
  // fp32 moments are updated in place; others through an fp32 copy, rounded back after.
  std::vector<float> mv, vv, xv;
  auto view = [&](optimizer::moment& mo, std::vector<float>& copy) -> std::span<float> {
    if (mo.mode == mode_none) return {};
    if (mo.mode == mode_fp32) return mo.data.data<float>();
    copy = decode(mo, n);
    return copy;
  };
  auto back = [&](optimizer::moment& mo, std::vector<float>& copy, const rounding& r) {
    if (mo.mode != mode_bf16 && mo.mode != mode_int8) return;
    const std::size_t step = mo.mode == mode_int8 ? static_cast<std::size_t>(mo.block) : n;
    for (std::size_t b = 0; b < n; b += step) store_moment(mo, b, std::min(step, n - b), copy.data() + b, r, true);
  };
  auto m = view(s.m, mv), v = view(s.v, vv), x = view(s.vmax, xv);
  if (kind == optimizer_kind::sgd) sgd_reference(p, g, m, pl.sgd, pl.first);
  else adam_reference(p, g, m, v, x, pl.adam);
  back(s.m, mv, pl.rm);
  back(s.v, vv, pl.rv);
  back(s.vmax, xv, pl.rx);
}

}  // namespace troupe::kernels::optim
