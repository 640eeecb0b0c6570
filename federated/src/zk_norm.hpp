#pragma once
/// @file
/// The norm proof of zkproof.hpp over a group policy: the proof's parts, its prover, verifier and
/// byte encoding. Instantiated in zk_norm.cpp; the tests reach the parts (a forged square, a
/// coordinate at (ℓ+1)/2) through this header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/zkproof.hpp"
#include "zk_bulletproofs.hpp"

namespace troupe::federated::zk {

/// The Σ-protocol linking C_i = x_i B + r_i H to C2_i = x_i C_i + s_i H, all i with one
/// challenge e: T1_i = a_i B + b_i H, T2_i = a_i C_i + c_i H, z1 = a + e x, z2 = b + e r,
/// z3 = c + e s. Checks: z1_i B + z2_i H = T1_i + e C_i and z1_i C_i + z3_i H = T2_i + e C2_i.
template <class G>
struct square_proof {
  std::vector<typename G::point> T1, T2;
  std::vector<typename G::scalar> z1, z2, z3;
};

template <class G>
struct norm_proof {
  std::vector<typename G::point> C, C2;  ///< commitments to x_i and to x_i²
  square_proof<G> squares;
  range_proof<G> coordinates;  ///< x_i + 2^(k-1) ∈ [0, 2^k)
  range_proof<G> norm;         ///< B_q² - Σ x_i² ∈ [0, 2^(2k))
  typename G::point K{};       ///< opening: K = k H
  typename G::scalar z{};      ///< opening: z = k + e' Σ ρ^i r_i
};

/// Proves for coordinates given as scalars (x_i mod ℓ, so that a test can commit to (ℓ+1)/2).
/// With `check`, out-of-range coordinates and a norm above the bound throw
/// std::invalid_argument; without, the prover goes on as a cheating one would.
/// `opened` are the integers the opening proof binds (the x_i as the verifier will hold them).
template <class G>
norm_proof<G> prove(const norm_params& p, std::span<const typename G::scalar> x, std::span<const std::int64_t> opened,
                    bool check);

/// Verifies; the reason of the first failed check (empty: verified).
template <class G>
std::string verify(const norm_params& p, const norm_proof<G>& proof, std::span<const std::int64_t> opened);

template <class G>
std::vector<std::uint8_t> encode(const norm_params& p, const norm_proof<G>& proof);
/// Throws std::invalid_argument naming the field that is wrong.
template <class G>
norm_proof<G> decode(const norm_params& p, std::span<const std::uint8_t> bytes);

}  // namespace troupe::federated::zk
