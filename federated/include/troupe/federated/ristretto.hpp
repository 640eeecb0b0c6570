#pragma once
/// @file
/// The prime-order group ristretto255 at the level of bytes: the few operations protocols built
/// on it need (private set intersection, and any later protocol on the same group), so that each
/// such protocol states its steps, not a library's calling conventions. The group arithmetic is
/// the project's own (r255.hpp, checked against libsodium in the tests); libsodium supplies
/// SHA-512 and the secure random generator.
///
/// Elements and scalars travel as their canonical 32-byte encodings (RFC 9496). An encoding
/// received from someone else is checked (multiply() refuses one that is not a valid element)
/// before it is used.
/// @threadsafe: every function may be called from any thread (libsodium is initialised once).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace troupe::federated::ristretto {

constexpr std::size_t element_bytes = 32;
constexpr std::size_t scalar_bytes = 32;
using element = std::array<std::uint8_t, element_bytes>;
using scalar = std::array<std::uint8_t, scalar_bytes>;

/// The element of SHA-512(domain length as one byte || domain || message) by
/// crypto_core_ristretto255_from_hash: a hash to the group whose discrete logarithm nobody knows.
/// `domain` (at most 255 bytes) separates the uses of the hash.
element hash_to_element(std::string_view domain, std::span<const std::byte> message);
/// multiply(s, hash_to_element(domain, m)) for every message m, in one batch (no encoding of
/// the hashed elements, one shared inversion for the products' encodings).
std::vector<element> hash_and_multiply(const scalar& s, std::string_view domain,
                                       std::span<const std::span<const std::byte>> messages);
/// A uniformly random non-zero scalar from the system's secure generator.
scalar random_scalar();
/// s * p. Throws std::invalid_argument when `p` is not the canonical encoding of an element, or
/// the product is the identity (a zero scalar or an element of small order: never for honest
/// inputs).
element multiply(const scalar& s, const element& p);
/// multiply(s, p) for every element, in one batch; throws as multiply() does (for the first
/// offending element, the message naming its index).
std::vector<element> multiply_each(const scalar& s, std::span<const element> elements);
/// Whether `p` is the canonical encoding of an element (the identity's, all zeros, included).
bool is_valid(const element& p);
/// A uniform integer in [0, bound) from the system's secure generator (bound > 0).
std::uint32_t random_below(std::uint32_t bound);

}  // namespace troupe::federated::ristretto
