#pragma once
/// @file
/// Bulletproofs (Bünz, Bootle, Boneh, Poelstra, Wuille, Maxwell, IEEE S&P 2018) over a group
/// policy (zk_group.hpp): the Fiat–Shamir transcript, the independent generators, the
/// logarithmic inner-product argument (the paper's Protocol 2 with Protocol 1's reduction) and
/// the aggregated range proof (section 4.3) with its verification as one multi-scalar
/// multiplication (section 6.2). Instantiated for each backend in zk_bulletproofs.cpp.
///
/// Notation: B is the group's standard generator (values), H the blinding generator, g_i and h_i
/// the vector generators; a Pedersen commitment to v with blinding γ is V = v B + γ H.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "zk_group.hpp"

namespace troupe::federated::zk {

/// A Fiat–Shamir transcript: SHA-512 over every public value appended, each with its label and
/// both lengths, so that no two different sequences of (label, value) hash alike. A challenge
/// hashes a copy of the state with its label; the 64 bytes drawn are appended back, so that the
/// next challenge depends on every earlier one.
class transcript {
public:
  explicit transcript(std::string_view protocol);
  void append(std::string_view label, std::span<const std::uint8_t> bytes);
  void append_u64(std::string_view label, std::uint64_t v);
  std::array<std::uint8_t, 64> challenge_bytes(std::string_view label);

  template <class G>
  void append_point(std::string_view label, const typename G::point& p) {
    const auto b = G::encode(p);
    append(label, b);
  }
  template <class G>
  void append_scalar(std::string_view label, const typename G::scalar& s) {
    const auto b = G::encode(s);
    append(label, b);
  }
  /// A challenge scalar, uniform mod ℓ (64 bytes reduced); never zero (a zero draw, of
  /// probability 2^-252, is drawn again).
  template <class G>
  typename G::scalar challenge(std::string_view label) {
    for (;;) {
      const auto wide = challenge_bytes(label);
      auto s = G::from_uniform(std::span<const std::uint8_t, 64>(wide));
      if (!G::is_zero(s)) return s;
    }
  }

private:
  alignas(64) std::array<std::uint8_t, 256> state_{};  // crypto_hash_sha512_state (208 bytes)
};

/// The generators: B (the group's standard one), H = hash_to_point("troupe.zk.H"), and
/// g_i = hash_to_point("troupe.zk.g", i), h_i = hash_to_point("troupe.zk.h", i) (i as 8 bytes,
/// little-endian). Nobody knows a discrete-logarithm relation among them. The vectors are made
/// once per process and grown on demand (thread-safe); a snapshot stays valid while held.
template <class G>
struct generators {
  typename G::point B, H;
  std::shared_ptr<const std::vector<typename G::point>> g, h;  ///< at least the n asked for
  static generators get(std::size_t n);
};

/// The inner-product argument's proof: log2(n) pairs (L_j, R_j) and the final scalars a, b.
template <class G>
struct ipa_proof {
  std::vector<typename G::point> L, R;
  typename G::scalar a{}, b{};
};

/// Proves knowledge of a, b (n a power of two) with P = <a, g> + <b, h'> + <a, b> U, where
/// h'_i = h_factor_i h_i (h_factor empty: all ones). Consumes the vectors.
///
/// `delayed`: how many rounds at a time leave the generators unfolded, computing L and R as MSMs
/// over the unfolded generators with the folds' coefficients, then folding those rounds at once
/// (one MSM of 2^delayed generators per folded one); 0 folds every round; -1 lets the policy
/// choose (libsodium, whose MSM is a loop of products: 0; r255: 4 while n >= 64). The proof is
/// the same whatever the choice (the prover draws nothing here): only the cost differs.
template <class G>
ipa_proof<G> ipa_prove(transcript& t, std::vector<typename G::point> g, std::vector<typename G::point> h,
                       std::vector<typename G::scalar> h_factor, const typename G::point& U,
                       std::vector<typename G::scalar> a, std::vector<typename G::scalar> b, int delayed = -1);

/// The challenges u_j of a proof of length n (appending L_j, R_j as the prover did), and the
/// verifier's coefficients: s_i = Π_j u_j^(±1) (+1 where bit log2(n)-1-j of i is set), so that
/// the folded generators are <s, g> and <s^-1, h>. Throws std::invalid_argument when the proof
/// has not log2(n) rounds.
template <class G>
struct ipa_coefficients {
  std::vector<typename G::scalar> u, u_inv, s, s_inv;
};
template <class G>
ipa_coefficients<G> ipa_challenges(transcript& t, std::size_t n, const ipa_proof<G>& proof);

/// Checks the argument alone (for its tests): P + Σ (u_j² L_j + u_j^-2 R_j) =
/// a <s, g> + b <s^-1, h> + a b U, as one multi-scalar multiplication.
template <class G>
bool ipa_verify(transcript& t, std::span<const typename G::point> g, std::span<const typename G::point> h,
                const typename G::point& U, const typename G::point& P, const ipa_proof<G>& proof);

/// The aggregated range proof of m values of n bits each.
template <class G>
struct range_proof {
  typename G::point A{}, S{}, T1{}, T2{};
  typename G::scalar tau_x{}, mu{}, t_hat{};
  ipa_proof<G> ipa;
};

/// Rounds of the inner-product argument in a range proof of m values of n bits (m padded to a
/// power of two).
std::size_t range_rounds(std::size_t n, std::size_t m);

/// Proves that each V_j + offset B (j < m) commits to a value in [0, 2^n): `v` holds those
/// values (v_j = the committed value + offset) and `gamma` the blindings of V_j. n is a power of
/// two from 1 to 64; m is padded to a power of two with commitments to 0 (the identity), which
/// the verifier pads alike. With `check`, a value that is not below 2^n throws
/// std::invalid_argument; without it, its low n bits are proved, and the proof fails (what a
/// cheating prover can do; for tests and for the attacks of the simulation).
template <class G>
range_proof<G> range_prove(transcript& t, std::size_t n, std::span<const typename G::point> V,
                           const typename G::scalar& offset, std::span<const typename G::scalar> v,
                           std::span<const typename G::scalar> gamma, bool check = true);

/// Checks a range proof as one multi-scalar multiplication: the relation
/// t̂ B + τ_x H = δ(y, z) B + Σ z^(2+j) V'_j + x T1 + x² T2 (weighted by a random c of the
/// verifier's) together with the inner-product argument's equation. False for a proof that
/// fails; throws std::invalid_argument for one of the wrong shape.
template <class G>
bool range_verify(transcript& t, std::size_t n, std::span<const typename G::point> V, const typename G::scalar& offset,
                  const range_proof<G>& proof);

}  // namespace troupe::federated::zk
