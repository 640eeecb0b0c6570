// s * P for eight points at once on AVX-512 IFMA: the same signed radix-16 windows, the same
// ref10 formulas and the same constant-time reads of the 1P..8P table as multiply_with_table
// (r255_mul.cpp), each 64-bit lane carrying one point. One scalar serves all eight lanes, so the
// lanes share the digits and every step; the table is read whole at every digit, as the
// one-point product reads it. multiply_each_portable is this path's reference
// (tests/federated/r255_test.cpp compares them on random points, and ristretto's batches with
// libsodium's bytes). Off x86-64 ifma_available() is false and the eight-lane entry points,
// never called there, throw.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string_view>

#include "r255_point.hpp"

#if !defined(__x86_64__)

namespace troupe::federated::r255::detail {

bool ifma_available() { return false; }

void pow22523_ifma(const fe*, fe*, std::size_t) {
  throw std::logic_error("r255: the AVX-512 IFMA path called on a CPU without it");
}

void multiply_each_ifma(const scalar&, std::span<const point>, std::span<point>) {
  throw std::logic_error("r255: the AVX-512 IFMA path called on a CPU without it");
}

}  // namespace troupe::federated::r255::detail

#else

#include <immintrin.h>

namespace troupe::federated::r255::detail {

bool ifma_available() {
  // TROUPE_SIMD=avx2 or none (as for the kernels) keeps the portable path, to compare the two on
  // one machine.
  static const bool ok = [] {
    const char* env = std::getenv("TROUPE_SIMD");
    if (env != nullptr && *env != '\0' && std::string_view(env) != "avx512") {
      if (std::string_view(env) != "avx2" && std::string_view(env) != "none")
        std::fprintf(stderr, "troupe: TROUPE_SIMD=%s is not one of avx512, avx2, none; using the CPU's vectors\n", env);
      else
        return false;
    }
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512ifma");
  }();
  return ok;
}

}  // namespace troupe::federated::r255::detail

// GCC 12 warns about the undefined source register inside _mm512_slli_epi64's own header (a
// false positive: the unmasked shift writes every lane).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "r255_fe8.hpp"

