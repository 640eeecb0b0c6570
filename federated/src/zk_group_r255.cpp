#include "zk_group_r255.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "r255_point.hpp"
#include "zk_random.hpp"

namespace troupe::federated::zk {
namespace {

using namespace r255::detail;

/// A point every proof multiplies (B, H): its odd multiples for a width-8 NAF inside Straus's
/// method, and the radix-16 comb of r255::base_mul for a product of its own.
struct fixed_base {
  r255::point P;
  affine odd[64];       ///< (2k + 1) P
  affine comb[32][8];   ///< (j + 1) 256^i P
  explicit fixed_base(const r255::point& p) : P(p) {
    std::vector<r255::point> pts;
    const r255::point p2 = r255::dbl(p);
    r255::point m = p;
    for (int k = 0; k < 64; ++k) {
      pts.push_back(m);
      m = m + p2;
    }
    r255::point row = p;
    for (int i = 0; i < 32; ++i) {
      r255::point e = row;
      for (int j = 0; j < 8; ++j) {
        pts.push_back(e);
        e = e + row;
      }
      for (int k = 0; k < 8; ++k) row = r255::dbl(row);
    }
    std::vector<fe> zinv(pts.size());
    for (std::size_t i = 0; i < pts.size(); ++i) zinv[i] = pts[i].Z;
    batch_invert(zinv.data(), zinv.size());
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const fe x = mul(pts[i].X, zinv[i]), y = mul(pts[i].Y, zinv[i]);
      const affine a{carry(add(y, x)), sub(y, x), mul(mul(x, y), fe_d2)};
      if (i < 64)
        odd[i] = a;
      else
        comb[(i - 64) / 8][(i - 64) % 8] = a;
    }
  }
  /// Whether q is this point in the same coordinates (the generators are copies of one value).
  bool is(const r255::point& q) const { return std::memcmp(&P, &q, sizeof P) == 0; }
};

r255::point hash_point(std::string_view domain, std::span<const std::uint8_t> message) {
  if (domain.size() > 255) throw std::invalid_argument("ristretto255 hash: the domain is longer than 255 bytes");
  crypto_hash_sha512_state st;
  crypto_hash_sha512_init(&st);
  const auto length = static_cast<unsigned char>(domain.size());
  crypto_hash_sha512_update(&st, &length, 1);
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(domain.data()), domain.size());
  crypto_hash_sha512_update(&st, message.data(), message.size());
  r255::bytes64 digest;
  crypto_hash_sha512_final(&st, digest.data());
  return r255::from_uniform_bytes(digest);
}

const fixed_base& base_B() {
  static const fixed_base t(r255::base_mul(r255::scalar_from_u64(1)));
  return t;
}

/// H as generators<G> makes it (zk_bulletproofs.hpp): hash_to_point("troupe.zk.H", {}).
const fixed_base& base_H() {
  static const fixed_base t(hash_point("troupe.zk.H", {}));
  return t;
}

p1p1 add_digit(const r255::point& acc, const affine* odd, int d) {
  return d > 0 ? add_p1p1(acc, odd[d / 2]) : sub_p1p1(acc, odd[-d / 2]);
}

/// s P from the comb (radix-16 digits, 64 additions and 4 doublings), variable time.
r255::point comb_mul(const r255::scalar& s, const fixed_base& t) {
  std::int8_t d[64];
  radix16(s, d);
  r255::point h = r255::identity();
  for (int i = 1; i < 64; i += 2)
    if (d[i] != 0) h = to_point(d[i] > 0 ? add_p1p1(h, t.comb[i / 2][d[i] - 1]) : sub_p1p1(h, t.comb[i / 2][-d[i] - 1]));
  p1p1 r = dbl_p1p1(to_p2(h));
  r = dbl_p1p1(to_p2(r));
  r = dbl_p1p1(to_p2(r));
  r = dbl_p1p1(to_p2(r));
  h = to_point(r);
  for (int i = 0; i < 64; i += 2)
    if (d[i] != 0) h = to_point(d[i] > 0 ? add_p1p1(h, t.comb[i / 2][d[i] - 1]) : sub_p1p1(h, t.comb[i / 2][-d[i] - 1]));
  return h;
}

/// The width-5 odd multiples of P: (2k + 1) P for k < 8.
void odd_multiples(const r255::point& P, cached odd[8]) {
  odd[0] = to_cached(P);
  const cached twice = to_cached(r255::dbl(P));
  r255::point m = P;
  for (int k = 1; k < 8; ++k) {
    m = to_point(add_p1p1(m, twice));
    odd[k] = to_cached(m);
  }
}

