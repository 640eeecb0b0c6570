#include "troupe/kernels/optim.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <immintrin.h>
#include <limits>
#include <new>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "troupe/core/log.hpp"

#include "cuda_ops.hpp"
#include "job_pool.hpp"
#include "quantize.hpp"
#include "quantize_avx2.hpp"
#include "quantize_avx512.hpp"

namespace troupe::kernels {

namespace {

// moment::mode values.
constexpr std::uint8_t mode_none = 0, mode_fp32 = 1, mode_bf16 = 2, mode_int8 = 3;

std::uint8_t mode_of(state_storage s) {
  switch (s) {
    case state_storage::bf16: return mode_bf16;
    case state_storage::int8: return mode_int8;
    default: return mode_fp32;
  }
}

}  // namespace

optimizer_kind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return optimizer_kind::sgd;
  if (name == "adam") return optimizer_kind::adam;
  if (name == "adamw") return optimizer_kind::adamw;
  throw std::invalid_argument("optimizer '" + name + "' is not one of: sgd, adam, adamw");
}

state_storage parse_state_storage(const std::string& name) {
  if (name == "fp32") return state_storage::fp32;
  if (name == "bf16") return state_storage::bf16;
  if (name == "int8") return state_storage::int8;
  if (name == "auto") return state_storage::automatic;
  throw std::invalid_argument("optimizer state '" + name + "' is not one of: fp32, bf16, int8, auto");
}

const char* name_of(state_storage s) noexcept {
  switch (s) {
    case state_storage::fp32: return "fp32";
    case state_storage::bf16: return "bf16";
    case state_storage::int8: return "int8";
    case state_storage::automatic: return "auto";
  }
  return "?";
}

namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument("optimizer: " + why); }

void validate(optimizer_kind kind, const hyperparameters& hp, const state_options& so) {
  if (static_cast<unsigned>(kind) > static_cast<unsigned>(optimizer_kind::adamw))
    bad("kind " + std::to_string(static_cast<unsigned>(kind)) + " is not SGD, Adam or AdamW");
  if (!(hp.lr >= 0) || !std::isfinite(hp.lr)) bad("lr must be finite and >= 0");
  if (!(hp.weight_decay >= 0) || !std::isfinite(hp.weight_decay)) bad("weight_decay must be finite and >= 0");
  if (kind == optimizer_kind::sgd) {
    if (!(hp.momentum >= 0) || !std::isfinite(hp.momentum)) bad("momentum must be finite and >= 0");
    if (!std::isfinite(hp.dampening)) bad("dampening must be finite");
    if (hp.nesterov && (hp.momentum <= 0 || hp.dampening != 0))
      bad("Nesterov momentum needs momentum > 0 and dampening 0");
  } else {
    if (!(hp.beta1 >= 0 && hp.beta1 < 1)) bad("beta1 must be in [0, 1)");
    if (!(hp.beta2 >= 0 && hp.beta2 < 1)) bad("beta2 must be in [0, 1)");
    if (!(hp.eps >= 0) || !std::isfinite(hp.eps)) bad("eps must be finite and >= 0");
  }
  if (static_cast<unsigned>(so.storage) > static_cast<unsigned>(state_storage::automatic))
    bad("state storage " + std::to_string(static_cast<unsigned>(so.storage)) + " is not fp32, bf16, int8 or automatic");
  // (A step keeps a few blocks per moment and thread in fast memory: 65,536 elements at most.)
  if (so.block_size < 1 || so.block_size > (1 << 16)) bad("state block_size must be in [1, 65536]");
  if (so.min_8bit_elements < 0) bad("state min_8bit_elements must be >= 0");
  if (!(so.percentile_scale >= 0 && so.percentile_scale <= 100)) bad("state percentile_scale must be in [0, 100]");
  if (!(so.percentile_clipping > 0 && so.percentile_clipping <= 100))
    bad("state percentile_clipping must be in (0, 100]");
}

bool same(const hyperparameters& a, const hyperparameters& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
         a.nesterov == b.nesterov && a.amsgrad == b.amsgrad;
}

bool same(const state_options& a, const state_options& b) {
  return a.storage == b.storage && a.block_size == b.block_size && a.min_8bit_elements == b.min_8bit_elements &&
         a.first_moment_fp32 == b.first_moment_fp32 && a.stochastic_rounding == b.stochastic_rounding &&
         a.percentile_scale == b.percentile_scale && a.percentile_clipping == b.percentile_clipping &&
         a.fp32_params == b.fp32_params;
}

/// MemAvailable from /proc/meminfo, in bytes; 0 when unknown.
std::size_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::size_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

// ---- the update rules: fused (one pass) and reference (one operation at a time) ----------------

// PyTorch's lerp for weight w: a + w (b - a) when w < 0.5, else b - (b - a)(1 - w).
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

struct adam_constants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size;
  float inv_bias2_sqrt;  // 1 / sqrt(bias_correction2), rounded once: torch divides by its square root
  float decay, l2, gscale;
};

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

/// The portable fp32 loop (CPUs without AVX2; the vector paths run optim_stream.inc).
void adam_fused(float* p, const float* grad, float* m, float* v, float* vmax, std::size_t n, const adam_constants& c) {
  if (c.l2 != 0.0f) {
    if (vmax) adam_fused_loop<true, true>(p, grad, m, v, vmax, n, c);
    else adam_fused_loop<true, false>(p, grad, m, v, vmax, n, c);
  } else {
    if (vmax) adam_fused_loop<false, true>(p, grad, m, v, vmax, n, c);
    else adam_fused_loop<false, false>(p, grad, m, v, vmax, n, c);
  }
}

/// The same arithmetic, one tensor-wide operation at a time (as torch.optim's single-tensor path).
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

struct sgd_constants {
  float lr, momentum, one_minus_dampening, wd, gscale;
  bool nesterov;
};

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

void sgd_fused(float* p, const float* grad, float* buf, std::size_t n, const sgd_constants& c, bool first) {
  if (c.wd != 0.0f) {
    if (buf) sgd_fused_loop<true, true>(p, grad, buf, n, c, first);
    else sgd_fused_loop<true, false>(p, grad, buf, n, c, first);
  } else {
    if (buf) sgd_fused_loop<false, true>(p, grad, buf, n, c, first);
    else sgd_fused_loop<false, false>(p, grad, buf, n, c, first);
  }
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

// ---- storage: moments as fp32, bf16 or 8-bit blocks ------------------------------------------

const quant::qmap& map_of(const optimizer::moment& mo) { return quant::qmap::dynamic(mo.is_signed); }

/// How values are rounded into a moment's storage at one step.
struct rounding {
  bool stochastic = false;
  double percentile = 0;
  std::uint32_t key = 0;
};

quant::block_options block_opts(const optimizer::moment& mo, const rounding& r) {
  quant::block_options o;
  o.block = static_cast<std::size_t>(mo.block);
  o.percentile = r.percentile;
  o.stochastic = r.stochastic;
  return o;
}

/// Elements [b, b + n) of a moment as fp32, into `out` (or a pointer into fp32 storage).
float* load_moment(optimizer::moment& mo, std::size_t b, std::size_t n, float* out) {
  switch (mo.mode) {
    case mode_fp32: return mo.data.data<float>().data() + b;
    case mode_bf16: {
      const std::uint16_t* h = mo.data.data<std::uint16_t>().data() + b;
      for (std::size_t i = 0; i < n; ++i) out[i] = quant::from_bf16(h[i]);
      return out;
    }
    case mode_int8: {
      // b is a block boundary and n at most one block.
      const float s = mo.scales.data<float>()[b / static_cast<std::size_t>(mo.block)];
      quant::dequantize_block(mo.data.data<std::uint8_t>().data() + b, n, s, map_of(mo), out);
      return out;
    }
    default: return nullptr;
  }
}

/// Writes back what load() gave, rounding into the moment's storage. `reference`: the 8-bit
/// codes come from the nearest-entry search instead of the table.
void store_moment(optimizer::moment& mo, std::size_t b, std::size_t n, const float* x, const rounding& r, bool reference) {
  switch (mo.mode) {
    case mode_bf16: {
      std::uint16_t* h = mo.data.data<std::uint16_t>().data() + b;
      if (r.stochastic && reference)
        for (std::size_t i = 0; i < n; ++i)
          h[i] = quant::to_bf16_stochastic(x[i], quant::random_bits(r.key, static_cast<std::uint32_t>(b + i)));
      else if (r.stochastic)
        quant::to_bf16_stochastic(x, n, r.key, static_cast<std::uint32_t>(b), h);
      else
        for (std::size_t i = 0; i < n; ++i) h[i] = quant::to_bf16(x[i]);
      return;
    }
    case mode_int8: {
      const auto o = block_opts(mo, r);
      float& s = mo.scales.data<float>()[b / o.block];
      s = quant::stored_scale(quant::block_scale(x, n, o.percentile));
      std::uint8_t* c = mo.data.data<std::uint8_t>().data() + b;
      if (reference) quant::quantize_block_reference(x, n, s, map_of(mo), o, r.key, static_cast<std::uint32_t>(b), c);
      else quant::quantize_block(x, n, s, map_of(mo), o, r.key, static_cast<std::uint32_t>(b), c);
      return;
    }
    default: return;
  }
}

/// The whole moment as fp32 values.
std::vector<float> decode(const optimizer::moment& mo, std::size_t n) {
  std::vector<float> out(n);
  switch (mo.mode) {
    case mode_fp32: std::copy_n(mo.data.data<float>().data(), n, out.data()); break;
    case mode_bf16:
      for (std::size_t i = 0; i < n; ++i) out[i] = quant::from_bf16(mo.data.data<std::uint16_t>()[i]);
      break;
    case mode_int8:
      quant::dequantize_blockwise(mo.data.data<std::uint8_t>().data(), mo.scales.data<float>().data(), n,
                                  static_cast<std::size_t>(mo.block), map_of(mo), out.data());
      break;
    default: break;
  }
  return out;
}

// ---- fused compressed-state Adam: bf16 or 8-bit moments converted in registers ---------------
//
// The chunk path (do_step) loads each compressed moment into an fp32 buffer, runs the fp32
// kernel on the buffers and rounds them back: three passes per chunk. The kernels below read
// bf16 or 8-bit moments straight into registers (AVX2 or AVX-512), update, and write bf16 back
// (or, for 8-bit, the block's new values to an L1 buffer while keeping its absmax, then the
// codes). They perform the same IEEE operations in the same order as adam_fused_loop (no FMA),
// so they give the same bits; elements that do not fill a vector go through the scalar element
// below.

/// One element of adam_fused_loop: returns the new parameter, sets the new moments.
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


/// How far ahead (in elements) the 8-bit kernel prefetches its streams.
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

// ---- the fp32 and bf16 loops, once per instruction set (optim_stream.inc) ------------------

#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
struct V {
  using reg = __m256;
  using ireg = __m256i;
  static constexpr std::size_t width = 8;
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg set1(float f) { return _mm256_set1_ps(f); }
  static ireg seti(std::uint32_t u) { return _mm256_set1_epi32(static_cast<int>(u)); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  static reg widen(const std::uint16_t* h) { return quant::avx2::bf16_widen(h); }
  static void narrow(std::uint16_t* h, reg x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(h), quant::avx2::bf16_nearest(x)); }
  static void narrow_stochastic(std::uint16_t* h, reg x, ireg key, std::uint32_t at) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), quant::avx2::bf16_stochastic(x, quant::avx2::random_bits(key, at)));
  }
};
#include "optim_stream.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi")
namespace avx512 {
struct V {
  using reg = __m512;
  using ireg = __m512i;
  static constexpr std::size_t width = 16;
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg set1(float f) { return _mm512_set1_ps(f); }
  static ireg seti(std::uint32_t u) { return _mm512_set1_epi32(static_cast<int>(u)); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static reg sqrt(reg a) { return _mm512_sqrt_ps(a); }
  static reg widen(const std::uint16_t* h) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void narrow(std::uint16_t* h, reg x) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), _mm512_cvtepi32_epi16(r));
  }
  static void narrow_stochastic(std::uint16_t* h, reg x, ireg key, std::uint32_t at) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), quant::avx512::bf16_stochastic(x, quant::avx512::random_bits(key, at)));
  }
};
#include "optim_stream.inc"
}  // namespace avx512
#pragma GCC pop_options

