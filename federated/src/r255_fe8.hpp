#pragma once
// GF(2^255 - 19) eight elements at a time on AVX-512 IFMA (private to the r255 sources): one
// element per 64-bit lane, in the same 5 limbs of 51 bits as r255_field.hpp, so that a lane moves
// to and from a field_element limb by limb. Every function here carries the target attribute
// (TROUPE_R255_IFMA): call them only from functions that carry it too, and those only where
// detail::ifma_available() said yes.
//
// vpmadd52{lo,hu}q multiply the low 52 bits of their operands: every input of mul() and sq()
// must have limbs below 2^52. mul(), sq(), carry(), sub() and add_carry() return limbs below
// 2^51 + 2^15; add() does not carry (its sum may reach 2^52 + 2^16: only sub() and carry() may
// take it).

#include <immintrin.h>

#include <cstdint>

#include "r255_field.hpp"

namespace troupe::federated::r255::detail::x8 {

#define TROUPE_R255_IFMA [[gnu::target("avx512f,avx512ifma")]]
#define TROUPE_R255_INLINE [[gnu::always_inline, gnu::target("avx512f,avx512ifma")]] inline

using v8 = __m512i;
struct fe8 {
  v8 l[5];
};

TROUPE_R255_INLINE v8 splat(std::uint64_t x) { return _mm512_set1_epi64(static_cast<long long>(x)); }

TROUPE_R255_INLINE fe8 constant(const fe& c) {
  return {{splat(c.limb[0]), splat(c.limb[1]), splat(c.limb[2]), splat(c.limb[3]), splat(c.limb[4])}};
}

/// One pass of carries, all limbs at once: limbs below 2^64 come out below 2^51 + 19 * 2^13.
TROUPE_R255_INLINE fe8 carry(const fe8& z) {
  const v8 m = splat(mask51);
  v8 c[5];
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) c[k] = _mm512_srli_epi64(z.l[k], 51);
  fe8 r;
  r.l[0] = _mm512_madd52lo_epu64(_mm512_and_si512(z.l[0], m), c[4], splat(19));
#pragma GCC unroll 4
  for (int k = 1; k < 5; ++k) r.l[k] = _mm512_add_epi64(_mm512_and_si512(z.l[k], m), c[k - 1]);
  return r;
}

TROUPE_R255_INLINE fe8 add(const fe8& a, const fe8& b) {
  fe8 r;
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) r.l[k] = _mm512_add_epi64(a.l[k], b.l[k]);
  return r;
}

TROUPE_R255_INLINE fe8 add_carry(const fe8& a, const fe8& b) { return carry(add(a, b)); }

/// a + 4p - b, carried: no limb underflows while b's limbs are below 2^53 - 76.
TROUPE_R255_INLINE fe8 sub(const fe8& a, const fe8& b) {
  fe8 r;
  r.l[0] = _mm512_sub_epi64(_mm512_add_epi64(a.l[0], splat(0x1fffffffffffb4)), b.l[0]);
#pragma GCC unroll 4
  for (int k = 1; k < 5; ++k) r.l[k] = _mm512_sub_epi64(_mm512_add_epi64(a.l[k], splat(0x1ffffffffffffc)), b.l[k]);
  return carry(r);
}

TROUPE_R255_INLINE fe8 neg(const fe8& a) {
  const v8 z = _mm512_setzero_si512();
  return sub({{z, z, z, z, z}}, a);
}

/// Column k of a product in radix 2^51: the low halves of a_i * b_j with i + j = k and twice the
/// high halves (weight 2^52) of those with i + j = k - 1.
template <int K>
TROUPE_R255_INLINE v8 column(const fe8& a, const fe8& b) {
  v8 lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
#pragma GCC unroll 5
  for (int i = 0; i < 5; ++i)
    if (K - i >= 0 && K - i < 5) lo = _mm512_madd52lo_epu64(lo, a.l[i], b.l[K - i]);
#pragma GCC unroll 5
  for (int i = 0; i < 5; ++i)
    if (K - 1 - i >= 0 && K - 1 - i < 5) hi = _mm512_madd52hi_epu64(hi, a.l[i], b.l[K - 1 - i]);
  return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 1));
}

/// z + 19 t (19t = 16t + 2t + t).
TROUPE_R255_INLINE v8 fold(v8 z, v8 t) {
  return _mm512_add_epi64(_mm512_add_epi64(z, t), _mm512_add_epi64(_mm512_slli_epi64(t, 4), _mm512_slli_epi64(t, 1)));
}

