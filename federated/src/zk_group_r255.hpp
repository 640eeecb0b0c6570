#pragma once
/// @file
/// The group policy of zk_group.hpp over the project's own ristretto255 (r255.hpp): scalars in
/// 52-bit limbs, points in extended coordinates that stay decoded between calls (each keeps the
/// encoding it was decoded from, so that appending it to a transcript costs no inversion), and
/// the multi-scalar multiplication as Pippenger's method for many points and, for a few, Straus's
/// interleaved NAFs with fixed-base tables for B and H. The fast backend of the norm proofs;
/// zk_group_sodium.hpp's libsodium calls are its reference (same generators, same transcript:
/// given the same randomness the two make the same proof bytes).

#include <span>
#include <string_view>

#include "troupe/federated/r255.hpp"
#include "zk_group.hpp"

namespace troupe::federated::zk {

struct r255_group {
  using scalar = r255::scalar;
  struct point {
    r255::point p = r255::identity();
    /// The encoding it was decoded from (has_enc), which encode() returns without an inversion;
    /// a computed point has none (encode() computes it each time).
    bytes32 enc{};
    bool has_enc = false;
    friend bool operator==(const point& a, const point& b) { return a.p == b.p; }
  };
  static constexpr std::string_view name = "r255";
  /// The multi-scalar multiplication is cheaper per point than a product: the protocols pick
  /// their MSM-heavy strategies (the inner-product prover's delayed folding).
  static constexpr bool fast_msm = true;

  static scalar zero() { return {}; }
  static scalar one() { return r255::scalar_from_u64(1); }
  static scalar from_u64(std::uint64_t v) { return r255::scalar_from_u64(v); }
  static scalar from_i64(std::int64_t v);
  static scalar from_uniform(std::span<const std::uint8_t, 64> wide);
  static scalar random();
  static scalar add(const scalar& a, const scalar& b) { return a + b; }
  static scalar sub(const scalar& a, const scalar& b) { return a - b; }
  static scalar mul(const scalar& a, const scalar& b) { return a * b; }
  static scalar neg(const scalar& a) { return -a; }
  /// Throws std::invalid_argument for zero.
  static scalar invert(const scalar& a);
  static bool is_zero(const scalar& a) { return a == scalar{}; }
  static bytes32 encode(const scalar& a) { return r255::to_bytes(a); }
  static bool decode_scalar(const bytes32& b, scalar& out);

  static point identity() { return {}; }
  static point add(const point& p, const point& q) { return {p.p + q.p}; }
  static point sub(const point& p, const point& q) { return {p.p - q.p}; }
  static point mul(const scalar& s, const point& p) { return {s * p.p}; }
  static point base_mul(const scalar& s) { return {r255::base_mul(s)}; }
  /// Σ s_i P_i, variable time: up to `straus_limit` points, Straus's method (B and H by their
  /// tables, the others' doublings shared and only as many as their longest scalar needs);
  /// beyond, Pippenger's (r255::msm).
  static point msm(std::span<const scalar> s, std::span<const point> p);
  /// out[i] = Σ_j s_j p[i + j stride] for every i < out.size(): many small MSMs that share their
  /// scalars (a prover folding generators several rounds at once), the scalars recoded once.
  static void msm_columns(std::span<const scalar> s, std::span<const point> p, std::size_t stride,
                          std::span<point> out);
  static bytes32 encode(const point& p);
  static bool decode_point(const bytes32& b, point& out);
  /// SHA-512 over (domain length, domain, message), mapped by RFC 9496's one-way map: the same
  /// element as sodium_group::hash_to_point.
  static point hash_to_point(std::string_view domain, std::span<const std::uint8_t> message);

  static constexpr std::size_t straus_limit = 32;
};

static_assert(group_policy<r255_group>);

}  // namespace troupe::federated::zk
