#include "zk_group_sodium.hpp"

#include <sodium.h>

#include <stdexcept>

#include "zk_random.hpp"

namespace troupe::federated::zk {
namespace {

void ensure_initialized() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
}

bool all_zero(const bytes32& b) {
  std::uint8_t acc = 0;
  for (auto x : b) acc |= x;
  return acc == 0;
}

}  // namespace

sodium_group::scalar sodium_group::one() {
  scalar s;
  s.b[0] = 1;
  return s;
}

sodium_group::scalar sodium_group::from_u64(std::uint64_t v) {
  scalar s;  // below 2^64 < ℓ: already canonical
  for (int i = 0; i < 8; ++i) s.b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  return s;
}

sodium_group::scalar sodium_group::from_i64(std::int64_t v) {
  if (v >= 0) return from_u64(static_cast<std::uint64_t>(v));
  return neg(from_u64(static_cast<std::uint64_t>(-(v + 1)) + 1));  // -INT64_MIN without overflow
}

sodium_group::scalar sodium_group::from_uniform(std::span<const std::uint8_t, 64> wide) {
  unsigned char copy[64];
  for (int i = 0; i < 64; ++i) copy[i] = wide[i];
  scalar s;
  crypto_core_ristretto255_scalar_reduce(s.b.data(), copy);
  return s;
}

sodium_group::scalar sodium_group::random() {
  ensure_initialized();
  std::array<std::uint8_t, 64> wide;
  if (draw_test_randomness(wide)) {
    for (;;) {
      const scalar s = from_uniform(wide);
      if (!is_zero(s)) return s;
      (void)draw_test_randomness(wide);
    }
  }
  scalar s;
  crypto_core_ristretto255_scalar_random(s.b.data());
  return s;
}

sodium_group::scalar sodium_group::add(const scalar& a, const scalar& b) {
  scalar s;
  crypto_core_ristretto255_scalar_add(s.b.data(), a.b.data(), b.b.data());
  return s;
}

sodium_group::scalar sodium_group::sub(const scalar& a, const scalar& b) {
  scalar s;
  crypto_core_ristretto255_scalar_sub(s.b.data(), a.b.data(), b.b.data());
  return s;
}

sodium_group::scalar sodium_group::mul(const scalar& a, const scalar& b) {
  scalar s;
  crypto_core_ristretto255_scalar_mul(s.b.data(), a.b.data(), b.b.data());
  return s;
}

sodium_group::scalar sodium_group::neg(const scalar& a) {
  scalar s;
  crypto_core_ristretto255_scalar_negate(s.b.data(), a.b.data());
  return s;
}

sodium_group::scalar sodium_group::invert(const scalar& a) {
  scalar s;
  if (crypto_core_ristretto255_scalar_invert(s.b.data(), a.b.data()) != 0)
    throw std::invalid_argument("ristretto255: zero has no inverse");
  return s;
}

bool sodium_group::is_zero(const scalar& a) { return all_zero(a.b); }

bool sodium_group::decode_scalar(const bytes32& b, scalar& out) {
  // Canonical: reducing the 32 bytes (as a 64-byte number) changes nothing.
  unsigned char wide[64] = {};
  for (int i = 0; i < 32; ++i) wide[i] = b[i];
  scalar r;
  crypto_core_ristretto255_scalar_reduce(r.b.data(), wide);
  if (r.b != b) return false;
  out = r;
  return true;
}

sodium_group::point sodium_group::add(const point& p, const point& q) {
  if (all_zero(p.b)) return q;
  if (all_zero(q.b)) return p;
  point r;
  if (crypto_core_ristretto255_add(r.b.data(), p.b.data(), q.b.data()) != 0)
    throw std::invalid_argument("ristretto255: adding a point that is not a valid encoding");
  return r;
}

sodium_group::point sodium_group::sub(const point& p, const point& q) {
  if (all_zero(q.b)) return p;
  point r;
  if (crypto_core_ristretto255_sub(r.b.data(), p.b.data(), q.b.data()) != 0)
    throw std::invalid_argument("ristretto255: subtracting a point that is not a valid encoding");
  return r;
}

sodium_group::point sodium_group::mul(const scalar& s, const point& p) {
  ensure_initialized();
  point r;
  // libsodium refuses an identity result (a zero scalar or the identity point): that is the
  // identity here. Every point this code holds was decoded or computed, so never invalid.
  if (crypto_scalarmult_ristretto255(r.b.data(), s.b.data(), p.b.data()) != 0) return identity();
  return r;
}

sodium_group::point sodium_group::base_mul(const scalar& s) {
  ensure_initialized();
  point r;
  if (crypto_scalarmult_ristretto255_base(r.b.data(), s.b.data()) != 0) return identity();
  return r;
}

sodium_group::point sodium_group::msm(std::span<const scalar> s, std::span<const point> p) {
  if (s.size() != p.size()) throw std::invalid_argument("msm: as many scalars as points are needed");
  const scalar minus_one = neg(one());
  point acc = identity();
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (is_zero(s[i]) || all_zero(p[i].b)) continue;
    if (s[i] == one())
      acc = add(acc, p[i]);
    else if (s[i] == minus_one)
      acc = sub(acc, p[i]);
    else
      acc = add(acc, mul(s[i], p[i]));
  }
  return acc;
}

bool sodium_group::decode_point(const bytes32& b, point& out) {
  ensure_initialized();
  // RFC 9496 refuses a value at or above p, so any with bit 255 set; libsodium 1.0.18's check
  // ignores that bit (the same point then has two encodings).
  if ((b[31] & 0x80) != 0) return false;
  if (crypto_core_ristretto255_is_valid_point(b.data()) != 1) return false;
  out.b = b;
  return true;
}

sodium_group::point sodium_group::hash_to_point(std::string_view domain, std::span<const std::uint8_t> message) {
  if (domain.size() > 255) throw std::invalid_argument("ristretto255 hash: the domain is longer than 255 bytes");
  ensure_initialized();
  crypto_hash_sha512_state st;
  crypto_hash_sha512_init(&st);
  const auto length = static_cast<unsigned char>(domain.size());
  crypto_hash_sha512_update(&st, &length, 1);
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(domain.data()), domain.size());
  crypto_hash_sha512_update(&st, message.data(), message.size());
  unsigned char digest[crypto_hash_sha512_BYTES];
  crypto_hash_sha512_final(&st, digest);
  point p;
  crypto_core_ristretto255_from_hash(p.b.data(), digest);
  return p;
}

}  // namespace troupe::federated::zk
