// GF(2^255 - 19): the conversions, the exponentiations and the square root ratio of RFC 9496.

#include "r255_field.hpp"

#include <vector>

namespace troupe::federated::r255::detail {

bytes32 to_bytes(const fe& a) {
  // Carry fully (value below 2^255 + small), then subtract p when the value is at least p: adding
  // 19 carries into bit 255 exactly then.
  fe t = carry(carry(a));
  std::uint64_t q = (t.limb[0] + 19) >> 51;
  q = (t.limb[1] + q) >> 51;
  q = (t.limb[2] + q) >> 51;
  q = (t.limb[3] + q) >> 51;
  q = (t.limb[4] + q) >> 51;
  t.limb[0] += 19 * q;
  std::uint64_t c;
  c = t.limb[0] >> 51; t.limb[0] &= mask51; t.limb[1] += c;
  c = t.limb[1] >> 51; t.limb[1] &= mask51; t.limb[2] += c;
  c = t.limb[2] >> 51; t.limb[2] &= mask51; t.limb[3] += c;
  c = t.limb[3] >> 51; t.limb[3] &= mask51; t.limb[4] += c;
  t.limb[4] &= mask51;
  const std::uint64_t w[4] = {t.limb[0] | (t.limb[1] << 51), (t.limb[1] >> 13) | (t.limb[2] << 38),
                              (t.limb[2] >> 26) | (t.limb[3] << 25), (t.limb[3] >> 39) | (t.limb[4] << 12)};
  bytes32 out;
  for (int i = 0; i < 32; ++i) out[i] = static_cast<std::uint8_t>(w[i / 8] >> (8 * (i % 8)));
  return out;
}

fe from_bytes(const bytes32& b) {
  std::uint64_t w[4] = {0, 0, 0, 0};
  for (int i = 0; i < 32; ++i) w[i / 8] |= static_cast<std::uint64_t>(b[i]) << (8 * (i % 8));
  return {{w[0] & mask51, ((w[0] >> 51) | (w[1] << 13)) & mask51, ((w[1] >> 38) | (w[2] << 26)) & mask51,
           ((w[2] >> 25) | (w[3] << 39)) & mask51, (w[3] >> 12) & mask51}};
}

std::uint64_t is_negative(const fe& a) { return to_bytes(a)[0] & 1; }

std::uint64_t is_zero(const fe& a) {
  const bytes32 b = to_bytes(a);
  std::uint64_t acc = 0;
  for (auto x : b) acc |= x;
  return ((acc | (0 - acc)) >> 63) ^ 1;
}

std::uint64_t equal(const fe& a, const fe& b) { return is_zero(sub(a, b)); }

namespace {

// z^(2^250 - 1) and z^11, the common head of both exponentiation chains.
fe pow_2_250_minus_1(const fe& z, fe& z11) {
  const fe z2 = sq(z);
  const fe z9 = mul(sq_n(z2, 2), z);
  z11 = mul(z9, z2);
  const fe z_5_0 = mul(sq(z11), z9);                   // 2^5 - 1
  const fe z_10_0 = mul(sq_n(z_5_0, 5), z_5_0);        // 2^10 - 1
  const fe z_20_0 = mul(sq_n(z_10_0, 10), z_10_0);     // 2^20 - 1
  const fe z_40_0 = mul(sq_n(z_20_0, 20), z_20_0);     // 2^40 - 1
  const fe z_50_0 = mul(sq_n(z_40_0, 10), z_10_0);     // 2^50 - 1
  const fe z_100_0 = mul(sq_n(z_50_0, 50), z_50_0);    // 2^100 - 1
  const fe z_200_0 = mul(sq_n(z_100_0, 100), z_100_0); // 2^200 - 1
  return mul(sq_n(z_200_0, 50), z_50_0);               // 2^250 - 1
}

}  // namespace

fe invert(const fe& a) {
  fe z11;
  const fe t = pow_2_250_minus_1(a, z11);
  return mul(sq_n(t, 5), z11);  // 2^255 - 32 + 11 = p - 2
}

fe pow22523(const fe& a) {
  fe z11;
  const fe t = pow_2_250_minus_1(a, z11);
  return mul(sq_n(t, 2), a);  // 2^252 - 4 + 1
}

fe sqrt_ratio_m1_prepare(const fe& u, const fe& v, fe& v3) {
  v3 = mul(sq(v), v);
  const fe v7 = mul(sq(v3), v);
  return mul(u, v7);
}

std::uint64_t sqrt_ratio_m1_finish(const fe& u, const fe& v, const fe& v3, const fe& pow, fe& root) {
  fe r = mul(mul(u, v3), pow);
  const fe check = mul(v, sq(r));
  const fe u_neg = neg(u);
  const std::uint64_t correct_sign = equal(check, u);
  const std::uint64_t flipped_sign = equal(check, u_neg);
  const std::uint64_t flipped_sign_i = equal(check, mul(u_neg, fe_sqrt_m1));
  cmov(r, mul(r, fe_sqrt_m1), flipped_sign | flipped_sign_i);
  root = abs(r);
  return correct_sign | flipped_sign;
}

std::uint64_t sqrt_ratio_m1(const fe& u, const fe& v, fe& root) {
  fe v3;
  const fe w = sqrt_ratio_m1_prepare(u, v, v3);
  return sqrt_ratio_m1_finish(u, v, v3, pow22523(w), root);
}

void pow22523_each(const fe* in, fe* out, std::size_t n) {
  if (ifma_available()) return pow22523_ifma(in, out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = pow22523(in[i]);
}

void batch_invert(fe* a, std::size_t n) {
  if (n == 0) return;
  // prefix[i] = a[0] * ... * a[i-1], with zeros passed over as ones so that one zero does not
  // spoil the others.
  std::vector<fe> prefix(n);
  fe acc = fe_one();
  for (std::size_t i = 0; i < n; ++i) {
    prefix[i] = acc;
    fe x = a[i];
    cmov(x, fe_one(), is_zero(a[i]));
    acc = mul(acc, x);
  }
  acc = invert(acc);
  for (std::size_t i = n; i-- > 0;) {
    const std::uint64_t zero = is_zero(a[i]);
    fe x = a[i];
    cmov(x, fe_one(), zero);
    fe inv = mul(acc, prefix[i]);
    acc = mul(acc, x);
    cmov(inv, fe_zero(), zero);
    a[i] = inv;
  }
}

}  // namespace troupe::federated::r255::detail
