// DCAP quotes as bytes: the three layouts read back field by field from hand-made quotes, and
// malformed bytes (truncations at every length, wrong versions and types, overrunning lengths,
// bytes left over) refused with a message naming what is wrong. Also the ISO 8601 times and hex.

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dcap_synthetic.hpp"
#include "support.hpp"
#include "troupe/federated/attest.hpp"

namespace troupe::federated::dcap {
namespace {

using test_support::expect_error;

quote parse(const std::vector<std::uint8_t>& b) { return parse_quote(b); }

TEST(DcapQuote, ReadsEveryFieldOfAVersion3SgxQuote) {
  const auto bytes = synthetic::quote(3, false);
  const auto q = parse(bytes);
  EXPECT_EQ(q.tee, tee_kind::sgx);
  EXPECT_EQ(q.header.version, 3);
  EXPECT_EQ(q.header.attestation_key_type, 2);
  EXPECT_EQ(q.header.qe_svn, 7);
  EXPECT_EQ(q.header.pce_svn, 9);
  EXPECT_EQ(q.header.qe_vendor_id[0], 0x10);
  EXPECT_EQ(q.header.user_data[19], 0x20 + 19);
  // The body's pattern starts at 0x30 at offset 48: CPUSVN, MISCSELECT at 16, MRENCLAVE at 64 ...
  EXPECT_EQ(q.enclave.cpu_svn[0], 0x30);
  EXPECT_EQ(q.enclave.misc_select, 0x43424140u);  // bytes 0x40..0x43, little-endian
  EXPECT_EQ(q.enclave.attributes[0], static_cast<std::uint8_t>(0x30 + 48));
  EXPECT_EQ(q.enclave.mr_enclave[0], static_cast<std::uint8_t>(0x30 + 64));
  EXPECT_EQ(q.enclave.mr_signer[0], static_cast<std::uint8_t>(0x30 + 128));
  EXPECT_EQ(q.enclave.isv_prod_id, static_cast<std::uint16_t>(((0x30 + 256) & 0xff) | (((0x30 + 257) & 0xff) << 8)));
  EXPECT_EQ(q.enclave.report_data[0], static_cast<std::uint8_t>(0x30 + 320));
  EXPECT_EQ(q.signed_part.size(), 48u + 384u);
  EXPECT_TRUE(std::equal(q.signed_part.begin(), q.signed_part.end(), bytes.begin()));
  EXPECT_EQ(q.signature[0], 0x70);
  EXPECT_EQ(q.attestation_key[63], static_cast<std::uint8_t>(0x80 + 63));
  EXPECT_EQ(q.qe_report_raw.size(), 384u);
  EXPECT_EQ(q.qe_report.cpu_svn[0], 0x40);
  EXPECT_EQ(q.qe_report_signature[0], 0x50);
  EXPECT_EQ(q.qe_auth_data.size(), 32u);
  EXPECT_EQ(q.qe_auth_data[0], 0x60);
  EXPECT_EQ(q.pck_chain_pem, synthetic::dummy_pem());
  EXPECT_EQ(q.measurement().size(), 32u);
}

TEST(DcapQuote, ReadsTheTdReportOfVersion4AndVersion5Quotes) {
  for (std::uint16_t version : {4, 5}) {
    SCOPED_TRACE(version);
    const auto bytes = synthetic::quote(version, true);
    const auto q = parse(bytes);
    const std::size_t body_at = version == 5 ? 54 : 48;
    EXPECT_EQ(q.tee, tee_kind::tdx);
    EXPECT_EQ(q.td.tee_tcb_svn[0], 0x30);
    EXPECT_EQ(q.td.mr_seam[0], 0x30 + 16);
    EXPECT_EQ(q.td.td_attributes[0], 0x30 + 120);
    EXPECT_EQ(q.td.mr_td[0], static_cast<std::uint8_t>(0x30 + 136));
    EXPECT_EQ(q.td.rtmr[3][0], static_cast<std::uint8_t>(0x30 + 472));
    EXPECT_EQ(q.td.report_data[0], static_cast<std::uint8_t>(0x30 + 520));
    EXPECT_FALSE(q.td.td15);
    EXPECT_EQ(q.signed_part.size(), body_at + 584);
    EXPECT_EQ(q.measurement().size(), 48u);
    EXPECT_EQ(q.qe_report.cpu_svn[0], 0x40);
    EXPECT_EQ(q.pck_chain_pem, synthetic::dummy_pem());
  }
  const auto q15 = parse(synthetic::quote(5, true, true));
  EXPECT_TRUE(q15.td.td15);
  EXPECT_EQ(q15.td.tee_tcb_svn2[0], static_cast<std::uint8_t>(0x30 + 584));
  EXPECT_EQ(q15.td.mr_servicetd[0], static_cast<std::uint8_t>(0x30 + 600));
  EXPECT_EQ(q15.signed_part.size(), 54u + 648u);
  const auto sgx5 = parse(synthetic::quote(5, false));
  EXPECT_EQ(sgx5.tee, tee_kind::sgx);
  EXPECT_EQ(sgx5.enclave.mr_enclave[0], static_cast<std::uint8_t>(0x30 + 64));
}

TEST(DcapQuote, TheDebugBitIsReadFromTheRightAttribute) {
  auto sgx = parse(synthetic::quote(3, false));
  sgx.enclave.attributes[0] = 0x02;
  EXPECT_TRUE(sgx.debug());
  sgx.enclave.attributes[0] = 0xfd;
  EXPECT_FALSE(sgx.debug());
  auto tdx = parse(synthetic::quote(4, true));
  tdx.td.td_attributes[0] = 0x01;
  EXPECT_TRUE(tdx.debug());
  tdx.td.td_attributes[0] = 0xfe;
  EXPECT_FALSE(tdx.debug());
}

TEST(DcapQuote, EveryTruncationIsRefusedWithAClearError) {
  for (auto [version, tdx] : {std::pair<int, bool>{3, false}, {4, true}, {5, true}}) {
    const auto bytes = synthetic::quote(static_cast<std::uint16_t>(version), tdx);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      const std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      try {
        (void)parse(cut);
        ADD_FAILURE() << "version " << version << " cut to " << n << " bytes was accepted";
      } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()).rfind("dcap quote: ", 0), 0u) << e.what();
      }
    }
  }
  expect_error<std::invalid_argument>([] { (void)parse({}); }, "header version at offset 0 needs 2 bytes, 0 are left (truncated)");
}

