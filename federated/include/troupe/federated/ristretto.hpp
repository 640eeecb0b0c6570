#pragma once
/// @file
/// The prime-order group ristretto255, through libsodium: the few operations protocols built on
/// it need (private set intersection, and any later protocol on the same group), so that each
/// such protocol states its steps, not libsodium's calling conventions.
///
/// Elements and scalars travel as their canonical 32-byte encodings. An encoding received from
/// someone else is checked (multiply() refuses one that is not a valid element) before it is used.
/// @threadsafe: every function may be called from any thread (libsodium is initialised once).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace troupe::federated::ristretto {

constexpr std::size_t element_bytes = 32;
constexpr std::size_t scalar_bytes = 32;
using element = std::array<std::uint8_t, element_bytes>;
using scalar = std::array<std::uint8_t, scalar_bytes>;

/// The element of SHA-512(domain length as one byte || domain || message) by
/// crypto_core_ristretto255_from_hash: a hash to the group whose discrete logarithm nobody knows.
/// `domain` (at most 255 bytes) separates the uses of the hash.
element hash_to_element(std::string_view domain, std::span<const std::byte> message);
/// A uniformly random non-zero scalar from the system's secure generator.
scalar random_scalar();
/// s * p. Throws std::invalid_argument when `p` is not the canonical encoding of an element, or
/// the product is the identity (a zero scalar or an element of small order: never for honest
/// inputs).
element multiply(const scalar& s, const element& p);
/// Whether `p` is the canonical encoding of a non-identity element.
bool is_valid(const element& p);
/// A uniform integer in [0, bound) from the system's secure generator (bound > 0).
std::uint32_t random_below(std::uint32_t bound);

}  // namespace troupe::federated::ristretto