/// Adam/AdamW over fp32 or bf16 moments on the widest vectors the CPU has (simd_level() >= 1):
/// adam_stream of optim_stream.inc with the loop-invariant choices as template arguments.
template <class M, bool Ams = false, bool Stochastic = false, class Vt = M>
void adam_stream_any(float* p, const float* grad, M* m, Vt* v, std::type_identity_t<Vt>* x, std::size_t n,
                     const adam_constants& c, const draw_keys& keys = {}) {
  with_choices(c, [&](auto l2, auto clip, auto low) {
    if (quant::simd_level() >= 2) avx512::adam_stream<l2, clip, low, M, Ams, Stochastic, Vt>(p, grad, m, v, x, n, c, keys);
    else avx2::adam_stream<l2, clip, low, M, Ams, Stochastic, Vt>(p, grad, m, v, x, n, c, keys);
  });
}

/// SGD over fp32 or bf16 momentum (none when buf is null) on the widest vectors the CPU has
/// (simd_level() >= 1); Stochastic: bf16 rounded by the draws of (key, at + i).
template <class M, bool Stochastic = false>
void sgd_stream_any(float* p, const float* grad, M* buf, std::size_t n, const sgd_constants& c, bool first,
                    std::uint32_t key = 0, std::uint32_t at = 0) {
  const bool avx512 = quant::simd_level() >= 2;
  if (c.wd != 0.0f) {
    if (avx512) avx512::sgd_stream<true, M, Stochastic>(p, grad, buf, n, c, first, key, at);
    else avx2::sgd_stream<true, M, Stochastic>(p, grad, buf, n, c, first, key, at);
  } else {
    if (avx512) avx512::sgd_stream<false, M, Stochastic>(p, grad, buf, n, c, first, key, at);
    else avx2::sgd_stream<false, M, Stochastic>(p, grad, buf, n, c, first, key, at);
  }
}

/// One block of 8-bit state on AVX2: the moments' codes (m, v and with Ams AMSGrad's maximum x)
/// decoded in registers (one table lookup each, quant::avx2::decode8), the update, and their new values written to buf[j]
/// with their absmax in absmax[j]. The caller then makes each moment's codes from its new values.
struct int8_block_avx2 {
  const std::uint8_t* codes[3] = {};  // m, v, x (Ams)
  float scale[3] = {};
  const float* values[3] = {};  // the maps' entries
  float* buf[3] = {};
  float absmax[3] = {};
};

template <bool L2, bool Clip, bool Low, bool Ams>
__attribute__((target("avx2"))) void adam_int8_avx2(float* p, const float* grad, std::size_t n, const adam_constants& c,
                                                    int8_block_avx2& d) {
  const avx2::adam_vectors k = avx2::broadcast(c);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  constexpr int moments = Ams ? 3 : 2;
  // Locals, not d's fields: d's floats could alias the stores, which would reload every pointer.
  const std::uint8_t* codes[3] = {d.codes[0], d.codes[1], d.codes[2]};
  const float* values[3] = {d.values[0], d.values[1], d.values[2]};
  float* buf[3] = {d.buf[0], d.buf[1], d.buf[2]};
  const __m256 scale[3] = {_mm256_set1_ps(d.scale[0]), _mm256_set1_ps(d.scale[1]), _mm256_set1_ps(d.scale[2])};
  __m256 top0 = _mm256_setzero_ps(), top1 = top0, top2 = top0;  // not an array: that lives on the stack
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mo[3];
    mo[0] = quant::avx2::decode8(values[0], codes[0] + i);
    mo[1] = quant::avx2::decode8(values[1], codes[1] + i);
    mo[2] = Ams ? quant::avx2::decode8(values[2], codes[2] + i) : mo[1];
#pragma GCC unroll 3
    for (int j = 0; j < moments; ++j) mo[j] = _mm256_mul_ps(mo[j], scale[j]);
    _mm256_storeu_ps(p + i, avx2::adam_update<L2, Clip, Low, Ams>(_mm256_loadu_ps(p + i), _mm256_loadu_ps(grad + i),
                                                                  mo[0], mo[1], k, &mo[2]));
    _mm256_storeu_ps(buf[0] + i, mo[0]);
    _mm256_storeu_ps(buf[1] + i, mo[1]);
    top0 = _mm256_max_ps(top0, _mm256_and_ps(mo[0], magnitude));
    top1 = _mm256_max_ps(top1, _mm256_and_ps(mo[1], magnitude));
    if constexpr (Ams) {
      _mm256_storeu_ps(buf[2] + i, mo[2]);
      top2 = _mm256_max_ps(top2, _mm256_and_ps(mo[2], magnitude));
    }
  }
  const __m256 top[3] = {top0, top1, top2};
  for (int j = 0; j < moments; ++j) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top[j]);
    d.absmax[j] = 0;
    for (float l : lanes) d.absmax[j] = std::max(d.absmax[j], l);
  }
  for (; i < n; ++i) {
    float mo[3];
    for (int j = 0; j < moments; ++j) mo[j] = values[j][codes[j][i]] * d.scale[j];
    p[i] = adam_element<L2>(p[i], grad[i], mo[0], mo[1], c, mo[0], mo[1], Ams ? &mo[2] : nullptr);
    for (int j = 0; j < moments; ++j) {
      buf[j][i] = mo[j];
      d.absmax[j] = std::max(d.absmax[j], std::fabs(mo[j]));
    }
  }
}

/// SGD with an 8-bit momentum buffer over the blocks of [begin, end) on AVX2: per block the
/// codes decoded in registers (one table lookup), the update and the new buffer written to an L1 buffer
/// with its absmax, then the codes from it (quant::quantize_block: nearest or stochastic, scaled
/// by the absmax or, percentile > 0, that percentile of |x|). The operations of sgd_fused_loop
/// after dequantize_block, so the same bits as the portable path.
template <bool Wd>
__attribute__((target("avx2"))) void sgd_int8_blocks_avx2(float* p, const float* g, std::uint8_t* mc, float* msc,
                                                          const quant::qmap& map, const quant::block_options& opts,
                                                          std::size_t begin, std::size_t end, std::size_t block,
                                                          const sgd_constants& c, bool first, float* buf,
                                                          std::uint32_t key, double percentile) {
  const __m256 gscale = _mm256_set1_ps(c.gscale), wd = _mm256_set1_ps(c.wd), momentum = _mm256_set1_ps(c.momentum);
  const __m256 omd = _mm256_set1_ps(c.one_minus_dampening), neg_lr = _mm256_set1_ps(-c.lr);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const bool clip = c.gscale != 1.0f, nesterov = c.nesterov;  // x * 1 == x: no clipping, no multiply
  const float* values = map.values();
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t n = std::min(block, end - b), k = b / block;
    float* pb = p + b;
    const float* gb = g + b;
    const std::uint8_t* cb = mc + b;
    const __m256 scale = _mm256_set1_ps(msc[k]);
    __m256 top = _mm256_setzero_ps();
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 pi = _mm256_loadu_ps(pb + i);
      __m256 gi = _mm256_loadu_ps(gb + i);
      if (clip) gi = _mm256_mul_ps(gi, gscale);
      if constexpr (Wd) gi = _mm256_add_ps(gi, _mm256_mul_ps(pi, wd));
      const __m256 bi =
          first ? gi
                : _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(quant::avx2::decode8(values, cb + i), scale), momentum),
                                _mm256_mul_ps(gi, omd));
      gi = nesterov ? _mm256_add_ps(gi, _mm256_mul_ps(bi, momentum)) : bi;
      _mm256_storeu_ps(pb + i, _mm256_add_ps(pi, _mm256_mul_ps(gi, neg_lr)));
      _mm256_storeu_ps(buf + i, bi);
      top = _mm256_max_ps(top, _mm256_and_ps(bi, magnitude));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top);
    float am = 0;
    for (float l : lanes) am = std::max(am, l);
    for (; i < n; ++i) {
      buf[i] = sgd_element<Wd>(pb[i], gb[i], values[cb[i]] * msc[k], c, first);
      am = std::max(am, std::fabs(buf[i]));
    }
    const float s = quant::stored_scale(percentile > 0 ? quant::block_scale(buf, n, percentile) : am);
    msc[k] = s;
    quant::quantize_block(buf, n, s, map, opts, key, static_cast<std::uint32_t>(b), mc + b);
  }
}

/// The moments of the AVX-512 Adam kernel, indexed 0 (m, the signed map), 1 (v) and, with
/// AMSGrad, 2 (its maximum; the unsigned map like v): codes, block scales and map values. With
/// first_moment_fp32, m is fp32 values instead (`m_fp32`, indexed like the parameters) and its
/// codes, scale and values are unused. `percentile`: scale each block by this percentile of |x|
/// (quant::block_scale) where that is not its absmax, else 0.
struct int8_moments {
  std::uint8_t* codes[3] = {};
  float* scales[3] = {};
  const float* values[3] = {};
  const std::uint8_t* planes[3] = {};  // the maps' entries as byte planes (qmap::planes)
  float* m_fp32 = nullptr;
  double percentile = 0;
};

/// A block whose new moment values wait in L1 buffers for their codes.
struct pending_block {
  std::uint8_t* codes[3] = {};
  const float* buf[3] = {};
  std::size_t n = 0;
  float inv[3] = {}, scale[3] = {};  // inv as quant::quantize_block: 1 / scale, 0 for a zero scale
  std::uint32_t first = 0;           // the block's first element in its tensor (stochastic rounding)
};

/// What stochastic rounding needs in the 8-bit kernel: the quantizers without keep_nonzero and
/// the moments' keys (quant::quantize_block's draws).
struct stochastic_state {
  quant::avx512::quantizer mq, vq;
  __m512i key[3];
  std::uint32_t key_scalar[3];
};

TROUPE_AVX512 inline stochastic_state load_stochastic(const quant::qmap& mmap, const quant::qmap& vmap,
                                                      const std::uint32_t (&keys)[3]) {
  stochastic_state sr{quant::avx512::load_quantizer(mmap, false), quant::avx512::load_quantizer(vmap, false), {}, {}};
  for (int k = 0; k < 3; ++k) {
    sr.key[k] = _mm512_set1_epi32(static_cast<int>(keys[k]));
    sr.key_scalar[k] = keys[k];
  }
  return sr;
}

