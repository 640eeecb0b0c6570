#pragma once
// AVX-512 pieces of the 8-bit quantizer and of bf16 rounding, shared by quantize.cpp and the
// fused optimizer step (optim_avx512.cpp): bf16 rounding and widening on 16 lanes, and the
// quantizer of qmap::estimate (a piece from the exponent, one multiply-add, no table in memory
// and no gather; the rare lanes it is not sure of go to the table). Same operations as the
// scalar twins, so the same results; callers check simd_level() >= 2 first.

#include <immintrin.h>

#include "quantize.hpp"

// Everything here needs AVX-512 F, DQ, BW, VL and VBMI (simd_level() 2).
#define TROUPE_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi")))

namespace troupe::kernels::quant::avx512 {

/// 16 codes (one per 32-bit lane) from the bytes at c.
TROUPE_AVX512 inline __m512i load_codes(const std::uint8_t* c) noexcept {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
}

/// The map entries of 64 codes, times `scale`: out[j] gets codes[16 j .. 16 j + 15]. Byte k of
/// each entry comes from the map's plane k (qmap::planes(), 256 bytes in four registers) by two
/// two-register byte permutes (codes 0-127 and 128-255) and a blend on the code's top bit; then
/// byte and word interleaves make the 32-bit entries. No gather: on CPUs where a 16-lane gather
/// is microcoded this is several times faster (docs/PERFORMANCE.md). (GCC 12 takes the
/// permute's undefined-value placeholder for an uninitialized variable.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
TROUPE_AVX512 inline void decode64(const std::uint8_t* planes, const std::uint8_t* codes, __m512 scale,
                                   __m512 (&out)[4]) noexcept {
  // The interleaves work inside 128-bit lanes: lane L of interleave j holds the bytes at
  // 16 L + 4 j + (0..3). Moving dword (j, L) of the codes to (L, j) first makes out[j] hold
  // codes 16 j .. 16 j + 15 in order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i c = _mm512_permutexvar_epi32(order, _mm512_loadu_si512(codes));
  const __mmask64 upper = _mm512_movepi8_mask(c);
  __m512i b[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const std::uint8_t* plane = planes + 256 * k;
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(plane), c, _mm512_load_si512(plane + 64));
    const __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(plane + 128), c, _mm512_load_si512(plane + 192));
    b[k] = _mm512_mask_blend_epi8(upper, lo, hi);
  }
  const __m512i w01l = _mm512_unpacklo_epi8(b[0], b[1]), w01h = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i w23l = _mm512_unpacklo_epi8(b[2], b[3]), w23h = _mm512_unpackhi_epi8(b[2], b[3]);
  out[0] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l)), scale);
  out[1] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l)), scale);
  out[2] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h)), scale);
  out[3] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h)), scale);
}
#pragma GCC diagnostic pop

/// A map's registers: the tables of qmap::estimate().
struct quantizer {
  __m512i piece;  // exponent slot -> piece
  __m512 threshold;
  __m512 scale, offset;  // per piece (16 entries, 9 used)
  __m512i limit;
  __m128i zero;  // the zero code in every byte
};

TROUPE_AVX512 inline quantizer load_quantizer(const qmap& map, bool keep) noexcept {
  quantizer q;
  q.piece = _mm512_loadu_si512(map.exponent_piece());
  q.threshold = _mm512_loadu_ps(map.exponent_threshold());
  q.scale = _mm512_loadu_ps(map.piece_scale(keep));
  q.offset = _mm512_loadu_ps(map.piece_offset(keep));
  q.limit = _mm512_loadu_si512(map.piece_limit(keep));
  q.zero = _mm_set1_epi8(static_cast<char>(map.zero_code()));
  return q;
}

