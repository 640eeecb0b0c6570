#pragma once
/// @file
/// Zero-knowledge proofs that a client's update is bounded in L2 norm, RoFL's construction
/// (Lycklama, Burkhalter, Viand, Küchler, Hithnawi, IEEE S&P 2023) on ristretto255:
///
///   1. the update is quantized to k-bit fixed point: x_i = trunc(Δ_i / q), q = B / (2^(k-1) - 1),
///      so that ‖Δ‖ <= B gives ‖x‖ <= 2^(k-1) - 1 =: B_q quanta (truncation never grows a value);
///   2. every coordinate is committed: C_i = x_i B + r_i H (Pedersen);
///   3. an aggregated Bulletproofs range proof shows x_i + 2^(k-1) ∈ [0, 2^k) for every i (this
///      stops the wrap-around cheat: a "coordinate" near ℓ/2 whose square is small mod ℓ);
///   4. the squares are committed, C2_i = x_i C_i + s_i H (a commitment to x_i² with blinding
///      x_i r_i + s_i), with a Σ-protocol proving knowledge of (x_i, r_i, s_i) behind both;
///   5. a second range proof shows B_q² - Σ x_i² ∈ [0, 2^(2k)) on B_q² B - Σ C2_i: ‖x‖ <= B_q;
///   6. an opening proof binds the commitments to the quantized update x when the verifier is
///      given it (a Schnorr proof on H of Σ ρ^i (C_i - x_i B), ρ a challenge).
/// Fiat–Shamir over SHA-512 binds every public value (the statement, each commitment, each
/// message of the prover) in order. The verifier learns from a proof that verifies: the
/// committed integers have ‖x‖ <= B_q; with step 6, that they are trunc(Δ / q) of the update it
/// holds, so ‖Δ‖ < B + sqrt(d) q.
///
/// Thread-safe: the functions keep no state but a cache of generators shared behind a lock.
/// Two backends compute the same protocol: the project's own ristretto255 (r255.hpp, with
/// Pippenger's multi-scalar multiplication; the default) and libsodium's calls (the reference,
/// a product and a re-encoding per call). Their proofs are the same bytes format: one made on
/// either verifies on the other.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::federated::zk {

/// Which ristretto255 computes a proof or its verification.
enum class group_backend {
  fast,    ///< the project's own (r255.hpp)
  sodium,  ///< libsodium's calls: the reference
};
/// "r255" or "sodium".
std::string_view backend_name(group_backend b);
/// "r255" (or "fast") and "sodium"; throws std::invalid_argument for anything else.
group_backend parse_backend(std::string_view name);

/// The public statement: the update's length, the bits per coordinate and the bound.
struct norm_params {
  std::size_t dim = 0;  ///< d: coordinates, 1 to 2^24
  int bits = 16;        ///< k: 8, 16 or 32
  double bound = 1.0;   ///< B: the L2 bound of the float update, > 0 and finite
};

/// Throws std::invalid_argument for a dim, bits or bound outside the ranges above.
void check_params(const norm_params& p);
/// q = B / (2^(k-1) - 1): the value of one quantum.
double quantum(const norm_params& p);
/// B_q = 2^(k-1) - 1: the bound in quanta.
std::int64_t bound_quanta(const norm_params& p);
/// x_i = trunc(Δ_i / q), saturated to ±2^62 (the prover refuses anything beyond ±2^(k-1) anyway).
/// Throws std::invalid_argument for a length other than dim or a value that is not finite.
std::vector<std::int64_t> quantize(std::span<const float> update, const norm_params& p);

/// The proof for the quantized update x (encoded, proof_bytes(p) bytes). Throws
/// std::invalid_argument, saying which, when a coordinate is outside [-2^(k-1), 2^(k-1)) or
/// Σ x_i² > B_q².
std::vector<std::uint8_t> prove_norm(std::span<const std::int64_t> x, const norm_params& p,
                                     group_backend backend = group_backend::fast);
/// What a client whose update breaks the bound can send: the same protocol with the prover's
/// checks skipped (the low bits of the values out of range are proved). It never verifies; the
/// simulation's malicious clients send it.
std::vector<std::uint8_t> forge_norm(std::span<const std::int64_t> x, const norm_params& p,
                                     group_backend backend = group_backend::fast);

/// Makes the generators a proof for `p` needs (2 k bit_ceil(d) points hashed to the group),
/// which the first proof of that size otherwise makes: for measurements.
void prepare(const norm_params& p, group_backend backend = group_backend::fast);

/// The backend's scalar multiplication of a point, measured now over `count` products: the
/// anchor that benchmark figures carry (a proof's cost on libsodium is about 10 k bit_ceil(d) of
/// them).
double product_us(group_backend backend = group_backend::fast, int count = 200);

/// The size of every proof for `p`: 12 + 32 (7 d + 2 (9 + r1 + r2) + 2) bytes, r1 and r2 the
/// two range proofs' rounds (log2(k bit_ceil(d)) and log2(2k)).
std::size_t proof_bytes(const norm_params& p);

/// The decoder: throws std::invalid_argument, naming the field, for bytes that are not a proof
/// for `p` (another length, magic, version, k or d; a point that is not a canonical ristretto255
/// encoding; a scalar that is not canonical).
void check_proof_encoding(std::span<const std::uint8_t> proof, const norm_params& p);

/// The outcome of a verification: ok, or the first check that failed.
struct verdict {
  bool ok = false;
  std::string reason;  ///< empty when ok
};
/// Decodes and verifies. With `opened` (d values) it also checks that the commitments open to
/// them (step 6); empty, it checks steps 2 to 5 only. A malformed encoding is a failed verdict
/// with the decoder's message, never an exception.
verdict verify_norm(std::span<const std::uint8_t> proof, const norm_params& p, std::span<const std::int64_t> opened = {},
                    group_backend backend = group_backend::fast);

}  // namespace troupe::federated::zk
