// The optimizer's fast step on any CPU: fused loops (every element read and written once) that
// the compiler vectorizes for the baseline instruction set. optim_fast.cpp runs them where
// quant::simd_level() is 0. (The gradient checks one value at a time are inline in
// optim_kernels.hpp, as the vector paths' tails.)
//
// Reference: optim_reference.cpp, bit for bit (the same IEEE operations in the same order; this
// file is compiled with -ffp-contract=off).

#include <algorithm>
#include <cmath>

#include "optim_kernels.hpp"

namespace troupe::kernels::optim::portable {

namespace {

/// One fused pass: every element read and written once. The loop-invariant choices are template
/// parameters or multiplications by exactly 1 (the decay and the clipping scale), so that the
/// loop has no branches and vectorizes; x * 1.0f == x for every float, so the arithmetic is the
/// reference's.
template <bool L2, bool Amsgrad>
void adam_fused_loop(float* __restrict p, const float* __restrict grad, float* __restrict m, float* __restrict v,
                     float* __restrict vmax, std::size_t n, const adam_constants c) {
  const bool low = c.one_minus_beta1 < 0.5f;
  for (std::size_t i = 0; i < n; ++i) {
    const float param = p[i] * c.decay;  // AdamW: decoupled decay first
    float g = grad[i] * c.gscale;        // percentile clipping
    if constexpr (L2) g = g + param * c.l2;  // Adam: L2 into the gradient
    const float mi = low ? m[i] + c.one_minus_beta1 * (g - m[i]) : g - (g - m[i]) * (1.0f - c.one_minus_beta1);
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * g * g;  // addcmul: (value * t1) * t2
    float second = vi;
    if constexpr (Amsgrad) {
      second = std::max(vmax[i], vi);
      vmax[i] = second;
    }
    const float denom = std::sqrt(second) * c.inv_bias2_sqrt + c.eps;
    p[i] = param + (-c.step_size) * mi / denom;  // addcdiv: (value * t1) / t2
    m[i] = mi;
    v[i] = vi;
  }
}

template <bool Wd, bool Momentum>
void sgd_fused_loop(float* __restrict p, const float* __restrict grad, float* __restrict buf, std::size_t n,
                    const sgd_constants c, bool first) {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (Momentum) {
      buf[i] = sgd_element<Wd>(p[i], grad[i], buf[i], c, first);
    } else {
      float g = grad[i] * c.gscale;
      if constexpr (Wd) g = g + p[i] * c.wd;
      p[i] = p[i] + g * (-c.lr);
    }
  }
}

}  // namespace

void adam_fp32(float* p, const float* grad, float* m, float* v, float* vmax, std::size_t n, const adam_constants& c) {
  if (c.l2 != 0.0f) {
    if (vmax) adam_fused_loop<true, true>(p, grad, m, v, vmax, n, c);
    else adam_fused_loop<true, false>(p, grad, m, v, vmax, n, c);
  } else {
    if (vmax) adam_fused_loop<false, true>(p, grad, m, v, vmax, n, c);
    else adam_fused_loop<false, false>(p, grad, m, v, vmax, n, c);
  }
}

void sgd_fp32(float* p, const float* grad, float* buf, std::size_t n, const sgd_constants& c, bool first) {
  if (c.wd != 0.0f) {
    if (buf) sgd_fused_loop<true, true>(p, grad, buf, n, c, first);
    else sgd_fused_loop<true, false>(p, grad, buf, n, c, first);
  } else {
    if (buf) sgd_fused_loop<false, true>(p, grad, buf, n, c, first);
    else sgd_fused_loop<false, false>(p, grad, buf, n, c, first);
  }
}

}  // namespace troupe::kernels::optim::portable
