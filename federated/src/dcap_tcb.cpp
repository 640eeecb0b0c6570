// The TCB info and QE identity documents (Intel's PCS API v3/v4 JSON) matched against a quote.
// The JSON has already been authenticated by its signature when these run; they still refuse
// anything unexpected (a missing field, a wrong type) with a clear reason, never guess.

#include "dcap_tcb.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>

namespace troupe::federated::dcap::detail {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why); }

json parse(std::string_view text, const char* what) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) fail(std::string(what) + " is not a JSON object");
    return j;
  } catch (const json::exception& e) {
    fail(std::string(what) + " is not JSON: " + e.what());
  }
}

const json& member(const json& j, const char* name, const char* what) {
  auto it = j.find(name);
  if (it == j.end()) fail(std::string(what) + " has no \"" + name + "\"");
  return *it;
}

std::string text_of(const json& j, const char* name, const char* what) {
  const auto& v = member(j, name, what);
  if (!v.is_string()) fail(std::string(what) + ": \"" + name + "\" is not a string");
  return v.get<std::string>();
}

std::int64_t number_of(const json& j, const char* name, const char* what) {
  const auto& v = member(j, name, what);
  if (!v.is_number_integer()) fail(std::string(what) + ": \"" + name + "\" is not an integer");
  return v.get<std::int64_t>();
}

bytes hex_of(const json& j, const char* name, const char* what, std::size_t size) {
  const auto text = text_of(j, name, what);
  bytes b;
  try {
    b = from_hex(text);
  } catch (const std::invalid_argument& e) {
    fail(std::string(what) + ": \"" + name + "\": " + e.what());
  }
  if (size != 0 && b.size() != size)
    fail(std::string(what) + ": \"" + name + "\" has " + std::to_string(b.size()) + " bytes, not " + std::to_string(size));
  return b;
}

const json& array_of(const json& j, const char* name, const char* what) {
  const auto& v = member(j, name, what);
  if (!v.is_array()) fail(std::string(what) + ": \"" + name + "\" is not an array");
  return v;
}

tcb_level level_of(const json& level, const char* what) {
  tcb_level l;
  l.status = text_of(level, "tcbStatus", what);
  if (!known_status(l.status)) fail(std::string(what) + ": unknown tcbStatus \"" + l.status + "\"");
  l.date = text_of(level, "tcbDate", what);
  if (auto it = level.find("advisoryIDs"); it != level.end()) {
    if (!it->is_array()) fail(std::string(what) + ": \"advisoryIDs\" is not an array");
    for (const auto& a : *it) {
      if (!a.is_string()) fail(std::string(what) + ": an advisory ID is not a string");
      l.advisory_ids.push_back(a.get<std::string>());
    }
  }
  return l;
}

// The 16 component SVNs of a level's "sgxtcbcomponents" or "tdxtcbcomponents" (version 3), or
// of version 2's "sgxtcbcompNNsvn" fields.
std::array<std::int64_t, 16> components(const json& tcb, const char* name, int version, const char* what) {
  std::array<std::int64_t, 16> svn{};
  if (version == 2) {
    for (int i = 0; i < 16; ++i) {
      char key[32];
      std::snprintf(key, sizeof key, "sgxtcbcomp%02dsvn", i + 1);
      svn[static_cast<std::size_t>(i)] = number_of(tcb, key, what);
    }
    return svn;
  }
  const auto& list = array_of(tcb, name, what);
  if (list.size() != 16) fail(std::string(what) + ": \"" + name + "\" has " + std::to_string(list.size()) + " components, not 16");
  for (std::size_t i = 0; i < 16; ++i) svn[i] = number_of(list[i], "svn", what);
  return svn;
}

bool masked_equal(std::span<const std::uint8_t> value, const bytes& mask, const bytes& expected) {
  for (std::size_t i = 0; i < value.size(); ++i)
    if ((value[i] & mask[i]) != expected[i]) return false;
  return true;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

}  // namespace troupe::federated::dcap::detail

namespace troupe::federated::dcap {
bool known_tcb_status(std::string_view s) noexcept { return detail::known_status(s); }
}  // namespace troupe::federated::dcap

