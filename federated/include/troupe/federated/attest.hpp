#pragma once
/// @file
/// Remote attestation of a trusted execution environment: Intel DCAP quotes, SGX (quote
/// version 3) and TDX (quote versions 4 and 5), verified against Intel's collateral with OpenSSL.
///
/// A quote is the enclave's (or trust domain's) report body, signed by an attestation key that
/// the platform's quoting enclave (QE) certified: the QE's own report carries SHA-256(attestation
/// key || QE authentication data) in its report data and is signed by the platform's PCK key,
/// whose certificate chains to Intel's SGX Root CA. The collateral (Intel's PCS answers at some
/// moment: CRLs, the TCB info of the platform's FMSPC, the QE identity, each signed by Intel's
/// TCB signing key) says whether the platform's firmware and the QE are current. verify_quote
/// checks, in this order, and stops at the first step that fails (see `verify_step`):
///
///   crls                the root CA CRL and the PCK CRL: signed by their issuers (chained to
///                       the pinned root), current at the given time
///   pck_chain           the quote's PCK certificate chain to the pinned root, no certificate
///                       revoked, all valid at the given time
///   tcb_info            its issuer chain, its ECDSA signature over the exact JSON bytes of its
///                       body, its issueDate..nextUpdate window, its id, FMSPC and PCE-ID
///   qe_identity         the same for the QE identity
///   qe_report_signature the QE report signed by the PCK certificate's key
///   attestation_key     QE report data == SHA-256(attestation key || QE auth data) || 32 zeros
///   quote_signature     header || report body signed by the attestation key
///   qe_tcb              the QE report against the QE identity (MRSIGNER, ISVPRODID, masked
///                       MISCSELECT and ATTRIBUTES, the ISVSVN level): the QE's TCB status
///   tcb_status          the platform's TCB level (the PCK certificate's 16 SGX TCB components
///                       and PCESVN; for TDX also the TEE TCB SVN and the TDX module identity),
///                       converged with the QE's status as Intel's verifier does; Revoked, or
///                       no level that matches, fails
///   policy              check_policy below
///
/// The trust anchor is pinned: the root of every chain must be a self-signed certificate whose
/// public key (SubjectPublicKeyInfo) hashes to `policy::root_key_sha256`, by default Intel's SGX
/// Root CA. Nothing in the quote or the collateral can substitute another root.
///
///   auto q = dcap::parse_quote(bytes);                       // std::invalid_argument if malformed
///   auto c = dcap::parse_collateral(json_text);
///   auto v = dcap::verify_quote(q, c, dcap::parse_time("2025-07-01T00:00:00Z"), {});
///   if (v.ok()) use(v.tcb_status, v.measurement);

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::federated::dcap {

using bytes = std::vector<std::uint8_t>;

enum class tee_kind { sgx, tdx };
const char* to_string(tee_kind t) noexcept;

/// The 48-byte quote header (little-endian fields).
struct quote_header {
  std::uint16_t version = 0;               ///< 3 (SGX), 4 or 5 (SGX or TDX)
  std::uint16_t attestation_key_type = 0;  ///< 2: ECDSA P-256 (the only one accepted)
  std::uint32_t tee_type = 0;              ///< 0x00 SGX, 0x81 TDX (version 4; 0 in version 3)
  std::uint16_t qe_svn = 0, pce_svn = 0;
  std::array<std::uint8_t, 16> qe_vendor_id{};
  std::array<std::uint8_t, 20> user_data{};
};

/// An SGX enclave report body (384 bytes): the quoted enclave's, and the QE's own report.
struct enclave_report {
  std::array<std::uint8_t, 16> cpu_svn{};
  std::uint32_t misc_select = 0;
  std::array<std::uint8_t, 16> attributes{};  ///< flags (bit 1: DEBUG) then XFRM, little-endian
  std::array<std::uint8_t, 32> mr_enclave{}, mr_signer{};
  std::uint16_t isv_prod_id = 0, isv_svn = 0;
  std::array<std::uint8_t, 64> report_data{};
};

/// A TDX TD report body: TDX 1.0's 584 bytes, or TDX 1.5's 648 (TEE_TCB_SVN2 and MRSERVICETD
/// added). The TCB is matched on TEE_TCB_SVN in both.
struct td_report {
  std::array<std::uint8_t, 16> tee_tcb_svn{};
  std::array<std::uint8_t, 48> mr_seam{}, mr_signer_seam{};
  std::array<std::uint8_t, 8> seam_attributes{}, td_attributes{}, xfam{};  ///< td_attributes bit 0: DEBUG
  std::array<std::uint8_t, 48> mr_td{}, mr_config_id{}, mr_owner{}, mr_owner_config{};
  std::array<std::array<std::uint8_t, 48>, 4> rtmr{};
  std::array<std::uint8_t, 64> report_data{};
  bool td15 = false;  ///< a TDX 1.5 TD report (quote version 5, body type 3): the two fields below
  std::array<std::uint8_t, 16> tee_tcb_svn2{};
  std::array<std::uint8_t, 48> mr_servicetd{};
};

/// A parsed quote. Every field was read with bounds checks; nothing here is verified yet.
struct quote {
  tee_kind tee = tee_kind::sgx;
  quote_header header;
  enclave_report enclave;  ///< the quoted enclave (SGX)
  td_report td;            ///< the quoted trust domain (TDX)
  bytes signed_part;       ///< header || (version 5: body type and size ||) report body: what the quote signature covers
  std::array<std::uint8_t, 64> signature{};        ///< ECDSA P-256, raw r || s (big-endian)
  std::array<std::uint8_t, 64> attestation_key{};  ///< P-256 point, raw x || y
  enclave_report qe_report;
  bytes qe_report_raw;                             ///< the QE report's 384 bytes, as signed
  std::array<std::uint8_t, 64> qe_report_signature{};
  bytes qe_auth_data;
  std::string pck_chain_pem;  ///< certification data type 5: PCK leaf, intermediate CA, root (PEM)

  /// MRENCLAVE (SGX, 32 bytes) or MRTD (TDX, 48 bytes).
  std::span<const std::uint8_t> measurement() const noexcept;
  /// The 64 bytes the enclave (or trust domain) chose.
  std::span<const std::uint8_t> report_data() const noexcept;
  /// The debug attribute: SGX ATTRIBUTES.DEBUG (bit 1), TDX TD_ATTRIBUTES.DEBUG (bit 0).
  bool debug() const noexcept;
};

/// Parses a version-3 (SGX), version-4 or version-5 (SGX or TDX) ECDSA P-256 quote. Throws
/// std::invalid_argument ("dcap quote: ...", naming the field and offset) for anything else:
/// truncation, an unknown version, key type, TEE type, body type or certification data type,
/// lengths that overrun the quote or leave bytes over. Zero bytes after the signature data (a
/// zero-padded buffer) are dropped; other bytes there are refused.
quote parse_quote(std::span<const std::uint8_t> data);

/// Intel's collateral for one quote, as the PCS serves it: chains in PEM, CRLs in hex-encoded
/// DER (or PEM), the TCB info and QE identity as the exact JSON text that was signed, their
/// signatures as hex raw r || s.
struct collateral {
  std::string pck_crl_issuer_chain, root_ca_crl, pck_crl;
  std::string tcb_info_issuer_chain, tcb_info, tcb_info_signature;
  std::string qe_identity_issuer_chain, qe_identity, qe_identity_signature;
};

/// Reads the collateral from a JSON object with the fields above (snake_case names). Throws
/// std::invalid_argument ("dcap collateral: ...") for malformed JSON or a missing field.
collateral parse_collateral(std::string_view json);

/// Seconds since 1970-01-01T00:00:00Z from an ISO 8601 UTC time, "YYYY-MM-DDTHH:MM:SSZ" (a
/// fraction of a second is accepted and dropped). Throws std::invalid_argument otherwise.
std::int64_t parse_time(std::string_view iso8601);
/// The inverse of parse_time, "YYYY-MM-DDTHH:MM:SSZ".
std::string format_time(std::int64_t seconds);

/// SHA-256 of Intel SGX Root CA's SubjectPublicKeyInfo (DER), the default trust anchor.
extern const std::array<std::uint8_t, 32> intel_sgx_root_key_sha256;

/// What the relying party requires beyond a genuine quote. The verifier chooses `nonce` fresh
/// for each attestation; the enclave only echoes it.
struct policy {
  /// MRENCLAVE (SGX, 32 bytes) or MRTD (TDX, 48 bytes) expected; unset: any.
  std::optional<bytes> measurement;
  /// A quote with the debug attribute set is refused unless this is true.
  bool allow_debug = false;
  /// With both set: report_data[0..32) must equal SHA-256(enclave_key || nonce), the key's
  /// bytes followed by the nonce's (a nonce is exactly 32 bytes, so the split is unambiguous).
  /// The last 32 bytes of report data are not checked. Set both or neither.
  std::optional<bytes> nonce, enclave_key;
  /// TCB statuses accepted as they are; others are still reported (verification::tcb_accepted).
  std::vector<std::string> accepted_tcb_statuses{"UpToDate"};
  /// The pinned root's public key hash (see intel_sgx_root_key_sha256).
  std::array<std::uint8_t, 32> root_key_sha256 = intel_sgx_root_key_sha256;
};

/// Is `s` a TCB status that Intel's collateral defines (the seven named under verification)?
bool known_tcb_status(std::string_view s) noexcept;

/// The steps of verify_quote, in the order they run.
enum class verify_step {
  crls, pck_chain, tcb_info, qe_identity, qe_report_signature, attestation_key, quote_signature,
  qe_tcb, tcb_status, policy,
};
const char* to_string(verify_step s) noexcept;
inline constexpr int verify_step_count = 10;

/// What verify_quote found.
struct verification {
  tee_kind tee = tee_kind::sgx;
  std::vector<verify_step> passed;    ///< the steps that passed, in order
  std::optional<verify_step> failed;  ///< the step that failed, if one did
  std::string error;                  ///< why it failed ("" when none did)
  /// The converged TCB status (UpToDate, SWHardeningNeeded, ConfigurationNeeded,
  /// ConfigurationAndSWHardeningNeeded, OutOfDate, OutOfDateConfigurationNeeded, Revoked), set
  /// once tcb_status ran.
  std::string tcb_status;
  std::string platform_tcb_status, qe_tcb_status, tdx_module_tcb_status;  ///< the parts converged
  std::vector<std::string> advisory_ids;  ///< Intel's advisories named by the matched levels
  std::string tcb_date;                   ///< the matched platform level's tcbDate
  std::string fmspc;                      ///< the platform's FMSPC (hex), from the PCK certificate
  bytes measurement;                      ///< MRENCLAVE or MRTD
  bytes report_data;
  bool debug = false;
  /// tcb_status is in policy::accepted_tcb_statuses.
  bool tcb_accepted = false;
  /// The last second at which the steps that passed still hold for this collateral: the earliest
  /// notAfter of the certificates and nextUpdate of the CRLs, TCB info and QE identity they
  /// checked (a verdict kept past it would outlive its collateral). INT64_MAX when none ran.
  std::int64_t valid_until = std::numeric_limits<std::int64_t>::max();

  /// Every step passed (the TCB status may still be one the policy does not accept).
  bool ok() const noexcept { return !failed; }
};

/// Checks the quote against the collateral as of `at` (seconds since the epoch) and the policy.
/// Never throws for bad input: a malformed certificate, CRL or JSON document fails its step. A
/// malformed policy (see check_policy) is the caller's error: std::invalid_argument, before any
/// step runs.
verification verify_quote(const quote& q, const collateral& c, std::int64_t at, const policy& p = {});

/// The policy step alone (measurement, debug, report data); returns "" when it passes, else why
/// not. Throws std::invalid_argument for a policy that is itself malformed (a nonce that is not
/// 32 bytes, a nonce without a key).
std::string check_policy(const quote& q, const policy& p);

/// Hex (either case) to bytes; std::invalid_argument for odd length or a non-hex character.
bytes from_hex(std::string_view hex);
std::string to_hex(std::span<const std::uint8_t> b);

}  // namespace troupe::federated::dcap
