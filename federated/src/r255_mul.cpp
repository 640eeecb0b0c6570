// ristretto255's scalar multiplications: the constant-time windowed product, the generator's
// product from a precomputed table, and the verifier's variable-time double product.

#include <stdexcept>
#include <string>
#include <vector>

#include "r255_point.hpp"

namespace troupe::federated::r255 {

using namespace detail;

namespace detail {

void radix16(const scalar& s, std::int8_t digits[64]) {
  const bytes32 b = to_bytes(s);
  for (int i = 0; i < 32; ++i) {
    digits[2 * i] = static_cast<std::int8_t>(b[i] & 15);
    digits[2 * i + 1] = static_cast<std::int8_t>(b[i] >> 4);
  }
  // Digits in [0, 15] become [-8, 7] with a carry into the next one; s < 2^253 keeps the last
  // digit at most 2.
  std::int8_t carry = 0;
  for (int i = 0; i < 63; ++i) {
    digits[i] = static_cast<std::int8_t>(digits[i] + carry);
    carry = static_cast<std::int8_t>((digits[i] + 8) >> 4);
    digits[i] = static_cast<std::int8_t>(digits[i] - (carry << 4));
  }
  digits[63] = static_cast<std::int8_t>(digits[63] + carry);
}

void naf(const scalar& s, int w, std::int8_t digits[256]) {
  const bytes32 b = to_bytes(s);
  std::uint64_t k[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 32; ++i) k[i / 8] |= static_cast<std::uint64_t>(b[i]) << (8 * (i % 8));
  const std::int64_t width = std::int64_t{1} << w, half = width / 2;
  for (int i = 0; i < 256; ++i) {
    std::int64_t d = 0;
    if (k[0] & 1) {
      d = static_cast<std::int64_t>(k[0] & static_cast<std::uint64_t>(width - 1));
      if (d >= half) d -= width;
      // k -= d (d odd, |d| < 2^(w-1)); k stays below 2^254.
      if (d > 0) {
        std::uint64_t borrow = static_cast<std::uint64_t>(d);
        for (auto& word : k) {
          const std::uint64_t before = word;
          word -= borrow;
          borrow = word > before ? 1 : 0;
        }
      } else {
        std::uint64_t c = static_cast<std::uint64_t>(-d);
        for (auto& word : k) {
          word += c;
          c = word < c ? 1 : 0;
        }
      }
    }
    digits[i] = static_cast<std::int8_t>(d);
    for (int j = 0; j < 4; ++j) k[j] = (k[j] >> 1) | (k[j + 1] << 63);
    k[4] >>= 1;
  }
}

void multiples_table(const point& p, cached table[8]) {
  table[0] = to_cached(p);
  point multiple = dbl(p);
  table[1] = to_cached(multiple);
  for (int j = 2; j < 8; ++j) {
    multiple = to_point(add_p1p1(multiple, table[0]));
    table[j] = to_cached(multiple);
  }
}

namespace {

/// d * P from its table of 1P..8P, for d in [-8, 8], reading every entry.
cached select(const cached table[8], std::int8_t d) {
  const auto negative = static_cast<std::uint64_t>(static_cast<std::uint8_t>(d) >> 7);
  const std::uint64_t magnitude = static_cast<std::uint64_t>(d) ^ (0 - negative);
  const std::uint64_t abs_d = (magnitude + negative) & 0xff;
  cached t = cached_identity();
  for (std::uint64_t j = 0; j < 8; ++j) cmov(t, table[j], ct_eq(abs_d, j + 1));
  const cached minus{t.YminusX, t.YplusX, t.Z, neg(t.T2d)};
  cmov(t, minus, negative);
  return t;
}

affine select(const affine table[8], std::int8_t d) {
  const auto negative = static_cast<std::uint64_t>(static_cast<std::uint8_t>(d) >> 7);
  const std::uint64_t magnitude = static_cast<std::uint64_t>(d) ^ (0 - negative);
  const std::uint64_t abs_d = (magnitude + negative) & 0xff;
  affine t = affine_identity();
  for (std::uint64_t j = 0; j < 8; ++j) cmov(t, table[j], ct_eq(abs_d, j + 1));
  const affine minus{t.yminusx, t.yplusx, neg(t.xy2d)};
  cmov(t, minus, negative);
  return t;
}

/// Affine forms of the points (one shared inversion).
std::vector<affine> to_affine(const std::vector<point>& pts) {
  std::vector<fe> zinv(pts.size());
  for (std::size_t i = 0; i < pts.size(); ++i) zinv[i] = pts[i].Z;
  batch_invert(zinv.data(), zinv.size());
  std::vector<affine> out(pts.size());
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const fe x = mul(pts[i].X, zinv[i]), y = mul(pts[i].Y, zinv[i]);
    out[i] = {carry(add(y, x)), sub(y, x), mul(mul(x, y), fe_d2)};
  }
  return out;
}

/// base[i][j] = (j + 1) * 256^i * B, for the 64 radix-16 digits of base_mul.
struct base_table {
  affine entry[32][8];
  base_table() {
    std::vector<point> pts;
    point row = generator();
    for (int i = 0; i < 32; ++i) {
      point m = row;
      for (int j = 0; j < 8; ++j) {
        pts.push_back(m);
        m = m + row;
      }
      for (int k = 0; k < 8; ++k) row = dbl(row);
    }
    const auto aff = to_affine(pts);
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 8; ++j) entry[i][j] = aff[8 * i + j];
  }
};

const base_table& base() {
  static const base_table table;
  return table;
}

/// odd[k] = (2k + 1) * B for k < 64, for the width-8 NAF of vartime_double_mul.
const std::vector<affine>& base_odd_multiples() {
  static const std::vector<affine> table = [] {
    std::vector<point> pts;
    const point b = generator(), b2 = dbl(b);
    point m = b;
    for (int k = 0; k < 64; ++k) {
      pts.push_back(m);
      m = m + b2;
    }
    return to_affine(pts);
  }();
  return table;
}

}  // namespace