/// qmap::estimate on 16 lanes (Signed: the map's signedness): the magnitude's index in the fine
/// form W (bits 16-23; index() makes 32-bit lanes of it, code_bytes() picks its byte), which is
/// the code for the unsigned map; signed_codes() makes the signed map's codes of it. `sure` is
/// and-ed with the lanes the estimate is sure of (the caller asks the table for the others).
/// Nonnegative: x is +0 or more (a second moment over its block scale), so that the unsigned map
/// clamps only above, at 1 (a percentile scale leaves values beyond it). Always inlined: the
/// fused kernels call it several times per chunk and a call spills their registers.
template <bool Signed, bool Nonnegative = false>
TROUPE_AVX512 inline __attribute__((always_inline)) __m512i quantize(const quantizer& q, __m512 x,
                                                                   __mmask16& sure) noexcept {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 a;
  if constexpr (Signed) a = _mm512_range_ps(x, one, 0x0a);  // min(|x|, 1), sign cleared
  else if constexpr (Nonnegative) a = _mm512_min_ps(x, one);
  else a = _mm512_min_ps(_mm512_max_ps(x, _mm512_setzero_ps()), one);
  const __m512i ab = _mm512_castps_si512(a);
  // The slot (qmap::slot): the permutes read only the index's low 4 bits.
  const __m512i e = _mm512_srli_epi32(_mm512_castps_si512(_mm512_max_ps(a, _mm512_set1_ps(qmap::est_floor))), 24);
  const __m512i pe = _mm512_permutexvar_epi32(e, q.piece);
  const __m512 threshold = _mm512_permutexvar_ps(e, q.threshold);
  const __mmask16 next = _mm512_cmp_ps_mask(a, threshold, _CMP_GE_OQ);
  const __m512i piece = _mm512_mask_add_epi32(pe, next, pe, _mm512_set1_epi32(1));
  const __m512 w = _mm512_fmadd_ps(a, _mm512_permutexvar_ps(piece, q.scale), _mm512_permutexvar_ps(piece, q.offset));
  const __m512i whole = _mm512_cvttps_epu32(w);
  sure = _mm512_mask_test_epi32_mask(sure, whole, _mm512_set1_epi32(static_cast<int>(qmap::sure_bits)));
  // The limit, and 0 for a zero magnitude.
  return _mm512_maskz_min_epu32(_mm512_test_epi32_mask(ab, ab), whole, _mm512_permutexvar_epi32(piece, q.limit));
}

/// The 32-bit indexes of quantize()'s fine form.
TROUPE_AVX512 inline __m512i index(__m512i fine) noexcept { return _mm512_srli_epi32(fine, 16); }

/// The permute that gathers the index bytes (byte 2) of the 16 lanes of each of two fine vectors
/// into bytes 0-31 (those of the first into 0-15).
TROUPE_AVX512 inline __m512i code_bytes() noexcept {
  return _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                         126, 122, 118, 114, 110, 106, 102, 98, 94, 90, 86, 82, 78, 74, 70, 66, 62, 58, 54, 50, 46, 42,
                         38, 34, 30, 26, 22, 18, 14, 10, 6, 2);
}

/// The 16 index bytes of quantize()'s fine form, in order.
TROUPE_AVX512 inline __m128i index_bytes(__m512i fine) noexcept {
  return _mm512_castsi512_si128(_mm512_permutexvar_epi8(code_bytes(), fine));
}

/// The lanes whose sign bit is set.
TROUPE_AVX512 inline __mmask16 negative(__m512 x) noexcept { return _mm512_movepi32_mask(_mm512_castps_si512(x)); }

/// The signed map's 16 codes from the magnitude indexes k (bytes) and the signs: the zero code
/// plus k, or minus k for the negative lanes, saturated at code 0 (the index 128 of the entry 1
/// has no negative twin).
TROUPE_AVX512 inline __m128i signed_codes(const quantizer& q, __m128i k, __mmask16 negative) noexcept {
  return _mm_mask_subs_epu8(_mm_adds_epu8(q.zero, k), negative, q.zero, k);
}

/// random_bits() on 16 lanes: the bits of (key, first + lane).
TROUPE_AVX512 inline __m512i random_bits(__m512i key, std::uint32_t first) noexcept {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i index = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(first)), lanes);
  __m512i h = _mm512_xor_si512(_mm512_mullo_epi32(index, _mm512_set1_epi32(static_cast<int>(0x9e3779b1u))), key);
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7feb352d));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