/// Which 8-bit moments a kernel instance has: m (unless kept in fp32), v, and AMSGrad's maximum.
template <bool MFp32, bool Ams>
struct moment_set {
  static constexpr int first = MFp32 ? 1 : 0;  // the first 8-bit moment
  static constexpr int end = Ams ? 3 : 2;     // also the moment buffers per block (m's unused with MFp32)
};

/// Codes of elements [j, j + 16) of a pending block: the arithmetic quantizer, then the table for
/// the lanes it is not sure of (Stochastic: draws, no table). Ams: AMSGrad's maximum too; MFp32:
/// no first moment.
/// Always inlined: as a call it would spill the kernel's vector registers (all caller-saved) on
/// every chunk, a 1.5x slower step. (GCC 12 takes the intrinsics' own undefined-value
/// placeholders for uninitialized variables here once they are inlined.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <bool Stochastic, bool Ams, bool MFp32>
TROUPE_AVX512 inline __attribute__((always_inline)) void quantize_chunk(
    const pending_block& q, std::size_t j, const quant::avx512::quantizer& mq, const quant::avx512::quantizer& vq,
    const quant::qmap& mmap, const quant::qmap& vmap, const stochastic_state& sr) {
  const __m512 xm = MFp32 ? _mm512_setzero_ps() : _mm512_mul_ps(_mm512_loadu_ps(q.buf[0] + j), _mm512_set1_ps(q.inv[0]));
  const __m512 xv = _mm512_mul_ps(_mm512_loadu_ps(q.buf[1] + j), _mm512_set1_ps(q.inv[1]));
  __m512 xx = xv;
  if constexpr (Ams) xx = _mm512_mul_ps(_mm512_loadu_ps(q.buf[2] + j), _mm512_set1_ps(q.inv[2]));
  if constexpr (Stochastic) {
    // Codes by draws; no lane needs the table (quant::avx512::stochastic_codes).
    const std::uint32_t at = q.first + static_cast<std::uint32_t>(j);
    const __m512i cv = quant::avx512::stochastic_codes<false>(sr.vq, vmap, xv, sr.key[1], at, true);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q.codes[1] + j), _mm512_cvtepi32_epi8(cv));
    if constexpr (!MFp32) {
      const __m512i cm = quant::avx512::stochastic_codes<true>(sr.mq, mmap, xm, sr.key[0], at, true);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q.codes[0] + j), _mm512_cvtepi32_epi8(cm));
    }
    if constexpr (Ams) {
      const __m512i cx = quant::avx512::stochastic_codes<false>(sr.vq, vmap, xx, sr.key[2], at, true);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q.codes[2] + j), _mm512_cvtepi32_epi8(cx));
    }
    return;
  }
  __mmask16 sure = 0xffff;  // the lanes every moment's estimate is sure of
  const __m512i kv = quant::avx512::quantize<false, true>(vq, xv, sure);
  if constexpr (MFp32) {
    quant::avx512::store_codes<false>(q.codes[1] + j, vq, kv, xv);
  } else {
    const __m512i km = quant::avx512::quantize<true>(mq, xm, sure);
    // Both moments' indexes in one permute: m's in bytes 0-15, v's (their codes) in bytes 16-31.
    const __m512i both = _mm512_permutex2var_epi8(km, quant::avx512::code_bytes(), kv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q.codes[0] + j),
                     quant::avx512::signed_codes(mq, _mm512_castsi512_si128(both), quant::avx512::negative(xm)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q.codes[1] + j), _mm256_extracti128_si256(_mm512_castsi512_si256(both), 1));
  }
  if constexpr (Ams) quant::avx512::store_codes<false>(q.codes[2] + j, vq, quant::avx512::quantize<false, true>(vq, xx, sure), xx);
  // A lane any moment is unsure of gets every code from the table.
  const __mmask16 unsure = static_cast<__mmask16>(~sure);
  if (unsure != 0) [[unlikely]] {
    for (unsigned m = unsure; m != 0; m &= m - 1) {
      const std::size_t i = j + static_cast<std::size_t>(__builtin_ctz(m));
      for (int k = moment_set<MFp32, Ams>::first; k < moment_set<MFp32, Ams>::end; ++k)
        q.codes[k][i] = quant::avx512::quantize_exact(k == 0 ? mmap : vmap, q.buf[k][i] * q.inv[k], true);
    }
  }
}
#pragma GCC diagnostic pop

/// The elements of a pending block that do not fill a vector.
template <bool Stochastic, bool Ams, bool MFp32>
inline void quantize_tail(const pending_block& q, std::size_t from, const quant::qmap& mmap, const quant::qmap& vmap,
                          const stochastic_state& sr) {
  if (from >= q.n) return;
  for (int k = moment_set<MFp32, Ams>::first; k < moment_set<MFp32, Ams>::end; ++k) {
    const quant::qmap& map = k == 0 ? mmap : vmap;
    if constexpr (Stochastic) {
      quant::block_options o;
      o.stochastic = true;
      quant::quantize_block(q.buf[k] + from, q.n - from, q.scale[k], map, o, sr.key_scalar[k],
                            q.first + static_cast<std::uint32_t>(from), q.codes[k] + from);
    } else {
      for (std::size_t i = from; i < q.n; ++i) q.codes[k][i] = quant::avx512::quantize_exact(map, q.buf[k][i] * q.inv[k], true);
    }
  }
}

/// The 8-bit blocks of [begin, end) on AVX-512, in two stages that overlap: while block k is
/// decoded and updated, block k - 1 gets its codes. The update reads the moments straight from
/// their codes, 64 at a time by byte permutes (quant::avx512::decode64; a block's vectors of 16
/// beyond its last whole 64 by gathers), writes the parameters, keeps the new moments' absmax
/// and leaves the new moments in an L1 buffer; once the block's scale is known, the arithmetic
/// quantizer makes their codes while the next block is updated, so that its integer and permute
/// work runs beside the update's division and square root (docs/PERFORMANCE.md). Two buffers
/// rotate between the stages. Stochastic: codes by stochastic rounding with `keys`
/// (quant::quantize_block's draws). Ams: AMSGrad, its maximum as a third 8-bit moment. MFp32:
/// the first moment in fp32 (mo.m_fp32), read and written in place as a stream. A block's scale
/// is its absmax, or mo.percentile's selection from the updated values in L1. `buffers` holds
/// 6 * block + 64 floats.
// GCC 12 takes the intrinsics' own undefined-value placeholders for uninitialized variables here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <bool L2, bool Clip, bool Low, bool Stochastic, bool Ams, bool MFp32>
TROUPE_AVX512 void adam_int8_blocks_avx512(float* p, const float* g, const int8_moments& mo, const quant::qmap& mmap,
                                           const quant::qmap& vmap, std::size_t begin, std::size_t end,
                                           std::size_t block, const adam_constants& c, float* buffers,
                                           const std::uint32_t (&keys)[3]) {
  using set = moment_set<MFp32, Ams>;
  const quant::avx512::quantizer mq = quant::avx512::load_quantizer(mmap, true);
  const quant::avx512::quantizer vq = quant::avx512::load_quantizer(vmap, true);
  const stochastic_state sr = load_stochastic(mmap, vmap, keys);
  const avx512::adam_vectors kc = avx512::broadcast(c);
  // 32 floats between the two buffers: 4 KiB apart, the update's stores and the quantizer's loads
  // at the same offset would alias in the store queue's address check.
  auto buffer = [&](std::size_t index) { return buffers + (set::end * block + 32) * (index % 2); };
  auto full_of = [](std::size_t n) { return n & ~std::size_t{15}; };
  pending_block prev;
  std::size_t index = 0;
  for (std::size_t b = begin; b < end; b += block, ++index) {
    const std::size_t n = std::min(block, end - b), k = b / block;
    float* mbuf = buffer(index);
    float* mrow = MFp32 ? mo.m_fp32 + b : mbuf;  // where this block's first moment is updated
    float* vbuf = mbuf + block;
    float* xbuf = vbuf + block;  // AMSGrad only
    float* pb = p + b;
    const float* gb = g + b;
    const std::uint8_t* codes[3] = {MFp32 ? nullptr : mo.codes[0] + b, mo.codes[1] + b, Ams ? mo.codes[2] + b : nullptr};
    float scale[3] = {};
    for (int m = set::first; m < set::end; ++m) scale[m] = mo.scales[m][k];
    const __m512 scales[3] = {_mm512_set1_ps(scale[0]), _mm512_set1_ps(scale[1]), _mm512_set1_ps(scale[2])};
    __m512 ma = _mm512_setzero_ps(), va = _mm512_setzero_ps(), xa = _mm512_setzero_ps();
    const std::size_t full = full_of(n), prev_full = full_of(prev.n);
    // Elements [i, i + 16) from their decoded moments (m unused with MFp32: its stream is read).
    auto update = [&](std::size_t i, __m512 mi, __m512 vi, __m512 xi) TROUPE_AVX512 {
      // Software prefetch 2 KiB ahead on the parameter and gradient streams: this loop is slow
      // enough per byte that the hardware prefetchers alone leave it waiting on memory
      // (docs/PERFORMANCE.md). A prefetch past the end of a tensor does not fault.
      _mm_prefetch(reinterpret_cast<const char*>(pb + i + prefetch_ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(gb + i + prefetch_ahead), _MM_HINT_T0);
      if constexpr (MFp32) {
        _mm_prefetch(reinterpret_cast<const char*>(mrow + i + prefetch_ahead), _MM_HINT_T0);
        mi = _mm512_loadu_ps(mrow + i);
      }
      _mm512_storeu_ps(pb + i, avx512::adam_update<L2, Clip, Low, Ams>(_mm512_loadu_ps(pb + i), _mm512_loadu_ps(gb + i),
                                                                mi, vi, kc, &xi));
      _mm512_storeu_ps(mrow + i, mi);
      _mm512_storeu_ps(vbuf + i, vi);
      if constexpr (!MFp32) ma = _mm512_range_ps(ma, mi, 0x0b);  // max(|ma|, |mi|), sign cleared
      va = _mm512_range_ps(va, vi, 0x0b);
      if constexpr (Ams) {
        _mm512_storeu_ps(xbuf + i, xi);
        xa = _mm512_range_ps(xa, xi, 0x0b);
      }
    };
    std::size_t i = 0;
    for (const std::size_t groups = n & ~std::size_t{63}; i < groups; i += 64) {
      __m512 dm[4] = {}, dv[4], dx[4] = {};
      for (int m = set::first; m < set::end; ++m)
        _mm_prefetch(reinterpret_cast<const char*>(codes[m] + i + prefetch_ahead), _MM_HINT_T0);
      if constexpr (!MFp32) quant::avx512::decode64(mo.planes[0], codes[0] + i, scales[0], dm);
      quant::avx512::decode64(mo.planes[1], codes[1] + i, scales[1], dv);
      if constexpr (Ams) quant::avx512::decode64(mo.planes[2], codes[2] + i, scales[2], dx);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) update(i + 16 * static_cast<std::size_t>(j), dm[j], dv[j], dx[j]);
      // The block before gets its codes for the same 64 elements (after the updates: better
      // scheduled than one chunk after each update).
      if (i + 64 <= prev_full) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          quantize_chunk<Stochastic, Ams, MFp32>(prev, i + 16 * static_cast<std::size_t>(j), mq, vq, mmap, vmap, sr);
      } else {
        for (std::size_t j = i; j < std::min(i + 64, prev_full); j += 16)
          quantize_chunk<Stochastic, Ams, MFp32>(prev, j, mq, vq, mmap, vmap, sr);
      }
    }
    auto gathered = [&](int m, std::size_t at) TROUPE_AVX512 {
      return _mm512_mul_ps(_mm512_i32gather_ps(quant::avx512::load_codes(codes[m] + at), mo.values[m], 4), scales[m]);
    };
    for (std::size_t j = i; j < full; j += 16) {
      update(j, MFp32 ? _mm512_setzero_ps() : gathered(0, j), gathered(1, j), Ams ? gathered(2, j) : _mm512_setzero_ps());
      if (j < prev_full) quantize_chunk<Stochastic, Ams, MFp32>(prev, j, mq, vq, mmap, vmap, sr);
    }
    for (i = std::max(i, full); i < prev_full; i += 16) quantize_chunk<Stochastic, Ams, MFp32>(prev, i, mq, vq, mmap, vmap, sr);
    quantize_tail<Stochastic, Ams, MFp32>(prev, prev_full, mmap, vmap, sr);
    float am = _mm512_reduce_max_ps(ma), av = _mm512_reduce_max_ps(va), ax = _mm512_reduce_max_ps(xa);
    for (std::size_t j = full; j < n; ++j) {
      const float mj = MFp32 ? mrow[j] : mo.values[0][codes[0][j]] * scale[0];
      float xj = Ams ? mo.values[2][codes[2][j]] * scale[2] : 0.0f;
      pb[j] = adam_element<L2>(pb[j], gb[j], mj, mo.values[1][codes[1][j]] * scale[1], c, mrow[j], vbuf[j],
                               Ams ? &xj : nullptr);
      am = std::max(am, std::fabs(mrow[j]));
      av = std::max(av, std::fabs(vbuf[j]));
      if constexpr (Ams) {
        xbuf[j] = xj;
        ax = std::max(ax, std::fabs(xj));
      }
    }
    const float absmax[3] = {am, av, ax};
    prev = {};
    prev.n = n;
    prev.first = static_cast<std::uint32_t>(b);
    for (int m = set::first; m < set::end; ++m) {
      const float s =
          quant::stored_scale(mo.percentile > 0 ? quant::block_scale(mbuf + m * block, n, mo.percentile) : absmax[m]);
      mo.scales[m][k] = s;
      prev.codes[m] = mo.codes[m] + b;
      prev.buf[m] = mbuf + m * block;
      prev.scale[m] = s;
      prev.inv[m] = s > 0 ? 1.0f / s : 0.0f;
    }
  }
  const std::size_t prev_full = full_of(prev.n);
  for (std::size_t j = 0; j < prev_full; j += 16) quantize_chunk<Stochastic, Ams, MFp32>(prev, j, mq, vq, mmap, vmap, sr);
  quantize_tail<Stochastic, Ams, MFp32>(prev, prev_full, mmap, vmap, sr);
}

