// The TCB rules of Intel's collateral, on small TCB info and QE identity documents written here:
// a level matches when every component is at least the level's (componentwise, not in
// lexicographic order), the first such level in the document's order wins, TDX skips the module's
// two TEE_TCB_SVN bytes when its major version is not 0, the QE identity's masks, and the way the
// statuses converge. Also the PCK certificate's SGX extensions as DER.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dcap_pck.hpp"
#include "dcap_synthetic.hpp"
#include "dcap_tcb.hpp"
#include "support.hpp"

namespace troupe::federated::dcap::detail {
namespace {

using test_support::expect_error;

std::string components(const std::vector<int>& svn) {
  std::string s = "[";
  for (std::size_t i = 0; i < 16; ++i) s += (i ? "," : "") + std::string("{\"svn\":") + std::to_string(i < svn.size() ? svn[i] : 0) + "}";
  return s + "]";
}

std::string level(const std::vector<int>& sgx, int pcesvn, const std::string& status, const std::vector<int>& tdx = {}) {
  std::string tcb = "{\"sgxtcbcomponents\":" + components(sgx) + ",\"pcesvn\":" + std::to_string(pcesvn);
  if (!tdx.empty()) tcb += ",\"tdxtcbcomponents\":" + components(tdx);
  return "{\"tcb\":" + tcb + "},\"tcbDate\":\"2024-01-01T00:00:00Z\",\"tcbStatus\":\"" + status +
         "\",\"advisoryIDs\":[\"INTEL-SA-" + status + "\"]}";
}

std::string tcb_info(const std::string& id, const std::vector<std::string>& levels, const std::string& extra = "") {
  std::string s = "{\"id\":\"" + id + "\",\"version\":3,\"issueDate\":\"2025-01-01T00:00:00Z\",\"nextUpdate\":\"2025-02-01T00:00:00Z\","
                  "\"fmspc\":\"00A067110000\",\"pceId\":\"0000\"" + extra + ",\"tcbLevels\":[";
  for (std::size_t i = 0; i < levels.size(); ++i) s += (i ? "," : "") + levels[i];
  return s + "]}";
}

pck_extensions platform(const std::vector<int>& svn, int pcesvn) {
  pck_extensions p;
  for (std::size_t i = 0; i < svn.size(); ++i) p.tcb_components[i] = static_cast<std::uint8_t>(svn[i]);
  p.pcesvn = static_cast<std::uint32_t>(pcesvn);
  p.fmspc = {0x00, 0xa0, 0x67, 0x11, 0x00, 0x00};
  p.pce_id = {0, 0};
  return p;
}

quote sgx_quote() { return parse_quote(synthetic::quote(3, false)); }

TEST(DcapTcb, ALevelMatchesOnlyWhenEveryComponentIsAtLeastItsOwn) {
  const auto info = tcb_info("SGX", {level({3, 3, 2, 2, 4, 1, 0, 5}, 13, "UpToDate"),
                                     level({2, 2, 2, 2, 3, 1, 0, 5}, 13, "OutOfDate"),
                                     level({1, 1, 1, 1, 1, 1, 0, 3}, 5, "OutOfDateConfigurationNeeded")});
  const auto q = sgx_quote();
  EXPECT_EQ(match_platform_tcb(info, q, platform({3, 3, 2, 2, 4, 1, 0, 5}, 13)).status, "UpToDate");
  EXPECT_EQ(match_platform_tcb(info, q, platform({9, 9, 9, 9, 9, 9, 9, 9}, 99)).status, "UpToDate");
  EXPECT_EQ(match_platform_tcb(info, q, platform({3, 3, 2, 2, 3, 1, 0, 5}, 13)).status, "OutOfDate");
  // Above the first level lexicographically (3 > 2 in the first component), below it in the fifth:
  // the second level.
  EXPECT_EQ(match_platform_tcb(info, q, platform({3, 3, 2, 2, 3, 9, 9, 9}, 13)).status, "OutOfDate");
  // PCESVN below the first two levels'.
  EXPECT_EQ(match_platform_tcb(info, q, platform({3, 3, 2, 2, 4, 1, 0, 5}, 12)).status, "OutOfDateConfigurationNeeded");
  const auto l = match_platform_tcb(info, q, platform({3, 3, 2, 2, 3, 1, 0, 5}, 13));
  EXPECT_EQ(l.advisory_ids, std::vector<std::string>{"INTEL-SA-OutOfDate"});
  // Lexicographically above the last level ([3,...] > [1,...]) but below it in component 8: none
  // matches, as Intel's verifier decides (TCB_NOT_SUPPORTED).
  expect_error<std::runtime_error>([&] { (void)match_platform_tcb(info, q, platform({3, 3, 2, 2, 4, 1, 0, 2}, 13)); },
                                   "TCB level not supported); against its last level: SGX component 8 is 2 < 3");
}

TEST(DcapTcb, TdxMatchesTheTeeTcbSvnSkippingTheModulesBytesWhenItHasAMajorVersion) {
  const std::vector<int> sgx{1, 1, 1, 1, 1, 1, 1, 1};
  const auto info = tcb_info("TDX", {level(sgx, 1, "UpToDate", {5, 0, 3}), level(sgx, 1, "OutOfDate", {5, 0, 2})});
  auto q = parse_quote(synthetic::quote(4, true));
  q.td.tee_tcb_svn = {};
  q.td.tee_tcb_svn[0] = 7;  // the module's SVN; major version 1: bytes 0 and 1 are the module's own
  q.td.tee_tcb_svn[1] = 1;
  q.td.tee_tcb_svn[2] = 3;
  const auto p = platform(sgx, 1);
  EXPECT_EQ(match_platform_tcb(info, q, p).status, "UpToDate");
  q.td.tee_tcb_svn[2] = 2;
  EXPECT_EQ(match_platform_tcb(info, q, p).status, "OutOfDate");
  // Major version 0: all 16 bytes are compared, the first (4) below every level's 5.
  q.td.tee_tcb_svn[1] = 0;
  q.td.tee_tcb_svn[0] = 4;
  expect_error<std::runtime_error>([&] { (void)match_platform_tcb(info, q, p); }, "TDX component 1 is 4 < 5");
  q.td.tee_tcb_svn[0] = 5;
  q.td.tee_tcb_svn[2] = 3;
  EXPECT_EQ(match_platform_tcb(info, q, p).status, "UpToDate");
}

TEST(DcapTcb, TheTdxModuleIsMatchedByItsIdentity) {
  const std::string zeros48(96, '0');
  const std::string module = ",\"tdxModule\":{\"mrsigner\":\"" + zeros48 +
                             "\",\"attributes\":\"0000000000000000\",\"attributesMask\":\"FFFFFFFFFFFFFFFF\"},"
                             "\"tdxModuleIdentities\":[{\"id\":\"TDX_01\",\"mrsigner\":\"" + zeros48 +
                             "\",\"attributes\":\"0000000000000000\",\"attributesMask\":\"FFFFFFFFFFFFFFFF\",\"tcbLevels\":["
                             "{\"tcb\":{\"isvsvn\":6},\"tcbDate\":\"2024-11-13T00:00:00Z\",\"tcbStatus\":\"UpToDate\"},"
                             "{\"tcb\":{\"isvsvn\":2},\"tcbDate\":\"2023-08-09T00:00:00Z\",\"tcbStatus\":\"OutOfDate\"}]}]";
  const auto info = tcb_info("TDX", {}, module);
  auto q = parse_quote(synthetic::quote(4, true));
  q.td.mr_signer_seam = {};
  q.td.seam_attributes = {};
  q.td.tee_tcb_svn = {};
  q.td.tee_tcb_svn[1] = 1;
  q.td.tee_tcb_svn[0] = 6;
  EXPECT_EQ(match_tdx_module(info, q).status, "UpToDate");
  q.td.tee_tcb_svn[0] = 3;
  EXPECT_EQ(match_tdx_module(info, q).status, "OutOfDate");
  q.td.tee_tcb_svn[0] = 1;
  expect_error<std::runtime_error>([&] { (void)match_tdx_module(info, q); }, "no level of TDX module identity TDX_01 matches its SVN 1");
  q.td.tee_tcb_svn[1] = 3;
  expect_error<std::runtime_error>([&] { (void)match_tdx_module(info, q); }, "has no TDX module identity TDX_03");
  q.td.tee_tcb_svn[1] = 1;
  q.td.tee_tcb_svn[0] = 6;
  q.td.mr_signer_seam[5] = 1;
  expect_error<std::runtime_error>([&] { (void)match_tdx_module(info, q); }, "MRSIGNERSEAM");
  q.td.mr_signer_seam[5] = 0;
  q.td.seam_attributes[7] = 0x80;
  expect_error<std::runtime_error>([&] { (void)match_tdx_module(info, q); }, "SEAMATTRIBUTES");
}

TEST(DcapTcb, TheQeIsMatchedByItsIdentityUnderItsMasks) {
  auto qe = sgx_quote().qe_report;
  qe.mr_signer = {};
  qe.mr_signer[0] = 0x8c;
  qe.isv_prod_id = 1;
  qe.isv_svn = 8;
  qe.misc_select = 0x00000001;  // outside the mask below
  qe.attributes = {};
  qe.attributes[0] = 0x15;      // 0x11 and bit 2, which the mask leaves out
  qe.attributes[9] = 0xee;      // XFRM: the mask leaves it out
  const std::string identity =
      "{\"id\":\"QE\",\"version\":2,\"issueDate\":\"2025-01-01T00:00:00Z\",\"nextUpdate\":\"2025-02-01T00:00:00Z\","
      "\"miscselect\":\"00000000\",\"miscselectMask\":\"FFFFFFFE\",\"attributes\":\"11000000000000000000000000000000\","
      "\"attributesMask\":\"FBFFFFFFFFFFFFFF0000000000000000\",\"mrsigner\":\"8C" + std::string(62, '0') +
      "\",\"isvprodid\":1,\"tcbLevels\":[{\"tcb\":{\"isvsvn\":8},\"tcbDate\":\"2024-03-13T00:00:00Z\",\"tcbStatus\":\"UpToDate\"},"
      "{\"tcb\":{\"isvsvn\":6},\"tcbDate\":\"2021-11-10T00:00:00Z\",\"tcbStatus\":\"OutOfDate\",\"advisoryIDs\":[\"INTEL-SA-00615\"]}]}";
  EXPECT_EQ(match_qe_identity(identity, qe).status, "UpToDate");
  qe.isv_svn = 7;
  const auto older = match_qe_identity(identity, qe);
  EXPECT_EQ(older.status, "OutOfDate");
  EXPECT_EQ(older.advisory_ids, std::vector<std::string>{"INTEL-SA-00615"});
  qe.isv_svn = 5;
  EXPECT_EQ(match_qe_identity(identity, qe).status, "Revoked");  // below every level
  qe.isv_svn = 8;
  qe.misc_select = 0x00000002;
  expect_error<std::runtime_error>([&] { (void)match_qe_identity(identity, qe); }, "MISCSELECT");
  qe.misc_select = 0;
  qe.attributes[0] = 0x13;
  expect_error<std::runtime_error>([&] { (void)match_qe_identity(identity, qe); }, "ATTRIBUTES");
  qe.attributes[0] = 0x11;
  qe.isv_prod_id = 2;
  expect_error<std::runtime_error>([&] { (void)match_qe_identity(identity, qe); }, "ISVPRODID 2");
  qe.isv_prod_id = 1;
  qe.mr_signer[31] = 1;
  expect_error<std::runtime_error>([&] { (void)match_qe_identity(identity, qe); }, "MRSIGNER");
}

TEST(DcapTcb, StatusesConvergeAsIntelsVerifierDoes) {
  // The QE's (or the TDX module's) OutOfDate makes the platform's status out of date, keeping
  // whether it needs configuration; Revoked anywhere is Revoked; otherwise the platform's stands.
  const struct {
    const char *platform, *other, *result;
  } table[] = {
      {"UpToDate", "UpToDate", "UpToDate"},
      {"UpToDate", "OutOfDate", "OutOfDate"},
      {"SWHardeningNeeded", "OutOfDate", "OutOfDate"},
      {"ConfigurationNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
      {"ConfigurationAndSWHardeningNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
      {"OutOfDate", "OutOfDate", "OutOfDate"},
      {"OutOfDateConfigurationNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
      {"SWHardeningNeeded", "UpToDate", "SWHardeningNeeded"},
      {"ConfigurationNeeded", "UpToDate", "ConfigurationNeeded"},
      {"UpToDate", "Revoked", "Revoked"},
      {"Revoked", "UpToDate", "Revoked"},
  };
  for (const auto& row : table) EXPECT_EQ(converge_status(row.platform, row.other), row.result) << row.platform << " + " << row.other;
}

TEST(DcapTcb, TheDocumentHeaderIsChecked) {
  const auto info = tcb_info("SGX", {});
  const auto at = parse_time("2025-01-15T00:00:00Z");
  check_document(info, "the TCB info", "SGX", at);
  expect_error<std::runtime_error>([&] { check_document(info, "the TCB info", "TDX", at); }, "is for \"SGX\", the quote needs \"TDX\"");
  expect_error<std::runtime_error>([&] { check_document(info, "the TCB info", "SGX", parse_time("2025-02-01T00:00:01Z")); },
                                   "is valid from 2025-01-01T00:00:00Z to 2025-02-01T00:00:00Z, not at 2025-02-01T00:00:01Z");
  expect_error<std::runtime_error>([&] { check_document("{\"id\":\"SGX\"}", "the TCB info", "SGX", at); }, "has no \"version\"");
  expect_error<std::runtime_error>([&] { check_document("{", "the TCB info", "SGX", at); }, "is not JSON");
  auto p = platform({}, 0);
  check_tcb_info_platform(info, p);
  p.fmspc[5] = 1;
  expect_error<std::runtime_error>([&] { check_tcb_info_platform(info, p); }, "is for FMSPC 00A067110000, the PCK certificate's is 00A067110001");
}

// DER of the SGX extensions: SEQUENCE { SEQUENCE { OID, value } ... }.
std::vector<std::uint8_t> tlv(std::uint8_t tag, const std::vector<std::uint8_t>& v) {
  std::vector<std::uint8_t> b{tag};
  if (v.size() < 128) {
    b.push_back(static_cast<std::uint8_t>(v.size()));
  } else {
    b.push_back(0x82);
    b.push_back(static_cast<std::uint8_t>(v.size() >> 8));
    b.push_back(static_cast<std::uint8_t>(v.size()));
  }
  b.insert(b.end(), v.begin(), v.end());
  return b;
}
std::vector<std::uint8_t> oid(std::vector<std::uint8_t> arcs) {
  std::vector<std::uint8_t> o{0x2a, 0x86, 0x48, 0x86, 0xf8, 0x4d, 0x01, 0x0d, 0x01};
  o.insert(o.end(), arcs.begin(), arcs.end());
  return tlv(0x06, o);
}
std::vector<std::uint8_t> item(std::vector<std::uint8_t> name, const std::vector<std::uint8_t>& value) {
  name.insert(name.end(), value.begin(), value.end());
  return tlv(0x30, name);
}
std::vector<std::uint8_t> extensions(int skip_component = 0) {
  std::vector<std::uint8_t> tcb;
  for (std::uint8_t i = 1; i <= 16; ++i) {
    if (i == skip_component) continue;
    const auto v = i == 5 ? std::vector<std::uint8_t>{0x00, 0xff} : std::vector<std::uint8_t>{i};  // 255 needs a leading 0
    const auto it = item(oid({2, i}), tlv(0x02, v));
    tcb.insert(tcb.end(), it.begin(), it.end());
  }
  for (const auto& it : {item(oid({2, 17}), tlv(0x02, {0x0d})), item(oid({2, 18}), tlv(0x04, std::vector<std::uint8_t>(16, 7)))})
    tcb.insert(tcb.end(), it.begin(), it.end());
  std::vector<std::uint8_t> all;
  for (const auto& it : {item(oid({1}), tlv(0x04, std::vector<std::uint8_t>(16, 1))), item(oid({2}), tlv(0x30, tcb)),
                         item(oid({3}), tlv(0x04, {0x00, 0x01})), item(oid({4}), tlv(0x04, {0x90, 0xc0, 0x6f, 0, 0, 0})),
                         item(oid({5}), tlv(0x0a, {0x01}))})
    all.insert(all.end(), it.begin(), it.end());
  return tlv(0x30, all);
}

TEST(DcapPck, ReadsTheSgxExtensions) {
  const auto p = parse_pck_extensions(extensions());
  EXPECT_EQ(p.tcb_components[0], 1);
  EXPECT_EQ(p.tcb_components[4], 255);
  EXPECT_EQ(p.tcb_components[15], 16);
  EXPECT_EQ(p.pcesvn, 13u);
  EXPECT_EQ(p.cpusvn[0], 7);
  EXPECT_EQ(p.pce_id, (bytes{0x00, 0x01}));
  EXPECT_EQ(p.fmspc, (bytes{0x90, 0xc0, 0x6f, 0, 0, 0}));
}

TEST(DcapPck, RefusesMalformedOrIncompleteExtensions) {
  expect_error<std::runtime_error>([] { (void)parse_pck_extensions(extensions(9)); }, "lacks some of its 16 component SVNs");
  auto b = extensions();
  b.pop_back();
  expect_error<std::runtime_error>([&] { (void)parse_pck_extensions(b); }, "SGX extensions");
  b = extensions();
  b.push_back(0);
  expect_error<std::runtime_error>([&] { (void)parse_pck_extensions(b); }, "bytes after the extension's SEQUENCE");
  expect_error<std::runtime_error>([] { (void)parse_pck_extensions(std::vector<std::uint8_t>{}); }, "truncated DER");
  expect_error<std::runtime_error>([] { (void)parse_pck_extensions(std::vector<std::uint8_t>{0x30, 0x85, 1, 1, 1, 1, 1}); },
                                   "a DER length of 5 bytes");
  // Each truncation of a valid encoding is refused, never read past its end.
  const auto whole = extensions();
  for (std::size_t n = 0; n < whole.size(); ++n)
    EXPECT_THROW((void)parse_pck_extensions(std::vector<std::uint8_t>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n))),
                 std::runtime_error);
}

}  // namespace
}  // namespace troupe::federated::dcap::detail
