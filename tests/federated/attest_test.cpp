// DCAP quote verification on real recorded quotes (SGX v3, TDX v4, TDX v5) and their collateral:
// they verify inside their window and not outside it; a flipped byte in any region of a quote or
// of its collateral fails at that region's step; the policy's checks. The recorded data lives
// outside the tree (TROUPE_DCAP_DATA, else the CMake cache's TROUPE_DCAP_DATA_DIR, by default
// ../shared/data/dcap): these tests skip when it is absent.

#include <gtest/gtest.h>

#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support.hpp"
#include "troupe/federated/attest.hpp"

#ifndef TROUPE_DCAP_DATA_DIR
#define TROUPE_DCAP_DATA_DIR "../shared/data/dcap"
#endif

namespace troupe::federated::dcap {
namespace {

using test_support::expect_error;

std::string data_dir() {
  if (const char* e = std::getenv("TROUPE_DCAP_DATA"); e != nullptr && *e != 0) return e;
  return TROUPE_DCAP_DATA_DIR;
}

#define REQUIRE_DCAP_DATA()                                                                                          \
  if (!std::filesystem::exists(data_dir() + "/sgx_quote_collateral.json"))                                           \
  GTEST_SKIP() << "no recorded DCAP quotes at " << data_dir() << " (set TROUPE_DCAP_DATA or -DTROUPE_DCAP_DATA_DIR)"

std::string slurp(const std::string& name) {
  std::ifstream in(data_dir() + "/" + name, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct recorded {
  std::string name;
  bytes raw;
  collateral c;
  std::int64_t at;  // inside every window of its collateral
};

recorded load(const std::string& name, const char* at) {
  const auto raw = slurp(name);
  return {name, bytes(raw.begin(), raw.end()), parse_collateral(slurp(name + "_collateral.json")), parse_time(at)};
}
recorded sgx() { return load("sgx_quote", "2025-07-01T00:00:00Z"); }
recorded tdx() { return load("tdx_quote", "2025-07-01T00:00:00Z"); }
recorded tdx_outdated() { return load("tdx_quote_outdated", "2026-03-01T00:00:00Z"); }

verification run(const bytes& raw, const collateral& c, std::int64_t at, const policy& p = {}) {
  return verify_quote(parse_quote(raw), c, at, p);
}

std::string failed_step(const verification& v) { return v.failed ? to_string(*v.failed) : "none"; }

TEST(DcapVerify, TheRecordedSgxQuoteVerifies) {
  REQUIRE_DCAP_DATA();
  const auto r = sgx();
  const auto v = run(r.raw, r.c, r.at);
  ASSERT_TRUE(v.ok()) << failed_step(v) << ": " << v.error;
  EXPECT_EQ(v.passed.size(), static_cast<std::size_t>(verify_step_count));
  EXPECT_EQ(v.tee, tee_kind::sgx);
  // The platform needs a configuration change and software hardening (Intel's TCB info says so of
  // its level); the QE is current.
  EXPECT_EQ(v.tcb_status, "ConfigurationAndSWHardeningNeeded");
  EXPECT_EQ(v.qe_tcb_status, "UpToDate");
  EXPECT_EQ(v.advisory_ids, (std::vector<std::string>{"INTEL-SA-00289", "INTEL-SA-00615"}));
  EXPECT_EQ(v.fmspc, "00a067110000");
  EXPECT_EQ(to_hex(v.measurement), "33d8736db756ed4997e04ba358d27833188f1932ff7b1d156904d3f560452fbb");
  EXPECT_FALSE(v.debug);
  EXPECT_FALSE(v.tcb_accepted);  // only UpToDate by default
  policy p;
  p.accepted_tcb_statuses = {"UpToDate", "ConfigurationAndSWHardeningNeeded"};
  EXPECT_TRUE(run(r.raw, r.c, r.at, p).tcb_accepted);
}

TEST(DcapVerify, TheRecordedTdxQuoteVerifiesUpToDate) {
  REQUIRE_DCAP_DATA();
  const auto r = tdx();
  const auto v = run(r.raw, r.c, r.at);
  ASSERT_TRUE(v.ok()) << failed_step(v) << ": " << v.error;
  EXPECT_EQ(v.tee, tee_kind::tdx);
  EXPECT_EQ(v.tcb_status, "UpToDate");
  EXPECT_EQ(v.platform_tcb_status, "UpToDate");
  EXPECT_EQ(v.tdx_module_tcb_status, "UpToDate");
  EXPECT_TRUE(v.advisory_ids.empty());
  EXPECT_TRUE(v.tcb_accepted);
  EXPECT_EQ(v.measurement.size(), 48u);
}

// The "outdated" recording's platform is below every TCB level of its TCB info by Intel's rule
// (each SGX component at least the level's): its SEAMLDR ACM component is 3, every level asks for
// 5. Intel's verifier calls this TCB_NOT_SUPPORTED; so does this one. (A lexicographic comparison
// of the 16 components, which some verifiers use, would match the second level, OutOfDate.)
TEST(DcapVerify, TheRecordedOutdatedTdxQuoteIsBelowEveryTcbLevel) {
  REQUIRE_DCAP_DATA();
  const auto r = tdx_outdated();
  const auto q = parse_quote(r.raw);
  EXPECT_EQ(q.header.version, 5);
  EXPECT_TRUE(q.td.td15);
  const auto v = verify_quote(q, r.c, r.at);
  ASSERT_EQ(failed_step(v), "tcb_status") << v.error;
  EXPECT_NE(v.error.find("TCB level not supported"), std::string::npos) << v.error;
  EXPECT_NE(v.error.find("SGX component 8 is 3 < 5"), std::string::npos) << v.error;
  EXPECT_EQ(v.passed.size(), static_cast<std::size_t>(verify_step_count - 2));  // all before tcb_status
  EXPECT_EQ(v.qe_tcb_status, "UpToDate");
  EXPECT_EQ(v.tdx_module_tcb_status, "UpToDate");
  EXPECT_TRUE(v.tcb_status.empty());
}

TEST(DcapVerify, OutsideTheCollateralsWindowItFailsAtTheValidityStep) {
  REQUIRE_DCAP_DATA();
  const auto r = sgx();
  // After the PCK CRL's nextUpdate (2025-07-19T10:23:18Z).
  auto v = run(r.raw, r.c, parse_time("2025-07-20T00:00:00Z"));
  EXPECT_EQ(failed_step(v), "crls");
  EXPECT_NE(v.error.find("the PCK CRL is valid from 2025-06-19T10:23:18Z to 2025-07-19T10:23:18Z"), std::string::npos) << v.error;
  // Before the PCK CRL was issued.
  EXPECT_EQ(failed_step(run(r.raw, r.c, parse_time("2025-06-01T00:00:00Z"))), "crls");
  // The CRLs are current but the TCB info (issued 10:56:11) is not yet.
  v = run(r.raw, r.c, parse_time("2025-06-19T10:30:00Z"));
  EXPECT_EQ(failed_step(v), "tcb_info");
  EXPECT_NE(v.error.find("the TCB info is valid from 2025-06-19T10:56:11Z"), std::string::npos) << v.error;
  // The TDX collateral from 2026 at a time in 2025, and the reverse.
  EXPECT_EQ(failed_step(run(tdx().raw, tdx_outdated().c, parse_time("2025-07-01T00:00:00Z"))), "crls");
  EXPECT_EQ(failed_step(run(tdx().raw, tdx().c, parse_time("2026-03-01T00:00:00Z"))), "crls");
}

TEST(DcapVerify, CollateralOfAnotherPlatformIsRefused) {
  REQUIRE_DCAP_DATA();
  // Another FMSPC: the TCB info is not this platform's.
  auto v = run(tdx().raw, tdx_outdated().c, tdx_outdated().at);
  EXPECT_EQ(failed_step(v), "tcb_info");
  EXPECT_NE(v.error.find("is for FMSPC 90C06F000000, the PCK certificate's is B0C06F000000"), std::string::npos) << v.error;
  // The SGX quote's PCK certificate is issued by the Processor CA: the Platform CA's CRL does not cover it.
  v = run(sgx().raw, tdx().c, tdx().at);
  EXPECT_EQ(failed_step(v), "pck_chain");
  EXPECT_NE(v.error.find("unable to get certificate CRL"), std::string::npos) << v.error;
}

TEST(DcapVerify, OnlyThePinnedRootIsTrusted) {
  REQUIRE_DCAP_DATA();
  const auto r = tdx();
  policy p;
  p.root_key_sha256[0] ^= 1;
  const auto v = run(r.raw, r.c, r.at, p);
  EXPECT_EQ(failed_step(v), "crls");
  EXPECT_NE(v.error.find("whose key is not the pinned root's"), std::string::npos) << v.error;
}

// Where each region of a quote starts, from its parsed layout.
struct regions {
  std::size_t body, signature, key, qe_report, qe_signature, auth, pem, end;
};
regions regions_of(const quote& q) {
  regions g{};
  g.body = q.header.version == 5 ? 54 : 48;
  g.signature = q.signed_part.size() + 4;
  g.key = g.signature + 64;
  g.qe_report = g.key + 64 + (q.header.version >= 4 ? 6 : 0);
  g.qe_signature = g.qe_report + 384;
  g.auth = g.qe_signature + 64 + 2;
  g.pem = g.auth + q.qe_auth_data.size() + 6;
  g.end = g.pem + q.pck_chain_pem.size();
  return g;
}

TEST(DcapVerify, AFlippedByteInEachRegionOfTheQuoteFailsAtItsStep) {
  REQUIRE_DCAP_DATA();
  for (const auto& r : {sgx(), tdx()}) {
    SCOPED_TRACE(r.name);
    const auto q = parse_quote(r.raw);
    const auto g = regions_of(q);
    const std::size_t report_data = g.body + (q.tee == tee_kind::tdx ? 520 : 320);
    // The PEM's 300th character is inside the PCK certificate's base64: a letter, changed in case.
    ASSERT_TRUE(std::isalpha(r.raw[g.pem + 300]));
    const struct {
      const char* region;
      std::size_t at;
      std::uint8_t mask;
      const char* step;
    } cases[] = {
        {"header (user data)", 40, 0x01, "quote_signature"},
        {"header (QE SVN)", 8, 0x01, "quote_signature"},
        {"report body (measurement)", g.body + (q.tee == tee_kind::tdx ? 136 : 64), 0x01, "quote_signature"},
        {"report body (report data)", report_data, 0x80, "quote_signature"},
        {"quote signature", g.signature + 40, 0x01, "quote_signature"},
        {"attestation key", g.key + 5, 0x01, "attestation_key"},
        {"QE report", g.qe_report + 100, 0x01, "qe_report_signature"},
        {"QE report data", g.qe_report + 320, 0x01, "qe_report_signature"},
        {"QE report signature", g.qe_signature + 10, 0x01, "qe_report_signature"},
        {"QE authentication data", g.auth + 3, 0x01, "attestation_key"},
        {"PCK certificate chain", g.pem + 300, 0x20, "pck_chain"},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE(c.region);
      auto b = r.raw;
      b[c.at] ^= c.mask;
      const auto v = run(b, r.c, r.at);
      EXPECT_EQ(failed_step(v), c.step) << v.error;
    }
    // The layout's own fields: refused as malformed before any check.
    for (std::size_t at : {std::size_t{0}, std::size_t{2}, std::size_t{4}, g.signature - 4, g.auth - 2, g.pem - 6}) {
      auto b = r.raw;
      b[at] ^= 0x04;
      EXPECT_THROW((void)parse_quote(b), std::invalid_argument) << "byte " << at;
    }
  }
}

// A flipped bit at every 23rd byte of each recorded quote (every byte when TROUPE_DCAP_SWEEP_ALL
// is set): none verifies, and each fails at the step of its region (or is refused as malformed).
TEST(DcapVerify, NoFlippedByteAnywhereVerifies) {
  REQUIRE_DCAP_DATA();
  const std::size_t stride = std::getenv("TROUPE_DCAP_SWEEP_ALL") ? 1 : 23;
  for (const auto& r : {sgx(), tdx(), tdx_outdated()}) {
    SCOPED_TRACE(r.name);
    const auto g = regions_of(parse_quote(r.raw));
    auto expected = [&](std::size_t at) -> std::set<std::string> {
      if (at < g.body) return {"malformed", "quote_signature"};  // header (v5: and the body's type and size)
      if (at < g.signature - 4) return {"quote_signature"};
      if (at < g.signature) return {"malformed"};
      if (at < g.key) return {"quote_signature"};
      if (at < g.key + 64) return {"attestation_key"};
      if (at < g.qe_report) return {"malformed"};
      if (at < g.qe_signature + 64) return {"qe_report_signature"};
      if (at < g.auth) return {"malformed"};
      if (at < g.pem - 6) return {"attestation_key"};
      if (at < g.pem) return {"malformed"};
      if (at < g.end) return {"malformed", "pck_chain"};
      return {"malformed"};  // zero padding
    };
    std::map<std::string, int> seen;
    for (std::size_t at = 0; at < r.raw.size(); at += stride) {
      auto b = r.raw;
      b[at] ^= 0x01;
      std::string step;
      try {
        step = failed_step(run(b, r.c, r.at));
      } catch (const std::invalid_argument&) {
        step = "malformed";
      }
      ++seen[step];
      EXPECT_TRUE(expected(at).count(step)) << "byte " << at << " failed at " << step;
    }
    EXPECT_EQ(seen.count("none"), 0u);
  }
}

TEST(DcapVerify, AFlippedByteInTheCollateralFailsAtItsStep) {
  REQUIRE_DCAP_DATA();
  const auto r = tdx();
  auto flip_hex = [](std::string s, std::size_t at) {  // another hex digit, same length
    s[at] = s[at] == '0' ? '1' : '0';
    return s;
  };
  const struct {
    const char* region;
    std::string collateral::*field;
    std::string changed;
    const char* step;
  } cases[] = {
      {"TCB info body (a status)", &collateral::tcb_info, [&] {
         auto s = r.c.tcb_info;
         s.replace(s.find("OutOfDate"), 9, "UpToDate!");
         return s;
       }(), "tcb_info"},
      {"TCB info body (an SVN)", &collateral::tcb_info, [&] {
         auto s = r.c.tcb_info;
         s[s.find("\"svn\":2") + 6] = '1';
         return s;
       }(), "tcb_info"},
      {"TCB info signature", &collateral::tcb_info_signature, flip_hex(r.c.tcb_info_signature, 70), "tcb_info"},
      {"TCB info issuer chain", &collateral::tcb_info_issuer_chain, [&] {
         auto s = r.c.tcb_info_issuer_chain;
         s[400] = s[400] == 'A' ? 'B' : 'A';
         return s;
       }(), "tcb_info"},
      {"QE identity body", &collateral::qe_identity, [&] {
         auto s = r.c.qe_identity;
         s[s.find("\"isvsvn\":") + 9] = '9';
         return s;
       }(), "qe_identity"},
      {"QE identity signature", &collateral::qe_identity_signature, flip_hex(r.c.qe_identity_signature, 3), "qe_identity"},
      {"PCK CRL (its signature)", &collateral::pck_crl, flip_hex(r.c.pck_crl, r.c.pck_crl.size() - 10), "crls"},
      {"PCK CRL (a revoked serial)", &collateral::pck_crl, flip_hex(r.c.pck_crl, 400), "crls"},
      {"root CA CRL", &collateral::root_ca_crl, flip_hex(r.c.root_ca_crl, r.c.root_ca_crl.size() - 20), "crls"},
      {"PCK CRL issuer chain", &collateral::pck_crl_issuer_chain, [&] {
         auto s = r.c.pck_crl_issuer_chain;
         s[500] = s[500] == 'A' ? 'B' : 'A';
         return s;
       }(), "crls"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.region);
    ASSERT_NE(r.c.*c.field, c.changed);
    auto changed = r.c;
    changed.*c.field = c.changed;
    const auto v = run(r.raw, changed, r.at);
    EXPECT_EQ(failed_step(v), c.step) << v.error;
  }
}

std::array<std::uint8_t, 32> sha256_of(const bytes& a, const bytes& b) {
  bytes m = a;
  m.insert(m.end(), b.begin(), b.end());
  std::array<std::uint8_t, 32> h{};
  SHA256(m.data(), m.size(), h.data());
  return h;
}

TEST(DcapPolicy, TheMeasurementMustBeTheExpectedOne) {
  REQUIRE_DCAP_DATA();
  for (const auto& r : {sgx(), tdx()}) {
    SCOPED_TRACE(r.name);
    const auto q = parse_quote(r.raw);
    policy p;
    p.accepted_tcb_statuses = {"UpToDate", "ConfigurationAndSWHardeningNeeded"};
    p.measurement = bytes(q.measurement().begin(), q.measurement().end());
    EXPECT_TRUE(verify_quote(q, r.c, r.at, p).ok());
    (*p.measurement)[7] ^= 1;
    const auto v = verify_quote(q, r.c, r.at, p);
    EXPECT_EQ(failed_step(v), "policy");
    EXPECT_NE(v.error.find(q.tee == tee_kind::tdx ? "MRTD" : "MRENCLAVE"), std::string::npos) << v.error;
    p.measurement->pop_back();
    expect_error<std::invalid_argument>([&] { (void)verify_quote(q, r.c, r.at, p); }, q.tee == tee_kind::tdx ? "has 47 bytes, not the 48 of the TDX quote's" : "has 31 bytes, not the 32 of the SGX quote's");
  }
}

TEST(DcapPolicy, ReportDataMustBeTheHashOfTheEnclaveKeyAndTheVerifiersNonce) {
  REQUIRE_DCAP_DATA();
  const auto r = tdx();
  auto q = parse_quote(r.raw);
  const bytes key = from_hex("04aabbccddeeff00112233445566778899"), nonce(32, 0x5c);
  policy p;
  p.enclave_key = key;
  p.nonce = nonce;
  // The recorded quote's report data is not SHA-256(key || nonce): refused at the policy step.
  auto v = verify_quote(q, r.c, r.at, p);
  EXPECT_EQ(failed_step(v), "policy");
  EXPECT_NE(v.error.find("is not SHA-256(enclave key || nonce)"), std::string::npos) << v.error;
  // The same check on a report that carries it (this changes the signed body, so only the policy
  // step itself is run): key then nonce passes, and any other order, key or nonce does not.
  const auto h = sha256_of(key, nonce);
  std::copy(h.begin(), h.end(), q.td.report_data.begin());
  EXPECT_EQ(check_policy(q, p), "");
  const auto swapped = sha256_of(nonce, key);
  std::copy(swapped.begin(), swapped.end(), q.td.report_data.begin());
  EXPECT_NE(check_policy(q, p), "");
  std::copy(h.begin(), h.end(), q.td.report_data.begin());
  (*p.nonce)[31] ^= 1;
  EXPECT_NE(check_policy(q, p), "");
  (*p.nonce)[31] ^= 1;
  p.enclave_key->push_back(0);
  EXPECT_NE(check_policy(q, p), "");
  // A malformed policy is an error of the caller's.
  p.nonce = bytes(16, 1);
  expect_error<std::invalid_argument>([&] { (void)check_policy(q, p); }, "the nonce has 16 bytes, not 32");
  p.enclave_key.reset();
  expect_error<std::invalid_argument>([&] { (void)check_policy(q, p); }, "needs both the nonce and the enclave key");
}

TEST(DcapPolicy, ADebugEnclaveIsRefusedUnlessAllowed) {
  REQUIRE_DCAP_DATA();
  for (const auto& r : {sgx(), tdx()}) {
    SCOPED_TRACE(r.name);
    auto q = parse_quote(r.raw);
    EXPECT_FALSE(q.debug());
    policy p;
    EXPECT_EQ(check_policy(q, p), "");
    if (q.tee == tee_kind::tdx)
      q.td.td_attributes[0] |= 0x01;
    else
      q.enclave.attributes[0] |= 0x02;
    EXPECT_NE(check_policy(q, p).find("debug mode"), std::string::npos);
    p.allow_debug = true;
    EXPECT_EQ(check_policy(q, p), "");
  }
}

}  // namespace
}  // namespace troupe::federated::dcap