#pragma GCC diagnostic pop

/// SGD with an 8-bit momentum buffer over the blocks of [begin, end) on AVX-512: the structure of
/// adam_int8_blocks_avx512 with one moment (decode by byte permutes, update, absmax, codes of the
/// block before written while this one is updated). The same operations as the portable path
/// (sgd_fused_loop between dequantize_block and quantize_block), so the same bits. Stochastic:
/// codes by stochastic rounding with `key` (quant::quantize_block's draws). A block's scale is
/// its absmax, or (percentile > 0) that percentile's selection from the new values in L1.
template <bool Wd, bool Stochastic>
TROUPE_AVX512 void sgd_int8_blocks_avx512(float* p, const float* g, std::uint8_t* mc, float* msc,
                                          const quant::qmap& map, std::size_t begin, std::size_t end,
                                          std::size_t block, const sgd_constants& c, bool first, float* buffers,
                                          std::uint32_t key, double percentile) {
  const quant::avx512::quantizer q = quant::avx512::load_quantizer(map, !Stochastic);
  const __m512i vkey = _mm512_set1_epi32(static_cast<int>(key));
  const __m512 gscale = _mm512_set1_ps(c.gscale), wd = _mm512_set1_ps(c.wd), momentum = _mm512_set1_ps(c.momentum);
  const __m512 omd = _mm512_set1_ps(c.one_minus_dampening), neg_lr = _mm512_set1_ps(-c.lr);
  const bool clip = c.gscale != 1.0f, nesterov = c.nesterov;
  struct {
    std::uint8_t* codes = nullptr;
    const float* values = nullptr;
    std::size_t n = 0;
    float inv = 0, scale = 0;
    std::uint32_t first = 0;  // the block's first element in its tensor
  } prev;
  auto quantize = [&](std::size_t j) TROUPE_AVX512 {
    if constexpr (Stochastic) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(prev.values + j), _mm512_set1_ps(prev.inv));
      const __m512i codes = quant::avx512::stochastic_codes<true>(q, map, x, vkey,
                                                                  prev.first + static_cast<std::uint32_t>(j), true);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(prev.codes + j), _mm512_cvtepi32_epi8(codes));
    } else {
      quant::avx512::store_exact_codes<true>(prev.codes + j, q, map, prev.values + j, prev.inv, true);
    }
  };
  auto quantize_rest = [&](std::size_t from) {
    if constexpr (Stochastic) {
      if (from >= prev.n) return;
      quant::block_options o;
      o.stochastic = true;
      quant::quantize_block(prev.values + from, prev.n - from, prev.scale, map, o, key,
                            prev.first + static_cast<std::uint32_t>(from), prev.codes + from);
      return;
    }
    for (std::size_t i = from; i < prev.n; ++i)
      prev.codes[i] = quant::avx512::quantize_exact(map, prev.values[i] * prev.inv, true);
  };
  int side = 0;
  for (std::size_t b = begin; b < end; b += block, side ^= 1) {
    const std::size_t n = std::min(block, end - b), k = b / block;
    float* buf = buffers + block * static_cast<std::size_t>(side);
    float* pb = p + b;
    const float* gb = g + b;
    const std::uint8_t* cb = mc + b;
    const __m512 scale = _mm512_set1_ps(msc[k]);
    __m512 amax = _mm512_setzero_ps();
    const std::size_t full = n & ~std::size_t{15}, prev_full = prev.n & ~std::size_t{15};
    // Elements [i, i + 16) with their decoded momentum `stored` (unused on the first step).
    auto update = [&](std::size_t i, __m512 stored) TROUPE_AVX512 {
      _mm_prefetch(reinterpret_cast<const char*>(pb + i + prefetch_ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(gb + i + prefetch_ahead), _MM_HINT_T0);
      if ((i & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(cb + i + prefetch_ahead), _MM_HINT_T0);
      const __m512 pi = _mm512_loadu_ps(pb + i);
      __m512 gi = _mm512_loadu_ps(gb + i);
      if (clip) gi = _mm512_mul_ps(gi, gscale);
      if constexpr (Wd) gi = _mm512_add_ps(gi, _mm512_mul_ps(pi, wd));
      const __m512 bi = first ? gi : _mm512_add_ps(_mm512_mul_ps(stored, momentum), _mm512_mul_ps(gi, omd));
      gi = nesterov ? _mm512_add_ps(gi, _mm512_mul_ps(bi, momentum)) : bi;
      _mm512_storeu_ps(pb + i, _mm512_add_ps(pi, _mm512_mul_ps(gi, neg_lr)));
      _mm512_storeu_ps(buf + i, bi);
      amax = _mm512_range_ps(amax, bi, 0x0b);  // max(|amax|, |bi|), sign cleared
      if (i < prev_full) quantize(i);
    };
    // Groups of 64 decoded by byte permutes, then vectors of 16 by gathers.
    std::size_t i = 0;
    for (const std::size_t groups = first ? 0 : full & ~std::size_t{63}; i < groups; i += 64) {
      __m512 stored[4];
      quant::avx512::decode64(map.planes(), cb + i, scale, stored);
      for (int j = 0; j < 4; ++j) update(i + 16 * static_cast<std::size_t>(j), stored[j]);
    }
    for (; i < full; i += 16)
      update(i, first ? _mm512_setzero_ps()
                      : _mm512_mul_ps(_mm512_i32gather_ps(quant::avx512::load_codes(cb + i), map.values(), 4), scale));
    for (; i < prev_full; i += 16) quantize(i);
    quantize_rest(prev_full);
    float am = _mm512_reduce_max_ps(amax);
    for (std::size_t j = full; j < n; ++j) {
      buf[j] = sgd_element<Wd>(pb[j], gb[j], map.value(cb[j]) * msc[k], c, first);
      am = std::max(am, std::fabs(buf[j]));
    }
    const float s = quant::stored_scale(percentile > 0 ? quant::block_scale(buf, n, percentile) : am);
    msc[k] = s;
    prev = {mc + b, buf, n, s > 0 ? 1.0f / s : 0.0f, s, static_cast<std::uint32_t>(b)};
  }
  for (std::size_t j = 0; j < (prev.n & ~std::size_t{15}); j += 16) quantize(j);
  quantize_rest(prev.n & ~std::size_t{15});
}

/// Whether scaling blocks of up to `block` values by percentile p of |x| is scaling by their
/// absmax: quant::block_scale takes the ceil(p / 100 * n)-th smallest |x| of n values, the
/// largest when that rank is n, for every n from 1 (a last, short block) up to `block`. Then
/// the fused kernels, which keep the absmax while they update, serve that percentile too (99.9
/// with blocks of up to 1000).
bool scale_is_absmax(double p, std::int64_t block) {
  if (p <= 0 || p >= 100) return true;
  for (std::int64_t n = 1; n <= block; ++n)
    if (static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(n))) < static_cast<std::size_t>(n)) return false;
  return true;
}

/// Whether adam_compressed takes this slot: every option of bf16 and 8-bit state (the first
/// moment like v or fp32), on AVX2 and AVX-512, except on AVX2 an fp32 first moment with 8-bit v:
/// there the chunk path (v decoded into L1 by a loop of table lookups, then the stream kernel) measured
/// 0.026 s/step against the fused loop's 0.035 (AdamW, 20 M parameters, Zen 3), while with both
/// moments 8-bit the fused loop is the faster (0.037 against 0.043).
bool fused_compressed(optimizer_kind kind, const optimizer::slot& s) {
  if (quant::simd_level() < 1 || kind == optimizer_kind::sgd) return false;
  const auto &m = s.m, &v = s.v, &x = s.vmax;
  if (x.mode != mode_none && (x.mode != v.mode || x.block != v.block)) return false;
  const bool same = m.mode == v.mode && m.block == v.block;
  if (v.mode == mode_int8 && !same && quant::simd_level() < 2) return false;
  return (same || m.mode == mode_fp32) && (v.mode == mode_bf16 || v.mode == mode_int8);
}

