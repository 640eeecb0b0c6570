#pragma once
// Edwards-curve formulas for ristretto255's points (a = -1), private to the r255 sources, in the
// forms of Bernstein et al.'s ref10: completed points (p1p1) from every addition and doubling,
// projective (p2) for doubling chains, extended (point) for additions, and the "cached" and
// "affine" forms of an addend.

#include "r255_field.hpp"

namespace troupe::federated::r255::detail {

struct p1p1 { fe X, Y, Z, T; };        // (X/Z, Y/T)
struct p2 { fe X, Y, Z; };             // (X/Z, Y/Z)
struct cached { fe YplusX, YminusX, Z, T2d; };
struct affine { fe yplusx, yminusx, xy2d; };  // Z = 1

inline point to_point(const p1p1& p) { return {mul(p.X, p.T), mul(p.Y, p.Z), mul(p.Z, p.T), mul(p.X, p.Y)}; }
inline p2 to_p2(const p1p1& p) { return {mul(p.X, p.T), mul(p.Y, p.Z), mul(p.Z, p.T)}; }
inline p2 to_p2(const point& p) { return {p.X, p.Y, p.Z}; }
inline cached to_cached(const point& p) { return {add(p.Y, p.X), sub(p.Y, p.X), p.Z, mul(p.T, fe_d2)}; }

inline cached cached_identity() { return {fe_one(), fe_one(), fe_one(), fe_zero()}; }
inline affine affine_identity() { return {fe_one(), fe_one(), fe_zero()}; }

inline p1p1 dbl_p1p1(const p2& p) {
  const fe xx = sq(p.X), yy = sq(p.Y), b = add(sq(p.Z), sq(p.Z));
  const fe aa = sq(add(p.X, p.Y));
  p1p1 r;
  r.Y = add(yy, xx);
  r.Z = sub(yy, xx);
  r.X = sub(aa, r.Y);
  r.T = sub(b, r.Z);
  return r;
}

inline p1p1 add_p1p1(const point& p, const cached& q) {
  const fe a = mul(add(p.Y, p.X), q.YplusX), b = mul(sub(p.Y, p.X), q.YminusX);
  const fe c = mul(q.T2d, p.T), zz = mul(p.Z, q.Z);
  const fe d = add(zz, zz);
  return {sub(a, b), add(a, b), add(d, c), sub(d, c)};
}

inline p1p1 sub_p1p1(const point& p, const cached& q) {
  const fe a = mul(add(p.Y, p.X), q.YminusX), b = mul(sub(p.Y, p.X), q.YplusX);
  const fe c = mul(q.T2d, p.T), zz = mul(p.Z, q.Z);
  const fe d = add(zz, zz);
  return {sub(a, b), add(a, b), sub(d, c), add(d, c)};
}

inline p1p1 add_p1p1(const point& p, const affine& q) {
  const fe a = mul(add(p.Y, p.X), q.yplusx), b = mul(sub(p.Y, p.X), q.yminusx);
  const fe c = mul(q.xy2d, p.T), d = add(p.Z, p.Z);
  return {sub(a, b), add(a, b), add(d, c), sub(d, c)};
}

inline p1p1 sub_p1p1(const point& p, const affine& q) {
  const fe a = mul(add(p.Y, p.X), q.yminusx), b = mul(sub(p.Y, p.X), q.yplusx);
  const fe c = mul(q.xy2d, p.T), d = add(p.Z, p.Z);
  return {sub(a, b), add(a, b), sub(d, c), add(d, c)};
}

inline void cmov(cached& r, const cached& q, std::uint64_t flag) {
  cmov(r.YplusX, q.YplusX, flag);
  cmov(r.YminusX, q.YminusX, flag);
  cmov(r.Z, q.Z, flag);
  cmov(r.T2d, q.T2d, flag);
}

inline void cmov(affine& r, const affine& q, std::uint64_t flag) {
  cmov(r.yplusx, q.yplusx, flag);
  cmov(r.yminusx, q.yminusx, flag);
  cmov(r.xy2d, q.xy2d, flag);
}

/// 1 if a == b, for small non-negative values, without a branch.
inline std::uint64_t ct_eq(std::uint64_t a, std::uint64_t b) { return ((a ^ b) - 1) >> 63; }

/// The 64 signed radix-16 digits of s (each in [-8, 8]), computed without a branch.
void radix16(const scalar& s, std::int8_t digits[64]);
/// The width-w non-adjacent form of s: 256 digits, each zero or odd in (-2^(w-1), 2^(w-1)).
void naf(const scalar& s, int w, std::int8_t digits[256]);

/// msm() with the window width c (2 <= c <= 16) given: the tests try every width.
point msm_with_window(std::span<const scalar> s, std::span<const point> p, int c);

/// table[d - 1] = d * p for d = 1..8, in the cached form.
void multiples_table(const point& p, cached table[8]);
/// The constant-time multiplication over a table made by multiples_table.
point multiply_with_table(const std::int8_t digits[64], const cached table[8]);

/// multiply_each() one point at a time (multiply_with_table): the reference of the IFMA path.
void multiply_each_portable(const scalar& s, std::span<const point> p, std::span<point> out);
/// multiply_each() eight points at a time on AVX-512 IFMA: only where ifma_available().
void multiply_each_ifma(const scalar& s, std::span<const point> p, std::span<point> out);

}  // namespace troupe::federated::r255::detail
