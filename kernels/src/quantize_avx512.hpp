#pragma once
// AVX-512F pieces of the 8-bit quantizer, shared by quantize.cpp and the fused optimizer step:
// a 256-entry float table held in registers (two-table permutes and a blend tree, no memory
// access), and the quantizer of qmap::quantize_estimated on 16 lanes (arithmetic estimate, one
// lookup of the decision point in such a table, one comparison): no 6,400-entry table and no
// gather. Same operations as the scalar twin, so the same results; callers check
// simd_level() >= 2 first.

#include <immintrin.h>

#include "quantize.hpp"

namespace troupe::kernels::quant::avx512 {

/// 256 floats as 16 registers of 16.
struct table {
  __m512 r[16];
};

__attribute__((target("avx512f"))) inline table load_table(const float* v) noexcept {
  table t;
  for (int j = 0; j < 16; ++j) t.r[j] = _mm512_loadu_ps(v + 16 * j);
  return t;
}

/// t[idx] for 16 indices in 0..255: bits 0-4 choose inside each pair of registers (8 permutes),
/// bits 5, 6 and 7 choose the pair.
__attribute__((target("avx512f"))) inline __m512 lookup(const table& t, __m512i idx) noexcept {
  const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
  const __mmask16 b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
  const __mmask16 b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
  __m512 p[8];
  for (int j = 0; j < 8; ++j) p[j] = _mm512_permutex2var_ps(t.r[2 * j], idx, t.r[2 * j + 1]);
  const __m512 q0 = _mm512_mask_blend_ps(b5, p[0], p[1]), q1 = _mm512_mask_blend_ps(b5, p[2], p[3]);
  const __m512 q2 = _mm512_mask_blend_ps(b5, p[4], p[5]), q3 = _mm512_mask_blend_ps(b5, p[6], p[7]);
  return _mm512_mask_blend_ps(b7, _mm512_mask_blend_ps(b6, q0, q1), _mm512_mask_blend_ps(b6, q2, q3));
}

/// 16 codes (one per 32-bit lane) from the bytes at c.
__attribute__((target("avx512f"))) inline __m512i load_codes(const std::uint8_t* c) noexcept {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
}

/// A map's registers: its decision points and the tables of qmap::estimate().
struct quantizer {
  table above;
  __m512i piece_lo, piece_hi;  // exponent -> piece index (32 entries in two registers)
  __m512 threshold_lo, threshold_hi;
  __m512 scale, offset;  // per piece (16 entries, 8 used)
  __m512i base, count;
  __m512i zero;
};

__attribute__((target("avx512f"))) inline quantizer load_quantizer(const qmap& map) noexcept {
  quantizer q;
  q.above = load_table(map.aboves());
  q.piece_lo = _mm512_loadu_si512(map.exponent_piece());
  q.piece_hi = _mm512_loadu_si512(map.exponent_piece() + 16);
  q.threshold_lo = _mm512_loadu_ps(map.exponent_threshold());
  q.threshold_hi = _mm512_loadu_ps(map.exponent_threshold() + 16);
  q.scale = _mm512_loadu_ps(map.piece_scale());
  q.offset = _mm512_loadu_ps(map.piece_offset());
  q.base = _mm512_loadu_si512(map.piece_base());
  q.count = _mm512_loadu_si512(map.piece_count());
  q.zero = _mm512_set1_epi32(map.zero_code());
  return q;
}

/// qmap::quantize_estimated on 16 lanes, then keep_nonzero (a nonzero x never gets the zero
/// code: +1 for positive x, -1 for negative x when `down`); codes in 32-bit lanes.
__attribute__((target("avx512f"))) inline __m512i quantize(const quantizer& q, __m512 x, bool keep,
                                                           bool down) noexcept {
  const __m512i b = _mm512_castps_si512(x);
  __m512i m = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  m = _mm512_max_epi32(m, _mm512_set1_epi32(static_cast<int>(qmap::est_lo_bits)));
  m = _mm512_min_epi32(m, _mm512_set1_epi32(static_cast<int>(qmap::est_hi_bits)));
  const __m512 a = _mm512_castsi512_ps(m);
  const __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(m, 23), _mm512_set1_epi32(qmap::est_first_exponent));
  __m512i piece = _mm512_permutex2var_epi32(q.piece_lo, e, q.piece_hi);
  const __m512 threshold = _mm512_permutex2var_ps(q.threshold_lo, e, q.threshold_hi);
  piece = _mm512_mask_add_epi32(piece, _mm512_cmp_ps_mask(a, threshold, _CMP_GE_OQ), piece, _mm512_set1_epi32(1));
  const __m512 t = _mm512_add_ps(_mm512_mul_ps(a, _mm512_permutexvar_ps(piece, q.scale)),
                                 _mm512_permutexvar_ps(piece, q.offset));
  const __m512i k = _mm512_min_epi32(_mm512_cvttps_epi32(t), _mm512_permutexvar_epi32(piece, q.count));
  const __m512i pm = _mm512_add_epi32(_mm512_permutexvar_epi32(piece, q.base), k);
  const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512i zero = _mm512_setzero_si512();
  // The estimate, and the decision point to compare with: above(estimate) for x >= 0 (up one
  // when x is above it), above(estimate - 1) for x < 0 (down one when x is not above it).
  __m512i c = _mm512_mask_max_epi32(_mm512_add_epi32(q.zero, pm), neg, _mm512_sub_epi32(q.zero, pm), zero);
  const __m512i idx = _mm512_mask_max_epi32(c, neg, _mm512_sub_epi32(c, _mm512_set1_epi32(1)), zero);
  const __m512 d = lookup(q.above, idx);
  const __m512i one = _mm512_set1_epi32(1);
  const __mmask16 up = _mm512_mask_cmp_ps_mask(static_cast<__mmask16>(~neg), x, d, _CMP_GT_OQ);
  const __mmask16 dn = _mm512_mask_cmp_ps_mask(_mm512_mask_cmpgt_epi32_mask(neg, c, zero), x, d, _CMP_LE_OQ);
  c = _mm512_mask_add_epi32(c, up, c, one);
  c = _mm512_mask_sub_epi32(c, dn, c, one);
  if (keep) {
    const __mmask16 at_zero = _mm512_cmpeq_epi32_mask(c, q.zero);
    const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    c = _mm512_mask_add_epi32(c, at_zero & pos, c, one);
    if (down) c = _mm512_mask_sub_epi32(c, at_zero & neg, c, one);
  }
  return c;
}

/// Writes 16 codes (0..255 in 32-bit lanes) as bytes.
__attribute__((target("avx512f"))) inline void store_codes(std::uint8_t* out, __m512i c) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(c));
}

}  // namespace troupe::kernels::quant::avx512