namespace troupe::federated::r255::detail {
namespace {

using namespace x8;

struct point8 { fe8 X, Y, Z, T; };
struct p1p1_8 { fe8 X, Y, Z, T; };
struct p2_8 { fe8 X, Y, Z; };
struct cached8 { fe8 YplusX, YminusX, Z, T2d; };

TROUPE_R255_INLINE point8 to_point(const p1p1_8& p) {
  return {mul(p.X, p.T), mul(p.Y, p.Z), mul(p.Z, p.T), mul(p.X, p.Y)};
}
TROUPE_R255_INLINE p2_8 to_p2(const p1p1_8& p) { return {mul(p.X, p.T), mul(p.Y, p.Z), mul(p.Z, p.T)}; }
TROUPE_R255_INLINE cached8 to_cached(const point8& p) {
  return {add_carry(p.Y, p.X), sub(p.Y, p.X), p.Z, mul(p.T, constant(fe_d2))};
}

TROUPE_R255_INLINE p1p1_8 dbl(const p2_8& p) {
  const fe8 xx = sq(p.X), yy = sq(p.Y), zz = sq(p.Z);
  const fe8 aa = sq(add_carry(p.X, p.Y));
  p1p1_8 r;
  r.Y = add_carry(yy, xx);
  r.Z = sub(yy, xx);
  r.X = sub(aa, r.Y);
  r.T = sub(add(zz, zz), r.Z);
  return r;
}

TROUPE_R255_INLINE p1p1_8 add(const point8& p, const cached8& q) {
  const fe8 a = mul(add_carry(p.Y, p.X), q.YplusX), b = mul(sub(p.Y, p.X), q.YminusX);
  const fe8 c = mul(q.T2d, p.T), zz = mul(p.Z, q.Z);
  const fe8 d = add(zz, zz);
  return {sub(a, b), add_carry(a, b), add_carry(d, c), sub(d, c)};
}

/// d * P in every lane from the lanes' tables of 1P..8P, for d in [-8, 8], reading every entry.
TROUPE_R255_INLINE cached8 select(const cached8 table[8], std::int8_t d) {
  const auto negative = static_cast<std::uint64_t>(static_cast<std::uint8_t>(d) >> 7);
  const std::uint64_t magnitude = static_cast<std::uint64_t>(d) ^ (0 - negative);
  const std::uint64_t abs_d = (magnitude + negative) & 0xff;
  const fe8 one = constant(fe_one()), zero = constant(fe_zero());
  cached8 t{one, one, one, zero};
  for (std::uint64_t j = 0; j < 8; ++j) {
    const auto m = static_cast<__mmask8>(0 - ct_eq(abs_d, j + 1));
    cmov(t.YplusX, table[j].YplusX, m);
    cmov(t.YminusX, table[j].YminusX, m);
    cmov(t.Z, table[j].Z, m);
    cmov(t.T2d, table[j].T2d, m);
  }
  const auto m = static_cast<__mmask8>(0 - negative);
  const cached8 minus{t.YminusX, t.YplusX, t.Z, neg(t.T2d)};
  cmov(t.YplusX, minus.YplusX, m);
  cmov(t.YminusX, minus.YminusX, m);
  cmov(t.T2d, minus.T2d, m);
  return t;
}

[[gnu::noinline]] TROUPE_R255_IFMA point8 multiply8(const std::int8_t digits[64], const point8& p) {
  cached8 table[8];
  table[0] = to_cached(p);
  point8 multiple = to_point(dbl(p2_8{p.X, p.Y, p.Z}));
  table[1] = to_cached(multiple);
  for (int j = 2; j < 8; ++j) {
    multiple = to_point(add(multiple, table[0]));
    table[j] = to_cached(multiple);
  }
  const fe8 one = constant(fe_one()), zero = constant(fe_zero());
  p1p1_8 r = add(point8{zero, one, one, zero}, select(table, digits[63]));
  for (int i = 62; i >= 0; --i) {
    r = dbl(to_p2(r));
    r = dbl(to_p2(r));
    r = dbl(to_p2(r));
    r = dbl(to_p2(r));
    r = add(to_point(r), select(table, digits[i]));
  }
  return to_point(r);
}

TROUPE_R255_INLINE fe8 sq_n(fe8 a, int n) {
  for (int i = 0; i < n; ++i) a = sq(a);
  return a;
}

/// z^(2^252 - 3), the chain of r255_field.cpp's pow22523.
[[gnu::noinline]] TROUPE_R255_IFMA fe8 pow22523_8(const fe8& z) {
  const fe8 z2 = sq(z);
  const fe8 z9 = mul(sq_n(z2, 2), z);
  const fe8 z11 = mul(z9, z2);
  const fe8 z_5_0 = mul(sq(z11), z9);
  const fe8 z_10_0 = mul(sq_n(z_5_0, 5), z_5_0);
  const fe8 z_20_0 = mul(sq_n(z_10_0, 10), z_10_0);
  const fe8 z_40_0 = mul(sq_n(z_20_0, 20), z_20_0);
  const fe8 z_50_0 = mul(sq_n(z_40_0, 10), z_10_0);
  const fe8 z_100_0 = mul(sq_n(z_50_0, 50), z_50_0);
  const fe8 z_200_0 = mul(sq_n(z_100_0, 100), z_100_0);
  const fe8 z_250_0 = mul(sq_n(z_200_0, 50), z_50_0);
  return mul(sq_n(z_250_0, 2), z);
}

}  // namespace

TROUPE_R255_IFMA void pow22523_ifma(const fe* in, fe* out, std::size_t n) {
  for (std::size_t base = 0; base < n; base += 8) {
    const int m = static_cast<int>(std::min<std::size_t>(8, n - base));
    const fe* from[8];
    fe* to[8];
    for (int i = 0; i < 8; ++i) {
      from[i] = &in[base + static_cast<std::size_t>(std::min(i, m - 1))];
      to[i] = &out[base + static_cast<std::size_t>(std::min(i, m - 1))];
    }
    scatter(pow22523_8(carry(gather(from))), to, m);
  }
}

TROUPE_R255_IFMA void multiply_each_ifma(const scalar& s, std::span<const point> p, std::span<point> out) {
  std::int8_t digits[64];
  radix16(s, digits);
  for (std::size_t base = 0; base < p.size(); base += 8) {
    // A short last group repeats its last point in the spare lanes.
    const int n = static_cast<int>(std::min<std::size_t>(8, p.size() - base));
    const fe* in[4][8];
    fe* to[4][8];
    for (int i = 0; i < 8; ++i) {
      const point& q = p[base + static_cast<std::size_t>(std::min(i, n - 1))];
      in[0][i] = &q.X, in[1][i] = &q.Y, in[2][i] = &q.Z, in[3][i] = &q.T;
      point& o = out[base + static_cast<std::size_t>(std::min(i, n - 1))];
      to[0][i] = &o.X, to[1][i] = &o.Y, to[2][i] = &o.Z, to[3][i] = &o.T;
    }
    // carry(): points from elsewhere may hold loose limbs (below 2^54); IFMA needs them below 2^52.
    const point8 q{carry(gather(in[0])), carry(gather(in[1])), carry(gather(in[2])), carry(gather(in[3]))};
    const point8 r = multiply8(digits, q);
    scatter(r.X, to[0], n);
    scatter(r.Y, to[1], n);
    scatter(r.Z, to[2], n);
    scatter(r.T, to[3], n);
  }
}

}  // namespace troupe::federated::r255::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // defined(__x86_64__)