/// Σ s_i P_i for a few points: the fixed bases by their tables, the others by Straus's method
/// (width-5 NAFs, one chain of doublings as long as the longest scalar needs).
r255::point straus(std::span<const r255::scalar> s, std::span<const r255_group::point> p) {
  const fixed_base& tb = base_B();
  const fixed_base& th = base_H();
  r255::scalar at_B{}, at_H{};
  bool use_B = false, use_H = false;
  struct term {
    std::int8_t naf[256];
    cached odd[8];
    int top;
  };
  std::vector<term> terms;
  terms.reserve(p.size());
  int top = -1;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (r255_group::is_zero(s[i])) continue;
    if (tb.is(p[i].p)) {
      at_B = at_B + s[i];
      use_B = true;
      continue;
    }
    if (th.is(p[i].p)) {
      at_H = at_H + s[i];
      use_H = true;
      continue;
    }
    term& t = terms.emplace_back();
    naf(s[i], 5, t.naf);
    t.top = 255;
    while (t.top >= 0 && t.naf[t.top] == 0) --t.top;
    odd_multiples(p[i].p, t.odd);
    top = std::max(top, t.top);
  }
  // The fixed bases join the chain when it is long anyway (about 28 additions each against the
  // comb's 68); with short scalars only (x_i C_i) or none, the comb is cheaper.
  std::int8_t naf_B[256], naf_H[256];
  const bool chain_B = use_B && top >= 200, chain_H = use_H && top >= 200;
  if (chain_B) naf(at_B, 8, naf_B);
  if (chain_H) naf(at_H, 8, naf_H);
  if (chain_B || chain_H) top = 255;
  r255::point acc = r255::identity();
  if (top >= 0) {
    p1p1 r{fe_zero(), fe_one(), fe_one(), fe_one()};  // the identity, completed
    for (int i = top; i >= 0; --i) {
      r = dbl_p1p1(to_p2(r));
      for (const term& t : terms) {
        const int d = t.naf[i];
        if (d > 0)
          r = add_p1p1(to_point(r), t.odd[d / 2]);
        else if (d < 0)
          r = sub_p1p1(to_point(r), t.odd[-d / 2]);
      }
      if (chain_B && naf_B[i] != 0) r = add_digit(to_point(r), tb.odd, naf_B[i]);
      if (chain_H && naf_H[i] != 0) r = add_digit(to_point(r), th.odd, naf_H[i]);
    }
    acc = to_point(r);
  }
  if (use_B && !chain_B) acc = acc + comb_mul(at_B, tb);
  if (use_H && !chain_H) acc = acc + comb_mul(at_H, th);
  return acc;
}

}  // namespace

void r255_group::msm_columns(std::span<const scalar> s, std::span<const point> p, std::size_t stride,
                             std::span<point> out) {
  const std::size_t m = s.size();
  if (out.size() > stride || (m > 0 && (m - 1) * stride + out.size() > p.size()))
    throw std::invalid_argument("msm_columns: the points do not hold the columns asked for");
  // The scalars' NAFs once for all the sums.
  std::vector<std::int8_t> digits(256 * m);
  int top = -1;
  for (std::size_t j = 0; j < m; ++j) {
    naf(s[j], 5, &digits[256 * j]);
    for (int i = 255; i > top; --i)
      if (digits[256 * j + i] != 0) top = i;
  }
  std::vector<cached> odd(8 * m);
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t j = 0; j < m; ++j) odd_multiples(p[i + j * stride].p, &odd[8 * j]);
    p1p1 r{fe_zero(), fe_one(), fe_one(), fe_one()};  // the identity, completed
    for (int b = top; b >= 0; --b) {
      r = dbl_p1p1(to_p2(r));
      for (std::size_t j = 0; j < m; ++j) {
        const int d = digits[256 * j + b];
        if (d > 0)
          r = add_p1p1(to_point(r), odd[8 * j + d / 2]);
        else if (d < 0)
          r = sub_p1p1(to_point(r), odd[8 * j - d / 2]);
      }
    }
    out[i] = {top < 0 ? r255::identity() : to_point(r)};
  }
}

r255_group::scalar r255_group::from_i64(std::int64_t v) {
  if (v >= 0) return from_u64(static_cast<std::uint64_t>(v));
  return neg(from_u64(static_cast<std::uint64_t>(-(v + 1)) + 1));  // -INT64_MIN without overflow
}

r255_group::scalar r255_group::from_uniform(std::span<const std::uint8_t, 64> wide) {
  r255::bytes64 b;
  std::memcpy(b.data(), wide.data(), 64);
  return r255::scalar_reduce(b);
}

r255_group::scalar r255_group::random() {
  std::array<std::uint8_t, 64> wide;
  if (draw_test_randomness(wide)) {
    for (;;) {
      const scalar s = from_uniform(wide);
      if (!is_zero(s)) return s;
      (void)draw_test_randomness(wide);
    }
  }
  return r255::random_scalar();
}

r255_group::scalar r255_group::invert(const scalar& a) {
  if (is_zero(a)) throw std::invalid_argument("ristretto255: zero has no inverse");
  return r255::invert(a);
}

bool r255_group::decode_scalar(const bytes32& b, scalar& out) {
  bool ok = false;
  const scalar s = r255::scalar_from_canonical(b, ok);
  if (ok) out = s;
  return ok;
}

r255_group::point r255_group::msm(std::span<const scalar> s, std::span<const point> p) {
  if (s.size() != p.size()) throw std::invalid_argument("msm: as many scalars as points are needed");
  if (p.size() <= straus_limit) return {straus(s, p)};
  // Scalars 0 and ±1 (a range proof's bits) are skipped or summed; the rest go to Pippenger's.
  static const scalar plus_one = one(), minus_one = neg(one());
  r255::point sum = r255::identity();
  std::vector<r255::scalar> rest_s;
  std::vector<r255::point> rest_p;
  rest_s.reserve(p.size());
  rest_p.reserve(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (is_zero(s[i])) continue;
    if (s[i] == plus_one)
      sum = sum + p[i].p;
    else if (s[i] == minus_one)
      sum = sum - p[i].p;
    else {
      rest_s.push_back(s[i]);
      rest_p.push_back(p[i].p);
    }
  }
  if (rest_p.empty()) return {sum};
  return {sum + r255::msm(rest_s, rest_p)};
}

bytes32 r255_group::encode(const point& p) { return p.has_enc ? p.enc : r255::encode(p.p); }

bool r255_group::decode_point(const bytes32& b, point& out) {
  r255::point q;
  if (!r255::decode(b, q)) return false;
  out.p = q;
  out.enc = b;
  out.has_enc = true;
  return true;
}

r255_group::point r255_group::hash_to_point(std::string_view domain, std::span<const std::uint8_t> message) {
  return {hash_point(domain, message)};
}

}  // namespace troupe::federated::zk
