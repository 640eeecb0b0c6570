#include "troupe/federated/ristretto.hpp"

#include <sodium.h>

#include <stdexcept>
#include <string>

namespace troupe::federated::ristretto {
namespace {

// sodium_init() is thread-safe and idempotent; it must precede the generator's first use.
void ensure_initialized() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
}

}  // namespace

element hash_to_element(std::string_view domain, std::span<const std::byte> message) {
  if (domain.size() > 255) throw std::invalid_argument("ristretto255 hash: the domain is longer than 255 bytes");
  ensure_initialized();
  crypto_hash_sha512_state st;
  crypto_hash_sha512_init(&st);
  const auto length = static_cast<unsigned char>(domain.size());
  crypto_hash_sha512_update(&st, &length, 1);
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(domain.data()), domain.size());
  crypto_hash_sha512_update(&st, reinterpret_cast<const unsigned char*>(message.data()), message.size());
  unsigned char digest[crypto_hash_sha512_BYTES];
  crypto_hash_sha512_final(&st, digest);
  element e;
  crypto_core_ristretto255_from_hash(e.data(), digest);
  sodium_memzero(digest, sizeof digest);
  return e;
}

scalar random_scalar() {
  ensure_initialized();
  scalar s;
  // crypto_core_ristretto255_scalar_random never returns zero.
  crypto_core_ristretto255_scalar_random(s.data());
  return s;
}

element multiply(const scalar& s, const element& p) {
  ensure_initialized();
  element q;
  // The product decodes `p` and fails for an invalid encoding or an identity result; only then
  // is it worth the second decoding that tells the two apart.
  if (crypto_scalarmult_ristretto255(q.data(), s.data(), p.data()) != 0) {
    if (crypto_core_ristretto255_is_valid_point(p.data()) != 1)
      throw std::invalid_argument("ristretto255: the 32 bytes are not the canonical encoding of a group element");
    throw std::invalid_argument("ristretto255: the product is the identity element");
  }
  return q;
}

bool is_valid(const element& p) {
  ensure_initialized();
  return crypto_core_ristretto255_is_valid_point(p.data()) == 1;
}

std::uint32_t random_below(std::uint32_t bound) {
  if (bound == 0) throw std::invalid_argument("ristretto255 random_below: the bound must be positive");
  ensure_initialized();
  return randombytes_uniform(bound);
}

}  // namespace troupe::federated::ristretto
