// The optimizer's fast step on AVX-512 F, DQ, BW, VL and VBMI (quant::simd_level() 2): the fp32
// and bf16 stream kernels (optim_stream.inc on 16 lanes), the 8-bit kernels that decode codes by
// byte permutes and make new codes with the arithmetic quantizer (quantize_avx512.hpp) while the
// next block is updated, and the gradient checks (finiteness, sums of squares).
//
// Reference: optim_reference.cpp, bit for bit. Every kernel performs the IEEE operations of
// adam_element / sgd_element (optim_kernels.hpp) in the same order, no FMA (this file is compiled
// with -ffp-contract=off), and quantizes as quant::quantize_block; elements that do not fill a
// vector go through those scalar rules.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "optim_kernels.hpp"
#include "quantize_avx512.hpp"

namespace troupe::kernels::optim::avx512 {

namespace {

// ---- the fp32 and bf16 loops (optim_stream.inc) ---------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi")
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
  static reg widen(const std::uint16_t* h) { return quant::avx512::bf16_widen(h); }
  static void narrow(std::uint16_t* h, reg x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), quant::avx512::bf16_nearest(x));
  }
  static void narrow_stochastic(std::uint16_t* h, reg x, ireg key, std::uint32_t at) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), quant::avx512::bf16_stochastic(x, quant::avx512::random_bits(key, at)));
  }
};
#include "optim_stream.inc"
#pragma GCC pop_options

// ---- 8-bit state -----------------------------------------------------------------------------

/// The moments of the Adam kernel (adam_int8_blocks), indexed 0 (m, the signed map), 1 (v)
/// and, with AMSGrad, 2 (its maximum; the unsigned map like v): codes, block scales and map
/// values. With first_moment_fp32, m is fp32 values instead (`m_fp32`, indexed like the
/// parameters) and its codes, scale and values are unused. `percentile`: scale each block by this percentile of |x|
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

/// The 8-bit Adam blocks of [begin, end), in two stages that overlap: while block k is
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
TROUPE_AVX512 void adam_int8_blocks(float* p, const float* g, const int8_moments& mo, const quant::qmap& mmap,
                                    const quant::qmap& vmap, std::size_t begin, std::size_t end, std::size_t block,
                                    const adam_constants& c, float* buffers, const std::uint32_t (&keys)[3]) {
  using set = moment_set<MFp32, Ams>;
  const quant::avx512::quantizer mq = quant::avx512::load_quantizer(mmap, true);
  const quant::avx512::quantizer vq = quant::avx512::load_quantizer(vmap, true);
  const stochastic_state sr = load_stochastic(mmap, vmap, keys);
  const adam_vectors kc = broadcast(c);
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
      _mm512_storeu_ps(pb + i, adam_update<L2, Clip, Low, Ams>(_mm512_loadu_ps(pb + i), _mm512_loadu_ps(gb + i), mi, vi, kc, &xi));
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

/// SGD with an 8-bit momentum buffer over the blocks of [begin, end): the structure of
/// adam_int8_blocks with one moment (decode by byte permutes, update, absmax, codes of the
/// block before written while this one is updated). The same operations as the portable path
/// (sgd_fused_loop between dequantize_block and quantize_block), so the same bits. Stochastic:
/// codes by stochastic rounding with `key` (quant::quantize_block's draws). A block's scale is
/// its absmax, or (percentile > 0) that percentile's selection from the new values in L1.
template <bool Wd, bool Stochastic>
TROUPE_AVX512 void sgd_int8_blocks(float* p, const float* g, std::uint8_t* mc, float* msc, const quant::qmap& map,
                                   std::size_t begin, std::size_t end, std::size_t block, const sgd_constants& c,
                                   bool first, float* buffers, std::uint32_t key, double percentile) {
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

// ---- the gradient checks -------------------------------------------------------------------------

// GCC 12 takes the reduction's own undefined-value placeholder for an uninitialized variable.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
/// optim::top_exponent: the largest exponent field per lane, 64 values per iteration with a
/// prefetch 1 KiB ahead, because this pass reads every gradient once per step and runs at memory
/// speed only so (with one 4-lane loop it took 0.50 ns per value on one thread at 50 M, twice the
/// 16-lane loop's time; docs/PERFORMANCE.md).
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
  return std::max(static_cast<std::uint32_t>(_mm512_reduce_max_epu32(top)), portable::top_exponent(x + i, n - i));
}
#pragma GCC diagnostic pop

/// optim::sum_of_squares with its 16 partial sums in two registers.
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
  return portable::sum_of_squares(x + i, n - i, sums);
}

}  // namespace

// ---- the entry points (optim_kernels.hpp) --------------------------------------------------------

#include "optim_stream_entries.inc"

void adam_int8(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c, const rounding& rm,
               const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers) {
  float* p = s.p->value.data<float>().data();
  const float* g = std::as_const(*s.p).grad.data<float>().data();
  const std::size_t block = static_cast<std::size_t>(s.v.block);
  const auto& mmap = quant::qmap::dynamic(true);
  const auto& vmap = map_of(s.v);
  int8_moments moments;
  const bool m_fp32 = s.m.mode == mode_fp32;
  if (m_fp32) {
    moments.m_fp32 = s.m.data.data<float>().data();
  } else {
    moments.codes[0] = s.m.data.data<std::uint8_t>().data();
    moments.scales[0] = s.m.scales.data<float>().data();
  }
  moments.codes[1] = s.v.data.data<std::uint8_t>().data();
  moments.scales[1] = s.v.scales.data<float>().data();
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
  with_flags(
      [&](auto stochastic, auto amsgrad, auto first_fp32) {
        with_choices(c, [&](auto l2, auto clip, auto low) {
          adam_int8_blocks<l2, clip, low, stochastic, amsgrad, first_fp32>(p, g, moments, mmap, vmap, begin, end, block,
                                                                           c, buffers, keys);
        });
      },
      rm.stochastic, ams, m_fp32);
}

void sgd_int8(float* p, const float* g, std::uint8_t* mc, float* msc, const quant::qmap& map, std::size_t begin,
              std::size_t end, std::size_t block, const sgd_constants& c, bool first, float* buffers,
              std::uint32_t key, double percentile, bool stochastic) {
  with_flags(
      [&](auto wd, auto stoch) {
        sgd_int8_blocks<wd, stoch>(p, g, mc, msc, map, begin, end, block, c, first, buffers, key, percentile);
      },
      c.wd != 0.0f, stochastic);
}

std::uint32_t top_exponent(const float* x, std::size_t n) { return top_exponent_avx512(x, n); }

double sum_of_squares(const float* x, std::size_t n) { return sum_of_squares_avx512(x, n); }

}  // namespace troupe::kernels::optim::avx512