/// The fused step over elements [begin, end) of a slot (begin on a block boundary for 8-bit).
/// absmax_scale: the 8-bit blocks' percentile scale is their absmax (scale_is_absmax).
void adam_compressed(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c,
                     const rounding& rm, const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers) {
  float* p = s.p->value.data<float>().data();
  const float* g = std::as_const(*s.p).grad.data<float>().data();
  if (s.v.mode == mode_bf16) {
    std::uint16_t* v = s.v.data.data<std::uint16_t>().data() + begin;
    std::uint16_t* x = s.vmax.mode == mode_bf16 ? s.vmax.data.data<std::uint16_t>().data() + begin : nullptr;
    const draw_keys keys{rm.key, rv.key, rx.key, static_cast<std::uint32_t>(begin)};
    auto stream = [&](auto* m, auto ams, auto stochastic) {
      adam_stream_any<std::remove_pointer_t<decltype(m)>, ams, stochastic, std::uint16_t>(p + begin, g + begin, m, v, x,
                                                                                          end - begin, c, keys);
    };
    auto with_options = [&](auto* m) {
      if (x && rv.stochastic) stream(m, std::true_type{}, std::true_type{});
      else if (x) stream(m, std::true_type{}, std::false_type{});
      else if (rv.stochastic) stream(m, std::false_type{}, std::true_type{});
      else stream(m, std::false_type{}, std::false_type{});
    };
    // The first moment bf16 like v, or fp32 (first_moment_fp32).
    if (s.m.mode == mode_fp32) with_options(s.m.data.data<float>().data() + begin);
    else with_options(s.m.data.data<std::uint16_t>().data() + begin);
    return;
  }
  const std::size_t block = static_cast<std::size_t>(s.v.block);
  // `buffers` (scratch_floats) holds the new values of up to three moments: one block each on
  // AVX2; two blocks each, 32 floats apart, on AVX-512 (that kernel quantizes the block before
  // while it updates one).
  if (quant::simd_level() >= 2) {
    const auto& mmap = quant::qmap::dynamic(true);
    const auto& vmap = map_of(s.v);
    std::uint8_t* vc = s.v.data.data<std::uint8_t>().data();
    float* vsc = s.v.scales.data<float>().data();
    int8_moments moments;
    const bool m_fp32 = s.m.mode == mode_fp32;
    if (m_fp32) {
      moments.m_fp32 = s.m.data.data<float>().data();
    } else {
      moments.codes[0] = s.m.data.data<std::uint8_t>().data();
      moments.scales[0] = s.m.scales.data<float>().data();
    }
    moments.codes[1] = vc;
    moments.scales[1] = vsc;
    moments.values[0] = mmap.values();
    moments.values[1] = moments.values[2] = vmap.values();
    moments.planes[0] = mmap.planes();
    moments.planes[1] = moments.planes[2] = vmap.planes();
    moments.percentile = absmax_scale ? 0.0 : rv.percentile;
    const bool ams = s.vmax.mode == mode_int8;
    if (ams) {
      moments.codes[2] = s.vmax.data.data<std::uint8_t>().data();
      moments.scales[2] = s.vmax.scales.data<float>().data();
    }
    const std::uint32_t keys[3] = {rm.key, rv.key, rx.key};
    auto run = [&](auto stochastic, auto amsgrad, auto first_fp32) {
      with_choices(c, [&](auto l2c, auto clip, auto low) {
        adam_int8_blocks_avx512<l2c, clip, low, stochastic, amsgrad, first_fp32>(p, g, moments, mmap, vmap, begin, end,
                                                                                   block, c, buffers, keys);
      });
    };
    auto with_fp32 = [&](auto stochastic, auto amsgrad) {
      if (m_fp32) run(stochastic, amsgrad, std::true_type{});
      else run(stochastic, amsgrad, std::false_type{});
    };
    auto with_ams = [&](auto stochastic) {
      if (ams) with_fp32(stochastic, std::true_type{});
      else with_fp32(stochastic, std::false_type{});
    };
    if (rm.stochastic) with_ams(std::true_type{});
    else with_ams(std::false_type{});
    return;
  }
  // AVX2 (both moments 8-bit; fused_compressed): a block at a time through adam_int8_avx2, then
  // each moment's codes from its new values by quant::quantize_block (nearest or stochastic;
  // scaled by the absmax or a percentile).
  optimizer::moment* mos[3] = {&s.m, &s.v, &s.vmax};
  const rounding* rs[3] = {&rm, &rv, &rx};
  const bool ams = s.vmax.mode == mode_int8;
  int8_block_avx2 d;
  const quant::qmap* maps[3] = {};
  quant::block_options opts[3];
  for (int j = 0; j < (ams ? 3 : 2); ++j) {
    maps[j] = &map_of(*mos[j]);
    opts[j] = block_opts(*mos[j], *rs[j]);
    d.values[j] = maps[j]->values();
  }
  for (int j = 0; j < 3; ++j) d.buf[j] = buffers + static_cast<std::size_t>(j) * block;
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t n = std::min(block, end - b), k = b / block;
    for (int j = 0; j < 3; ++j) {
      if (mos[j]->mode != mode_int8) continue;
      d.codes[j] = mos[j]->data.data<std::uint8_t>().data() + b;
      d.scale[j] = mos[j]->scales.data<float>()[k];
    }
    with_choices(c, [&](auto l2c, auto clip, auto low) {
      if (ams) adam_int8_avx2<l2c, clip, low, true>(p + b, g + b, n, c, d);
      else adam_int8_avx2<l2c, clip, low, false>(p + b, g + b, n, c, d);
    });
    for (int j = 0; j < 3; ++j) {
      if (mos[j]->mode != mode_int8) continue;
      const float scale =
          quant::stored_scale(absmax_scale ? d.absmax[j] : quant::block_scale(d.buf[j], n, rs[j]->percentile));
      mos[j]->scales.data<float>()[k] = scale;
      quant::quantize_block(d.buf[j], n, scale, *maps[j], opts[j], rs[j]->key,
                            static_cast<std::uint32_t>(b), mos[j]->data.data<std::uint8_t>().data() + b);
    }
  }
}

using jobs::run_jobs;

std::size_t numel_of(const optimizer::slot& s) { return static_cast<std::size_t>(s.p->value.numel()); }

/// The elements a fast step processes at once: one 8-bit block (all 8-bit moments of a tensor
/// share the block size), or 256 elements of bf16.
std::size_t chunk_of(const optimizer::slot& s) {
  for (const auto* mo : {&s.m, &s.v, &s.vmax})
    if (mo->mode == mode_int8) return static_cast<std::size_t>(mo->block);
  return 256;
}

/// The L1 scratch, in floats, that a worker stepping slot s uses: the 8-bit kernels' block
/// buffers (AVX-512 Adam: two blocks of up to three moments, 32 floats apart; AVX2: three
/// blocks; SGD: two), or three chunks of the portable path.
std::size_t scratch_floats(const optimizer::slot& s) { return 6 * chunk_of(s) + 64; }

}  // namespace

// ---- construction, storage decisions and conversions -------------------------------------------

optimizer::optimizer(optimizer_kind kind, std::vector<param_group> groups, optimizer_options options)
    : kind_(kind), groups_(std::move(groups)), options_(options) {
  for (const auto& g : groups_) {
    validate(kind, g.hp, g.state);
    for (const auto* p : g.params)
      if (p) {
        where_ = p->value.where();
        break;
      }
  }
  if (std::unordered_set<std::uint64_t>(options_.tensor_keys.begin(), options_.tensor_keys.end()).size() !=
      options_.tensor_keys.size())
    bad("tensor_keys names a key twice: two tensors would round with the same random numbers");
  check_slots();
  check_groups();
  sync_slots();
  prepare();
}

std::vector<std::pair<parameter*, std::size_t>> optimizer::members() const {
  std::vector<std::pair<parameter*, std::size_t>> out;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (auto* p : groups_[g].params) out.emplace_back(p, g);
  return out;
}

bool optimizer::same_members() const {
  std::size_t k = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (const auto* p : groups_[g].params) {
      if (k >= slots_.size() || slots_[k].p != p || slots_[k].group != g) return false;
      ++k;
    }
  return k == slots_.size();
}

void optimizer::check_slots() const {
  if (!options_.tensor_keys.empty()) {
    std::size_t tensors = 0;
    for (const auto& group : groups_) tensors += group.params.size();
    if (options_.tensor_keys.size() != tensors)
      bad("tensor_keys has " + std::to_string(options_.tensor_keys.size()) + " keys for " + std::to_string(tensors) +
          " tensors (one per tensor, or none)");
  }
  auto check_tensors = [&](const parameter* p) {
    if (!p || p->value.type() != dtype::f32 || p->grad.type() != dtype::f32 || p->grad.shape() != p->value.shape())
      bad("every parameter needs an f32 value and an f32 gradient of the same shape" +
          (p ? " ('" + p->name + "' has " + p->value.str() + " and " + p->grad.str() + ")" : std::string(" (a null one)")));
    if (p->value.where() != where_ || p->grad.where() != where_)
      bad("parameter '" + p->name + "' (value on " + p->value.where().str() + ", gradient on " +
          p->grad.where().str() + ") is not on " + where_.str() +
          ": every parameter and gradient of an optimizer must live on one device");
  };
  auto check_size = [](const parameter* p, const slot& s) {
    if (s.numel != p->value.numel())
      bad("parameter '" + p->name + "' changed size from " + std::to_string(s.numel) + " to " +
          std::to_string(p->value.numel()) + " elements since its state was made");
  };
  if (same_members()) {  // the usual step: the slots were checked for duplicates when made
    for (const auto& s : slots_) {
      check_tensors(s.p);
      check_size(s.p, s);
    }
    return;
  }
  std::unordered_map<const parameter*, std::size_t> had;
  for (std::size_t k = 0; k < slots_.size(); ++k) had.emplace(slots_[k].p, k);
  std::unordered_set<const parameter*> listed;
  for (const auto& group : groups_) {
    for (const auto* p : group.params) {
      check_tensors(p);
      if (!listed.insert(p).second) bad("parameter '" + p->name + "' is listed twice (it would be stepped twice)");
      if (auto it = had.find(p); it != had.end()) check_size(p, slots_[it->second]);
    }
  }
}

void optimizer::sync_slots() {
  if (same_members()) return;
  std::unordered_map<const parameter*, std::size_t> had;
  for (std::size_t k = 0; k < slots_.size(); ++k) had.emplace(slots_[k].p, k);
  std::vector<slot> next;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (auto* p : groups_[g].params) {
      if (auto it = had.find(p); it != had.end()) {
        next.push_back(std::move(slots_[it->second]));
        next.back().group = g;
      } else {
        next.push_back(slot{p, g, p->value.numel(), {}, {}, {}, false, {}, 0});
      }
    }
  }
  slots_ = std::move(next);
}

namespace {

/// The state a slot needs: which moments, in which storage.
struct wanted {
  std::uint8_t m = mode_none, v = mode_none, vmax = mode_none;
  std::int64_t block = 0;
};

}  // namespace

