#include "troupe/federated/ristretto.hpp"

#include <sodium.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "troupe/federated/r255.hpp"

namespace troupe::federated::ristretto {
namespace {

// sodium_init() is thread-safe and idempotent; it must precede the generator's first use.
void ensure_initialized() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
}

/// The 64 bytes SHA-512(domain length as one byte || domain || message).
r255::bytes64 domain_hash(std::string_view domain, std::span<const std::byte> message) {
  crypto_hash_sha512_state st;
  crypto_hash_sha512_init(&st);
  const auto length = static_cast<unsigned char>(domain.size());
  crypto_hash_sha512_update(&st, &length, 1);
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(domain.data()), domain.size());
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(message.data()), message.size());
  r255::bytes64 digest;
  crypto_hash_sha512_final(&st, digest.data());
  return digest;
}

void check_domain(std::string_view domain) {
  if (domain.size() > 255) throw std::invalid_argument("ristretto255 hash: the domain is longer than 255 bytes");
}

/// The scalar the 32 bytes stand for as libsodium's crypto_scalarmult_ristretto255 reads them: a
/// 255-bit little-endian integer (the top bit ignored), taken mod the group order.
r255::scalar to_scalar(const scalar& s) {
  r255::bytes64 wide{};
  std::memcpy(wide.data(), s.data(), s.size());
  wide[31] &= 0x7f;
  const r255::scalar k = r255::scalar_reduce(wide);
  sodium_memzero(wide.data(), wide.size());
  return k;
}

[[noreturn]] void throw_invalid() {
  throw std::invalid_argument("ristretto255: the 32 bytes are not the canonical encoding of a group element");
}
[[noreturn]] void throw_identity() { throw std::invalid_argument("ristretto255: the product is the identity element"); }

/// s * p[i] for every point, encoded: (s / 2) * p[i] then the batch encoding of the doubles,
/// which needs one inversion for all of them instead of a square root each.
std::vector<element> products_encoded(const scalar& s, std::span<const r255::point> points) {
  static const r255::scalar half = r255::invert(r255::scalar_from_u64(2));
  const r255::scalar k = to_scalar(s) * half;
  std::vector<r255::point> products(points.size());
  r255::multiply_each(k, points, products);
  std::vector<element> out(points.size());
  r255::double_and_encode(products, out);
  for (const auto& e : out)
    if (e == element{}) throw_identity();
  return out;
}

}  // namespace

element hash_to_element(std::string_view domain, std::span<const std::byte> message) {
  check_domain(domain);
  ensure_initialized();
  r255::bytes64 digest = domain_hash(domain, message);
  const element e = r255::encode(r255::from_uniform_bytes(digest));
  sodium_memzero(digest.data(), digest.size());
  return e;
}

std::vector<element> hash_and_multiply(const scalar& s, std::string_view domain,
                                       std::span<const std::span<const std::byte>> messages) {
  check_domain(domain);
  ensure_initialized();
  std::vector<r255::bytes64> digests(messages.size());
  for (std::size_t i = 0; i < messages.size(); ++i) digests[i] = domain_hash(domain, messages[i]);
  std::vector<r255::point> points(messages.size());
  r255::from_uniform_bytes_each(digests, points);
  sodium_memzero(digests.data(), digests.size() * sizeof(r255::bytes64));
  return products_encoded(s, points);
}

scalar random_scalar() {
  ensure_initialized();
  scalar s;
  // crypto_core_ristretto255_scalar_random never returns zero.
  crypto_core_ristretto255_scalar_random(s.data());
  return s;
}

element multiply(const scalar& s, const element& p) {
  r255::point q;
  if (!r255::decode(p, q)) throw_invalid();
  const element out = r255::encode(to_scalar(s) * q);
  if (out == element{}) throw_identity();
  return out;
}

std::vector<element> multiply_each(const scalar& s, std::span<const element> elements) {
  std::vector<r255::point> points(elements.size());
  std::vector<std::uint8_t> ok(elements.size());
  r255::decode_each(elements, points, ok);
  for (std::size_t i = 0; i < elements.size(); ++i)
    if (!ok[i])
      throw std::invalid_argument("ristretto255: element " + std::to_string(i) +
                                  ": the 32 bytes are not the canonical encoding of a group element");
  return products_encoded(s, points);
}

bool is_valid(const element& p) {
  r255::point q;
  return r255::decode(p, q);
}

std::uint32_t random_below(std::uint32_t bound) {
  if (bound == 0) throw std::invalid_argument("ristretto255 random_below: the bound must be positive");
  ensure_initialized();
  return randombytes_uniform(bound);
}

}  // namespace troupe::federated::ristretto
