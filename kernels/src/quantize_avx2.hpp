#pragma once
// AVX2 pieces shared by quantize.cpp and the fused optimizer step (optim_avx2.cpp): the draws of
// random_bits(), table lookups, and bf16 rounding and widening on 8 lanes, the same operations as
// the scalar twins, so the same results; callers check simd_level() >= 1 first.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define TROUPE_AVX2 __attribute__((target("avx2")))

namespace troupe::kernels::quant::avx2 {

/// random_bits() on 8 lanes: the bits of (key, first + lane).
TROUPE_AVX2 inline __m256i random_bits(__m256i key, std::uint32_t first) noexcept {
  const __m256i index =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i h = _mm256_xor_si256(_mm256_mullo_epi32(index, _mm256_set1_epi32(static_cast<int>(0x9e3779b1u))), key);
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7feb352d));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

/// table[i0..i7] on 8 lanes by scalar loads inserted into the vector (T: 32-bit float or int).
/// This is how the AVX2 kernels look up tables instead of vpgatherdd: on Zen 3 an 8-lane gather
/// is microcoded (about 9 cycles), and these inserts measured 0.27-0.47 ns per value against the
/// gather's 0.44-0.77 (tables of 1 and 16 KiB in L1; docs/PERFORMANCE.md).
template <class T>
TROUPE_AVX2 inline __m256i lookup8(const T* table, std::uint32_t i0, std::uint32_t i1, std::uint32_t i2,
                                   std::uint32_t i3, std::uint32_t i4, std::uint32_t i5, std::uint32_t i6,
                                   std::uint32_t i7) noexcept {
  static_assert(sizeof(T) == 4);
  auto at = [table](std::uint32_t i) {
    std::int32_t v;
    std::memcpy(&v, table + i, 4);
    return v;
  };
  __m128i lo = _mm_cvtsi32_si128(at(i0)), hi = _mm_cvtsi32_si128(at(i4));
  lo = _mm_insert_epi32(lo, at(i1), 1);
  hi = _mm_insert_epi32(hi, at(i5), 1);
  lo = _mm_insert_epi32(lo, at(i2), 2);
  hi = _mm_insert_epi32(hi, at(i6), 2);
  lo = _mm_insert_epi32(lo, at(i3), 3);
  hi = _mm_insert_epi32(hi, at(i7), 3);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/// table[idx] on 8 lanes (the indexes leave the vector two at a time).
TROUPE_AVX2 inline __m256i lookup(const std::int32_t* table, __m256i idx) noexcept {
  const __m128i l = _mm256_castsi256_si128(idx), h = _mm256_extracti128_si256(idx, 1);
  const auto a = static_cast<std::uint64_t>(_mm_cvtsi128_si64(l)), b = static_cast<std::uint64_t>(_mm_extract_epi64(l, 1));
  const auto c = static_cast<std::uint64_t>(_mm_cvtsi128_si64(h)), d = static_cast<std::uint64_t>(_mm_extract_epi64(h, 1));
  auto low = [](std::uint64_t q) { return static_cast<std::uint32_t>(q); };
  return lookup8(table, low(a), static_cast<std::uint32_t>(a >> 32), low(b), static_cast<std::uint32_t>(b >> 32), low(c),
                 static_cast<std::uint32_t>(c >> 32), low(d), static_cast<std::uint32_t>(d >> 32));
}
TROUPE_AVX2 inline __m256 lookup(const float* table, __m256i idx) noexcept {
  return _mm256_castsi256_ps(lookup(reinterpret_cast<const std::int32_t*>(table), idx));
}

/// The map entries of 8 codes: values[codes[0..7]].
TROUPE_AVX2 inline __m256 decode8(const float* values, const std::uint8_t* codes) noexcept {
  return _mm256_castsi256_ps(
      lookup8(values, codes[0], codes[1], codes[2], codes[3], codes[4], codes[5], codes[6], codes[7]));
}

/// 16-bit values in 32-bit lanes (0..0xffff) to 8 consecutive 16-bit values.
TROUPE_AVX2 inline __m128i narrow_16(__m256i h) noexcept {
  // packus keeps 0..0xffff; lanes come out as 0-3, 0-3 | 4-7, 4-7.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08));
}

/// quant::to_bf16_stochastic on 8 lanes with their random bits.
TROUPE_AVX2 inline __m128i bf16_stochastic(__m256 x, __m256i bits) noexcept {
  const __m256i sign_bit = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i b = _mm256_castps_si256(x);
  const __m256i sign = _mm256_and_si256(b, sign_bit);
  const __m256i mag = _mm256_andnot_si256(sign_bit, b);
  const __m256i up = _mm256_add_epi32(mag, _mm256_and_si256(bits, _mm256_set1_epi32(0xffff)));
  // Never round a finite value up into infinity (nor change an infinity or a NaN).
  const __m256i over = _mm256_cmpgt_epi32(_mm256_srli_epi32(up, 16), _mm256_set1_epi32(0x7f7f));
  return narrow_16(_mm256_srli_epi32(_mm256_or_si256(sign, _mm256_blendv_epi8(up, mag, over)), 16));
}

/// quant::to_bf16 (round to nearest even) on 8 lanes.
TROUPE_AVX2 inline __m128i bf16_nearest(__m256 x) noexcept {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return narrow_16(_mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16));
}

/// 8 bf16 values widened exactly.
TROUPE_AVX2 inline __m256 bf16_widen(const std::uint16_t* h) noexcept {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

}  // namespace troupe::kernels::quant::avx2
