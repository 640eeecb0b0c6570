#pragma once
// A sealed update's plaintext (what a client binds to the round and to itself) and --tee
// swtpm's batch of nonces: decoded inside the enclave from bytes a client chose, so kept apart
// from the actor for the fuzzer (tests/fuzz/tee_fuzz.cpp).

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/federated/tee.hpp"

namespace troupe::federated::tee {

/// A sealed update's plaintext: what the client binds to the round and to itself.
///   "TEE1" | u32 round | u64 client | f64 weight | u32 dim | u32 kind (0 dense, 1 sparse) | u32 n
///   | dense: n floats (n = dim) | sparse: n u32 positions (padding 0xFFFFFFFF), then n floats
struct update_payload {
  std::uint32_t round = 0;
  std::uint64_t client = 0;
  double weight = 0;
  std::uint32_t dim = 0;
  bool sparse = false;
  std::vector<std::uint32_t> index;  // sparse only
  std::vector<float> value;
};
bytes encode_payload(const update_payload& p);
/// A decoded payload whose positions and values are the decoded bytes themselves.
struct payload_view {
  std::uint32_t round = 0;
  std::uint64_t client = 0;
  double weight = 0;
  std::uint32_t dim = 0;
  bool sparse = false;
  std::span<const std::uint32_t> index;  // sparse only
  std::span<const float> value;
};
/// The payload's fixed part (36 bytes: through the count `n`), what a client seals before the
/// positions and values without copying them: encode_payload(p) is payload_head(p, n) followed
/// by the positions (sparse) and the values.
std::array<std::uint8_t, 36> payload_head(const update_payload& p, std::uint32_t n);
/// SHA-256(nonce 1 || nonce 2 || ...): a list of 32-byte nonces as one 32-byte nonce.
std::array<std::uint8_t, 32> nonce_list_digest(const std::vector<bytes>& nonces);
/// What the enclave tags for each participant when it opens a round (tee_box.hpp's round_tag)
/// and each client checks before sealing: "troupe tee round v1" | u32 round | u64 dim | f64 noise stddev |
/// f64 divisor | u8 oblivious | nonce_list_digest(the round's nonces, in order).
bytes round_statement(std::uint32_t round, std::uint64_t dim, double noise_stddev, double divisor, bool oblivious,
                      const std::vector<bytes>& nonces);
/// SHA-256(statement): the associated data of every box sealed in that round (tee_box.hpp).
std::array<std::uint8_t, 32> statement_digest(std::span<const std::uint8_t> statement);
/// The report data that binds an enclave's keys to a list of nonces: SHA-256(enclave key ||
/// nonce_list_digest(nonces)), as dcap::check_policy checks it with that digest as the nonce.
/// --tee swtpm's qualifying data (the round's nonces); --tee sim's enrolment quote (the nonces
/// of the clients it enrols).
std::array<std::uint8_t, 32> batch_qualifying(std::span<const std::uint8_t> enclave_key, const std::vector<bytes>& nonces);
/// Throws std::invalid_argument naming what is wrong (length, magic, kind, a count).
update_payload decode_payload(std::span<const std::uint8_t> plain);
/// As decode_payload, without copying the positions and values: the view points into `plain`,
/// which must be 4-byte aligned (throws otherwise) and outlive it. decode_payload is this on an
/// aligned copy, so both accept and refuse the same bytes.
payload_view decode_payload_view(std::span<const std::uint8_t> plain);

}  // namespace troupe::federated::tee
