#pragma once
/// @file
/// ristretto255 (RFC 9496) in this project's own code: the prime-order group on Curve25519's
/// Edwards form, its scalars mod l, and the multiplications protocols on the group need (one
/// secret product, the generator's product from a table, a verifier's double product, and
/// Pippenger's multi-scalar multiplication). libsodium's implementation is its reference in the
/// tests (tests/federated/r255_test.cpp); ristretto.hpp's byte-level functions run on it.
///
/// Field elements are 5 limbs of 51 bits (products in unsigned __int128), points are extended
/// twisted-Edwards coordinates (X:Y:Z:T), scalars are 5 limbs of 52 bits reduced with
/// Montgomery's method. Everything that takes a secret (a scalar of `*`, base_mul, encode,
/// decode, from_uniform_bytes, the scalar arithmetic) runs in time independent of its value;
/// the functions named vartime_* and msm() take public inputs only (a verifier's).
/// @threadsafe: every function may be called from any thread (the tables are built once).

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace troupe::federated::r255 {

using bytes32 = std::array<std::uint8_t, 32>;
using bytes64 = std::array<std::uint8_t, 64>;

/// An element of GF(2^255 - 19): 5 limbs of 51 bits, not necessarily reduced.
struct field_element {
  std::uint64_t limb[5];
};

/// A scalar mod l = 2^252 + 27742317777372353535851937790883648493: 5 limbs of 52 bits, always
/// the canonical value (< l). A value type; the zero-initialised scalar is 0.
struct scalar {
  std::uint64_t limb[5] = {0, 0, 0, 0, 0};
};

/// A group element: a point (X:Y:Z:T) of the Edwards curve standing for its ristretto class.
/// Compare with ==, never by coordinates (several points stand for one element).
struct point {
  field_element X, Y, Z, T;
};

// --- scalars ---------------------------------------------------------------------------------

/// The scalar of 32 little-endian bytes; `ok` is false (and the result 0) when the value is not
/// below l (a non-canonical encoding).
scalar scalar_from_canonical(const bytes32& bytes, bool& ok);
/// The 32 little-endian bytes of s (canonical).
bytes32 to_bytes(const scalar& s);
/// The 512-bit little-endian integer mod l (how a hash becomes a uniform scalar).
scalar scalar_reduce(const bytes64& bytes);
/// A small scalar (tests, and protocols' constants).
scalar scalar_from_u64(std::uint64_t v);
scalar operator+(const scalar& a, const scalar& b);
scalar operator-(const scalar& a, const scalar& b);
scalar operator-(const scalar& a);
scalar operator*(const scalar& a, const scalar& b);
bool operator==(const scalar& a, const scalar& b);
/// 1/a mod l; 0 for a = 0.
scalar invert(const scalar& a);
/// Replaces every a[i] by 1/a[i] with one inversion in all (Montgomery's trick); zeros stay 0.
void batch_invert(std::span<scalar> a);
/// A uniformly random scalar, never zero, from the system's secure generator.
scalar random_scalar();

// --- points ----------------------------------------------------------------------------------

point identity();
/// The generator B of RFC 9496 (encoding e2f2ae0a...d2d76).
point generator();
point operator+(const point& p, const point& q);
point operator-(const point& p, const point& q);
point operator-(const point& p);
/// Equality of the ristretto classes (X1*Y2 == Y1*X2 or Y1*Y2 == X1*X2).
bool operator==(const point& p, const point& q);
/// 2p (cheaper than p + p).
point dbl(const point& p);

/// RFC 9496 section 4.3.2: the canonical 32-byte encoding.
bytes32 encode(const point& p);
/// RFC 9496 section 4.3.1: false (out untouched) for a non-canonical or invalid encoding.
bool decode(const bytes32& bytes, point& out);
/// RFC 9496 section 4.3.4: the element derived from 64 uniform bytes (the one-way map applied to
/// each half, the two images added); equals libsodium's crypto_core_ristretto255_from_hash.
point from_uniform_bytes(const bytes64& bytes);
/// decode(in[i], out[i]) for every i, ok[i] its result (1 or 0), the square roots' exponentiations
/// run together (eight at a time on CPUs with AVX-512 IFMA): spans of equal length, else
/// std::invalid_argument.
void decode_each(std::span<const bytes32> in, std::span<point> out, std::span<std::uint8_t> ok);
/// out[i] = from_uniform_bytes(in[i]) for every i, batched as decode_each is (std::invalid_argument
/// unless `out` is as long as `in`); the copies it makes of the inputs are wiped before it returns.
void from_uniform_bytes_each(std::span<const bytes64> in, std::span<point> out);
/// encode(2 * p[i]) for every i with one field inversion in all (no square root per point):
/// `out` must be as long as `p` (std::invalid_argument otherwise).
void double_and_encode(std::span<const point> p, std::span<bytes32> out);

// --- multiplications -------------------------------------------------------------------------

/// s * p, constant time (signed radix-16 windows over a table of p's first 8 multiples).
point operator*(const scalar& s, const point& p);
/// s * B, constant time, from a table of B's multiples built on first use.
point base_mul(const scalar& s);
/// a * A + b * B, variable time (width-5 NAF for A, width-8 NAF over a table for B): public inputs.
point vartime_double_mul(const scalar& a, const point& A, const scalar& b);
/// s * p for every p[i] (constant time), written to out[i]: the scalar's digits are recoded once;
/// eight points at a time on CPUs with AVX-512 IFMA. std::invalid_argument unless `out` is as long
/// as `p` (it may be `p` itself).
void multiply_each(const scalar& s, std::span<const point> p, std::span<point> out);
/// sum of s[i] * p[i], variable time: Pippenger's bucket method, window chosen by the count
/// (spans of equal length; empty gives the identity).
point msm(std::span<const scalar> s, std::span<const point> p);
/// The plain reference of msm(): the sum of single products.
point msm_reference(std::span<const scalar> s, std::span<const point> p);

}  // namespace troupe::federated::r255