void optimizer::check_groups() const {
  // What changed since the last step is checked again.
  const bool first = seen_hp_.empty();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!first && g < seen_hp_.size() && same(groups_[g].hp, seen_hp_[g]) && same(groups_[g].state, seen_state_[g]))
      continue;
    validate(kind_, groups_[g].hp, groups_[g].state);
    // A name that is no parameter would change nothing. Groups often share their state options,
    // so a name may be another group's parameter.
    for (const auto& name : groups_[g].state.fp32_params) {
      const auto all = members();
      if (std::none_of(all.begin(), all.end(), [&](const auto& m) { return m.first->name == name; }))
        bad("state option fp32_params names '" + name + "', which is no parameter of this optimizer" +
            (all.empty() ? std::string() : " (the first is '" + all.front().first->name + "')"));
    }
    if (!where_.is_cpu()) {
      const auto& so = groups_[g].state;
      // Checked here, before a step counts: the CUDA step keeps a block's values in shared memory.
      if (so.block_size > cuda::max_int8_block && so.storage != state_storage::fp32 &&
          so.storage != state_storage::bf16)
        bad("state block_size " + std::to_string(so.block_size) + " is above " +
            std::to_string(cuda::max_int8_block) + ", the largest 8-bit block on " + where_.str());
    }
  }
}

void optimizer::prepare() {
  // Choose storage for automatic groups (again when a group's storage changed).
  const bool first = seen_hp_.empty();
  bool resolve = first || groups_.size() != seen_hp_.size();
  for (std::size_t g = 0; g < groups_.size() && !resolve; ++g)
    if (groups_[g].state.storage != seen_state_[g].storage) resolve = true;
  if (resolve) {
    resolved_.assign(groups_.size(), state_storage::fp32);
    std::size_t fp32_bytes = 0;
    bool any = false;
    for (const auto& s : slots_) {
      const auto& grp = groups_[s.group];
      if (grp.state.storage != state_storage::automatic) continue;
      any = true;
      const std::size_t moments =
          kind_ == optimizer_kind::sgd ? (grp.hp.momentum != 0 ? 1 : 0) : (grp.hp.amsgrad ? 3 : 2);
      fp32_bytes += moments * 4 * numel_of(s);
    }
    state_storage choice = state_storage::fp32;
    if (any) {
      if (const char* env = std::getenv("TROUPE_OPTIM_STATE"); env && *env) {
        try {
          choice = parse_state_storage(env);
        } catch (const std::invalid_argument&) {
          throw std::invalid_argument(std::string("TROUPE_OPTIM_STATE='") + env +
                                      "' is not one of: fp32, bf16, int8, auto");
        }
      } else {
        choice = state_storage::automatic;
      }
      if (choice == state_storage::automatic) {
        const std::size_t avail = options_.available_memory ? options_.available_memory
                                  : where_.is_cpu()          ? host_available_memory()
                                                             : cuda::free_memory(where_.index);
        const std::size_t small = std::size_t{64} << 20;
        if (fp32_bytes < small || avail == 0 || fp32_bytes <= avail / 4) choice = state_storage::fp32;
        else if (fp32_bytes / 2 <= avail / 4) choice = state_storage::bf16;
        else choice = state_storage::int8;
        if (choice != state_storage::fp32)
          log().info("optimizer state: {} ({} MiB in fp32, {} MiB available)", name_of(choice), fp32_bytes >> 20,
                     avail >> 20);
      }
    }
    for (std::size_t g = 0; g < groups_.size(); ++g)
      resolved_[g] = groups_[g].state.storage == state_storage::automatic ? choice : groups_[g].state.storage;
  }
  seen_hp_.clear();
  seen_state_.clear();
  for (const auto& g : groups_) {
    seen_hp_.push_back(g.hp);
    seen_state_.push_back(g.state);
  }
  // Allocate or convert; when memory runs out, lower automatic groups one level and start over.
  for (std::size_t i = 0; i < slots_.size();) {
    try {
      allocate(slots_[i]);
      ++i;
    } catch (const std::bad_alloc&) {
      bool lowered = false;
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        if (groups_[g].state.storage != state_storage::automatic || resolved_[g] == state_storage::int8) continue;
        const auto from = resolved_[g];
        resolved_[g] = from == state_storage::fp32 ? state_storage::bf16 : state_storage::int8;
        log().warn("optimizer state of group {} does not fit in memory as {}: converting to {}", g, name_of(from),
                   name_of(resolved_[g]));
        lowered = true;
      }
      if (!lowered) throw;
      i = 0;
    }
  }
}

namespace {

/// A moment whose tensors are on the host (itself when they are).
optimizer::moment on_host(const optimizer::moment& mo) {
  optimizer::moment out = mo;
  if (out.data.defined()) out.data = out.data.to(device::cpu());
  if (out.scales.defined()) out.scales = out.scales.to(device::cpu());
  return out;
}

}  // namespace

void optimizer::allocate(slot& s) {
  const auto& grp = groups_[s.group];
  const auto& so = grp.state;
  const std::size_t n = numel_of(s);
  wanted w;
  std::uint8_t compressed = mode_of(resolved_[s.group]);
  const bool forced = std::find(so.fp32_params.begin(), so.fp32_params.end(), s.p->name) != so.fp32_params.end();
  if (forced || (compressed == mode_int8 && static_cast<std::int64_t>(n) < so.min_8bit_elements))
    compressed = mode_fp32;
  if (kind_ == optimizer_kind::sgd) {
    if (grp.hp.momentum != 0) w.m = so.first_moment_fp32 ? mode_fp32 : compressed;
  } else {
    w.m = so.first_moment_fp32 ? mode_fp32 : compressed;
    w.v = compressed;
    if (grp.hp.amsgrad) w.vmax = compressed;
  }
  // A block longer than the tensor is the tensor: one scale either way, and scratch for no more.
  w.block = std::min<std::int64_t>(so.block_size, std::max<std::int64_t>(1, static_cast<std::int64_t>(n)));

  auto fit = [&](moment& mo, std::uint8_t mode, bool is_signed) {
    const std::int64_t block = mode == mode_int8 ? w.block : 0;
    if (mo.mode == mode && mo.block == block) return;
    if (mode == mode_none) {
      mo = moment{};
      if (&mo == &s.m) s.momentum_started = false;
      return;
    }
    // New storage, filled from the old values (zeros when there were none).
    const std::int64_t len = static_cast<std::int64_t>(n);
    std::size_t bytes = 0;
    const std::size_t blocks = block ? (n + static_cast<std::size_t>(block) - 1) / static_cast<std::size_t>(block) : 0;
    bytes = mode == mode_fp32 ? 4 * n : mode == mode_bf16 ? 2 * n : n + 4 * blocks;
    // (The old storage of this moment is freed by the conversion: not counted with the new.)
    const std::size_t replaced = (mo.data.defined() ? mo.data.nbytes() : 0) + (mo.scales.defined() ? mo.scales.nbytes() : 0);
    if (options_.state_memory_limit && state_bytes() - replaced + bytes > options_.state_memory_limit)
      throw std::bad_alloc();
    moment next;
    next.mode = mode;
    next.is_signed = is_signed;
    next.block = block;
    // Conversions go through the host; the new state is then copied to the parameters' device.
    const std::vector<float> old = mo.mode == mode_none ? std::vector<float>() : decode(on_host(mo), n);
    switch (mode) {
      case mode_fp32:
        next.data = tensor::zeros({len});
        if (!old.empty()) std::copy(old.begin(), old.end(), next.data.data<float>().begin());
        break;
      case mode_bf16: {
        next.data = tensor::zeros({len}, dtype::bf16);
        auto h = next.data.data<std::uint16_t>();
        for (std::size_t i = 0; i < old.size(); ++i) h[i] = quant::to_bf16(old[i]);
        break;
      }
      case mode_int8: {
        next.data = tensor::empty({len}, dtype::u8);
        next.scales = tensor::zeros({static_cast<std::int64_t>(blocks)});
        const auto& map = map_of(next);
        if (old.empty()) {
          std::fill_n(next.data.data<std::uint8_t>().data(), n, map.zero_code());
        } else {
          quant::block_options o;
          o.block = static_cast<std::size_t>(block);
          o.percentile = so.percentile_scale;
          quant::quantize_blockwise(old.data(), n, map, o, 0, next.data.data<std::uint8_t>().data(),
                                    next.scales.data<float>().data());
        }
        break;
      }
    }
    if (!where_.is_cpu()) {
      next.data = next.data.to(where_);
      if (next.scales.defined()) next.scales = next.scales.to(where_);
    }
    mo = std::move(next);
  };
  fit(s.m, w.m, true);
  fit(s.v, w.v, false);
  fit(s.vmax, w.vmax, false);
}

void optimizer::set_lr_schedule(std::function<double(std::int64_t, double)> schedule) {
  schedule_ = std::move(schedule);
}

state_memory optimizer::state_memory_total() const noexcept {
  state_memory total;
  for (const auto& t : state_report()) {
    total.codes += t.bytes.codes;
    total.scales += t.bytes.scales;
    total.fp32 += t.bytes.fp32;
  }
  return total;
}

std::vector<tensor_state> optimizer::state_report() const {
  std::vector<tensor_state> out;
  for (const auto& s : slots_) {
    tensor_state t;
    t.name = s.p->name;
    t.numel = s.p->value.numel();
    for (const moment* mo : {&s.m, &s.v, &s.vmax}) {
      switch (mo->mode) {
        case mode_fp32: t.bytes.fp32 += mo->data.nbytes(); break;
        case mode_bf16:
          t.bytes.codes += mo->data.nbytes();
          t.storage = state_storage::bf16;
          break;
        case mode_int8:
          t.bytes.codes += mo->data.nbytes();
          t.bytes.scales += mo->scales.nbytes();
          t.storage = state_storage::int8;
          break;
        default: break;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

int optimizer::thread_count(std::size_t elements) const {
  if (options_.threads > 0) return options_.threads;
  if (elements < (std::size_t{1} << 20)) return 1;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void optimizer::zero_grad() {
  // The parameters listed now: one added since the last step starts from zero too.
  for (const auto& [p, group] : members()) {
    if (!p || p->grad.where() != where_ || p->grad.type() != dtype::f32) continue;  // (refused by the next step)
    if (!where_.is_cpu()) cuda::fill_zero(p->grad.bytes(), p->grad.nbytes(), where_.index);
    else std::fill(p->grad.data<float>().begin(), p->grad.data<float>().end(), 0.0f);
  }
}

namespace {

// A float is NaN or infinite when its exponent bits are all ones. The vector paths keep the
// largest value of x & 0x7f800000 per lane, which is 0x7f800000 only if some value had them all
// set; 64 values per iteration and a prefetch 1 KiB ahead, because this pass reads every gradient
// once per step and runs at memory speed only so (with one 4-lane loop it took 0.50 ns per value
// on one thread at 50 M, twice the 16-lane loop's time; docs/PERFORMANCE.md).
constexpr std::uint32_t exponent_bits = 0x7f800000u;

std::uint32_t top_exponent_scalar(const float* x, std::size_t n) {
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, x + i, 4);
    top = std::max(top, b & exponent_bits);
  }
  return top;
}

// GCC 12 takes the reduction's own undefined-value placeholder for an uninitialized variable.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
TROUPE_AVX512 std::uint32_t top_exponent_avx512(const float* x, std::size_t n) {
  const __m512i e = _mm512_set1_epi32(static_cast<int>(exponent_bits));
  __m512i top = _mm512_setzero_si512();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (std::size_t k = 0; k < 64; k += 16) _mm_prefetch(reinterpret_cast<const char*>(x + i + k + 256), _MM_HINT_T0);
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(x + i), e);
    const __m512i b = _mm512_and_si512(_mm512_loadu_si512(x + i + 16), e);
    const __m512i c = _mm512_and_si512(_mm512_loadu_si512(x + i + 32), e);
    const __m512i d = _mm512_and_si512(_mm512_loadu_si512(x + i + 48), e);
    top = _mm512_max_epu32(top, _mm512_max_epu32(_mm512_max_epu32(a, b), _mm512_max_epu32(c, d)));
  }
  return std::max(static_cast<std::uint32_t>(_mm512_reduce_max_epu32(top)), top_exponent_scalar(x + i, n - i));
}
#pragma GCC diagnostic pop

__attribute__((target("avx2"))) std::uint32_t top_exponent_avx2(const float* x, std::size_t n) {
  const __m256i e = _mm256_set1_epi32(static_cast<int>(exponent_bits));
  __m256i top = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (std::size_t k = 0; k < 32; k += 16) _mm_prefetch(reinterpret_cast<const char*>(x + i + k + 256), _MM_HINT_T0);
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), e);
    const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), e);
    const __m256i c = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), e);
    const __m256i d = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 24)), e);
    top = _mm256_max_epu32(top, _mm256_max_epu32(_mm256_max_epu32(a, b), _mm256_max_epu32(c, d)));
  }
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  std::uint32_t most = top_exponent_scalar(x + i, n - i);
  for (std::uint32_t l : lanes) most = std::max(most, l);
  return most;
}

