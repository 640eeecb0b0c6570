#pragma once
/// @file
/// What the zero-knowledge proofs (zk_bulletproofs.hpp, zk_norm.hpp) ask of a prime-order group:
/// a group policy, a struct of types and static functions. The protocols are written once against
/// it and instantiated for each backend in the .cpp files (zk_group_r255.hpp: the project's own
/// ristretto255, the default; zk_group_sodium.hpp: libsodium's calls, the reference).
///
/// A policy `G` provides:
///   G::scalar, G::point           regular value types (copyable, ==)
///   G::name                       "r255" or "sodium" (for messages and benchmarks)
///   scalars (mod ℓ):  zero(), one(), from_u64(u64), from_i64(i64), from_uniform(64 bytes, reduced
///                     mod ℓ), random(), add, sub, mul, neg, invert (of a non-zero scalar),
///                     is_zero, encode (32 bytes, canonical little-endian),
///                     decode_scalar(32 bytes, scalar&) -> false unless canonical (< ℓ)
///   points:           identity(), add, sub, mul(scalar, point), base_mul(scalar) (the group's
///                     standard generator B), msm(span<scalar>, span<point>) = Σ s_i P_i,
///                     encode (32 bytes), decode_point(32 bytes, point&) -> false unless the
///                     canonical encoding of a group element, hash_to_point(domain, message)
///                     (a point nobody knows the discrete logarithm of)
///
/// Optional: G::fast_msm (true: an MSM point costs far less than a product, so the prover may
/// trade products for MSMs, see ipa_prove) and G::msm_columns (many small MSMs sharing their
/// scalars).
///
/// Everything is variable time: the prover's secrets are the client's own update, which the
/// simulation holds in the clear anyway; a deployment would want a constant-time prover.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace troupe::federated::zk {

using bytes32 = std::array<std::uint8_t, 32>;

template <class G>
concept group_policy = requires(const typename G::scalar& a, const typename G::point& p, std::uint64_t u, std::int64_t i,
                                std::span<const std::uint8_t, 64> wide, const bytes32& b, typename G::scalar& so,
                                typename G::point& po, std::span<const typename G::scalar> ss,
                                std::span<const typename G::point> ps, std::string_view domain,
                                std::span<const std::uint8_t> message) {
  { G::name } -> std::convertible_to<std::string_view>;
  { G::zero() } -> std::same_as<typename G::scalar>;
  { G::one() } -> std::same_as<typename G::scalar>;
  { G::from_u64(u) } -> std::same_as<typename G::scalar>;
  { G::from_i64(i) } -> std::same_as<typename G::scalar>;
  { G::from_uniform(wide) } -> std::same_as<typename G::scalar>;
  { G::random() } -> std::same_as<typename G::scalar>;
  { G::add(a, a) } -> std::same_as<typename G::scalar>;
  { G::sub(a, a) } -> std::same_as<typename G::scalar>;
  { G::mul(a, a) } -> std::same_as<typename G::scalar>;
  { G::neg(a) } -> std::same_as<typename G::scalar>;
  { G::invert(a) } -> std::same_as<typename G::scalar>;
  { G::is_zero(a) } -> std::same_as<bool>;
  { G::encode(a) } -> std::same_as<bytes32>;
  { G::decode_scalar(b, so) } -> std::same_as<bool>;
  { G::identity() } -> std::same_as<typename G::point>;
  { G::add(p, p) } -> std::same_as<typename G::point>;
  { G::sub(p, p) } -> std::same_as<typename G::point>;
  { G::mul(a, p) } -> std::same_as<typename G::point>;
  { G::base_mul(a) } -> std::same_as<typename G::point>;
  { G::msm(ss, ps) } -> std::same_as<typename G::point>;
  { G::encode(p) } -> std::same_as<bytes32>;
  { G::decode_point(b, po) } -> std::same_as<bool>;
  { G::hash_to_point(domain, message) } -> std::same_as<typename G::point>;
};

}  // namespace troupe::federated::zk