point multiply_with_table(const std::int8_t digits[64], const cached table[8]) {
  p1p1 r = add_p1p1(identity(), select(table, digits[63]));
  for (int i = 62; i >= 0; --i) {
    r = dbl_p1p1(to_p2(r));
    r = dbl_p1p1(to_p2(r));
    r = dbl_p1p1(to_p2(r));
    r = dbl_p1p1(to_p2(r));
    r = add_p1p1(to_point(r), select(table, digits[i]));
  }
  return to_point(r);
}

}  // namespace detail

point operator*(const scalar& s, const point& p) {
  std::int8_t digits[64];
  radix16(s, digits);
  cached table[8];
  multiples_table(p, table);
  return multiply_with_table(digits, table);
}

void multiply_each(const scalar& s, std::span<const point> p, std::span<point> out) {
  if (out.size() != p.size())
    throw std::invalid_argument("r255::multiply_each: " + std::to_string(p.size()) + " points for " +
                                std::to_string(out.size()) + " products");
  if (ifma_available()) multiply_each_ifma(s, p, out);
  else multiply_each_portable(s, p, out);
}

void detail::multiply_each_portable(const scalar& s, std::span<const point> p, std::span<point> out) {
  std::int8_t digits[64];
  radix16(s, digits);
  cached table[8];
  for (std::size_t i = 0; i < p.size(); ++i) {
    multiples_table(p[i], table);
    out[i] = multiply_with_table(digits, table);
  }
}

point base_mul(const scalar& s) {
  std::int8_t digits[64];
  radix16(s, digits);
  const base_table& t = base();
  // Odd digits first, shifted by 16 with four doublings, then the even ones.
  point h = identity();
  for (int i = 1; i < 64; i += 2) h = to_point(add_p1p1(h, select(t.entry[i / 2], digits[i])));
  p1p1 r = dbl_p1p1(to_p2(h));
  r = dbl_p1p1(to_p2(r));
  r = dbl_p1p1(to_p2(r));
  r = dbl_p1p1(to_p2(r));
  h = to_point(r);
  for (int i = 0; i < 64; i += 2) h = to_point(add_p1p1(h, select(t.entry[i / 2], digits[i])));
  return h;
}

point vartime_double_mul(const scalar& a, const point& A, const scalar& b) {
  std::int8_t da[256], db[256];
  naf(a, 5, da);
  naf(b, 8, db);
  cached odd_a[8];  // (2k + 1) * A
  odd_a[0] = to_cached(A);
  const point a2 = dbl(A);
  point m = A;
  for (int k = 1; k < 8; ++k) {
    m = to_point(add_p1p1(m, to_cached(a2)));
    odd_a[k] = to_cached(m);
  }
  const auto& odd_b = base_odd_multiples();
  int top = 255;
  while (top >= 0 && da[top] == 0 && db[top] == 0) --top;
  if (top < 0) return identity();
  p1p1 t{fe_zero(), fe_one(), fe_one(), fe_one()};  // the identity, completed
  for (int i = top; i >= 0; --i) {
    t = dbl_p1p1(to_p2(t));
    if (da[i] > 0) t = add_p1p1(to_point(t), odd_a[da[i] / 2]);
    else if (da[i] < 0) t = sub_p1p1(to_point(t), odd_a[-da[i] / 2]);
    if (db[i] > 0) t = add_p1p1(to_point(t), odd_b[db[i] / 2]);
    else if (db[i] < 0) t = sub_p1p1(to_point(t), odd_b[-db[i] / 2]);
  }
  return to_point(t);
}

}  // namespace troupe::federated::r255
