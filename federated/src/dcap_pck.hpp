#pragma once
// The PCK certificate's SGX extensions (OID 1.2.840.113741.1.13.1), read from the extension's
// DER value.

#include <span>

#include "dcap_tcb.hpp"

namespace troupe::federated::dcap::detail {

/// The TCB (16 component SVNs, PCESVN, CPUSVN), PCE-ID and FMSPC; std::runtime_error when one is
/// missing or the DER is malformed.
pck_extensions parse_pck_extensions(std::span<const std::uint8_t> extension_value);

}  // namespace troupe::federated::dcap::detail
