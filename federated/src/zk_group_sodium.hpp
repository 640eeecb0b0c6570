#pragma once
/// @file
/// The group policy of zk_group.hpp over libsodium's ristretto255 calls
/// (crypto_core_ristretto255_*, crypto_scalarmult_ristretto255*): scalars are their 32-byte
/// canonical encodings, points their 32-byte encodings, decoded again by every call, and the
/// multi-scalar multiplication is a loop of products and sums. The reference the fast backend
/// is measured against.

#include <span>
#include <string_view>

#include "zk_group.hpp"

namespace troupe::federated::zk {

struct sodium_group {
  struct scalar {
    bytes32 b{};
    friend bool operator==(const scalar&, const scalar&) = default;
  };
  struct point {
    bytes32 b{};  ///< all zeros: the identity
    friend bool operator==(const point&, const point&) = default;
  };
  static constexpr std::string_view name = "sodium";

  static scalar zero() { return {}; }
  static scalar one();
  static scalar from_u64(std::uint64_t v);
  static scalar from_i64(std::int64_t v);
  static scalar from_uniform(std::span<const std::uint8_t, 64> wide);
  static scalar random();
  static scalar add(const scalar& a, const scalar& b);
  static scalar sub(const scalar& a, const scalar& b);
  static scalar mul(const scalar& a, const scalar& b);
  static scalar neg(const scalar& a);
  /// Throws std::invalid_argument for zero.
  static scalar invert(const scalar& a);
  static bool is_zero(const scalar& a);
  static bytes32 encode(const scalar& a) { return a.b; }
  static bool decode_scalar(const bytes32& b, scalar& out);

  static point identity() { return {}; }
  static point add(const point& p, const point& q);
  static point sub(const point& p, const point& q);
  static point mul(const scalar& s, const point& p);
  static point base_mul(const scalar& s);
  /// Σ s_i P_i as a loop: a zero scalar is skipped, ±1 is a sum or a difference, the rest a
  /// product (libsodium has no multi-scalar multiplication).
  static point msm(std::span<const scalar> s, std::span<const point> p);
  static bytes32 encode(const point& p) { return p.b; }
  static bool decode_point(const bytes32& b, point& out);
  /// SHA-512 over (domain length, domain, message), mapped by crypto_core_ristretto255_from_hash.
  static point hash_to_point(std::string_view domain, std::span<const std::uint8_t> message);
};

static_assert(group_policy<sodium_group>);

}  // namespace troupe::federated::zk
