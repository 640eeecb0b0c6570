#pragma once
// A client's channel to the enclave: a crypto_kx session between the client's X25519 key pair
// (drawn once, on its first round with this enclave) and the enclave's attested X25519 key, and
// AES-256-GCM boxes under that session's key. Both ends derive the key once; a box costs one
// pass of AES-GCM and no public-key operation.
//
//   box = client public key (32) | nonce (12, random) | AES-256-GCM(plaintext) | tag (16)
//
// The box's associated data (authenticated, not sent) is what it is bound to: for an update, the
// SHA-256 of the round's statement (tee_payload.hpp's round_statement), so that a box opens only
// in the round, with the noise, divisor, setting and nonces, that its client checked.
//
// The nonce is drawn at random for every box: a session key seals one box per round, far below
// the 2^32 boxes a random 96-bit nonce allows under one key.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "troupe/federated/tee.hpp"

namespace troupe::federated::tee {

using key32 = std::array<std::uint8_t, 32>;

inline constexpr std::size_t box_header = 32 + 12, box_tag = 16, box_overhead = box_header + box_tag;

/// A client's end: its key pair, the key it seals with (crypto_kx's client transmit key) and
/// the key the enclave's round tags are under (its receive key).
struct box_sender {
  key32 public_key{}, secret_key{}, rx{}, tx{};
};
/// The enclave's end of a client's session: `rx` opens the client's boxes, `tx` tags its rounds.
struct enclave_session {
  key32 rx{}, tx{};
};
/// Draws the client's key pair and derives its key toward `enclave_key`. Throws
/// std::runtime_error for a key crypto_kx refuses (a low-order point).
box_sender make_sender(const key32& enclave_key);
/// The enclave's keys for a client's public key (crypto_kx's server keys). Throws
/// std::runtime_error for a key crypto_kx refuses.
enclave_session session_with(const key32& enclave_public, const key32& enclave_secret, std::span<const std::uint8_t, 32> client_key);
/// The enclave's tag of a round for one client: BLAKE2b-256 keyed by their session's key (the
/// enclave's tx, the client's rx) over the round's statement and the client's id. Only the
/// holders of that session's key, the client and the enclave whose X25519 key the client
/// derived it with, can make it.
std::array<std::uint8_t, 32> round_tag(const key32& key, std::span<const std::uint8_t> statement, std::uint64_t client);

/// Seals the concatenation of `parts` into `out` (box_overhead + their total length bytes),
/// authenticating `aad` with them.
void seal_box(const box_sender& from, std::span<const std::uint8_t> aad, std::initializer_list<std::span<const std::uint8_t>> parts,
              std::span<std::uint8_t> out);
/// Opens `box` (its first 32 bytes are the sender's key; `rx` that key's session receive key)
/// into `plain` (resized). Returns false when the box is shorter than its overhead or does not
/// open, under this `aad` too.
bool open_box(const key32& rx, std::span<const std::uint8_t> aad, std::span<const std::uint8_t> box, std::vector<std::uint8_t>& plain);
/// As open_box, decrypting in place: on success the plaintext is box[box_header, size - box_tag),
/// returned; on failure an empty span and the ciphertext's bytes are wiped.
std::span<const std::uint8_t> open_box_in_place(const key32& rx, std::span<const std::uint8_t> aad, std::span<std::uint8_t> box);

}  // namespace troupe::federated::tee
