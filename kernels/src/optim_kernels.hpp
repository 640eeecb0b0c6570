#pragma once
// The fast CPU kernels of the optimizer step, one file per instruction set: optim_avx512.cpp
// (simd_level() 2), optim_avx2.cpp (1) and optim_portable.cpp (any CPU, vectorized by the
// compiler); optim_fast.cpp picks among them. Here: the scalar rules every kernel performs, one
// element at a time (adam_element, sgd_element: adam_fused_loop's and sgd_fused_loop's element),
// inline so that the kernels' loops and their scalar tails inline them, and the kernels' entry
// points.
//
// Every kernel performs these rules' IEEE operations in the same order (no FMA contraction:
// these files are compiled with -ffp-contract=off), so that it gives the bits of the reference
// step (optim_reference.cpp); the tests compare each instruction set with it (quant::limit_simd).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "optim_step.hpp"
#include "quantize.hpp"

namespace troupe::kernels::optim {

// ---- the scalar rules ------------------------------------------------------------------------

/// One element of the fused Adam pass: returns the new parameter, sets the new moments.
/// With vmax (AMSGrad): *vmax is the maximum so far, read and replaced.
template <bool L2>
inline float adam_element(float p, float grad, float m, float v, const adam_constants& c, float& m_out,
                          float& v_out, float* vmax = nullptr) {
  const float param = p * c.decay;
  float g = grad * c.gscale;
  if constexpr (L2) g = g + param * c.l2;
  const float mi = c.one_minus_beta1 < 0.5f ? m + c.one_minus_beta1 * (g - m) : g - (g - m) * (1.0f - c.one_minus_beta1);
  const float vi = v * c.beta2 + c.one_minus_beta2 * g * g;
  float second = vi;
  if (vmax) {
    second = std::max(*vmax, vi);
    *vmax = second;
  }
  const float denom = std::sqrt(second) * c.inv_bias2_sqrt + c.eps;
  m_out = mi;
  v_out = vi;
  return param + (-c.step_size) * mi / denom;
}

/// One element of SGD with momentum, from the old momentum `old` (the portable loop's buffer,
/// or an 8-bit kernel's decoded value): updates p, returns the new momentum.
template <bool Wd>
inline float sgd_element(float& p, float grad, float old, const sgd_constants& c, bool first) {
  float g = grad * c.gscale;
  if constexpr (Wd) g = g + p * c.wd;
  const float b = first ? g : old * c.momentum + g * c.one_minus_dampening;
  g = c.nesterov ? g + b * c.momentum : b;
  p = p + g * (-c.lr);
  return b;
}

/// How far ahead (in elements) the vector kernels prefetch their streams.
constexpr std::size_t prefetch_ahead = 512;

/// Calls f(l2, clip, low) with the three loop-invariant choices of an Adam step (L2 decay,
/// gradient clipping, which form of the first-moment update) as std::bool_constant values, so
/// that a kernel can take them as template arguments and its loop tests none of them.
template <class F>
void with_choices(const adam_constants& c, F&& f) {
  auto low = [&](auto l2, auto clip) {
    if (c.one_minus_beta1 < 0.5f) f(l2, clip, std::true_type{});
    else f(l2, clip, std::false_type{});
  };
  auto clip = [&](auto l2) {
    if (c.gscale != 1.0f) low(l2, std::true_type{});
    else low(l2, std::false_type{});
  };
  if (c.l2 != 0.0f) clip(std::true_type{});
  else clip(std::false_type{});
}

/// Calls f(std::bool_constant<flag>...) with each flag made a compile-time constant, so that a
/// kernel can take them as template arguments and its loop tests none of them.
template <class F>
void with_flags(F&& f) {
  f();
}
template <class F, class... Flags>
void with_flags(F&& f, bool flag, Flags... rest) {
  if (flag) with_flags([&](auto... b) { f(std::true_type{}, b...); }, rest...);
  else with_flags([&](auto... b) { f(std::false_type{}, b...); }, rest...);
}

inline float moment_value(float x) { return x; }
inline float moment_value(std::uint16_t h) { return quant::from_bf16(h); }
inline void set_moment(float& x, float v) { x = v; }
inline void set_moment(std::uint16_t& h, float v) { h = quant::to_bf16(v); }

/// Where a stochastically rounded bf16 moment draws its bits: element i of the call with
/// (key, first + i), first being the index of p[0] in its tensor.
struct draw_keys {
  std::uint32_t m = 0, v = 0, x = 0, first = 0;
};

template <bool Stochastic, class M>
inline void set_moment(M& out, float x, std::uint32_t key, std::uint32_t at) {
  if constexpr (Stochastic) out = quant::to_bf16_stochastic(x, quant::random_bits(key, at));
  else set_moment(out, x);
}

// ---- the kernels' entry points -----------------------------------------------------------------

/// Any CPU (optim_portable.cpp): loops the compiler vectorizes for the baseline instruction set.
namespace portable {
/// Adam/AdamW over fp32 moments (vmax: AMSGrad's maximum, or null).
void adam_fp32(float* p, const float* grad, float* m, float* v, float* vmax, std::size_t n, const adam_constants& c);
/// SGD over an fp32 momentum buffer (none when buf is null).
void sgd_fp32(float* p, const float* grad, float* buf, std::size_t n, const sgd_constants& c, bool first);
/// top_exponent (optim_step.hpp) one value at a time; inline: the vector paths' tails too.
inline std::uint32_t top_exponent(const float* x, std::size_t n) {
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, x + i, 4);
    top = std::max(top, b & exponent_bits);
  }
  return top;
}
/// sum_of_squares (optim_step.hpp) with its 16 partial sums `sums` already holding the sums of
/// the elements before x (a vector path's); adds x's and returns the total. Inline, as above.
inline double sum_of_squares(const float* x, std::size_t n, double* sums) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    sums[i % 16] += v * v;
  }
  double total = 0;
  for (int k = 0; k < 16; ++k) total += sums[k];
  return total;
}
}  // namespace portable

