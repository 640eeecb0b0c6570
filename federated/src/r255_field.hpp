#pragma once
// GF(2^255 - 19) in 5 limbs of 51 bits (private to the r255 sources). A "loose" element has
// limbs below 2^54; mul() and sq() take loose inputs and return limbs below 2^51 + 2^18; add()
// does not carry (two carried inputs give limbs below 2^52.1); sub() and neg() carry.

#include <cstddef>
#include <cstdint>

#include "troupe/federated/r255.hpp"

namespace troupe::federated::r255::detail {

using fe = field_element;
__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning
constexpr std::uint64_t mask51 = (std::uint64_t{1} << 51) - 1;

inline fe fe_zero() { return {{0, 0, 0, 0, 0}}; }
inline fe fe_one() { return {{1, 0, 0, 0, 0}}; }

[[gnu::always_inline]] inline fe carry(const fe& a) {
  fe r = a;
  std::uint64_t c;
  c = r.limb[0] >> 51; r.limb[0] &= mask51; r.limb[1] += c;
  c = r.limb[1] >> 51; r.limb[1] &= mask51; r.limb[2] += c;
  c = r.limb[2] >> 51; r.limb[2] &= mask51; r.limb[3] += c;
  c = r.limb[3] >> 51; r.limb[3] &= mask51; r.limb[4] += c;
  c = r.limb[4] >> 51; r.limb[4] &= mask51; r.limb[0] += c * 19;
  return r;
}

inline fe add(const fe& a, const fe& b) {
  return {{a.limb[0] + b.limb[0], a.limb[1] + b.limb[1], a.limb[2] + b.limb[2], a.limb[3] + b.limb[3],
           a.limb[4] + b.limb[4]}};
}

// a + 4p - b: no limb underflows while b's limbs are below 2^53 - 76.
[[gnu::always_inline]] inline fe sub(const fe& a, const fe& b) {
  constexpr std::uint64_t four_p0 = 0x1fffffffffffb4, four_pi = 0x1ffffffffffffc;
  return carry({{a.limb[0] + four_p0 - b.limb[0], a.limb[1] + four_pi - b.limb[1], a.limb[2] + four_pi - b.limb[2],
                 a.limb[3] + four_pi - b.limb[3], a.limb[4] + four_pi - b.limb[4]}});
}

inline fe neg(const fe& a) { return sub(fe_zero(), a); }

[[gnu::always_inline]] inline fe reduce_wide(u128 r0, u128 r1, u128 r2, u128 r3, u128 r4) {
  fe out;
  r1 += static_cast<std::uint64_t>(r0 >> 51);
  out.limb[0] = static_cast<std::uint64_t>(r0) & mask51;
  r2 += static_cast<std::uint64_t>(r1 >> 51);
  out.limb[1] = static_cast<std::uint64_t>(r1) & mask51;
  r3 += static_cast<std::uint64_t>(r2 >> 51);
  out.limb[2] = static_cast<std::uint64_t>(r2) & mask51;
  r4 += static_cast<std::uint64_t>(r3 >> 51);
  out.limb[3] = static_cast<std::uint64_t>(r3) & mask51;
  const auto c = static_cast<std::uint64_t>(r4 >> 51);
  out.limb[4] = static_cast<std::uint64_t>(r4) & mask51;
  const u128 t = static_cast<u128>(c) * 19 + out.limb[0];
  out.limb[0] = static_cast<std::uint64_t>(t) & mask51;
  out.limb[1] += static_cast<std::uint64_t>(t >> 51);
  return out;
}

[[gnu::always_inline]] inline fe mul(const fe& a, const fe& b) {
  const std::uint64_t a0 = a.limb[0], a1 = a.limb[1], a2 = a.limb[2], a3 = a.limb[3], a4 = a.limb[4];
  const std::uint64_t b0 = b.limb[0], b1 = b.limb[1], b2 = b.limb[2], b3 = b.limb[3], b4 = b.limb[4];
  const std::uint64_t b1_19 = b1 * 19, b2_19 = b2 * 19, b3_19 = b3 * 19, b4_19 = b4 * 19;
  const u128 r0 = (u128)a0 * b0 + (u128)a1 * b4_19 + (u128)a2 * b3_19 + (u128)a3 * b2_19 + (u128)a4 * b1_19;
  const u128 r1 = (u128)a0 * b1 + (u128)a1 * b0 + (u128)a2 * b4_19 + (u128)a3 * b3_19 + (u128)a4 * b2_19;
  const u128 r2 = (u128)a0 * b2 + (u128)a1 * b1 + (u128)a2 * b0 + (u128)a3 * b4_19 + (u128)a4 * b3_19;
  const u128 r3 = (u128)a0 * b3 + (u128)a1 * b2 + (u128)a2 * b1 + (u128)a3 * b0 + (u128)a4 * b4_19;
  const u128 r4 = (u128)a0 * b4 + (u128)a1 * b3 + (u128)a2 * b2 + (u128)a3 * b1 + (u128)a4 * b0;
  return reduce_wide(r0, r1, r2, r3, r4);
}

[[gnu::always_inline]] inline fe sq(const fe& a) {
  const std::uint64_t a0 = a.limb[0], a1 = a.limb[1], a2 = a.limb[2], a3 = a.limb[3], a4 = a.limb[4];
  const std::uint64_t d0 = 2 * a0, d1 = 2 * a1, a3_19 = 19 * a3, a3_38 = 38 * a3, a4_19 = 19 * a4, a4_38 = 38 * a4;
  const u128 r0 = (u128)a0 * a0 + (u128)a1 * a4_38 + (u128)a2 * a3_38;
  const u128 r1 = (u128)d0 * a1 + (u128)a2 * a4_38 + (u128)a3 * a3_19;
  const u128 r2 = (u128)d0 * a2 + (u128)a1 * a1 + (u128)a3 * a4_38;
  const u128 r3 = (u128)d0 * a3 + (u128)d1 * a2 + (u128)a4 * a4_19;
  const u128 r4 = (u128)d0 * a4 + (u128)d1 * a3 + (u128)a2 * a2;
  return reduce_wide(r0, r1, r2, r3, r4);
}

/// a squared n times (n >= 1).
inline fe sq_n(fe a, int n) {
  for (int i = 0; i < n; ++i) a = sq(a);
  return a;
}

/// r = flag ? b : r, for flag 0 or 1, without a branch.
inline void cmov(fe& r, const fe& b, std::uint64_t flag) {
  const std::uint64_t m = 0 - flag;
  for (int i = 0; i < 5; ++i) r.limb[i] ^= m & (r.limb[i] ^ b.limb[i]);
}

/// r = flag ? -r : r.
inline void cneg(fe& r, std::uint64_t flag) { cmov(r, neg(r), flag); }

/// The canonical little-endian bytes (the value fully reduced mod p).
bytes32 to_bytes(const fe& a);
/// The element of 32 little-endian bytes, the top bit ignored.
fe from_bytes(const bytes32& b);
/// 1 if the canonical value is odd (RFC 9496's IS_NEGATIVE), else 0.
std::uint64_t is_negative(const fe& a);
/// 1 if a = 0 mod p, else 0.
std::uint64_t is_zero(const fe& a);
/// 1 if a = b mod p, else 0.
std::uint64_t equal(const fe& a, const fe& b);
/// |a|: a or -a, whichever is even.
inline fe abs(const fe& a) {
  fe r = a;
  cneg(r, is_negative(a));
  return r;
}
/// 1/a (0 for 0).
fe invert(const fe& a);
/// a^((p-5)/8) = a^(2^252 - 3).
fe pow22523(const fe& a);
/// RFC 9496's SQRT_RATIO_M1(u, v): was_square (1 or 0) and the non-negative root of u/v, or of
/// sqrt(-1) * u/v when u/v is not a square.
std::uint64_t sqrt_ratio_m1(const fe& u, const fe& v, fe& root);
/// sqrt_ratio_m1 in two halves around its exponentiation, so that a batch can run the
/// exponentiations together (pow22523_each): prepare returns the power's argument u * v^7 and
/// sets v3 = v^3; finish takes pow22523 of that argument and returns what sqrt_ratio_m1 does.
fe sqrt_ratio_m1_prepare(const fe& u, const fe& v, fe& v3);
std::uint64_t sqrt_ratio_m1_finish(const fe& u, const fe& v, const fe& v3, const fe& pow, fe& root);
/// out[i] = pow22523(in[i]) for i < n (in and out may be the same array): eight at a time on
/// AVX-512 IFMA where the CPU has it (r255_ifma.cpp), else one by one.
void pow22523_each(const fe* in, fe* out, std::size_t n);
/// Whether this CPU runs AVX-512 IFMA (the eight-lane paths of r255_ifma.cpp) and TROUPE_SIMD
/// (avx512, avx2 or none, read once) does not rule it out.
bool ifma_available();
/// pow22523_each on AVX-512 IFMA: only where ifma_available().
void pow22523_ifma(const fe* in, fe* out, std::size_t n);
/// Replaces every a[i] by 1/a[i] (Montgomery's trick: one inversion); zeros stay zero.
void batch_invert(fe* a, std::size_t n);

// Curve and ristretto constants (RFC 9496 section 4.1), as 51-bit limbs.
inline constexpr fe fe_d{{0x34dca135978a3, 0x1a8283b156ebd, 0x5e7a26001c029, 0x739c663a03cbb, 0x52036cee2b6ff}};
inline constexpr fe fe_d2{{0x69b9426b2f159, 0x35050762add7a, 0x3cf44c0038052, 0x6738cc7407977, 0x2406d9dc56dff}};
inline constexpr fe fe_sqrt_m1{{0x61b274a0ea0b0, 0x0d5a5fc8f189d, 0x7ef5e9cbd0c60, 0x78595a6804c9e, 0x2b8324804fc1d}};
inline constexpr fe fe_sqrt_ad_minus_one{
    {0x7f6a0497b2e1b, 0x1836f0a97afd2, 0x7d747f6be7638, 0x456079e7e6498, 0x376931bf2b834}};
inline constexpr fe fe_invsqrt_a_minus_d{
    {0x0fdaa805d40ea, 0x2eb482e57d339, 0x007610274bc58, 0x6510b613dc8ff, 0x786c8905cfaff}};
inline constexpr fe fe_one_minus_d_sq{{0x409c1945fc176, 0x719abc6a1fc4f, 0x1c37f90b20684, 0x06bccca55eedf, 0x029072a8b2b3e}};
inline constexpr fe fe_d_minus_one_sq{{0x55aaa44ed4d20, 0x59603c3332635, 0x26d3baf4a7928, 0x120a66e6997a9, 0x5968b37af66c2}};

}  // namespace troupe::federated::r255::detail
