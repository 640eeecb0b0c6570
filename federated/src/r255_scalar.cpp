// Scalars mod l in 5 limbs of 52 bits, multiplied with Montgomery's reduction (R = 2^260):
// a * b = mont(mont(a * b) * R^2). Constant time: no branch or index depends on a value.

#include <sodium.h>

#include <stdexcept>
#include <vector>

#include "troupe/federated/r255.hpp"

namespace troupe::federated::r255 {
namespace {

__extension__ typedef unsigned __int128 u128;  // __extension__: no -Wpedantic warning
constexpr std::uint64_t mask52 = (std::uint64_t{1} << 52) - 1;
constexpr scalar order{{0x2631a5cf5d3ed, 0xdea2f79cd6581, 0x000000014def9, 0x0000000000000, 0x0100000000000}};
constexpr scalar r_mod_l{{0xf48bd6721e6ed, 0x3bab5ac67e45a, 0xfffffeb35e51b, 0xfffffffffffff, 0x00fffffffffff}};
constexpr scalar rr_mod_l{{0x9d265e952d13b, 0xd63c715bea69f, 0x5be65cb687604, 0x3dceec73d217f, 0x009411b7c309a}};
constexpr std::uint64_t lfactor = 0x51da312547e1b;  // -1/l mod 2^52

/// a - b, plus l when that is negative: a - b mod l for a, b below 2^260 with a - b > -l.
scalar sub_mod(const scalar& a, const scalar& b) {
  scalar d;
  std::uint64_t borrow = 0;
  for (int i = 0; i < 5; ++i) {
    borrow = a.limb[i] - (b.limb[i] + (borrow >> 63));
    d.limb[i] = borrow & mask52;
  }
  const std::uint64_t add_l = 0 - (borrow >> 63);
  std::uint64_t carry = 0;
  for (int i = 0; i < 5; ++i) {
    carry = (carry >> 52) + d.limb[i] + (order.limb[i] & add_l);
    d.limb[i] = carry & mask52;
  }
  return d;
}

void mul_wide(const scalar& a, const scalar& b, u128 z[9]) {
  const std::uint64_t* x = a.limb;
  const std::uint64_t* y = b.limb;
  z[0] = (u128)x[0] * y[0];
  z[1] = (u128)x[0] * y[1] + (u128)x[1] * y[0];
  z[2] = (u128)x[0] * y[2] + (u128)x[1] * y[1] + (u128)x[2] * y[0];
  z[3] = (u128)x[0] * y[3] + (u128)x[1] * y[2] + (u128)x[2] * y[1] + (u128)x[3] * y[0];
  z[4] = (u128)x[0] * y[4] + (u128)x[1] * y[3] + (u128)x[2] * y[2] + (u128)x[3] * y[1] + (u128)x[4] * y[0];
  z[5] = (u128)x[1] * y[4] + (u128)x[2] * y[3] + (u128)x[3] * y[2] + (u128)x[4] * y[1];
  z[6] = (u128)x[2] * y[4] + (u128)x[3] * y[3] + (u128)x[4] * y[2];
  z[7] = (u128)x[3] * y[4] + (u128)x[4] * y[3];
  z[8] = (u128)x[4] * y[4];
}

/// z / R mod l for z < l * R (the product of two values below 2^260 and l).
scalar montgomery_reduce(const u128 z[9]) {
  const std::uint64_t* l = order.limb;
  auto part1 = [](u128 sum, std::uint64_t& n) {
    n = (static_cast<std::uint64_t>(sum) * lfactor) & mask52;
    return (sum + (u128)n * order.limb[0]) >> 52;
  };
  auto part2 = [](u128 sum, std::uint64_t& w) {
    w = static_cast<std::uint64_t>(sum) & mask52;
    return sum >> 52;
  };
  std::uint64_t n0, n1, n2, n3, n4;
  u128 c = part1(z[0], n0);
  c = part1(c + z[1] + (u128)n0 * l[1], n1);
  c = part1(c + z[2] + (u128)n0 * l[2] + (u128)n1 * l[1], n2);
  c = part1(c + z[3] + (u128)n1 * l[2] + (u128)n2 * l[1], n3);  // l[3] = 0
  c = part1(c + z[4] + (u128)n0 * l[4] + (u128)n2 * l[2] + (u128)n3 * l[1], n4);
  scalar r;
  c = part2(c + z[5] + (u128)n1 * l[4] + (u128)n3 * l[2] + (u128)n4 * l[1], r.limb[0]);
  c = part2(c + z[6] + (u128)n2 * l[4] + (u128)n4 * l[2], r.limb[1]);
  c = part2(c + z[7] + (u128)n3 * l[4], r.limb[2]);
  c = part2(c + z[8] + (u128)n4 * l[4], r.limb[3]);
  r.limb[4] = static_cast<std::uint64_t>(c);
  return sub_mod(r, order);
}

scalar montgomery_mul(const scalar& a, const scalar& b) {
  u128 z[9];
  mul_wide(a, b, z);
  return montgomery_reduce(z);
}

scalar from_words(const std::uint64_t w[4]) {
  return {{w[0] & mask52, ((w[0] >> 52) | (w[1] << 12)) & mask52, ((w[1] >> 40) | (w[2] << 24)) & mask52,
           ((w[2] >> 28) | (w[3] << 36)) & mask52, w[3] >> 16}};
}

template <std::size_t N>
void load_words(const std::array<std::uint8_t, N>& b, std::uint64_t* w) {
  for (std::size_t i = 0; i < N / 8; ++i) w[i] = 0;
  for (std::size_t i = 0; i < N; ++i) w[i / 8] |= static_cast<std::uint64_t>(b[i]) << (8 * (i % 8));
}

}  // namespace

scalar scalar_from_canonical(const bytes32& bytes, bool& ok) {
  std::uint64_t w[4];
  load_words(bytes, w);
  const scalar s = from_words(w);
  // s - l borrows exactly when s < l (s < 2^256 fits the limbs: the top one holds 48 bits).
  std::uint64_t borrow = 0;
  for (int i = 0; i < 5; ++i) borrow = s.limb[i] - (order.limb[i] + (borrow >> 63));
  ok = (borrow >> 63) == 1;
  return ok ? s : scalar{};
}

bytes32 to_bytes(const scalar& s) {
  const std::uint64_t* l = s.limb;
  const std::uint64_t w[4] = {l[0] | (l[1] << 52), (l[1] >> 12) | (l[2] << 40), (l[2] >> 24) | (l[3] << 28),
                              (l[3] >> 36) | (l[4] << 16)};
  bytes32 out;
  for (int i = 0; i < 32; ++i) out[i] = static_cast<std::uint8_t>(w[i / 8] >> (8 * (i % 8)));
  return out;
}

scalar scalar_reduce(const bytes64& bytes) {
  std::uint64_t w[8];
  load_words(bytes, w);
  // lo: bits 0..259, hi: bits 260..511; value = lo + hi * 2^260 = lo + hi * R.
  const scalar lo{{w[0] & mask52, ((w[0] >> 52) | (w[1] << 12)) & mask52, ((w[1] >> 40) | (w[2] << 24)) & mask52,
                   ((w[2] >> 28) | (w[3] << 36)) & mask52, ((w[3] >> 16) | (w[4] << 48)) & mask52}};
  const scalar hi{{(w[4] >> 4) & mask52, ((w[4] >> 56) | (w[5] << 8)) & mask52, ((w[5] >> 44) | (w[6] << 20)) & mask52,
                   ((w[6] >> 32) | (w[7] << 32)) & mask52, w[7] >> 20}};
  return montgomery_mul(lo, r_mod_l) + montgomery_mul(hi, rr_mod_l);
}

scalar scalar_from_u64(std::uint64_t v) {
  bytes64 b{};
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  return scalar_reduce(b);
}

scalar operator+(const scalar& a, const scalar& b) {
  scalar s;
  std::uint64_t carry = 0;
  for (int i = 0; i < 5; ++i) {
    carry = a.limb[i] + b.limb[i] + (carry >> 52);
    s.limb[i] = carry & mask52;
  }
  return sub_mod(s, order);
}

scalar operator-(const scalar& a, const scalar& b) { return sub_mod(a, b); }
scalar operator-(const scalar& a) { return sub_mod(scalar{}, a); }

scalar operator*(const scalar& a, const scalar& b) { return montgomery_mul(montgomery_mul(a, b), rr_mod_l); }

bool operator==(const scalar& a, const scalar& b) {
  std::uint64_t acc = 0;
  for (int i = 0; i < 5; ++i) acc |= a.limb[i] ^ b.limb[i];
  return acc == 0;
}

scalar invert(const scalar& a) {
  // a^(l - 2) in the Montgomery domain; the exponent is public, so its bits may steer the loop.
  static constexpr std::uint8_t l_minus_2[32] = {0xeb, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7,
                                                 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0x10};
  const scalar am = montgomery_mul(a, rr_mod_l);
  scalar acc = r_mod_l;  // 1 in the Montgomery domain
  for (int bit = 252; bit >= 0; --bit) {
    acc = montgomery_mul(acc, acc);
    if ((l_minus_2[bit / 8] >> (bit % 8)) & 1) acc = montgomery_mul(acc, am);
  }
  u128 z[9] = {};
  for (int i = 0; i < 5; ++i) z[i] = acc.limb[i];
  return montgomery_reduce(z);
}

void batch_invert(std::span<scalar> a) {
  // prefix[i] = a[0] * ... * a[i-1] in the Montgomery domain (x stands for x R), zeros passed over
  // as ones; without a branch on any value.
  const scalar one_m = r_mod_l;
  auto select = [](const scalar& x, const scalar& y, std::uint64_t take_y) {
    const std::uint64_t m = 0 - take_y;
    scalar r;
    for (int k = 0; k < 5; ++k) r.limb[k] = x.limb[k] ^ (m & (x.limb[k] ^ y.limb[k]));
    return r;
  };
  auto is_zero = [](const scalar& x) {
    std::uint64_t acc = 0;
    for (auto l : x.limb) acc |= l;
    return ((acc | (0 - acc)) >> 63) ^ 1;
  };
  std::vector<scalar> prefix(a.size());
  scalar acc = one_m;
  for (std::size_t i = 0; i < a.size(); ++i) {
    prefix[i] = acc;
    acc = montgomery_mul(acc, select(montgomery_mul(a[i], rr_mod_l), one_m, is_zero(a[i])));
  }
  // acc = P R for the product P: 1/(P R) times R^2, twice through montgomery_mul, is R / P.
  acc = montgomery_mul(montgomery_mul(invert(acc), rr_mod_l), rr_mod_l);
  for (std::size_t i = a.size(); i-- > 0;) {
    const std::uint64_t zero = is_zero(a[i]);
    const scalar inv = montgomery_mul(acc, prefix[i]);  // R / a[i]
    acc = montgomery_mul(acc, select(montgomery_mul(a[i], rr_mod_l), one_m, zero));
    u128 z[9] = {};
    for (int k = 0; k < 5; ++k) z[k] = inv.limb[k];
    a[i] = select(montgomery_reduce(z), scalar{}, zero);
  }
}

scalar random_scalar() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
  for (;;) {
    bytes64 b;
    randombytes_buf(b.data(), b.size());
    const scalar s = scalar_reduce(b);
    sodium_memzero(b.data(), b.size());
    if (!(s == scalar{})) return s;
  }
}

}  // namespace troupe::federated::r255
