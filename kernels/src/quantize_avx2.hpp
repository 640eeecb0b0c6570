#pragma once
// AVX2 pieces shared by quantize.cpp and the fused optimizer step: the draws of random_bits()
// and bf16 stochastic rounding on 8 lanes, the same operations as the scalar twins, so the same
// results; callers check simd_level() >= 1 first.

#include <immintrin.h>

#include <cstdint>

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
