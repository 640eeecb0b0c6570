// The optimizer's fast step on AVX2 (quant::simd_level() 1): the fp32 and bf16 stream kernels
// (optim_stream.inc on 8 lanes), the 8-bit kernels that decode codes in registers (one table
// lookup per code, quant::avx2::decode8) and the gradients' finiteness check.
//
// Reference: optim_reference.cpp, bit for bit. Every kernel performs the IEEE operations of
// adam_element / sgd_element (optim_kernels.hpp) in the same order, no FMA (this file is compiled
// with -ffp-contract=off); elements that do not fill a vector go through those scalar rules.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "optim_kernels.hpp"
#include "quantize_avx2.hpp"

namespace troupe::kernels::optim::avx2 {

namespace {

// ---- the fp32 and bf16 loops (optim_stream.inc) ---------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx2")
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
#pragma GCC pop_options

// ---- 8-bit state -----------------------------------------------------------------------------

/// One block of 8-bit state: the moments' codes (m, v and with Ams AMSGrad's maximum x) decoded
/// in registers (one table lookup each, quant::avx2::decode8), the update, and their new values
/// written to buf[j] with their absmax in absmax[j]. The caller then makes each moment's codes
/// from its new values.
struct int8_block {
  const std::uint8_t* codes[3] = {};  // m, v, x (Ams)
  float scale[3] = {};
  const float* values[3] = {};  // the maps' entries
  float* buf[3] = {};
  float absmax[3] = {};
};

template <bool L2, bool Clip, bool Low, bool Ams>
__attribute__((target("avx2"))) void adam_int8_block(float* p, const float* grad, std::size_t n,
                                                     const adam_constants& c, int8_block& d) {
  const adam_vectors k = broadcast(c);
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
    _mm256_storeu_ps(p + i, adam_update<L2, Clip, Low, Ams>(_mm256_loadu_ps(p + i), _mm256_loadu_ps(grad + i), mo[0],
                                                            mo[1], k, &mo[2]));
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

/// sgd_int8's loop: per block the codes decoded in registers (one table lookup), the update and
/// the new buffer written to an L1 buffer with its absmax, then the codes from it
/// (quant::quantize_block: nearest or stochastic, scaled by the absmax or, percentile > 0, that
/// percentile of |x|). The operations of sgd_element after dequantize_block, so the same bits as
/// the portable path.
template <bool Wd>
__attribute__((target("avx2"))) void sgd_int8_blocks(float* p, const float* g, std::uint8_t* mc, float* msc,
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

// ---- the gradient check --------------------------------------------------------------------------

/// optim::top_exponent: the largest exponent field per lane, 32 values per iteration with a
/// prefetch 1 KiB ahead (this pass reads every gradient once per step and runs at memory speed
/// only so; docs/PERFORMANCE.md).
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
  std::uint32_t most = portable::top_exponent(x + i, n - i);
  for (std::uint32_t l : lanes) most = std::max(most, l);
  return most;
}

}  // namespace

// ---- the entry points (optim_kernels.hpp) --------------------------------------------------------

#include "optim_stream_entries.inc"

void adam_int8(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c, const rounding& rm,
               const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers) {
  // A block at a time through adam_int8_block, then each moment's codes from its new values by
  // quant::quantize_block (nearest or stochastic; scaled by the absmax or a percentile).
  float* p = s.p->value.data<float>().data();
  const float* g = std::as_const(*s.p).grad.data<float>().data();
  const std::size_t block = static_cast<std::size_t>(s.v.block);
  optimizer::moment* mos[3] = {&s.m, &s.v, &s.vmax};
  const rounding* rs[3] = {&rm, &rv, &rx};
  const bool ams = s.vmax.mode == mode_int8;
  int8_block d;
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
      if (ams) adam_int8_block<l2c, clip, low, true>(p + b, g + b, n, c, d);
      else adam_int8_block<l2c, clip, low, false>(p + b, g + b, n, c, d);
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

void sgd_int8(float* p, const float* g, std::uint8_t* mc, float* msc, const quant::qmap& map,
              const quant::block_options& opts, std::size_t begin, std::size_t end, std::size_t block,
              const sgd_constants& c, bool first, float* buffers, std::uint32_t key, double percentile) {
  if (c.wd != 0.0f)
    sgd_int8_blocks<true>(p, g, mc, msc, map, opts, begin, end, block, c, first, buffers, key, percentile);
  else
    sgd_int8_blocks<false>(p, g, mc, msc, map, opts, begin, end, block, c, first, buffers, key, percentile);
}

std::uint32_t top_exponent(const float* x, std::size_t n) { return top_exponent_avx2(x, n); }

}  // namespace troupe::kernels::optim::avx2