/// The largest exponent field (x & 0x7f800000) among x[0, n): 0x7f800000 when a value is NaN or
/// infinite.
std::uint32_t top_exponent(const float* x, std::size_t n) {
  const int level = quant::simd_level();
  if (level >= 2) return top_exponent_avx512(x, n);
  if (level == 1) return top_exponent_avx2(x, n);
  return top_exponent_scalar(x, n);
}

/// Below this exponent field a gradient's square is finite with room to spare (|g| < 2^63, g^2 <
/// 2^126): what 8-bit second moments need, whose block scale an infinite g^2 made infinite (and
/// every zero code of the block NaN at the next decode).
constexpr std::uint32_t square_finite_bits = static_cast<std::uint32_t>(127 + 63) << 23;

}  // namespace

namespace {

/// The sum of x[i]^2 in double, in 16 partial sums (element i goes to sum i % 16) added in
/// order at the end: the same bits on every vector path (AVX-512 keeps the 16 sums in two
/// registers), and no chain of dependent additions to wait on.
double sum_of_squares_scalar(const float* x, std::size_t n, double* sums) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    sums[i % 16] += v * v;
  }
  double total = 0;
  for (int k = 0; k < 16; ++k) total += sums[k];
  return total;
}

TROUPE_AVX512 double sum_of_squares_avx512(const float* x, std::size_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  alignas(64) double sums[16];
  _mm512_store_pd(sums, lo);
  _mm512_store_pd(sums + 8, hi);
  return sum_of_squares_scalar(x + i, n - i, sums);
}

double sum_of_squares(const float* x, std::size_t n) {
  if (quant::simd_level() >= 2) return sum_of_squares_avx512(x, n);
  double sums[16] = {};
  return sum_of_squares_scalar(x, n, sums);
}

}  // namespace

bool optimizer::gradients_finite() const {
  std::vector<double> sums;
  return grads_finite(sums);
}

std::uint32_t optimizer::finite_limit(std::size_t group) const {
  // 8-bit (or automatic, which may pick it) second moments also refuse a gradient whose square
  // is not finite; so does SGD's 8-bit momentum (an infinite momentum would make its block's
  // scale infinite, and every value of the block NaN).
  const auto& [params, hp, state] = groups_[group];
  const bool eight_bit = state.storage == state_storage::int8 || state.storage == state_storage::automatic;
  const bool int8 = eight_bit && (kind_ != optimizer_kind::sgd || (hp.momentum != 0 && !state.first_moment_fp32));
  return int8 ? square_finite_bits : exponent_bits;
}

void optimizer::device_gradients(std::vector<const float*>& grads, std::vector<std::int64_t>& sizes,
                                 std::vector<std::uint32_t>& limits) const {
  for (const auto& [p, group] : members()) {
    grads.push_back(reinterpret_cast<const float*>(std::as_const(*p).grad.bytes()));
    sizes.push_back(p->grad.numel());
    limits.push_back(finite_limit(group));
  }
}

bool optimizer::clips() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const param_group& g) { return g.state.percentile_clipping < 100; });
}

bool optimizer::prepared() const {
  if (seen_hp_.size() != groups_.size() || !same_members()) return false;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (!same(groups_[g].hp, seen_hp_[g]) || !same(groups_[g].state, seen_state_[g])) return false;
  return true;
}

bool optimizer::grads_finite(std::vector<double>& sums) const {
  // Over the parameters as the groups list them now (the slots' order once synced).
  const auto params = members();
  sums.assign(params.size(), 0.0);
  if (!where_.is_cpu()) {
    std::vector<const float*> grads;
    std::vector<std::int64_t> sizes;
    std::vector<std::uint32_t> limits;
    device_gradients(grads, sizes, limits);
    if (!cuda::all_finite(grads, sizes, limits, where_.index)) return false;
    if (clips()) {
      // The device sums as sum_of_squares below does, to the bit.
      const std::vector<double> all = cuda::sums_of_squares(grads, sizes, where_.index);
      for (std::size_t k = 0; k < params.size(); ++k)
        if (groups_[params[k].second].state.percentile_clipping < 100) sums[k] = all[k];
    }
    return true;
  }
  // Pieces of at most 1<<16 elements, checked in parallel for large steps. A slot's sum of squares
  // is the sum of its pieces' in piece order (sum_of_squares within a piece), so that it is the
  // same for any thread count; the piece is still in cache from the check when it is summed.
  struct piece {
    const float* g;
    std::size_t n, slot;
    bool sum;
    std::uint32_t limit;  // the exponent fields allowed are below it
  };
  std::vector<piece> pieces;
  std::size_t total = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto g = std::as_const(*params[k].first).grad.data<float>();
    const bool sum = groups_[params[k].second].state.percentile_clipping < 100;
    const std::uint32_t limit = finite_limit(params[k].second);
    for (std::size_t b = 0; b < g.size(); b += 1u << 16)
      pieces.push_back({g.data() + b, std::min<std::size_t>(1u << 16, g.size() - b), k, sum, limit});
    total += g.size();
  }
  std::vector<double> piece_sums(pieces.size(), 0.0);
  std::atomic<bool> finite{true};
  run_jobs(pieces.size(), thread_count(total), [&](std::size_t j, int) {
    if (top_exponent(pieces[j].g, pieces[j].n) >= pieces[j].limit) finite.store(false, std::memory_order_relaxed);
    else if (pieces[j].sum) piece_sums[j] = sum_of_squares(pieces[j].g, pieces[j].n);
  });
  for (std::size_t j = 0; j < pieces.size(); ++j) sums[pieces[j].slot] += piece_sums[j];
  return finite.load();
}

bool optimizer::step() { return do_step(false); }
bool optimizer::reference_step() { return do_step(true); }

