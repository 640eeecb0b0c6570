#pragma once
/// @file
/// Attested aggregation in a (simulated) enclave: `troupe fedsim --tee sim`.
///
/// The aggregator runs as an enclave actor in a process of its own (a node of the run's actor
/// system). A client is enrolled once per enclave: with the other participants new to it, it
/// draws a fresh 32-byte nonce and the enclave answers one Intel DCAP SGX quote (version 3) for
/// the batch, its report data SHA-256(enclave X25519 key || SHA-256(the batch's nonces)) and its
/// MRENCLAVE the SHA-256 of the enclave's program file; the client verifies it with
/// dcap::verify_quote (attest.hpp: the same code as `troupe attest verify`) and derives a
/// crypto_kx session with the key it verified. Every round each participant draws a fresh nonce
/// and checks the enclave's tag of the round (BLAKE2b keyed by their session's key over the
/// round, its parameters and the nonces), then seals its update under the session's key
/// (AES-256-GCM). The enclave opens the boxes, sums (FedAvg's weighted mean, or DP-FedAvg's
/// clipped sum with Gaussian noise drawn from its own randomness) and releases only the
/// aggregate.
///
/// Simulated: no hardware signs the quotes. sim_platform makes, at run time, a test key chain in
/// Intel's shape (root CA, PCK platform CA, PCK certificate with the SGX extensions, TCB signing
/// certificate, CRLs, TCB info and QE identity, QE report) whose root is not Intel's; clients
/// accept it only when told to (`--tee-root test`), and every output says "tee":"simulated".
///
/// `--tee swtpm` runs the same protocol with a software TPM 2.0 (swtpm) instead: PCR 16 holds
/// the enclave program's hash, extended before the program starts, and one TPM quote a round
/// covers the enclave's key and all the round's nonces (src/tee_tpm.hpp).

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/attest.hpp"

namespace troupe::federated {
class simulation;
struct simulation_options;
}

namespace troupe::federated::tee {

using bytes = std::vector<std::uint8_t>;

/// What an enclave needs to make quotes on a simulated platform: the attestation key (PEM, a
/// P-256 private key) and the bytes of a quote's signature data that follow the quote's own
/// signature (the attestation public key, the QE report certifying it, that report's signature
/// by the PCK key, the QE authentication data and the PCK certificate chain).
struct quoting_material {
  std::string attestation_key_pem;
  bytes qe_part;
};

/// A simulated SGX platform and its "Intel": a P-256 test key chain made with OpenSSL at
/// construction, valid from an hour before `now` to 30 days after. Not thread-safe.
class sim_platform {
public:
  explicit sim_platform(std::int64_t now);
  ~sim_platform();
  sim_platform(const sim_platform&) = delete;
  sim_platform& operator=(const sim_platform&) = delete;

  /// The collateral (CRLs, issuer chains, signed TCB info and QE identity) as
  /// dcap::parse_collateral reads it (JSON).
  std::string collateral_json() const;
  /// SHA-256 of the test root's SubjectPublicKeyInfo: the pin for dcap::policy::root_key_sha256.
  std::array<std::uint8_t, 32> root_key_sha256() const;
  quoting_material material() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Makes SGX quotes (version 3) over enclave reports, signed with the material's attestation
/// key (parsed once: OpenSSL 3's PEM decoder costs more than the signature). Throws
/// std::runtime_error when OpenSSL fails.
class quote_signer {
public:
  explicit quote_signer(quoting_material m);
  ~quote_signer();
  quote_signer(quote_signer&&) noexcept;
  quote_signer& operator=(quote_signer&&) noexcept;
  /// A quote of an enclave with this MRENCLAVE and report data.
  bytes quote(std::span<const std::uint8_t, 32> mr_enclave, std::span<const std::uint8_t, 64> report_data) const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// quote_signer(m).quote(mr_enclave, report_data).
bytes make_quote(const quoting_material& m, std::span<const std::uint8_t, 32> mr_enclave,
                 std::span<const std::uint8_t, 64> report_data);

/// The quote_signature step of dcap::verify_quote alone: the quote's header and body signed by
/// its attestation key, and Intel's QE vendor ID. For a relying party that has verified, with
/// verify_quote, a quote whose every other byte (attestation key, QE report and its signature,
/// certification data) and collateral were the same: what a fresh quote still has to show.
bool quote_signature_verifies(const dcap::quote& q);

/// SHA-256 of a file's bytes (an enclave's measurement: its program file). Throws
/// std::runtime_error when it cannot be read.
std::array<std::uint8_t, 32> file_sha256(const std::string& path);

/// The sealing key of an enclave with measurement `mr_enclave` on a platform whose secret is
/// `platform_secret` (32 bytes): BLAKE2b keyed by the secret over a label and the measurement, as
/// SGX derives MRENCLAVE-policy seal keys from the CPU's fused secret.
std::array<std::uint8_t, 32> seal_key(std::span<const std::uint8_t> platform_secret,
                                      std::span<const std::uint8_t, 32> mr_enclave);
/// XChaCha20-Poly1305 under seal_key: nonce || ciphertext. open_sealed throws
/// std::runtime_error when the box does not open under that key (another measurement, another
/// platform, a changed byte).
bytes seal(std::span<const std::uint8_t, 32> key, std::span<const std::uint8_t> plain);
bytes open_sealed(std::span<const std::uint8_t, 32> key, std::span<const std::uint8_t> box);

/// The memory coordinates an aggregation step touched, in order (what an observer of the
/// enclave's memory accesses learns: Kato et al., VLDB 2023).
using access_trace = std::vector<std::uint32_t>;

/// Writes the dense form of a sparse update into `out` (zeros elsewhere). `index` holds
/// positions below out.size(), or 0xFFFFFFFF for padding (an entry that sets nothing). Plain:
/// one write per entry at its position (the positions leak through the access pattern).
/// Oblivious: every entry touches every coordinate, selecting by a mask, so the addresses touched
/// depend on the lengths only. Both give the same `out`. `trace`, when not null, receives every
/// coordinate read or written. Throws std::invalid_argument for a position out of range or
/// lengths that differ.
void densify(std::span<const std::uint32_t> index, std::span<const float> value, std::span<float> out, bool oblivious,
             access_trace* trace = nullptr);

/// The enclave node's main: joins the head at `head` ("HOST:PORT"; the cluster token from
/// TROUPE_CLUSTER_TOKEN), prints {"node":N} and serves until its standard input closes.
/// Returns the process's exit status.
int run_enclave_node(const std::string& head);

/// Installs --tee's transform and aggregator into `sim` (install_mechanisms calls it). Throws
/// std::invalid_argument for what --tee cannot combine with or a missing --tee-root test.
void install_tee(simulation& sim, const simulation_options& options);

}  // namespace troupe::federated::tee