namespace troupe::federated::dcap::detail {

bool known_status(std::string_view s) noexcept {
  static const char* const all[] = {"UpToDate", "SWHardeningNeeded", "ConfigurationNeeded",
                                    "ConfigurationAndSWHardeningNeeded", "OutOfDate",
                                    "OutOfDateConfigurationNeeded", "Revoked"};
  return std::find(std::begin(all), std::end(all), s) != std::end(all);
}

std::int64_t check_document(std::string_view text, const char* what, const std::string& expected_id, std::int64_t at) {
  const json j = parse(text, what);
  const auto id = text_of(j, "id", what);
  if (id != expected_id) fail(std::string(what) + " is for \"" + id + "\", the quote needs \"" + expected_id + "\"");
  const auto version = number_of(j, "version", what);
  const bool tcb_info = expected_id == "SGX" || expected_id == "TDX";
  if (tcb_info ? (version != 2 && version != 3) || (expected_id == "TDX" && version != 3) : version != 2)
    fail(std::string(what) + " version " + std::to_string(version) + " is not supported");
  const auto issued = text_of(j, "issueDate", what), next = text_of(j, "nextUpdate", what);
  std::int64_t from = 0, to = 0;
  try {
    from = parse_time(issued);
    to = parse_time(next);
  } catch (const std::invalid_argument& e) {
    fail(std::string(what) + ": " + e.what());
  }
  if (at < from || at > to)
    fail(std::string(what) + " is valid from " + issued + " to " + next + ", not at " + format_time(at));
  return to;
}

void check_tcb_info_platform(std::string_view text, const pck_extensions& pck) {
  const json j = parse(text, "the TCB info");
  const auto fmspc = hex_of(j, "fmspc", "the TCB info", 6);
  if (fmspc != pck.fmspc)
    fail("the TCB info is for FMSPC " + upper(to_hex(fmspc)) + ", the PCK certificate's is " + upper(to_hex(pck.fmspc)));
  const auto pce = hex_of(j, "pceId", "the TCB info", 2);
  if (pce != pck.pce_id)
    fail("the TCB info is for PCE-ID " + upper(to_hex(pce)) + ", the PCK certificate's is " + upper(to_hex(pck.pce_id)));
}

tcb_level match_platform_tcb(std::string_view text, const quote& q, const pck_extensions& pck) {
  const char* what = "the TCB info";
  const json j = parse(text, what);
  const int version = static_cast<int>(number_of(j, "version", what));
  const bool tdx = q.tee == tee_kind::tdx;
  // With a TDX module of major version > 0, TEE_TCB_SVN's first two bytes are the module's SVN and
  // version, matched by its own identity (match_tdx_module), not by the platform's levels.
  const std::size_t first_tdx = tdx && q.td.tee_tcb_svn[1] != 0 ? 2 : 0;
  // Intel's rule: a level matches when every component is at least the level's (componentwise, not
  // in lexicographic order). `short_of` names, for the last level tried, what falls short.
  std::string short_of;
  for (const auto& level : array_of(j, "tcbLevels", what)) {
    const auto& tcb = member(level, "tcb", what);
    const auto sgx = components(tcb, "sgxtcbcomponents", version, what);
    short_of.clear();
    for (std::size_t i = 0; i < 16; ++i)
      if (pck.tcb_components[i] < sgx[i])
        short_of += " SGX component " + std::to_string(i + 1) + " is " + std::to_string(pck.tcb_components[i]) + " < " + std::to_string(sgx[i]) + ";";
    const auto pcesvn = number_of(tcb, "pcesvn", what);
    if (static_cast<std::int64_t>(pck.pcesvn) < pcesvn)
      short_of += " PCESVN is " + std::to_string(pck.pcesvn) + " < " + std::to_string(pcesvn) + ";";
    if (tdx) {
      const auto t = components(tcb, "tdxtcbcomponents", version, what);
      for (std::size_t i = first_tdx; i < 16; ++i)
        if (q.td.tee_tcb_svn[i] < t[i])
          short_of += " TDX component " + std::to_string(i + 1) + " is " + std::to_string(q.td.tee_tcb_svn[i]) + " < " + std::to_string(t[i]) + ";";
    }
    if (short_of.empty()) return level_of(level, what);
  }
  if (!short_of.empty()) short_of.pop_back();
  fail("no TCB level of the TCB info matches the platform (TCB level not supported); against its last level:" + short_of);
}

tcb_level match_tdx_module(std::string_view text, const quote& q) {
  const char* what = "the TCB info";
  const json j = parse(text, what);
  const auto major = q.td.tee_tcb_svn[1];
  auto check_identity = [&](const json& id, const char* name) {
    const auto signer = hex_of(id, "mrsigner", name, 48);
    if (!std::equal(signer.begin(), signer.end(), q.td.mr_signer_seam.begin()))
      fail(std::string("the TDX module's MRSIGNERSEAM ") + to_hex(q.td.mr_signer_seam) + " is not " + name + "'s");
    const auto attributes = hex_of(id, "attributes", name, 8), mask = hex_of(id, "attributesMask", name, 8);
    if (!masked_equal(q.td.seam_attributes, mask, attributes))
      fail(std::string("the TDX module's SEAMATTRIBUTES ") + to_hex(q.td.seam_attributes) + " do not match " + name + "'s");
  };
  if (major == 0) {
    check_identity(member(j, "tdxModule", what), "the TCB info's tdxModule");
    return {"UpToDate", "", {}};
  }
  char wanted[16];
  std::snprintf(wanted, sizeof wanted, "TDX_%02X", major);
  for (const auto& id : array_of(j, "tdxModuleIdentities", what)) {
    if (text_of(id, "id", what) != wanted) continue;
    check_identity(id, wanted);
    for (const auto& level : array_of(id, "tcbLevels", what))
      if (q.td.tee_tcb_svn[0] >= number_of(member(level, "tcb", what), "isvsvn", what)) return level_of(level, what);
    fail(std::string("no level of TDX module identity ") + wanted + " matches its SVN " + std::to_string(q.td.tee_tcb_svn[0]));
  }
  fail(std::string("the TCB info has no TDX module identity ") + wanted);
}

tcb_level match_qe_identity(std::string_view text, const enclave_report& qe) {
  const char* what = "the QE identity";
  const json j = parse(text, what);
  const auto signer = hex_of(j, "mrsigner", what, 32);
  if (!std::equal(signer.begin(), signer.end(), qe.mr_signer.begin()))
    fail("the QE's MRSIGNER " + upper(to_hex(qe.mr_signer)) + " is not the QE identity's " + upper(to_hex(signer)));
  const auto prod = number_of(j, "isvprodid", what);
  if (prod != qe.isv_prod_id)
    fail("the QE's ISVPRODID " + std::to_string(qe.isv_prod_id) + " is not the QE identity's " + std::to_string(prod));
  // MISCSELECT's hex is the 32-bit value written most significant byte first.
  const auto misc = hex_of(j, "miscselect", what, 4), misc_mask = hex_of(j, "miscselectMask", what, 4);
  auto be32 = [](const bytes& b) {
    return static_cast<std::uint32_t>(b[0]) << 24 | static_cast<std::uint32_t>(b[1]) << 16 |
           static_cast<std::uint32_t>(b[2]) << 8 | b[3];
  };
  if ((qe.misc_select & be32(misc_mask)) != be32(misc))
    fail("the QE's MISCSELECT does not match the QE identity's under its mask");
  // ATTRIBUTES' hex is in the report's byte order.
  const auto attributes = hex_of(j, "attributes", what, 16), mask = hex_of(j, "attributesMask", what, 16);
  if (!masked_equal(qe.attributes, mask, attributes))
    fail("the QE's ATTRIBUTES " + upper(to_hex(qe.attributes)) + " do not match the QE identity's under its mask");
  for (const auto& level : array_of(j, "tcbLevels", what))
    if (qe.isv_svn >= number_of(member(level, "tcb", what), "isvsvn", what)) return level_of(level, what);
  // Below every level: Intel's verifier takes the QE as revoked.
  return {"Revoked", "", {}};
}

std::string converge_status(const std::string& platform, const std::string& other) {
  if (other == "Revoked" || platform == "Revoked") return "Revoked";
  if (other == "OutOfDate") {
    if (platform == "UpToDate" || platform == "SWHardeningNeeded") return "OutOfDate";
    if (platform == "ConfigurationNeeded" || platform == "ConfigurationAndSWHardeningNeeded")
      return "OutOfDateConfigurationNeeded";
  }
  return platform;
}

}  // namespace troupe::federated::dcap::detail
