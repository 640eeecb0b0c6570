#pragma once
// Quotes laid out by hand in the DCAP formats (versions 3, 4 and 5; SGX and TDX bodies), with
// every field a known pattern: what the parser's tests read back, and the fuzzer's seeds. They
// carry no valid signature or certificate; only the layout is real.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::federated::dcap::synthetic {

inline void put16(std::vector<std::uint8_t>& b, std::uint16_t v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}
inline void put32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
// n bytes i, i+1, ... (mod 256): each field distinguishable from its neighbours.
inline void pattern(std::vector<std::uint8_t>& b, std::size_t n, std::uint8_t first) {
  for (std::size_t i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(first + i));
}

inline const std::string& dummy_pem() {
  static const std::string pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  return pem;
}

/// The QE part: QE report (pattern from 0x40), its signature (0x50), `auth` bytes of QE
/// authentication data (0x60), then certification data type 5 holding `pem`.
inline std::vector<std::uint8_t> qe_part(std::size_t auth, const std::string& pem) {
  std::vector<std::uint8_t> b;
  pattern(b, 384, 0x40);
  pattern(b, 64, 0x50);
  put16(b, static_cast<std::uint16_t>(auth));
  pattern(b, auth, 0x60);
  put16(b, 5);
  put32(b, static_cast<std::uint32_t>(pem.size()));
  b.insert(b.end(), pem.begin(), pem.end());
  return b;
}

/// A whole quote. `tdx` picks the TD report body (TDX 1.5's with version 5 when `td15`).
/// Header: version, key type 2, TEE type, QE SVN 7, PCE SVN 9, vendor ID (0x10...), user data
/// (0x20...). Body: a pattern from 0x30. Signature (0x70...), attestation key (0x80...).
inline std::vector<std::uint8_t> quote(std::uint16_t version, bool tdx, bool td15 = false, std::size_t auth = 32,
                                       const std::string& pem = dummy_pem()) {
  std::vector<std::uint8_t> b;
  put16(b, version);
  put16(b, 2);
  put32(b, tdx ? 0x81 : 0);
  put16(b, 7);
  put16(b, 9);
  pattern(b, 16, 0x10);
  pattern(b, 20, 0x20);
  const std::size_t body = tdx ? (td15 ? 648 : 584) : 384;
  if (version == 5) {
    put16(b, tdx ? (td15 ? 3 : 2) : 1);
    put32(b, static_cast<std::uint32_t>(body));
  }
  pattern(b, body, 0x30);
  std::vector<std::uint8_t> sig;
  pattern(sig, 64, 0x70);
  pattern(sig, 64, 0x80);
  const auto qe = qe_part(auth, pem);
  if (version == 3) {
    sig.insert(sig.end(), qe.begin(), qe.end());
  } else {
    put16(sig, 6);
    put32(sig, static_cast<std::uint32_t>(qe.size()));
    sig.insert(sig.end(), qe.begin(), qe.end());
  }
  put32(b, static_cast<std::uint32_t>(sig.size()));
  b.insert(b.end(), sig.begin(), sig.end());
  return b;
}

}  // namespace troupe::federated::dcap::synthetic
