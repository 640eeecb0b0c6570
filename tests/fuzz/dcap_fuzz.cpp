// libFuzzer target for the DCAP attestation decoders (`make fuzz`): the quote parser
// (dcap::parse_quote) and the PCK certificate's SGX extension reader. Hostile bytes must never
// crash or hang; a refusal is std::invalid_argument (the quote) or std::runtime_error (the
// extensions); whatever is accepted must keep the parser's promises (the oracle below).
//
// The first input byte chooses the decoder: even, a quote; odd, the extensions' DER.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>

#include "dcap_pck.hpp"
#include "troupe/federated/attest.hpp"

using namespace troupe::federated::dcap;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "dcap_fuzz: %s\n", what.c_str());
  std::abort();
}

void check_quote(std::span<const std::uint8_t> data) {
  quote q;
  try {
    q = parse_quote(data);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind("dcap quote: ", 0) != 0) broken(std::string("a refusal without its prefix: ") + e.what());
    return;
  }
  const std::size_t body = q.tee == tee_kind::sgx ? 384 : (q.td.td15 ? 648 : 584);
  const std::size_t header = q.header.version == 5 ? 54 : 48;
  if (q.header.version < 3 || q.header.version > 5) broken("an unsupported version accepted");
  if (q.signed_part.size() != header + body) broken("the signed part is not header and body");
  if (!std::equal(q.signed_part.begin(), q.signed_part.end(), data.begin())) broken("the signed part is not the quote's prefix");
  if (q.qe_report_raw.size() != 384) broken("a QE report of another size");
  if (q.pck_chain_pem.rfind("-----BEGIN CERTIFICATE-----", 0) != 0) broken("a PCK chain that does not start with a certificate");
  // The same bytes parse to the same quote, and the zero padding after it changes nothing.
  const auto again = parse_quote(data);
  if (again.signed_part != q.signed_part || again.pck_chain_pem != q.pck_chain_pem || again.qe_auth_data != q.qe_auth_data)
    broken("parsing twice gave two quotes");
}

void check_extensions(std::span<const std::uint8_t> data) {
  try {
    const auto p = troupe::federated::dcap::detail::parse_pck_extensions(data);
    if (p.fmspc.size() != 6 || p.pce_id.size() != 2) broken("an FMSPC or PCE-ID of another size accepted");
    if (p.pcesvn > 65535) broken("a PCESVN beyond 16 bits accepted");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("SGX extensions") == std::string::npos) broken(std::string("an unexplained refusal: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::span<const std::uint8_t> rest(data + 1, size - 1);
  if (data[0] % 2 == 0)
    check_quote(rest);
  else
    check_extensions(rest);
  return 0;
}
