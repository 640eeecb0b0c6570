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
/// --tee swtpm's qualifying data: SHA-256(enclave key || SHA-256(the round's nonces, in order)).
std::array<std::uint8_t, 32> batch_qualifying(std::span<const std::uint8_t> enclave_key, const std::vector<bytes>& nonces);
/// Throws std::invalid_argument naming what is wrong (length, magic, kind, a count).
update_payload decode_payload(std::span<const std::uint8_t> plain);

}  // namespace troupe::federated::tee
