// The fused MLP step's row kernels for AVX2 with FMA and for AVX-512: classifier_rows.inc
// compiled once per instruction set, each in its own namespace and target region.

#include "classifier_fused.hpp"

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <utility>

namespace troupe::kernels::detail {

namespace {

// GCC 12 warns about the undefined source register inside _mm512_maskz_loadu_ps's own header
// (a false positive: maskz zeroes the masked lanes). The loops over the R rows must unroll
// completely, or the accumulators live on the stack: `#pragma GCC unroll` on each.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
/// 8 lanes; 6 rows per forward tile (12 accumulators and 3 operands in the 16 registers).
struct V {
  using reg = __m256;
  using mask = __m256i;
  static constexpr int width = 8, forward_tile = 6;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float f) { return _mm256_set1_ps(f); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg load_part(mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store_part(float* p, mask m, reg x) { _mm256_maskstore_ps(p, m, x); }
  static mask first(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg fnmadd(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static float sum(reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
};
#include "classifier_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
/// 16 lanes; 12 rows per forward tile (of the 32 registers).
struct V {
  using reg = __m512;
  using mask = __mmask16;
  static constexpr int width = 16, forward_tile = 12;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float f) { return _mm512_set1_ps(f); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg load_part(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_part(float* p, mask m, reg x) { _mm512_mask_storeu_ps(p, m, x); }
  static mask first(int n) { return static_cast<mask>((1u << n) - 1); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg fnmadd(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }
  static float sum(reg x) { return _mm512_reduce_add_ps(x); }
};
#include "classifier_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC diagnostic pop

}  // namespace

int cpu_simd_level() noexcept {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}

const row_kernels* row_kernels_for(int level) noexcept {
  switch (level) {
    case 2: return &avx512::kernels;
    case 1: return &avx2::kernels;
    default: return nullptr;
  }
}

}  // namespace troupe::kernels::detail