/// quant::to_bf16_stochastic on 16 lanes with their random bits.
TROUPE_AVX512 inline __m256i bf16_stochastic(__m512 x, __m512i bits) noexcept {
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i b = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(b, sign_bit);
  const __m512i mag = _mm512_andnot_si512(sign_bit, b);
  const __m512i up = _mm512_add_epi32(mag, _mm512_and_si512(bits, _mm512_set1_epi32(0xffff)));
  // Never round a finite value up into infinity (nor change an infinity or a NaN).
  const __mmask16 over = _mm512_cmpgt_epu32_mask(_mm512_srli_epi32(up, 16), _mm512_set1_epi32(0x7f7f));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_or_si512(sign, _mm512_mask_blend_epi32(over, up, mag)), 16));
}

/// quant::to_bf16 (round to nearest even) on 16 lanes.
TROUPE_AVX512 inline __m256i bf16_nearest(__m512 x) noexcept {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_cvtepi32_epi16(r);
}

/// 16 bf16 values widened exactly.
TROUPE_AVX512 inline __m512 bf16_widen(const std::uint16_t* h) noexcept {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/// Stochastic rounding of 16 normalized values xn (quant::quantize_block's rule): the draw
/// between the two entries around xn with the bits of (key, first + lane), then keep_nonzero.
/// The arithmetic quantizer `q` (loaded without keep_nonzero) gives a code next to xn (the
/// nearest or, on the rare lanes it is not sure of, the one across the decision point) and, from
/// t, which side of its entry xn lies on (inside a decade entry k sits at t = k + 1/2); that
/// guesses the lower entry of the pair, whose two values come in one 64-bit gather (map.pairs()).
/// The guess is off by at most one code (the last entry of a decade, a lane not sure): the lanes
/// outside their pair move one code and gather again. Values beyond the map's ends are clamped
/// into it, where they equal an end entry. Codes in 32-bit lanes. Always inlined (a call would
/// spill the caller's vector registers); GCC 12 takes the intrinsics' undefined-value
/// placeholders for uninitialized variables here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <bool Signed>
TROUPE_AVX512 inline __attribute__((always_inline)) __m512i stochastic_codes(const quantizer& q, const qmap& map,
                                                                             __m512 xn, __m512i key, std::uint32_t first,
                                                                             bool keep) noexcept {
  const __m512i zero = _mm512_set1_epi32(_mm_extract_epi8(q.zero, 0)), one = _mm512_set1_epi32(1);
  const __m512i none = _mm512_setzero_si512();
  const __m512 zero_f = _mm512_setzero_ps();
  __mmask16 sure = 0xffff;  // unused: the draw below checks the pair
  const __m512i fine = quantize<Signed>(q, xn, sure);
  __m512i c = index(fine);
  // Above its entry in code order: the magnitude above its entry (t's fraction at least 1/2: the
  // fine form's bit 15, within 2^-14), mirrored for the negative half of the signed map.
  __mmask16 above = _mm512_test_epi32_mask(fine, _mm512_set1_epi32(0x8000));
  if constexpr (Signed) {
    const __mmask16 neg = negative(xn);
    c = _mm512_max_epi32(_mm512_mask_sub_epi32(_mm512_add_epi32(zero, c), neg, zero, c), none);
    above ^= neg;
  }
  __m512i lo = _mm512_mask_sub_epi32(c, static_cast<__mmask16>(~above), c, one);
  lo = _mm512_min_epi32(_mm512_max_epi32(lo, none), _mm512_set1_epi32(254));
  const float* values = map.values();
  const __m512 x = _mm512_min_ps(_mm512_max_ps(xn, _mm512_set1_ps(values[0])), _mm512_set1_ps(values[255]));
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, one);
  __m512 a, b;
  for (;;) {
    const __m512 p0 = _mm512_castpd_ps(_mm512_i32gather_pd(_mm512_castsi512_si256(lo), map.pairs(), 8));
    const __m512 p1 = _mm512_castpd_ps(_mm512_i32gather_pd(_mm512_extracti64x4_epi64(lo, 1), map.pairs(), 8));
    a = _mm512_permutex2var_ps(p0, even, p1);
    b = _mm512_permutex2var_ps(p0, odd, p1);
    const __mmask16 low = _mm512_cmp_ps_mask(x, a, _CMP_LT_OQ), high = _mm512_cmp_ps_mask(x, b, _CMP_GT_OQ);
    if ((low | high) == 0) [[likely]] break;
    lo = _mm512_mask_add_epi32(_mm512_mask_sub_epi32(lo, low, lo, one), high, lo, one);
  }
  // The reference's draw: (x - a) > u (b - a) takes the upper entry; x equal to the upper entry is
  // that entry (u (b - a) may round up to b - a).
  const __m512 draw = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(random_bits(key, first), 8)), _mm512_set1_ps(0x1p-24f));
  const __mmask16 take_hi = _mm512_cmp_ps_mask(_mm512_sub_ps(x, a), _mm512_mul_ps(draw, _mm512_sub_ps(b, a)), _CMP_GT_OQ) |
                            _mm512_cmp_ps_mask(x, b, _CMP_EQ_OQ);
  c = _mm512_mask_add_epi32(lo, take_hi, lo, one);
  if (keep) {
    const __mmask16 at_zero = _mm512_cmpeq_epi32_mask(c, zero) & _mm512_cmp_ps_mask(xn, zero_f, _CMP_NEQ_UQ);
    const __mmask16 pos = at_zero & _mm512_cmp_ps_mask(xn, zero_f, _CMP_GT_OQ);
    const __mmask16 neg = at_zero & _mm512_cmp_ps_mask(xn, zero_f, _CMP_LT_OQ) & _mm512_cmpgt_epi32_mask(c, none);
    c = _mm512_mask_sub_epi32(_mm512_mask_add_epi32(c, pos, c, one), neg, c, one);
  }
  return c;
}
#pragma GCC diagnostic pop

