#pragma once
// The collateral's JSON documents read against a quote: the TCB info's header and the TCB level
// that the platform matches, the QE identity and the QE's level, and the convergence of their
// statuses into one. Each function throws std::runtime_error with the reason when it fails.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/federated/attest.hpp"

namespace troupe::federated::dcap::detail {

/// What the PCK certificate's SGX extensions (OID 1.2.840.113741.1.13.1) say of the platform.
struct pck_extensions {
  std::array<std::uint8_t, 16> tcb_components{};  ///< SGX TCB component SVNs 1..16
  std::uint32_t pcesvn = 0;
  std::array<std::uint8_t, 16> cpusvn{};
  bytes pce_id;  ///< 2 bytes
  bytes fmspc;   ///< 6 bytes
};

/// One matched level: its status, date and advisories.
struct tcb_level {
  std::string status, date;
  std::vector<std::string> advisory_ids;
};

/// A signed collateral document's header: the id expected for the quote's TEE ("SGX"/"TDX" for
/// TCB info, "QE"/"TD_QE" for the QE identity), a supported version and a window holding `at`.
/// Returns its nextUpdate (seconds since the epoch).
std::int64_t check_document(std::string_view json, const char* what, const std::string& expected_id, std::int64_t at);

/// The TCB info's FMSPC and PCE-ID against the PCK certificate's.
void check_tcb_info_platform(std::string_view tcb_info, const pck_extensions& pck);

/// The first TCB level (in the document's order, newest first) whose SGX components and PCESVN
/// the PCK certificate meets, and for TDX whose TDX components the TEE TCB SVN meets (from the
/// third component when the TDX module's major version, TEE_TCB_SVN[1], is not 0).
tcb_level match_platform_tcb(std::string_view tcb_info, const quote& q, const pck_extensions& pck);

/// TDX only: the TDX module's identity (TDX_<major version>; or the tdxModule entry when the major
/// version is 0) against MRSIGNERSEAM and SEAMATTRIBUTES, and its level from TEE_TCB_SVN[0].
tcb_level match_tdx_module(std::string_view tcb_info, const quote& q);

/// The QE report against the QE identity (MRSIGNER, ISVPRODID, masked MISCSELECT and ATTRIBUTES)
/// and the QE's level by ISVSVN: the first level at or below it, Revoked when none is (as Intel's
/// verifier does).
tcb_level match_qe_identity(std::string_view qe_identity, const enclave_report& qe);

/// The platform's status converged with the QE's and (TDX) the module's, as Intel's Quote
/// Verification Library does: an OutOfDate QE or module makes UpToDate/SWHardeningNeeded
/// OutOfDate and the ConfigurationNeeded statuses OutOfDateConfigurationNeeded; Revoked wins.
std::string converge_status(const std::string& platform, const std::string& other);

/// Is `s` one of the statuses Intel's TCB info defines?
bool known_status(std::string_view s) noexcept;

}  // namespace troupe::federated::dcap::detail
