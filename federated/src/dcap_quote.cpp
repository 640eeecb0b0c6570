// DCAP quotes as bytes: the version-3, -4 and -5 layouts (Intel SGX ECDSA Quote Library
// Reference, appendix "Quote Format"; Intel TDX DCAP Quoting Library API, "Quote Format"), the
// collateral's JSON, hex and times. Every read goes through `reader`, which refuses to step past
// the end; a refusal names the field and its offset.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>

#include "troupe/federated/attest.hpp"

namespace troupe::federated::dcap {
namespace {

constexpr std::size_t enclave_report_bytes = 384, td_report_bytes = 584, td15_report_bytes = 648;
constexpr std::uint16_t ecdsa_p256 = 2;
constexpr std::uint32_t tee_sgx = 0x00, tee_tdx = 0x81;
constexpr std::uint16_t cert_pck_chain = 5, cert_qe_report = 6;

[[noreturn]] void malformed(const std::string& what) { throw std::invalid_argument("dcap quote: " + what); }

class reader {
public:
  explicit reader(std::span<const std::uint8_t> d, std::size_t at = 0) : d_(d), at_(at) {}
  std::size_t offset() const noexcept { return at_; }
  std::size_t left() const noexcept { return d_.size() - at_; }

  std::span<const std::uint8_t> take(std::size_t n, const char* field) {
    if (n > left())
      malformed(std::string(field) + " at offset " + std::to_string(at_) + " needs " + std::to_string(n) +
                " bytes, " + std::to_string(left()) + " are left (truncated)");
    auto s = d_.subspan(at_, n);
    at_ += n;
    return s;
  }
  template <std::size_t N>
  void copy(std::array<std::uint8_t, N>& out, const char* field) {
    auto s = take(N, field);
    std::memcpy(out.data(), s.data(), N);
  }
  std::uint16_t u16(const char* field) {
    auto s = take(2, field);
    return static_cast<std::uint16_t>(s[0] | s[1] << 8);
  }
  std::uint32_t u32(const char* field) {
    auto s = take(4, field);
    return static_cast<std::uint32_t>(s[0]) | static_cast<std::uint32_t>(s[1]) << 8 |
           static_cast<std::uint32_t>(s[2]) << 16 | static_cast<std::uint32_t>(s[3]) << 24;
  }

private:
  std::span<const std::uint8_t> d_;
  std::size_t at_ = 0;
};

enclave_report read_enclave_report(reader& r) {
  enclave_report e;
  r.copy(e.cpu_svn, "report CPUSVN");
  e.misc_select = r.u32("report MISCSELECT");
  r.take(28, "report reserved bytes");
  r.copy(e.attributes, "report ATTRIBUTES");
  r.copy(e.mr_enclave, "report MRENCLAVE");
  r.take(32, "report reserved bytes");
  r.copy(e.mr_signer, "report MRSIGNER");
  r.take(96, "report reserved bytes");
  e.isv_prod_id = r.u16("report ISVPRODID");
  e.isv_svn = r.u16("report ISVSVN");
  r.take(60, "report reserved bytes");
  r.copy(e.report_data, "report REPORTDATA");
  return e;
}

td_report read_td_report(reader& r) {
  td_report t;
  r.copy(t.tee_tcb_svn, "TD report TEE_TCB_SVN");
  r.copy(t.mr_seam, "TD report MRSEAM");
  r.copy(t.mr_signer_seam, "TD report MRSIGNERSEAM");
  r.copy(t.seam_attributes, "TD report SEAMATTRIBUTES");
  r.copy(t.td_attributes, "TD report TDATTRIBUTES");
  r.copy(t.xfam, "TD report XFAM");
  r.copy(t.mr_td, "TD report MRTD");
  r.copy(t.mr_config_id, "TD report MRCONFIGID");
  r.copy(t.mr_owner, "TD report MROWNER");
  r.copy(t.mr_owner_config, "TD report MROWNERCONFIG");
  for (auto& m : t.rtmr) r.copy(m, "TD report RTMR");
  r.copy(t.report_data, "TD report REPORTDATA");
  return t;
}

// Certification data type 5: the PCK chain as PEM text (some quoting libraries end it with NULs).
std::string read_pck_chain(reader& r, const char* where) {
  const auto type = r.u16("certification data type");
  const auto size = r.u32("certification data size");
  if (type != cert_pck_chain)
    malformed(std::string(where) + " has certification data type " + std::to_string(type) +
              "; only type 5 (the PCK certificate chain) is supported");
  auto pem = r.take(size, "PCK certificate chain");
  std::string text(pem.begin(), pem.end());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  // Only PEM certificates and the line breaks between them: a byte outside them would be covered by
  // no signature, so none is let through.
  static const std::string begin = "-----BEGIN CERTIFICATE-----", end = "-----END CERTIFICATE-----";
  std::size_t at = 0, certificates = 0;
  for (;;) {
    while (at < text.size() && (text[at] == '\n' || text[at] == '\r')) ++at;
    if (at == text.size()) break;
    if (text.compare(at, begin.size(), begin) != 0)
      malformed("the PCK certificate chain has bytes outside its PEM certificates, at its byte " + std::to_string(at));
    const auto stop = text.find(end, at + begin.size());
    if (stop == std::string::npos) malformed("the PCK certificate chain's certificate " + std::to_string(certificates + 1) + " has no END line");
    at = stop + end.size();
    ++certificates;
  }
  if (certificates == 0) malformed("the PCK certificate chain holds no PEM certificate");
  return text;
}

// The QE report, its signature and the QE authentication data: the same in both versions.
void read_qe_part(reader& r, quote& q) {
  auto raw = r.take(enclave_report_bytes, "QE report");
  q.qe_report_raw.assign(raw.begin(), raw.end());
  reader qr(raw);
  q.qe_report = read_enclave_report(qr);
  r.copy(q.qe_report_signature, "QE report signature");
  const auto auth = r.u16("QE authentication data size");
  auto a = r.take(auth, "QE authentication data");
  q.qe_auth_data.assign(a.begin(), a.end());
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

const char* to_string(tee_kind t) noexcept { return t == tee_kind::sgx ? "SGX" : "TDX"; }

std::span<const std::uint8_t> quote::measurement() const noexcept {
  if (tee == tee_kind::tdx) return td.mr_td;
  return enclave.mr_enclave;
}

std::span<const std::uint8_t> quote::report_data() const noexcept {
  if (tee == tee_kind::tdx) return td.report_data;
  return enclave.report_data;
}

bool quote::debug() const noexcept {
  if (tee == tee_kind::tdx) return (td.td_attributes[0] & 0x01) != 0;
  return (enclave.attributes[0] & 0x02) != 0;
}

quote parse_quote(std::span<const std::uint8_t> data) {
  reader r(data);
  quote q;
  auto& h = q.header;
  h.version = r.u16("header version");
  h.attestation_key_type = r.u16("header attestation key type");
  h.tee_type = r.u32("header TEE type");
  h.qe_svn = r.u16("header QE SVN");
  h.pce_svn = r.u16("header PCE SVN");
  r.copy(h.qe_vendor_id, "header QE vendor ID");
  r.copy(h.user_data, "header user data");
  if (h.version < 3 || h.version > 5)
    malformed("version " + std::to_string(h.version) + " is not supported (3: SGX, 4 and 5: SGX or TDX)");
  if (h.attestation_key_type != ecdsa_p256)
    malformed("attestation key type " + std::to_string(h.attestation_key_type) +
              " is not supported (2: ECDSA P-256)");
  if (h.version == 3 && h.tee_type != 0)
    malformed("a version-3 quote has TEE type " + std::to_string(h.tee_type) + ", not 0 (SGX)");
  if (h.tee_type != tee_sgx && h.tee_type != tee_tdx)
    malformed("TEE type " + std::to_string(h.tee_type) + " is neither SGX (0x00) nor TDX (0x81)");
  q.tee = h.tee_type == tee_tdx ? tee_kind::tdx : tee_kind::sgx;

  std::size_t body = q.tee == tee_kind::tdx ? td_report_bytes : enclave_report_bytes;
  if (h.version == 5) {
    // Version 5 names the body: 1 an SGX enclave report, 2 a TDX 1.0 TD report, 3 a TDX 1.5 one.
    const auto type = r.u16("body type");
    const auto size = r.u32("body size");
    const std::uint16_t expected_type = q.tee == tee_kind::sgx ? 1 : (type == 3 ? 3 : 2);
    if (type != expected_type)
      malformed("body type " + std::to_string(type) + " does not fit TEE type " + std::to_string(h.tee_type));
    body = type == 1 ? enclave_report_bytes : type == 2 ? td_report_bytes : td15_report_bytes;
    if (size != body)
      malformed("body size " + std::to_string(size) + " is not the " + std::to_string(body) + " bytes of body type " +
                std::to_string(type));
    q.td.td15 = type == 3;
  }
  const std::size_t body_at = r.offset();
  auto body_bytes = r.take(body, q.tee == tee_kind::tdx ? "TD report body" : "enclave report body");
  reader br(body_bytes);
  if (q.tee == tee_kind::tdx) {
    const bool td15 = q.td.td15;
    q.td = read_td_report(br);
    q.td.td15 = td15;
    if (td15) {
      br.copy(q.td.tee_tcb_svn2, "TD report TEE_TCB_SVN2");
      br.copy(q.td.mr_servicetd, "TD report MRSERVICETD");
    }
  } else {
    q.enclave = read_enclave_report(br);
  }
  q.signed_part.assign(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(body_at + body));

  const auto sig_size = r.u32("signature data size");
  if (sig_size > r.left())
    malformed("signature data size " + std::to_string(sig_size) + " at offset " + std::to_string(r.offset() - 4) +
              " overruns the " + std::to_string(r.left()) + " bytes that follow (truncated)");
  // Quote generation may hand out a zero-padded buffer: zeros after the signature data are
  // dropped (they are covered by no signature); anything else after it is refused.
  const auto tail = data.subspan(r.offset() + sig_size);
  if (std::any_of(tail.begin(), tail.end(), [](std::uint8_t b) { return b != 0; }))
    malformed(std::to_string(tail.size()) + " bytes after the signature data, not all zero padding");
  data = data.first(r.offset() + sig_size);
  r = reader(data, r.offset());
  r.copy(q.signature, "quote signature");
  r.copy(q.attestation_key, "attestation key");
  if (h.version == 3) {
    read_qe_part(r, q);
    q.pck_chain_pem = read_pck_chain(r, "the quote");
  } else {
    // Versions 4 and 5 wrap the QE part in certification data of type 6.
    const auto type = r.u16("certification data type");
    const auto size = r.u32("certification data size");
    if (type != cert_qe_report)
      malformed("version-" + std::to_string(h.version) + " certification data type " + std::to_string(type) +
                " is not supported (6: the QE report certification data)");
    reader inner(r.take(size, "QE report certification data"));
    read_qe_part(inner, q);
    q.pck_chain_pem = read_pck_chain(inner, "the QE report certification data");
    if (inner.left() != 0)
      malformed(std::to_string(inner.left()) + " bytes left over in the QE report certification data");
  }
  if (r.left() != 0) malformed(std::to_string(r.left()) + " bytes left over at the end of the signature data");
  return q;
}

collateral parse_collateral(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("dcap collateral: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("dcap collateral: not a JSON object");
  auto field = [&](const char* name) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string())
      throw std::invalid_argument(std::string("dcap collateral: the string field \"") + name + "\" is missing");
    return it->get<std::string>();
  };
  collateral c;
  c.pck_crl_issuer_chain = field("pck_crl_issuer_chain");
  c.root_ca_crl = field("root_ca_crl");
  c.pck_crl = field("pck_crl");
  c.tcb_info_issuer_chain = field("tcb_info_issuer_chain");
  c.tcb_info = field("tcb_info");
  c.tcb_info_signature = field("tcb_info_signature");
  c.qe_identity_issuer_chain = field("qe_identity_issuer_chain");
  c.qe_identity = field("qe_identity");
  c.qe_identity_signature = field("qe_identity_signature");
  return c;
}

std::int64_t parse_time(std::string_view s) {
  auto bad = [&] {
    throw std::invalid_argument("'" + std::string(s) + "' is not an ISO 8601 UTC time (YYYY-MM-DDTHH:MM:SSZ)");
  };
  // YYYY-MM-DDTHH:MM:SS then an optional fraction, then Z.
  if (s.size() < 20) bad();
  auto num = [&](std::size_t at, std::size_t n) {
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') bad();
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':') bad();
  std::size_t end = 19;
  if (s[end] == '.') {
    ++end;
    const std::size_t digits = end;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    if (end == digits) bad();
  }
  if (end + 1 != s.size() || (s[end] != 'Z' && s[end] != 'z')) bad();
  std::tm t{};
  t.tm_year = num(0, 4) - 1900;
  t.tm_mon = num(5, 2) - 1;
  t.tm_mday = num(8, 2);
  t.tm_hour = num(11, 2);
  t.tm_min = num(14, 2);
  t.tm_sec = num(17, 2);
  if (t.tm_mon > 11 || t.tm_mday < 1 || t.tm_mday > 31 || t.tm_hour > 23 || t.tm_min > 59 || t.tm_sec > 60) bad();
  const std::tm asked = t;
  const std::time_t v = timegm(&t);
  // timegm normalises 2025-02-30 to March: refuse a date that does not exist.
  if (t.tm_mday != asked.tm_mday || t.tm_mon != asked.tm_mon) bad();
  return static_cast<std::int64_t>(v);
}

std::string format_time(std::int64_t seconds) {
  const std::time_t v = static_cast<std::time_t>(seconds);
  std::tm t{};
  gmtime_r(&v, &t);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &t);
  return buf;
}

bytes from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) throw std::invalid_argument("hex of odd length " + std::to_string(hex.size()));
  bytes out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) throw std::invalid_argument("not hex at character " + std::to_string(2 * i + (hi < 0 ? 0 : 1)));
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return out;
}

std::string to_hex(std::span<const std::uint8_t> b) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (auto x : b) {
    s.push_back(digits[x >> 4]);
    s.push_back(digits[x & 15]);
  }
  return s;
}

}  // namespace troupe::federated::dcap