/// The exact code of one value (the table, then keep_nonzero's rule): for the lanes quantize()
/// is not sure of.
inline std::uint8_t quantize_exact(const qmap& map, float x, bool keep) noexcept {
  int c = map.quantize(x);
  if (keep && c == map.zero_code() && x != 0.0f) c += x > 0.0f ? 1 : (map.is_signed() && c > 0 ? -1 : 0);
  return static_cast<std::uint8_t>(c);
}

/// The codes of the `lanes` of the 16 values at `values` times `inv` by the table (the lanes the
/// estimate is not sure of; rare, so out of the callers' loops).
__attribute__((noinline, cold)) inline void exact_codes(std::uint8_t* out, unsigned lanes, const qmap& map,
                                                        const float* values, float inv, bool keep) noexcept {
  for (; lanes != 0; lanes &= lanes - 1) {
    const int lane = __builtin_ctz(lanes);
    out[lane] = quantize_exact(map, values[lane] * inv, keep);
  }
}

/// Writes the 16 codes of the values x as bytes, from quantize<Signed>()'s fine form.
template <bool Signed>
TROUPE_AVX512 inline void store_codes(std::uint8_t* out, const quantizer& q, __m512i fine, __m512 x) noexcept {
  __m128i c = index_bytes(fine);
  if constexpr (Signed) c = signed_codes(q, c, negative(x));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), c);
}

/// The codes of the 16 values at `values` times `inv` (quant::quantize_block's scaling), written
/// to `out`: the estimate, then the table for the lanes it is not sure of. `q` loaded with `keep`.
template <bool Signed>
TROUPE_AVX512 inline __attribute__((always_inline)) void store_exact_codes(std::uint8_t* out, const quantizer& q,
                                                                         const qmap& map, const float* values,
                                                                         float inv, bool keep) noexcept {
  const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(values), _mm512_set1_ps(inv));
  __mmask16 sure = 0xffff;
  store_codes<Signed>(out, q, quantize<Signed>(q, x, sure), x);
  if (sure != 0xffff) [[unlikely]] exact_codes(out, static_cast<__mmask16>(~sure), map, values, inv, keep);
}

}  // namespace troupe::kernels::quant::avx512