/// AVX2 (optim_avx2.cpp); callers check quant::simd_level() >= 1.
namespace avx2 {
/// Adam/AdamW over fp32 moments (x: AMSGrad's maximum, or null).
void adam_fp32(float* p, const float* grad, float* m, float* v, float* x, std::size_t n, const adam_constants& c);
/// Adam/AdamW over a bf16 second moment (and AMSGrad maximum x, or null), the first moment bf16
/// or fp32 (first_moment_fp32). Stochastic: bf16 rounded by the draws of `keys`; else to nearest
/// even.
void adam_bf16(float* p, const float* grad, std::uint16_t* m, std::uint16_t* v, std::uint16_t* x, std::size_t n,
               const adam_constants& c, const draw_keys& keys, bool stochastic);
void adam_bf16(float* p, const float* grad, float* m, std::uint16_t* v, std::uint16_t* x, std::size_t n,
               const adam_constants& c, const draw_keys& keys, bool stochastic);
/// SGD over an fp32 momentum buffer (none when buf is null).
void sgd_fp32(float* p, const float* grad, float* buf, std::size_t n, const sgd_constants& c, bool first);
/// SGD over a bf16 momentum buffer; stochastic: rounded by the draws of (key, at + i).
void sgd_bf16(float* p, const float* grad, std::uint16_t* buf, std::size_t n, const sgd_constants& c, bool first,
              bool stochastic, std::uint32_t key, std::uint32_t at);
/// Adam/AdamW over elements [begin, end) of a slot whose moments are all 8-bit (begin on a block
/// boundary); `buffers` holds three blocks.
void adam_int8(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c, const rounding& rm,
               const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers);
/// SGD with an 8-bit momentum buffer (codes mc, block scales msc) over the blocks of
/// [begin, end); `buffers` holds one block. Codes by quant::quantize_block with `opts`.
void sgd_int8(float* p, const float* g, std::uint8_t* mc, float* msc, const quant::qmap& map,
              const quant::block_options& opts, std::size_t begin, std::size_t end, std::size_t block,
              const sgd_constants& c, bool first, float* buffers, std::uint32_t key, double percentile);
std::uint32_t top_exponent(const float* x, std::size_t n);
}  // namespace avx2

/// AVX-512 F, DQ, BW, VL and VBMI (optim_avx512.cpp): avx2's entry points and more; callers
/// check quant::simd_level() >= 2.
namespace avx512 {
void adam_fp32(float* p, const float* grad, float* m, float* v, float* x, std::size_t n, const adam_constants& c);
void adam_bf16(float* p, const float* grad, std::uint16_t* m, std::uint16_t* v, std::uint16_t* x, std::size_t n,
               const adam_constants& c, const draw_keys& keys, bool stochastic);
void adam_bf16(float* p, const float* grad, float* m, std::uint16_t* v, std::uint16_t* x, std::size_t n,
               const adam_constants& c, const draw_keys& keys, bool stochastic);
void sgd_fp32(float* p, const float* grad, float* buf, std::size_t n, const sgd_constants& c, bool first);
void sgd_bf16(float* p, const float* grad, std::uint16_t* buf, std::size_t n, const sgd_constants& c, bool first,
              bool stochastic, std::uint32_t key, std::uint32_t at);
/// Adam/AdamW over elements [begin, end) of a slot with 8-bit v (and AMSGrad maximum), the first
/// moment 8-bit or fp32 (begin on a block boundary); `buffers` holds 6 blocks and 64 floats.
void adam_int8(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c, const rounding& rm,
               const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers);
/// SGD with an 8-bit momentum buffer (the signed map) over the blocks of [begin, end);
/// `buffers` holds two blocks. Stochastic: codes by stochastic rounding with `key`.
void sgd_int8(float* p, const float* g, std::uint8_t* mc, float* msc, const quant::qmap& map, std::size_t begin,
              std::size_t end, std::size_t block, const sgd_constants& c, bool first, float* buffers,
              std::uint32_t key, double percentile, bool stochastic);
std::uint32_t top_exponent(const float* x, std::size_t n);
double sum_of_squares(const float* x, std::size_t n);
}  // namespace avx512

}  // namespace troupe::kernels::optim