TEST(DcapQuote, RefusesUnsupportedVersionsKeysAndTypes) {
  auto with = [](std::size_t at, std::uint8_t v) {
    auto b = synthetic::quote(4, true);
    b[at] = v;
    return b;
  };
  expect_error<std::invalid_argument>([&] { (void)parse(with(0, 2)); }, "version 2 is not supported");
  expect_error<std::invalid_argument>([&] { (void)parse(with(0, 6)); }, "version 6 is not supported");
  expect_error<std::invalid_argument>([&] { (void)parse(with(2, 3)); }, "attestation key type 3 is not supported");
  expect_error<std::invalid_argument>([&] { (void)parse(with(4, 0x82)); }, "TEE type 130 is neither SGX");
  auto v3_tdx = synthetic::quote(3, false);
  v3_tdx[4] = 0x81;
  expect_error<std::invalid_argument>([&] { (void)parse(v3_tdx); }, "a version-3 quote has TEE type 129");
  // Version 5: the body type must fit the TEE type and its size the type.
  auto v5 = synthetic::quote(5, true);
  v5[48] = 1;
  expect_error<std::invalid_argument>([&] { (void)parse(v5); }, "body type 1 does not fit TEE type 129");
  v5 = synthetic::quote(5, true);
  v5[50] = 0x49;  // 584 -> 585
  expect_error<std::invalid_argument>([&] { (void)parse(v5); }, "body size 585 is not the 584 bytes of body type 2");
}

TEST(DcapQuote, RefusesCertificationDataOtherThanThePckChain) {
  // Version 4's outer certification data must be type 6, the inner one type 5.
  auto b = synthetic::quote(4, true);
  const std::size_t outer = 48 + 584 + 4 + 128;
  b[outer] = 5;
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "version-4 certification data type 5 is not supported");
  b = synthetic::quote(4, true);
  const std::size_t inner = outer + 6 + 384 + 64 + 2 + 32;
  b[inner] = 3;
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "certification data type 3; only type 5");
  // A chain of PEM certificates and line breaks, nothing else: no bytes that no signature covers.
  expect_error<std::invalid_argument>([] { (void)parse(synthetic::quote(3, false, false, 32, "")); },
                                      "holds no PEM certificate");
  expect_error<std::invalid_argument>([] { (void)parse(synthetic::quote(3, false, false, 32, "not a certificate")); },
                                      "bytes outside its PEM certificates, at its byte 0");
  expect_error<std::invalid_argument>(
      [] { (void)parse(synthetic::quote(3, false, false, 32, synthetic::dummy_pem() + "\x01")); },
      "bytes outside its PEM certificates, at its byte 59");
  expect_error<std::invalid_argument>(
      [] { (void)parse(synthetic::quote(3, false, false, 32, "-----BEGIN CERTIFICATE-----\nAAAA\n")); },
      "certificate 1 has no END line");
  // Trailing NULs (some quoting libraries end the chain with one) are not part of it.
  const auto q = parse(synthetic::quote(3, false, false, 32, synthetic::dummy_pem() + std::string(2, '\0')));
  EXPECT_EQ(q.pck_chain_pem, synthetic::dummy_pem());
}

