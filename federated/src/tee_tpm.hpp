#pragma once
// --tee swtpm's TPM 2.0 pieces: the swtpm process with its attestation key and measured PCR 16,
// quotes made with tpm2_quote, and their verification with OpenSSL (see tee_tpm.cpp).

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <sys/types.h>

#include "troupe/federated/tee.hpp"

namespace troupe::federated::tee {

/// A TPM2_Quote's signed TPMS_ATTEST and its ECDSA signature (DER).
struct tpm_quote {
  bytes attest, signature;
};

/// swtpm and tpm2-tools are on the PATH.
bool swtpm_available();

/// PCR 16 after a reset and one extend with `measurement`: SHA-256(32 zeros || measurement).
std::array<std::uint8_t, 32> pcr_after_extend(std::span<const std::uint8_t, 32> measurement);

/// A running swtpm (loopback TCP, state in a temporary directory) with a restricted ECDSA P-256
/// attestation key under the owner hierarchy, PCR 16 reset and extended with `measurement`.
/// Throws std::invalid_argument when swtpm or tpm2-tools are missing, std::runtime_error when a
/// step fails. The process and the directory go with the object.
class swtpm_platform {
public:
  explicit swtpm_platform(std::span<const std::uint8_t, 32> measurement);
  ~swtpm_platform();
  swtpm_platform(const swtpm_platform&) = delete;
  swtpm_platform& operator=(const swtpm_platform&) = delete;

  const std::string& tcti() const noexcept { return tcti_; }
  std::string ak_context() const { return dir_ + "/ak.ctx"; }
  const std::string& ak_pem() const noexcept { return ak_pem_; }

private:
  void start(std::span<const std::uint8_t, 32> measurement);
  void stop() noexcept;  // kills swtpm and removes the directory, whatever start() got to

  std::string dir_, tcti_, ak_pem_;
  pid_t pid_ = -1;
};

/// TPM2_Quote of PCR 16 (SHA-256 bank) with this qualifying data, by the key at `ak_context`.
tpm_quote quote_with_tpm(const std::string& tcti, const std::string& ak_context, std::span<const std::uint8_t, 32> qualifying);

/// "" when `q` is signed by the AK, is a quote of PCR 16 alone in the SHA-256 bank whose
/// digest is that of `expected_pcr16`, carries `qualifying` as its extra data and a safe clock;
/// otherwise why not.
std::string verify_tpm_quote(const tpm_quote& q, const std::string& ak_pem, std::span<const std::uint8_t, 32> qualifying,
                             std::span<const std::uint8_t, 32> expected_pcr16);

/// The TPMS_ATTEST part of verify_tpm_quote alone (its signature already checked): "" or why
/// not. Reads only within `attest` (fuzzed: tests/fuzz/tee_fuzz.cpp).
std::string check_tpm_attest(std::span<const std::uint8_t> attest, std::span<const std::uint8_t, 32> qualifying,
                             std::span<const std::uint8_t, 32> expected_pcr16);

}  // namespace troupe::federated::tee
