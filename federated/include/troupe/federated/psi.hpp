#pragma once
/// @file
/// Private set intersection of two parties' example IDs: ECDH-PSI on ristretto255
/// (Meadows 1986; Huberman, Franklin and Hogg 1999), honest-but-curious parties.
///
/// Each party hashes its IDs to the group (ristretto::hash_to_element, domain "troupe/psi/v1")
/// and raises them to its secret random scalar; the blinded elements cross in a random order.
/// Each then raises the other's elements to its own scalar and sends them back in the order
/// received. A party now holds H(x)^(ab) for each of its own IDs x (the peer's second message,
/// in the order of its own first) and the set H(y)^(ba) of the peer's (which it computed): the
/// IDs whose doubly blinded element is in that set are the intersection. Under the decisional
/// Diffie-Hellman assumption a party learns the intersection and the size of the other's set,
/// nothing else. The transcript is the four messages, each a run of 32-byte elements.
///
///   psi_party a(ids_a), b(ids_b);
///   auto a1 = a.blinded_ids(), b1 = b.blinded_ids();      // a -> b, b -> a
///   auto a2 = a.blind_peer(b1), b2 = b.blind_peer(a1);    // a -> b, b -> a
///   auto common = a.intersect(b2);                        // == b.intersect(a2)

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/federated/ristretto.hpp"

namespace troupe::federated {

/// One party. Not thread-safe: one thread drives it (its steps use `threads` threads inside).
class psi_party {
public:
  /// `ids`: the party's example IDs; a repeated ID is refused (std::invalid_argument).
  /// `threads`: threads for the group operations (0: one per hardware thread).
  explicit psi_party(std::vector<std::uint64_t> ids, unsigned threads = 0);

  /// First message: the IDs hashed and blinded by this party's scalar, in a random order.
  std::vector<std::byte> blinded_ids();
  /// Second message: the peer's first message with each element blinded again by this party's
  /// scalar, in the order received. Throws std::invalid_argument, changing nothing, for a
  /// message that is not whole 32-byte elements or holds an invalid or repeated element.
  std::vector<std::byte> blind_peer(std::span<const std::byte> peer_first);
  /// The intersection, ascending, from the peer's second message (its blinding of this party's
  /// first). Needs blinded_ids() and blind_peer() first (std::logic_error otherwise); throws
  /// std::invalid_argument for a message of the wrong length or with an invalid element.
  std::vector<std::uint64_t> intersect(std::span<const std::byte> peer_second);

  std::size_t size() const noexcept { return ids_.size(); }
  /// The peer's set size, learned from its first message (0 before).
  std::size_t peer_size() const noexcept { return peer_.size(); }

private:
  std::vector<std::uint64_t> ids_;
  unsigned threads_;
  ristretto::scalar key_;
  std::vector<std::uint32_t> order_;    // order_[i]: the ID sent i-th in the first message
  std::vector<ristretto::element> peer_;  // the peer's elements blinded by both, sorted
  bool sent_ = false, blinded_peer_ = false;
};

/// Both parties of one intersection, run in this process (as a simulation runs them).
struct psi_outcome {
  std::vector<std::uint64_t> intersection;  ///< ascending
  std::size_t size_a = 0, size_b = 0;
  std::size_t transcript_bytes = 0;         ///< the four messages together
  double seconds = 0;                       ///< wall time, both parties' work included
};
psi_outcome run_psi(std::vector<std::uint64_t> ids_a, std::vector<std::uint64_t> ids_b, unsigned threads = 0);

}  // namespace troupe::federated