bool optimizer::do_step(bool reference) {
  if (reference && !where_.is_cpu())
    bad("reference_step runs on host parameters only (these are on " + where_.str() +
        "): compare with an optimizer over host copies");
  // Everything is checked before anything changes: a refused or skipped step leaves the state,
  // its storage and the membership as they were.
  check_slots();
  check_groups();
  // On a device, when the state needs no change, the check and the step go to the device
  // together (cuda::checked_step, no wait between them): the step's kernels skip themselves when
  // a gradient fails, and the step counts taken below are given back.
  const bool together = !where_.is_cpu() && prepared() && !clips();
  std::vector<double> squares;  // per slot, for percentile clipping
  if (!together && !grads_finite(squares)) {
    ++skipped_;
    return false;
  }
  // The schedule is asked once per group and step: what was checked is what is used.
  std::vector<double> group_lr(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const double lr = schedule_ ? schedule_(steps_ + 1, groups_[g].hp.lr) : groups_[g].hp.lr;
    if (!(lr >= 0) || !std::isfinite(lr))
      bad("the lr schedule gave " + std::to_string(lr) + " at step " + std::to_string(steps_ + 1) +
          " (it must be finite and >= 0)");
    group_lr[g] = lr;
  }
  sync_slots();
  prepare();
  // Each worker's L1 scratch, taken before anything changes: a step that cannot have it fails
  // whole (std::bad_alloc), never after some tensors were stepped.
  std::size_t elements = 0, per_worker = 0;
  for (const auto& s : slots_) {
    elements += numel_of(s);
    per_worker = std::max(per_worker, scratch_floats(s));
  }
  const std::size_t workers = where_.is_cpu() && !reference ? static_cast<std::size_t>(thread_count(elements)) : 0;
  const auto scratch = std::make_unique_for_overwrite<float[]>(per_worker * workers);
  const std::int64_t t = ++steps_;

  // Per tensor constants, and the gradient scale of percentile clipping.
  struct plan {
    bool absmax_scale;  // the percentile scale is the absmax for this slot's blocks
    adam_constants adam;
    sgd_constants sgd;
    bool first;
    rounding rm, rv, rx;
    std::size_t piece;
  };
  std::vector<plan> plans(slots_.size());
  struct {
    double beta1 = -1, beta2 = -1, ts = -1, bc1 = 0, bc2 = 0;
  } corrections;
  std::size_t total = 0;
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    auto& s = slots_[k];
    const auto& grp = groups_[s.group];
    const auto& hp = grp.hp;
    const double lr = group_lr[s.group];
    float gscale = 1.0f;
    if (grp.state.percentile_clipping < 100) {
      // bitsandbytes' percentile clipping over the last 100 squared norms (this one included):
      // the clip is the sorted history's entry at index p (0-based, of 100). Unlike bitsandbytes,
      // the history holds only the norms seen so far (no zeros at the start): index p N / 100.
      const double sq = squares[k];
      if (s.gnorms.size() == 100) s.gnorms.erase(s.gnorms.begin());
      s.gnorms.push_back(static_cast<float>(std::min(sq, static_cast<double>(std::numeric_limits<float>::max()))));
      std::vector<float> sorted = s.gnorms;
      std::sort(sorted.begin(), sorted.end());
      const auto index = std::min(sorted.size() - 1, static_cast<std::size_t>(std::floor(
                                                         grp.state.percentile_clipping / 100.0 * sorted.size())));
      const double clip = std::sqrt(static_cast<double>(sorted[index]));
      const double current = std::sqrt(sq);
      if (current > clip) gscale = static_cast<float>(clip / current);
    }
    auto& pl = plans[k];
    pl.absmax_scale = scale_is_absmax(grp.state.percentile_scale, s.m.mode == mode_int8 ? s.m.block : s.v.block);
    pl.sgd = {static_cast<float>(lr), static_cast<float>(hp.momentum), static_cast<float>(1 - hp.dampening),
              static_cast<float>(hp.weight_decay), gscale, hp.nesterov};
    pl.first = !s.momentum_started;
    // Bias corrections in double, as torch.optim computes them from Python floats.
    // Per tensor, as torch counts state["step"]: a tensor added later starts from step 1.
    // Tensors of a group usually share the step count: the powers are computed once for them.
    const double ts = static_cast<double>(++s.steps);
    if (hp.beta1 != corrections.beta1 || hp.beta2 != corrections.beta2 || ts != corrections.ts)
      corrections = {hp.beta1, hp.beta2, ts, 1 - std::pow(hp.beta1, ts), 1 - std::pow(hp.beta2, ts)};
    const double bc1 = corrections.bc1;
    const double bc2 = corrections.bc2;
    pl.adam = {static_cast<float>(hp.beta1),
               static_cast<float>(hp.beta2),
               static_cast<float>(1 - hp.beta1),
               static_cast<float>(1 - hp.beta2),
               static_cast<float>(hp.eps),
               static_cast<float>(lr / bc1),
               static_cast<float>(1 / std::sqrt(bc2)),
               kind_ == optimizer_kind::adamw ? static_cast<float>(1 - lr * hp.weight_decay) : 1.0f,
               kind_ == optimizer_kind::adam ? static_cast<float>(hp.weight_decay) : 0.0f,
               gscale};
    for (int which = 0; which < 3; ++which) {
      rounding& r = which == 0 ? pl.rm : which == 1 ? pl.rv : pl.rx;
      r.stochastic = grp.state.stochastic_rounding;
      r.percentile = grp.state.percentile_scale;
      r.key = quant::random_key(options_.seed, static_cast<std::uint64_t>(t),
                                options_.tensor_keys.empty() ? k : options_.tensor_keys[k], static_cast<std::uint64_t>(which));
    }
    // Threads split tensors into pieces of whole chunks (8-bit blocks).
    const std::size_t chunk = chunk_of(s);
    pl.piece = ((std::size_t{1} << 16) + chunk - 1) / chunk * chunk;
    total += numel_of(s);
  }

  if (!where_.is_cpu()) {
    // One fused multi-tensor step on the device (optim_cuda.cu), with the constants above.
    std::vector<cuda::tensor_update> list;
    list.reserve(slots_.size());
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      auto& s = slots_[k];
      const auto& pl = plans[k];
      cuda::tensor_update u;
      u.p = reinterpret_cast<float*>(s.p->value.bytes());
      u.g = reinterpret_cast<const float*>(std::as_const(*s.p).grad.bytes());
      u.n = static_cast<std::int64_t>(numel_of(s));
      auto ref = [](moment& mo, const rounding& r) {
        cuda::moment_ref out;
        out.mode = mo.mode;
        out.is_signed = mo.is_signed;
        out.data = mo.mode == mode_none ? nullptr : mo.data.bytes();
        out.scales = mo.mode == mode_int8 ? reinterpret_cast<float*>(mo.scales.bytes()) : nullptr;
        out.key = r.key;
        return out;
      };
      u.m = ref(s.m, pl.rm);
      u.v = ref(s.v, pl.rv);
      u.x = ref(s.vmax, pl.rx);
      for (const auto* mo : {&s.m, &s.v, &s.vmax})
        if (mo->mode == mode_int8) u.block = mo->block;
      const auto& a = pl.adam;
      const auto& g = pl.sgd;
      u.c = {a.beta1, a.beta2, a.one_minus_beta1, a.one_minus_beta2, a.eps, a.step_size, a.inv_bias2_sqrt, a.decay, a.l2,
             g.lr,    g.momentum, g.one_minus_dampening, g.wd, kind_ == optimizer_kind::sgd ? g.gscale : a.gscale,
             g.nesterov, pl.first};
      u.stochastic = groups_[s.group].state.stochastic_rounding;
      u.percentile = pl.absmax_scale ? 0.0 : pl.rv.percentile;
      list.push_back(u);
    }
    if (together) {
      std::vector<const float*> grads;
      std::vector<std::int64_t> sizes;
      std::vector<std::uint32_t> limits;
      device_gradients(grads, sizes, limits);
      if (!cuda::checked_step(kind_ == optimizer_kind::sgd, list, grads, sizes, limits, where_.index)) {
        --steps_;
        for (auto& s : slots_) --s.steps;
        ++skipped_;
        return false;
      }
    } else {
      cuda::optimizer_step(kind_ == optimizer_kind::sgd, list, where_.index);
    }
  } else if (reference) {
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      auto& s = slots_[k];
      const auto& pl = plans[k];
      const std::size_t n = numel_of(s);
      auto p = s.p->value.data<float>();
      auto g = std::as_const(*s.p).grad.data<float>();
      // fp32 moments are updated in place; others through an fp32 copy, rounded back after.
      std::vector<float> mv, vv, xv;
      auto view = [&](moment& mo, std::vector<float>& copy) -> std::span<float> {
        if (mo.mode == mode_none) return {};
        if (mo.mode == mode_fp32) return mo.data.data<float>();
        copy = decode(mo, n);
        return copy;
      };
      auto back = [&](moment& mo, std::vector<float>& copy, const rounding& r) {
        if (mo.mode != mode_bf16 && mo.mode != mode_int8) return;
        const std::size_t step = mo.mode == mode_int8 ? static_cast<std::size_t>(mo.block) : n;
        for (std::size_t b = 0; b < n; b += step) store_moment(mo, b, std::min(step, n - b), copy.data() + b, r, true);
      };
      auto m = view(s.m, mv), v = view(s.v, vv), x = view(s.vmax, xv);
      if (kind_ == optimizer_kind::sgd) sgd_reference(p, g, m, pl.sgd, pl.first);
      else adam_reference(p, g, m, v, x, pl.adam);
      back(s.m, mv, pl.rm);
      back(s.v, vv, pl.rv);
      back(s.vmax, xv, pl.rx);
    }
  } else {
    struct job {
      std::size_t slot, begin, end;
    };
    std::vector<job> jobs;
    for (std::size_t k = 0; k < slots_.size(); ++k)
      for (std::size_t b = 0, n = numel_of(slots_[k]); b < n; b += plans[k].piece)
        jobs.push_back({k, b, std::min(n, b + plans[k].piece)});
    run_jobs(jobs.size(), thread_count(total), [&](std::size_t j, int w) {
      float* const buffers = scratch.get() + static_cast<std::size_t>(w) * per_worker;
      auto& s = slots_[jobs[j].slot];
      const auto& pl = plans[jobs[j].slot];
      float* p = s.p->value.data<float>().data();
      const float* g = std::as_const(*s.p).grad.data<float>().data();
      auto kernel = [&](std::size_t b, std::size_t n, float* m, float* v, float* x) {
        if (kind_ == optimizer_kind::sgd) {
          if (quant::simd_level() >= 1) sgd_stream_any(p + b, g + b, m, n, pl.sgd, pl.first);
          else sgd_fused(p + b, g + b, m, n, pl.sgd, pl.first);
        } else if (quant::simd_level() >= 1) {
          if (x) adam_stream_any<float, true>(p + b, g + b, m, v, x, n, pl.adam);
          else adam_stream_any<float>(p + b, g + b, m, v, nullptr, n, pl.adam);
        } else adam_fused(p + b, g + b, m, v, x, n, pl.adam);
      };
      const bool all_fp32 = s.m.mode <= mode_fp32 && s.v.mode <= mode_fp32 && s.vmax.mode <= mode_fp32;
      if (all_fp32) {
        auto at = [&](moment& mo) { return mo.mode == mode_fp32 ? mo.data.data<float>().data() + jobs[j].begin : nullptr; };
        kernel(jobs[j].begin, jobs[j].end - jobs[j].begin, at(s.m), at(s.v), at(s.vmax));
        return;
      }
      if (kind_ == optimizer_kind::sgd && s.m.mode == mode_bf16 && quant::simd_level() >= 1) {
        std::uint16_t* buf = s.m.data.data<std::uint16_t>().data() + jobs[j].begin;
        const std::size_t n = jobs[j].end - jobs[j].begin;
        if (groups_[s.group].state.stochastic_rounding)
          sgd_stream_any<std::uint16_t, true>(p + jobs[j].begin, g + jobs[j].begin, buf, n, pl.sgd, pl.first, pl.rm.key,
                                              static_cast<std::uint32_t>(jobs[j].begin));
        else sgd_stream_any(p + jobs[j].begin, g + jobs[j].begin, buf, n, pl.sgd, pl.first);
        return;
      }
      const state_options& so = groups_[s.group].state;
      if (kind_ == optimizer_kind::sgd && s.m.mode == mode_int8 && quant::simd_level() >= 1) {
        const std::size_t block = static_cast<std::size_t>(s.m.block);
        std::uint8_t* mc = s.m.data.data<std::uint8_t>().data();
        float* msc = s.m.scales.data<float>().data();
        const auto& map = map_of(s.m);
        const double percentile = pl.absmax_scale ? 0.0 : pl.rm.percentile;
        const std::size_t begin = jobs[j].begin, end = jobs[j].end;
        auto run = [&](auto wd, auto stochastic) {
          if (quant::simd_level() >= 2 && s.m.is_signed)
            sgd_int8_blocks_avx512<wd, stochastic>(p, g, mc, msc, map, begin, end, block, pl.sgd, pl.first,
                                                   buffers, pl.rm.key, percentile);
          else
            sgd_int8_blocks_avx2<wd>(p, g, mc, msc, map, block_opts(s.m, pl.rm), begin, end, block, pl.sgd, pl.first,
                                     buffers, pl.rm.key, percentile);
        };
        const bool wd = pl.sgd.wd != 0.0f;
        if (so.stochastic_rounding) {
          if (wd) run(std::true_type{}, std::true_type{});
          else run(std::false_type{}, std::true_type{});
        } else if (wd) run(std::true_type{}, std::false_type{});
        else run(std::false_type{}, std::false_type{});
        return;
      }
      if (kind_ != optimizer_kind::sgd && fused_compressed(kind_, s)) {
        adam_compressed(s, jobs[j].begin, jobs[j].end, pl.adam, pl.rm, pl.rv, pl.rx, pl.absmax_scale, buffers);
        return;
      }
      // Other compressed moments: one block at a time through buffers that stay in L1.
      const std::size_t chunk = chunk_of(s);
      for (std::size_t b = jobs[j].begin; b < jobs[j].end; b += chunk) {
        const std::size_t n = std::min(chunk, jobs[j].end - b);
        float* m = load_moment(s.m, b, n, buffers);
        float* v = load_moment(s.v, b, n, buffers + chunk);
        float* x = load_moment(s.vmax, b, n, buffers + 2 * chunk);
        kernel(b, n, m, v, x);
        store_moment(s.m, b, n, m, pl.rm, false);
        store_moment(s.v, b, n, v, pl.rv, false);
        store_moment(s.vmax, b, n, x, pl.rx, false);
      }
    });
  }
  for (auto& s : slots_)
    if (s.m.mode != mode_none) s.momentum_started = true;
  return true;
}

std::function<double(std::int64_t, double)> cosine_lr(double total_steps) {
  if (!(total_steps >= 1) || !std::isfinite(total_steps))
    throw std::invalid_argument("a cosine schedule needs a finite number of steps of at least 1, not " +
                                std::to_string(total_steps));
  return [total_steps](std::int64_t step, double base) {
    return base * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step - 1) / total_steps));
  };
}

}  // namespace troupe::kernels