TEST(DcapQuote, RefusesLengthsThatOverrunOrLeaveBytesOver) {
  auto b = synthetic::quote(3, false);
  const std::size_t size_at = 48 + 384;
  b[size_at] = static_cast<std::uint8_t>(b[size_at] + 1);  // one more byte of signature data than there is
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "overruns the");
  // The QE authentication data's size beyond the signature data.
  b = synthetic::quote(3, false);
  b[size_at + 4 + 128 + 384 + 64 + 1] = 0xff;
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "QE authentication data at offset");
  // A version-4 QE report certification data with a byte it does not account for.
  b = synthetic::quote(4, true);
  const std::size_t sig_size = 48 + 584, outer_size = sig_size + 4 + 128 + 2;
  b[outer_size] = static_cast<std::uint8_t>(b[outer_size] + 1);
  b[sig_size] = static_cast<std::uint8_t>(b[sig_size] + 1);
  b.push_back(0);
  // The extra byte is inside the outer certification data now, but the PCK chain's own size ends before it.
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "1 bytes left over in the QE report certification data");
}

TEST(DcapQuote, DropsZeroPaddingAfterTheQuoteButNothingElse) {
  auto b = synthetic::quote(4, true);
  const auto plain = parse(b);
  b.insert(b.end(), 70, 0);
  const auto padded = parse(b);
  EXPECT_EQ(padded.signed_part, plain.signed_part);
  EXPECT_EQ(padded.pck_chain_pem, plain.pck_chain_pem);
  b.back() = 1;
  expect_error<std::invalid_argument>([&] { (void)parse(b); }, "70 bytes after the signature data, not all zero padding");
}

TEST(DcapQuote, RandomBytesAreRefusedNeverCrash) {
  std::mt19937_64 g(7);
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::uint8_t> b(g() % 6000);
    for (auto& x : b) x = static_cast<std::uint8_t>(g());
    // Half of them with a plausible header, so that the parser gets past it.
    if (i % 2 == 0 && b.size() >= 8) {
      b[0] = static_cast<std::uint8_t>(3 + i % 3);
      b[1] = 0;
      b[2] = 2;
      b[3] = 0;
      b[4] = i % 3 == 0 ? 0 : 0x81;
      b[5] = b[6] = b[7] = 0;
    }
    try {
      (void)parse(b);
    } catch (const std::invalid_argument& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()).rfind("dcap quote: ", 0), 0u);
    }
  }
  EXPECT_EQ(refused, 2000);
}

TEST(DcapTime, ParsesIso8601UtcAndRefusesAnythingElse) {
  EXPECT_EQ(parse_time("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_time("2025-07-01T00:00:00Z"), 1751328000);
  EXPECT_EQ(parse_time("2025-06-19T10:56:11Z"), 1750330571);
  EXPECT_EQ(parse_time("2025-06-19T10:56:11.250Z"), 1750330571);
  EXPECT_EQ(parse_time("2024-02-29T12:00:00Z"), 1709208000);
  EXPECT_EQ(format_time(1750330571), "2025-06-19T10:56:11Z");
  for (const char* bad : {"", "2025-07-01", "2025-07-01T00:00:00", "2025-07-01 00:00:00Z", "2025-07-01T00:00:00+02:00",
                          "2025-02-30T00:00:00Z", "2025-13-01T00:00:00Z", "2025-07-01T24:00:00Z", "2025-07-01T00:00:00.Z",
                          "2025-07-01T00:00:00ZZ", "20x5-07-01T00:00:00Z"})
    expect_error<std::invalid_argument>([&] { (void)parse_time(bad); }, "is not an ISO 8601 UTC time");
}

TEST(DcapHex, RoundTripsAndRefusesBadDigits) {
  const bytes b{0x00, 0x9a, 0xff, 0x10};
  EXPECT_EQ(to_hex(b), "009aff10");
  EXPECT_EQ(from_hex("009AfF10"), b);
  EXPECT_TRUE(from_hex("").empty());
  expect_error<std::invalid_argument>([] { (void)from_hex("abc"); }, "odd length 3");
  expect_error<std::invalid_argument>([] { (void)from_hex("0g"); }, "not hex at character 1");
}

TEST(DcapCollateral, ReadsItsFieldsAndRefusesMalformedJson) {
  const std::string fields[] = {"pck_crl_issuer_chain", "root_ca_crl", "pck_crl", "tcb_info_issuer_chain", "tcb_info",
                                "tcb_info_signature", "qe_identity_issuer_chain", "qe_identity", "qe_identity_signature"};
  std::string json = "{";
  for (const auto& f : fields) json += (json.size() > 1 ? "," : "") + ("\"" + f + "\":\"" + f + "-value\"");
  json += "}";
  const auto c = parse_collateral(json);
  EXPECT_EQ(c.pck_crl, "pck_crl-value");
  EXPECT_EQ(c.tcb_info, "tcb_info-value");
  EXPECT_EQ(c.qe_identity_signature, "qe_identity_signature-value");
  expect_error<std::invalid_argument>([] { (void)parse_collateral("{\"pck_crl\":"); }, "dcap collateral: not JSON");
  expect_error<std::invalid_argument>([] { (void)parse_collateral("[1,2]"); }, "not a JSON object");
  expect_error<std::invalid_argument>([] { (void)parse_collateral("{\"pck_crl\":\"x\"}"); },
                                      "the string field \"pck_crl_issuer_chain\" is missing");
}

}  // namespace
}  // namespace troupe::federated::dcap
