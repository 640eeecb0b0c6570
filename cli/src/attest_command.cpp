// `troupe attest verify QUOTE --collateral FILE --at TIME`: an Intel DCAP quote (SGX or TDX)
// verified against Intel's collateral as of a time, and a policy (troupe/federated/attest.hpp).
//
// Exit status: 0 verified and the TCB status accepted (UpToDate, or those --accept-tcb names);
// 3 every step passed but the TCB status is not accepted (OutOfDate, SWHardeningNeeded, ...: the
// quote is genuine, the platform is behind); 1 a step failed, or a file or flag is bad.

#include <array>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "troupe/federated/attest.hpp"

namespace troupe::cli {
namespace {

namespace dcap = troupe::federated::dcap;

struct attest_options {
  std::string quote, collateral, at, measurement, nonce, enclave_key;
  std::vector<std::string> accept_tcb;
  bool allow_debug = false, json = false;
};

constexpr int exit_verified = 0, exit_failed = 1, exit_tcb_not_accepted = 3;

const char* describe(dcap::verify_step s) {
  switch (s) {
    case dcap::verify_step::crls: return "root CA and PCK CRLs signed by their issuers and current";
    case dcap::verify_step::pck_chain: return "PCK certificate chain to the pinned Intel SGX Root CA, none revoked";
    case dcap::verify_step::tcb_info: return "TCB info signed by Intel's TCB signing key, current, this FMSPC";
    case dcap::verify_step::qe_identity: return "QE identity signed by Intel's TCB signing key, current";
    case dcap::verify_step::qe_report_signature: return "QE report signed by the PCK key";
    case dcap::verify_step::attestation_key: return "attestation key bound by the QE report data";
    case dcap::verify_step::quote_signature: return "quote signed by the attestation key";
    case dcap::verify_step::qe_tcb: return "QE matches its identity (MRSIGNER, ISVPRODID, masks)";
    case dcap::verify_step::tcb_status: return "TCB level of the platform, the QE and the TDX module";
    case dcap::verify_step::policy: return "policy: measurement, debug, report data";
  }
  return "";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(what) + " " + path + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

dcap::bytes hex_flag(const std::string& text, const char* flag) {
  try {
    return dcap::from_hex(text);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string(flag) + ": " + e.what());
  }
}

// A failure before verify_quote ran (a file, the quote's format, the collateral's format).
int refuse(const attest_options& o, const char* step, const std::string& why) {
  if (o.json)
    std::cout << "{\"verified\":false,\"failed_step\":" << json_string(step) << ",\"error\":" << json_string(why) << "}\n";
  std::cerr << "troupe attest verify: " << why << "\n";
  return exit_failed;
}

void print_text(const dcap::quote& q, const dcap::verification& v, const std::string& at) {
  std::cout << dcap::to_string(q.tee) << " quote (version " << q.header.version << "), as of " << at << "\n";
  for (auto s : v.passed) std::printf("  ok      %-20s %s\n", dcap::to_string(s), describe(s));
  if (v.failed) std::printf("  FAILED  %-20s %s\n          %s\n", dcap::to_string(*v.failed), describe(*v.failed), v.error.c_str());
  if (!v.tcb_status.empty() || !v.qe_tcb_status.empty()) {
    std::cout << "TCB status: " << (v.tcb_status.empty() ? "none" : v.tcb_status) << " (platform "
              << (v.platform_tcb_status.empty() ? "unmatched" : v.platform_tcb_status) << ", QE " << v.qe_tcb_status;
    if (q.tee == dcap::tee_kind::tdx) std::cout << ", TDX module " << (v.tdx_module_tcb_status.empty() ? "unmatched" : v.tdx_module_tcb_status);
    std::cout << ")";
    if (!v.tcb_date.empty()) std::cout << ", TCB date " << v.tcb_date;
    std::cout << "\n";
    if (!v.advisory_ids.empty()) {
      std::cout << "advisories:";
      for (const auto& a : v.advisory_ids) std::cout << " " << a;
      std::cout << "\n";
    }
  }
  if (!v.fmspc.empty()) std::cout << "FMSPC: " << v.fmspc << "\n";
  std::cout << (q.tee == dcap::tee_kind::tdx ? "MRTD: " : "MRENCLAVE: ") << dcap::to_hex(v.measurement) << "\n"
            << "report data: " << dcap::to_hex(v.report_data) << "\n"
            << "debug: " << (v.debug ? "yes" : "no") << "\n";
  if (v.failed)
    std::cout << "NOT VERIFIED: failed at " << dcap::to_string(*v.failed) << "\n";
  else if (!v.tcb_accepted)
    std::cout << "VERIFIED, BUT THE TCB STATUS " << v.tcb_status << " IS NOT ACCEPTED (--accept-tcb names those that are)\n";
  else
    std::cout << "VERIFIED: " << v.tcb_status << "\n";
}

void print_json(const dcap::quote& q, const dcap::verification& v, const std::string& at) {
  std::ostringstream j;
  j << "{\"verified\":" << (v.ok() ? "true" : "false") << ",\"tee\":" << json_string(dcap::to_string(q.tee))
    << ",\"quote_version\":" << q.header.version << ",\"at\":" << json_string(at) << ",\"steps\":[";
  for (std::size_t i = 0; i < v.passed.size(); ++i)
    j << (i ? "," : "") << "{\"step\":" << json_string(dcap::to_string(v.passed[i])) << ",\"ok\":true}";
  if (v.failed) j << (v.passed.empty() ? "" : ",") << "{\"step\":" << json_string(dcap::to_string(*v.failed)) << ",\"ok\":false}";
  j << "],\"failed_step\":" << (v.failed ? json_string(dcap::to_string(*v.failed)) : "null")
    << ",\"error\":" << (v.failed ? json_string(v.error) : "null");
  auto text_or_null = [](const std::string& s) { return s.empty() ? std::string("null") : json_string(s); };
  j << ",\"tcb_status\":" << text_or_null(v.tcb_status) << ",\"tcb_accepted\":" << (v.tcb_accepted ? "true" : "false")
    << ",\"platform_tcb_status\":" << text_or_null(v.platform_tcb_status) << ",\"qe_tcb_status\":" << text_or_null(v.qe_tcb_status)
    << ",\"tdx_module_tcb_status\":" << text_or_null(v.tdx_module_tcb_status) << ",\"advisory_ids\":[";
  for (std::size_t i = 0; i < v.advisory_ids.size(); ++i) j << (i ? "," : "") << json_string(v.advisory_ids[i]);
  j << "],\"fmspc\":" << text_or_null(v.fmspc) << ",\"measurement\":" << json_string(dcap::to_hex(v.measurement))
    << ",\"report_data\":" << json_string(dcap::to_hex(v.report_data)) << ",\"debug\":" << (v.debug ? "true" : "false") << "}";
  std::cout << j.str() << "\n";
}

int run_verify(const attest_options& o) {
  std::int64_t at = 0;
  dcap::policy p;
  try {
    at = o.at == "now" ? static_cast<std::int64_t>(std::time(nullptr)) : dcap::parse_time(o.at);
    if (!o.measurement.empty()) p.measurement = hex_flag(o.measurement, "--measurement");
    if (!o.nonce.empty()) p.nonce = hex_flag(o.nonce, "--nonce");
    if (!o.enclave_key.empty()) p.enclave_key = hex_flag(o.enclave_key, "--enclave-key");
    if (p.nonce && p.nonce->size() != 32)
      throw std::runtime_error("--nonce has " + std::to_string(p.nonce->size()) + " bytes; it must be 32 (64 hex digits)");
    p.allow_debug = o.allow_debug;
    if (!o.accept_tcb.empty()) {
      p.accepted_tcb_statuses = o.accept_tcb;
      for (const auto& s : o.accept_tcb)
        if (!dcap::known_tcb_status(s) || s == "Revoked")
          throw std::runtime_error("--accept-tcb: '" + s +
                                   "' is not one of UpToDate, SWHardeningNeeded, ConfigurationNeeded, "
                                   "ConfigurationAndSWHardeningNeeded, OutOfDate, OutOfDateConfigurationNeeded");
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe attest verify: " << e.what() << "\n";
    return exit_failed;
  }
  dcap::quote q;
  dcap::collateral c;
  try {
    const auto raw = read_file(o.quote, "QUOTE");
    q = dcap::parse_quote({reinterpret_cast<const std::uint8_t*>(raw.data()), raw.size()});
  } catch (const std::exception& e) {
    return refuse(o, "quote_format", e.what());
  }
  try {
    c = dcap::parse_collateral(read_file(o.collateral, "--collateral"));
  } catch (const std::exception& e) {
    return refuse(o, "collateral_format", e.what());
  }
  dcap::verification v;
  try {
    v = dcap::verify_quote(q, c, at, p);
  } catch (const std::invalid_argument& e) {  // a policy that does not fit this quote
    std::cerr << "troupe attest verify: " << e.what() << "\n";
    return exit_failed;
  }
  const std::string when = dcap::format_time(at);
  if (o.json)
    print_json(q, v, when);
  else
    print_text(q, v, when);
  if (v.failed) return exit_failed;
  return v.tcb_accepted ? exit_verified : exit_tcb_not_accepted;
}

}  // namespace

void add_attest_command(CLI::App& app, int& rc) {
  auto* attest = app.add_subcommand("attest", "remote attestation: verify Intel SGX and TDX (DCAP) quotes");
  attest->require_subcommand(1);
  auto o = std::make_shared<attest_options>();
  auto* verify = attest->add_subcommand(
      "verify",
      "verify a DCAP quote against Intel's collateral as of a time (exit 0: verified; 3: verified, TCB status not "
      "accepted; 1: not verified)");
  verify->add_option("QUOTE", o->quote, "the quote as produced by the quoting enclave (binary)")->required();
  verify->add_option("--collateral", o->collateral,
                     "Intel's collateral as one JSON object (PCK CRL and its issuer chain, root CA CRL, TCB info, QE "
                     "identity with their signatures and issuer chains)")
      ->required();
  verify->add_option("--at", o->at, "the time to verify as of: ISO 8601 UTC (2025-07-01T00:00:00Z) or now")->required();
  verify->add_option("--measurement", o->measurement, "expected MRENCLAVE (SGX, 64 hex digits) or MRTD (TDX, 96)");
  verify->add_flag("--allow-debug", o->allow_debug, "accept an enclave or trust domain in debug mode");
  auto* nonce = verify->add_option("--nonce", o->nonce,
                                   "the verifier's fresh 32-byte nonce (hex): report data[0..32) must be "
                                   "SHA-256(enclave key || nonce)");
  auto* key = verify->add_option("--enclave-key", o->enclave_key, "the enclave's public key bytes (hex) bound with --nonce");
  nonce->needs(key);
  key->needs(nonce);
  verify->add_option("--accept-tcb", o->accept_tcb, "TCB statuses accepted besides UpToDate (S1,S2,...)")->delimiter(',');
  verify->add_flag("--json", o->json, "one JSON object");
  verify->callback([o, &rc] {
    // UpToDate is always accepted; --accept-tcb adds to it.
    if (!o->accept_tcb.empty()) o->accept_tcb.insert(o->accept_tcb.begin(), "UpToDate");
    rc = run_verify(*o);
  });
}

}  // namespace troupe::cli
