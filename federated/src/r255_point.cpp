// ristretto255's elements: the group law, RFC 9496's encoding, decoding and one-way map, and the
// batch encoding of doubled points.

#include <sodium.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "r255_point.hpp"

namespace troupe::federated::r255 {

using namespace detail;

point identity() { return {fe_zero(), fe_one(), fe_one(), fe_zero()}; }

point generator() {
  static constexpr fe x{{0x62d608f25d51a, 0x412a4b4f6592a, 0x75b7171a4b31d, 0x1ff60527118fe, 0x216936d3cd6e5}};
  static constexpr fe y{{0x6666666666658, 0x4cccccccccccc, 0x1999999999999, 0x3333333333333, 0x6666666666666}};
  static constexpr fe t{{0x68ab3a5b7dda3, 0x00eea2a5eadbb, 0x2af8df483c27e, 0x332b375274732, 0x67875f0fd78b7}};
  return {x, y, fe_one(), t};
}

point operator+(const point& p, const point& q) { return to_point(add_p1p1(p, to_cached(q))); }
point operator-(const point& p, const point& q) { return to_point(sub_p1p1(p, to_cached(q))); }
point operator-(const point& p) { return {neg(p.X), p.Y, p.Z, neg(p.T)}; }
point dbl(const point& p) { return to_point(dbl_p1p1(to_p2(p))); }

bool operator==(const point& p, const point& q) {
  return (equal(mul(p.X, q.Y), mul(p.Y, q.X)) | equal(mul(p.Y, q.Y), mul(p.X, q.X))) == 1;
}

bytes32 encode(const point& p) {
  const fe u1 = mul(add(p.Z, p.Y), sub(p.Z, p.Y));
  const fe u2 = mul(p.X, p.Y);
  fe invsqrt;
  (void)sqrt_ratio_m1(fe_one(), mul(u1, sq(u2)), invsqrt);
  const fe den1 = mul(invsqrt, u1), den2 = mul(invsqrt, u2);
  const fe z_inv = mul(mul(den1, den2), p.T);
  const fe ix0 = mul(p.X, fe_sqrt_m1), iy0 = mul(p.Y, fe_sqrt_m1);
  const fe enchanted_denominator = mul(den1, fe_invsqrt_a_minus_d);
  const std::uint64_t rotate = is_negative(mul(p.T, z_inv));
  fe x = p.X, y = p.Y, den_inv = den2;
  cmov(x, iy0, rotate);
  cmov(y, ix0, rotate);
  cmov(den_inv, enchanted_denominator, rotate);
  cneg(y, is_negative(mul(x, z_inv)));
  return to_bytes(abs(mul(den_inv, sub(p.Z, y))));
}

namespace {

// RFC 9496 section 4.3.1's decoding, in two halves around SQRT_RATIO_M1's exponentiation so that
// a batch runs its exponentiations together (pow22523_each).
struct decode_state {
  fe s, u1, u2, v, v3, v_u2_sqr;
  bool canonical;
};

fe decode_prepare(const bytes32& bytes, decode_state& d) {
  d.s = from_bytes(bytes);
  // Canonical: the bytes are the reduced value's (this also refuses a set top bit), and s >= 0.
  const bytes32 again = to_bytes(d.s);
  std::uint8_t diff = 0;
  for (int i = 0; i < 32; ++i) diff |= again[i] ^ bytes[i];
  d.canonical = diff == 0 && is_negative(d.s) == 0;
  const fe ss = sq(d.s);
  d.u1 = sub(fe_one(), ss);
  d.u2 = add(fe_one(), ss);
  const fe u2_sqr = sq(d.u2);
  d.v = sub(neg(mul(fe_d, sq(d.u1))), u2_sqr);
  d.v_u2_sqr = mul(d.v, u2_sqr);
  return sqrt_ratio_m1_prepare(fe_one(), d.v_u2_sqr, d.v3);
}

bool decode_finish(const decode_state& d, const fe& pow, point& out) {
  if (!d.canonical) return false;
  fe invsqrt;
  const std::uint64_t was_square = sqrt_ratio_m1_finish(fe_one(), d.v_u2_sqr, d.v3, pow, invsqrt);
  const fe den_x = mul(invsqrt, d.u2);
  const fe den_y = mul(mul(invsqrt, den_x), d.v);
  const fe x = abs(mul(add(d.s, d.s), den_x));
  const fe y = mul(d.u1, den_y);
  const fe t = mul(x, y);
  if (!was_square || is_negative(t) || is_zero(y)) return false;
  out = {x, y, fe_one(), t};
  return true;
}

// RFC 9496 section 4.3.4's MAP, in the same two halves.
struct map_state {
  fe t, r, u, v, v3;
};

fe map_prepare(const fe& t, map_state& m) {
  const fe one = fe_one();
  m.t = t;
  m.r = mul(fe_sqrt_m1, sq(t));
  m.u = mul(add(m.r, one), fe_one_minus_d_sq);
  m.v = mul(sub(neg(one), mul(m.r, fe_d)), add(m.r, fe_d));
  return sqrt_ratio_m1_prepare(m.u, m.v, m.v3);
}

point map_finish(const map_state& m, const fe& pow) {
  const fe one = fe_one();
  fe s;
  const std::uint64_t was_square = sqrt_ratio_m1_finish(m.u, m.v, m.v3, pow, s);
  const fe s_prime = neg(abs(mul(s, m.t)));
  cmov(s, s_prime, was_square ^ 1);
  fe c = neg(one);
  cmov(c, m.r, was_square ^ 1);
  const fe n = sub(mul(mul(c, sub(m.r, one)), fe_d_minus_one_sq), m.v);
  const fe w0 = mul(add(s, s), m.v);
  const fe w1 = mul(n, fe_sqrt_ad_minus_one);
  const fe ss = sq(s);
  const fe w2 = sub(one, ss), w3 = add(one, ss);
  return {mul(w0, w3), mul(w2, w1), mul(w1, w3), mul(w0, w2)};
}

point map(const fe& t) {
  map_state m;
  const fe w = map_prepare(t, m);
  return map_finish(m, pow22523(w));
}

/// The batches below go in chunks of this many elements (their states stay in the caches).
constexpr std::size_t chunk = 128;

}  // namespace

bool decode(const bytes32& bytes, point& out) {
  decode_state d;
  const fe w = decode_prepare(bytes, d);
  return decode_finish(d, pow22523(w), out);
}

void decode_each(std::span<const bytes32> in, std::span<point> out, std::span<std::uint8_t> ok) {
  if (out.size() != in.size() || ok.size() != in.size())
    throw std::invalid_argument("r255::decode_each: " + std::to_string(in.size()) + " encodings for " +
                                std::to_string(out.size()) + " points and " + std::to_string(ok.size()) + " results");
  std::vector<decode_state> st(std::min(chunk, in.size()));
  std::vector<fe> w(st.size());
  for (std::size_t base = 0; base < in.size(); base += chunk) {
    const std::size_t n = std::min(chunk, in.size() - base);
    for (std::size_t i = 0; i < n; ++i) w[i] = decode_prepare(in[base + i], st[i]);
    pow22523_each(w.data(), w.data(), n);
    for (std::size_t i = 0; i < n; ++i) ok[base + i] = decode_finish(st[i], w[i], out[base + i]) ? 1 : 0;
  }
}

point from_uniform_bytes(const bytes64& bytes) {
  bytes32 lo, hi;
  for (int i = 0; i < 32; ++i) {
    lo[i] = bytes[i];
    hi[i] = bytes[32 + i];
  }
  const point p = map(from_bytes(lo)) + map(from_bytes(hi));
  sodium_memzero(lo.data(), lo.size());
  sodium_memzero(hi.data(), hi.size());
  return p;
}

void from_uniform_bytes_each(std::span<const bytes64> in, std::span<point> out) {
  if (out.size() != in.size())
    throw std::invalid_argument("r255::from_uniform_bytes_each: " + std::to_string(in.size()) + " inputs for " +
                                std::to_string(out.size()) + " points");
  // The inputs may be secret (hashed identifiers): the copies of their halves, and every value
  // the map derives from them here, are wiped before their buffers are freed.
  std::vector<map_state> st(2 * std::min(chunk, in.size()));
  std::vector<fe> w(st.size());
  for (std::size_t base = 0; base < in.size(); base += chunk) {
    const std::size_t n = std::min(chunk, in.size() - base);
    for (std::size_t i = 0; i < n; ++i) {
      bytes32 lo, hi;
      for (int b = 0; b < 32; ++b) {
        lo[b] = in[base + i][b];
        hi[b] = in[base + i][32 + b];
      }
      w[2 * i] = map_prepare(from_bytes(lo), st[2 * i]);
      w[2 * i + 1] = map_prepare(from_bytes(hi), st[2 * i + 1]);
      sodium_memzero(lo.data(), lo.size());
      sodium_memzero(hi.data(), hi.size());
    }
    pow22523_each(w.data(), w.data(), 2 * n);
    for (std::size_t i = 0; i < n; ++i) out[base + i] = map_finish(st[2 * i], w[2 * i]) + map_finish(st[2 * i + 1], w[2 * i + 1]);
  }
  sodium_memzero(st.data(), st.size() * sizeof(map_state));
  sodium_memzero(w.data(), w.size() * sizeof(fe));
}

void double_and_encode(std::span<const point> points, std::span<bytes32> out) {
  // The encoding of 2P needs no square root: with P = (X:Y:Z:T), 2P's encoding is a rational
  // function of e = 2XY, f = Z^2 + dT^2, g = Y^2 + X^2, h = Z^2 - dT^2, whose one inversion
  // (of e*f*g*h) all the points share (Montgomery's trick).
  if (out.size() != points.size())
    throw std::invalid_argument("r255::double_and_encode: " + std::to_string(points.size()) + " points for " +
                                std::to_string(out.size()) + " encodings");
  struct state { fe e, f, g, h, eg, fh; };
  const std::size_t n = points.size();
  std::vector<state> st(n);
  std::vector<fe> inv(n);
  for (std::size_t i = 0; i < n; ++i) {
    const point& p = points[i];
    const fe xx = sq(p.X), yy = sq(p.Y), zz = sq(p.Z), dtt = mul(sq(p.T), fe_d);
    state& s = st[i];
    s.e = mul(p.X, add(p.Y, p.Y));
    s.f = carry(add(zz, dtt));
    s.g = carry(add(yy, xx));
    s.h = sub(zz, dtt);
    s.eg = mul(s.e, s.g);
    s.fh = mul(s.f, s.h);
    inv[i] = mul(s.eg, s.fh);
  }
  batch_invert(inv.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const state& s = st[i];
    const fe z_inv = mul(s.eg, inv[i]), t_inv = mul(s.fh, inv[i]);
    const std::uint64_t negcheck1 = is_negative(mul(s.eg, z_inv));
    fe e = s.e, g = s.g, h = s.h, magic = fe_invsqrt_a_minus_d;
    const fe minus_e = neg(s.e), f_sqrt_a = mul(s.f, fe_sqrt_m1);
    cmov(e, s.g, negcheck1);
    cmov(g, minus_e, negcheck1);
    cmov(h, f_sqrt_a, negcheck1);
    cmov(magic, fe_sqrt_m1, negcheck1);
    const std::uint64_t negcheck2 = is_negative(mul(mul(h, e), z_inv));
    cneg(g, negcheck2);
    out[i] = to_bytes(abs(mul(sub(h, g), mul(magic, mul(g, t_inv)))));
  }
}

}  // namespace troupe::federated::r255