// Bounds: with limbs below 2^52, each column sums at most 5 low and 5 high halves (below 2^52
// each), so z[k] < 15 * 2^52 < 2^56 and z[k] + 19 z[k+5] < 2^61: no overflow before the carry.
// The columns go one at a time (two accumulators live) and the high five first, so that each
// low column folds in 2^255 = 19 mod p as soon as it is done.
TROUPE_R255_INLINE fe8 mul(const fe8& a, const fe8& b) {
  const v8 z5 = column<5>(a, b), z6 = column<6>(a, b), z7 = column<7>(a, b), z8 = column<8>(a, b),
           z9 = column<9>(a, b);
  fe8 r;
  r.l[0] = fold(column<0>(a, b), z5);
  r.l[1] = fold(column<1>(a, b), z6);
  r.l[2] = fold(column<2>(a, b), z7);
  r.l[3] = fold(column<3>(a, b), z8);
  r.l[4] = fold(column<4>(a, b), z9);
  return carry(r);
}

/// The columns z[0..9] of a square reduced with 2^255 = 19 mod p.
TROUPE_R255_INLINE fe8 reduce_columns(const v8 lo[9], const v8 hi[10]) {
  // hi[k] holds high halves of weight 2^(51(k-1) + 52) = 2 * 2^(51k).
  v8 z[10];
  z[0] = lo[0];
#pragma GCC unroll 8
  for (int k = 1; k < 9; ++k) z[k] = _mm512_add_epi64(lo[k], _mm512_slli_epi64(hi[k], 1));
  z[9] = _mm512_slli_epi64(hi[9], 1);
  fe8 r;
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) r.l[k] = fold(z[k], z[k + 5]);
  return carry(r);
}

/// a^2: the 10 cross products once, doubled, then the 5 squares (15 of mul's 25 products).
TROUPE_R255_INLINE fe8 sq(const fe8& a) {
  const v8 zero = _mm512_setzero_si512();
  v8 lo[9], hi[10];
#pragma GCC unroll 9
  for (int k = 0; k < 9; ++k) lo[k] = zero;
#pragma GCC unroll 10
  for (int k = 0; k < 10; ++k) hi[k] = zero;
#pragma GCC unroll 5
  for (int i = 0; i < 5; ++i) {
#pragma GCC unroll 5
    for (int j = i + 1; j < 5; ++j) {
      lo[i + j] = _mm512_madd52lo_epu64(lo[i + j], a.l[i], a.l[j]);
      hi[i + j + 1] = _mm512_madd52hi_epu64(hi[i + j + 1], a.l[i], a.l[j]);
    }
  }
#pragma GCC unroll 9
  for (int k = 1; k < 9; ++k) lo[k] = _mm512_slli_epi64(lo[k], 1);
#pragma GCC unroll 10
  for (int k = 2; k < 10; ++k) hi[k] = _mm512_slli_epi64(hi[k], 1);
#pragma GCC unroll 5
  for (int i = 0; i < 5; ++i) {
    lo[2 * i] = _mm512_madd52lo_epu64(lo[2 * i], a.l[i], a.l[i]);
    hi[2 * i + 1] = _mm512_madd52hi_epu64(hi[2 * i + 1], a.l[i], a.l[i]);
  }
  return reduce_columns(lo, hi);
}

/// r = mask's lanes ? b : r.
TROUPE_R255_INLINE void cmov(fe8& r, const fe8& b, __mmask8 mask) {
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) r.l[k] = _mm512_mask_mov_epi64(r.l[k], mask, b.l[k]);
}

/// Lane i of the result = a[i] (a field element with limbs below 2^52).
TROUPE_R255_INLINE fe8 gather(const fe* const a[8]) {
  fe8 r;
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k)
    r.l[k] = _mm512_set_epi64(static_cast<long long>(a[7]->limb[k]), static_cast<long long>(a[6]->limb[k]),
                              static_cast<long long>(a[5]->limb[k]), static_cast<long long>(a[4]->limb[k]),
                              static_cast<long long>(a[3]->limb[k]), static_cast<long long>(a[2]->limb[k]),
                              static_cast<long long>(a[1]->limb[k]), static_cast<long long>(a[0]->limb[k]));
  return r;
}

/// out[i] = lane i of a, for the first n lanes.
TROUPE_R255_INLINE void scatter(const fe8& a, fe* const out[8], int n) {
  alignas(64) std::uint64_t lane[5][8];
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) _mm512_store_si512(lane[k], a.l[k]);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 5; ++k) out[i]->limb[k] = lane[k][i];
}

}  // namespace troupe::federated::r255::detail::x8
