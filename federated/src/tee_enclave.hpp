#pragma once
// The simulated enclave's actor (--tee sim): it lives on a node process of its own, holds its
// X25519 key pair (its sessions with the clients), answers one quote per batch of clients it
// enrols, tags each round it opens for each participant, opens the clients' boxes and releases
// only the round's aggregate. Declared here so that the host side (tee_mechanism.cpp)
// and the node (tee_enclave.cpp) share one TROUPE_REMOTE interface.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <string>
#include <vector>

#include <troupe/actors/remote.hpp>

#include "tee_box.hpp"
#include "tee_payload.hpp"
#include "troupe/federated/tee.hpp"
#include "troupe/federated/update.hpp"


namespace troupe::federated {

/// The enclave. Its methods run one at a time (an actor); a box under an id that is not the
/// round's participant's or under another key than its own, a box that does not open under the
/// round's statement, a replayed client, a box of another round, or a weight or value that is
/// not finite fails the round at finish().
class tee_enclave {
public:
  /// `platform_secret`: the simulated CPU's 32-byte sealing secret. `tpm`: "" (DCAP quotes
  /// from the quoting material), or "TCTI|AK_CONTEXT" (--tee swtpm: TPM quotes by that key).
  tee_enclave(std::string attestation_key_pem, std::vector<std::uint8_t> qe_part, std::vector<std::uint8_t> platform_secret,
              std::string tpm);
  /// The enclave's X25519 public key (32 bytes).
  std::vector<std::uint8_t> public_key();
  /// One quote for a batch of clients' 32-byte nonces (their enrolment with this enclave):
  /// report data batch_qualifying(public key, nonces) || 32 zeros.
  std::vector<std::uint8_t> attest(std::vector<std::vector<std::uint8_t>> nonces);
  /// --tee swtpm: one TPM quote of PCR 16 for the round's nonces, its qualifying data
  /// SHA-256(public key || SHA-256(nonce 1 || nonce 2 || ...)): {TPMS_ATTEST, signature}.
  std::vector<std::vector<std::uint8_t>> tpm_quote(std::vector<std::vector<std::uint8_t>> nonces);
  /// Starts a round: `noise_stddev` 0 gives FedAvg's weighted mean; > 0 DP-FedAvg: the clipped
  /// updates' plain sum, N(0, noise_stddev²) noise from the enclave's own randomness on every
  /// coordinate, divided by `divisor` (K). `oblivious`: sparse updates densified obliviously.
  /// `nonces`, `clients`, `keys`: the participants' fresh 32-byte nonces, ids and X25519 keys
  /// (a client's key is pinned at its first round; another later is refused). Each round number
  /// opens once: a round at or below one begun before is refused, whether that one was released
  /// or failed. Returns, for each participant in order, round_tag(its session's key,
  /// round_statement(round, dim, noise_stddev, divisor, oblivious, nonces), its id).
  std::vector<std::vector<std::uint8_t>> begin(std::uint32_t round, std::uint64_t dim, double noise_stddev, double divisor,
                                               bool oblivious, std::vector<std::vector<std::uint8_t>> nonces,
                                               std::vector<std::uint64_t> clients, std::vector<std::vector<std::uint8_t>> keys);
  /// A client's box (tee_box.hpp: its key, then AES-256-GCM under their crypto_kx key, the
  /// associated data SHA-256 of the round's statement). Only the round's participants, under the
  /// key each has in this round, once each, with finite weights and values.
  void add(std::uint64_t client, std::vector<std::byte> sealed);
  /// The aggregate (dim floats); throws when a box failed or nothing was added.
  std::vector<float> finish();
  /// The enclave's state (key pairs, noise key), sealed under its measurement's key.
  std::vector<std::uint8_t> checkpoint();
  /// Restores a checkpoint(); throws when it does not open here (another measurement or platform).
  void restore(std::vector<std::uint8_t> sealed);
  /// Its MRENCLAVE (for tests and logs; clients trust the quote's, never this).
  std::vector<std::uint8_t> measurement();

private:
  std::unique_ptr<tee::quote_signer> signer_;  // null under --tee swtpm
  std::vector<std::uint8_t> platform_secret_;
  std::string tpm_tcti_, tpm_ak_;
  std::array<std::uint8_t, 32> mr_enclave_{}, pk_{}, sk_{}, noise_key_{};
  struct client_key {
    tee::key32 pk{};
    tee::enclave_session keys;
  };
  std::unordered_map<std::uint64_t, client_key> clients_;  // pinned at each client's first round (begin only)
  struct participant {
    std::uint64_t id = 0;
    client_key key;
    bool added = false;
  };
  std::vector<participant> participants_;  // the open round's, from begin()
  std::array<std::uint8_t, 32> statement_digest_{};  // the boxes' associated data this round
  std::uint32_t round_ = 0;
  std::optional<std::uint32_t> last_begun_;  // the highest round begun: each round number opens once
  std::uint64_t dim_ = 0;
  double stddev_ = 0, divisor_ = 1;
  bool oblivious_ = false, open_ = false;
  std::unique_ptr<aggregator> mean_;
  std::vector<double> sum_, draws_;
  std::size_t added_ = 0;
  std::string error_;
  std::vector<float> scratch_;
};

}  // namespace troupe::federated

namespace troupe::federated::tee {
/// Standard normal draws (Box–Muller) from ChaCha20's stream under a 32-byte key
/// (randombytes_buf_deterministic): the enclave's DP noise, under a key only it holds. The same
/// key gives the same draws.
void keyed_normal_draws(std::span<const std::uint8_t, 32> key, std::span<double> out);
}  // namespace troupe::federated::tee

TROUPE_REMOTE(troupe::federated::tee_enclave, public_key, attest, tpm_quote, begin, add, finish, checkpoint, restore, measurement)
