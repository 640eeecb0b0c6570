// A simulated SGX platform for --tee sim: a test key chain in the shape of Intel's (names,
// extensions, CRLs, signed TCB info and QE identity, a QE report certifying an attestation
// key), made with OpenSSL at run time, so that dcap::verify_quote checks the quotes of the
// simulated enclave step by step exactly as it checks real ones. Only the root differs: a
// fresh P-256 key, pinned by the clients that are told to accept it (--tee-root test).

#include "openssl_ptr.hpp"
#include "troupe/federated/tee.hpp"

#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace troupe::federated::tee {
namespace {

[[noreturn]] void fail(const std::string& what) {
  const unsigned long e = ERR_get_error();
  char buf[256] = "no detail";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  throw std::runtime_error("tee sim platform: " + what + ": " + buf);
}

using namespace troupe::federated::detail::ossl;

pkey_ptr p256() {
  pkey_ptr k(EVP_EC_gen("P-256"));
  if (!k) fail("cannot make a P-256 key");
  return k;
}

void put16(bytes& b, std::uint16_t v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}
void put32(bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// ECDSA P-256 over SHA-256, as the quote carries it: raw r || s, 32 bytes each.
std::array<std::uint8_t, 64> sign_raw(EVP_PKEY* key, std::span<const std::uint8_t> message) {
  md_ctx_ptr md(EVP_MD_CTX_new());
  std::size_t n = 0;
  if (!md || EVP_DigestSignInit(md.get(), nullptr, EVP_sha256(), nullptr, key) != 1 ||
      EVP_DigestSign(md.get(), nullptr, &n, message.data(), message.size()) != 1)
    fail("cannot sign");
  bytes der(n);
  if (EVP_DigestSign(md.get(), der.data(), &n, message.data(), message.size()) != 1) fail("cannot sign");
  const unsigned char* p = der.data();
  sig_ptr sig(d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(n)));
  if (!sig) fail("cannot read a signature");
  std::array<std::uint8_t, 64> raw{};
  if (BN_bn2binpad(ECDSA_SIG_get0_r(sig.get()), raw.data(), 32) != 32 ||
      BN_bn2binpad(ECDSA_SIG_get0_s(sig.get()), raw.data() + 32, 32) != 32)
    fail("a signature's r or s is too long");
  return raw;
}

std::string hex(std::span<const std::uint8_t> b) { return dcap::to_hex(b); }

void set_name(X509_NAME* n, const char* cn) {
  if (X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(n, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("troupe simulated platform (not Intel)"), -1, -1, 0) != 1)
    fail("cannot name a certificate");
}

void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!e || X509_add_ext(cert, e, -1) != 1) fail(std::string("cannot add the extension ") + value);
  X509_EXTENSION_free(e);
}

// `issuer` null: self-signed.
x509_ptr certificate(const char* cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, long serial, bool ca,
                     std::int64_t from, std::int64_t to, const bytes& sgx_extension = {}) {
  x509_ptr x(X509_new());
  if (!x || X509_set_version(x.get(), 2) != 1 || ASN1_INTEGER_set(X509_get_serialNumber(x.get()), serial) != 1 ||
      !ASN1_TIME_set(X509_getm_notBefore(x.get()), static_cast<time_t>(from)) ||
      !ASN1_TIME_set(X509_getm_notAfter(x.get()), static_cast<time_t>(to)) || X509_set_pubkey(x.get(), key) != 1)
    fail("cannot make a certificate");
  set_name(X509_get_subject_name(x.get()), cn);
  if (X509_set_issuer_name(x.get(), issuer ? X509_get_subject_name(issuer) : X509_get_subject_name(x.get())) != 1)
    fail("cannot set an issuer");
  X509* by = issuer ? issuer : x.get();
  add_ext(x.get(), by, NID_subject_key_identifier, "hash");
  add_ext(x.get(), by, NID_authority_key_identifier, "keyid:always");
  add_ext(x.get(), by, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add_ext(x.get(), by, NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,nonRepudiation");
  if (!sgx_extension.empty()) {
    ASN1_OBJECT* oid = OBJ_txt2obj("1.2.840.113741.1.13.1", 1);
    ASN1_OCTET_STRING* v = ASN1_OCTET_STRING_new();
    if (!oid || !v || ASN1_OCTET_STRING_set(v, sgx_extension.data(), static_cast<int>(sgx_extension.size())) != 1)
      fail("cannot encode the SGX extensions");
    X509_EXTENSION* e = X509_EXTENSION_create_by_OBJ(nullptr, oid, 0, v);
    ASN1_OBJECT_free(oid);
    ASN1_OCTET_STRING_free(v);
    if (!e || X509_add_ext(x.get(), e, -1) != 1) fail("cannot add the SGX extensions");
    X509_EXTENSION_free(e);
  }
  if (X509_sign(x.get(), issuer_key, EVP_sha256()) <= 0) fail("cannot sign a certificate");
  return x;
}

std::string pem_of(X509* x) {
  bio_ptr b(BIO_new(BIO_s_mem()));
  if (!b || PEM_write_bio_X509(b.get(), x) != 1) fail("cannot write PEM");
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

// An empty CRL of `issuer`, as hex DER (the PCS's form).
std::string crl_hex(X509* issuer, EVP_PKEY* key, std::int64_t from, std::int64_t to) {
  crl_ptr c(X509_CRL_new());
  ASN1_TIME* last = ASN1_TIME_set(nullptr, static_cast<time_t>(from));
  ASN1_TIME* next = ASN1_TIME_set(nullptr, static_cast<time_t>(to));
  ASN1_INTEGER* number = ASN1_INTEGER_new();
  const bool ok = c && last && next && number && X509_CRL_set_version(c.get(), 1) == 1 &&
                  X509_CRL_set_issuer_name(c.get(), X509_get_subject_name(issuer)) == 1 &&
                  X509_CRL_set1_lastUpdate(c.get(), last) == 1 && X509_CRL_set1_nextUpdate(c.get(), next) == 1 &&
                  ASN1_INTEGER_set(number, 1) == 1 && X509_CRL_add1_ext_i2d(c.get(), NID_crl_number, number, 0, 0) == 1;
  ASN1_TIME_free(last);
  ASN1_TIME_free(next);
  ASN1_INTEGER_free(number);
  if (!ok) fail("cannot make a CRL");
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, nullptr, nullptr, c.get(), 0);
  X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, NID_authority_key_identifier, "keyid:always");
  if (!e || X509_CRL_add_ext(c.get(), e, -1) != 1) fail("cannot add a CRL's key identifier");
  X509_EXTENSION_free(e);
  if (X509_CRL_sign(c.get(), key, EVP_sha256()) <= 0) fail("cannot sign a CRL");
  unsigned char* der = nullptr;
  const int n = i2d_X509_CRL(c.get(), &der);
  if (n <= 0) fail("cannot encode a CRL");
  std::string out = hex({der, static_cast<std::size_t>(n)});
  OPENSSL_free(der);
  return out;
}

// DER of a TLV with a short or long length.
bytes tlv(std::uint8_t tag, const bytes& value) {
  bytes b{tag};
  const std::size_t n = value.size();
  if (n < 0x80) {
    b.push_back(static_cast<std::uint8_t>(n));
  } else if (n < 0x100) {
    b.insert(b.end(), {0x81, static_cast<std::uint8_t>(n)});
  } else {
    b.insert(b.end(), {0x82, static_cast<std::uint8_t>(n >> 8), static_cast<std::uint8_t>(n)});
  }
  b.insert(b.end(), value.begin(), value.end());
  return b;
}

bytes cat(std::initializer_list<bytes> parts) {
  bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const bytes sgx_oid = {0x2a, 0x86, 0x48, 0x86, 0xf8, 0x4d, 0x01, 0x0d, 0x01};
const bytes fmspc = {0x00, 0x90, 0x6e, 0xd5, 0x00, 0x00}, pce_id = {0x00, 0x00};
constexpr std::uint8_t component_svn = 3;
constexpr std::uint16_t pcesvn = 13, qe_isvsvn = 8;

bytes oid(const bytes& prefix, std::initializer_list<std::uint8_t> arcs) {
  bytes o = prefix;
  o.insert(o.end(), arcs);
  return tlv(0x06, o);
}

// The PCK certificate's SGX extensions: PPID, TCB (16 component SVNs, PCESVN, CPUSVN), PCE-ID,
// FMSPC, SGX type (Intel's PCK certificate profile).
bytes sgx_extensions() {
  bytes tcb_items;
  bytes tcb_prefix = sgx_oid;
  tcb_prefix.push_back(2);
  for (std::uint8_t i = 1; i <= 16; ++i)
    tcb_items = cat({tcb_items, tlv(0x30, cat({oid(tcb_prefix, {i}), tlv(0x02, {component_svn})}))});
  tcb_items = cat({tcb_items, tlv(0x30, cat({oid(tcb_prefix, {17}), tlv(0x02, {0x00, static_cast<std::uint8_t>(pcesvn)})}))});
  tcb_items = cat({tcb_items, tlv(0x30, cat({oid(tcb_prefix, {18}), tlv(0x04, bytes(16, component_svn))}))});
  bytes items = cat({tlv(0x30, cat({oid(sgx_oid, {1}), tlv(0x04, bytes(16, 0x5a))})),
                     tlv(0x30, cat({oid(sgx_oid, {2}), tlv(0x30, tcb_items)})),
                     tlv(0x30, cat({oid(sgx_oid, {3}), tlv(0x04, pce_id)})),
                     tlv(0x30, cat({oid(sgx_oid, {4}), tlv(0x04, fmspc)})),
                     tlv(0x30, cat({oid(sgx_oid, {5}), tlv(0x0a, {0x00})}))});
  return tlv(0x30, items);
}

const std::array<std::uint8_t, 32> qe_mrsigner = {0x8c, 0x4f, 0x57, 0x75, 0xd7, 0x96, 0x50, 0x3e, 0x96, 0x13, 0x7f,
                                                  0x77, 0xc6, 0x8a, 0x82, 0x9a, 0x00, 0x56, 0xac, 0x8d, 0xed, 0x70,
                                                  0x14, 0x0b, 0x08, 0x1b, 0x09, 0x44, 0x90, 0xc5, 0x7b, 0xff};

// An SGX report body (384 bytes) with these fields, the rest zero.
bytes report_body(std::uint8_t attributes0, std::span<const std::uint8_t> mr_enclave, std::span<const std::uint8_t> mr_signer,
                  std::uint16_t prod_id, std::uint16_t svn, std::span<const std::uint8_t> report_data) {
  bytes b(384, 0);
  b[48] = attributes0;
  b[56] = 0x03;  // XFRM: x87 and SSE
  std::memcpy(b.data() + 64, mr_enclave.data(), 32);
  std::memcpy(b.data() + 128, mr_signer.data(), 32);
  b[256] = static_cast<std::uint8_t>(prod_id);
  b[257] = static_cast<std::uint8_t>(prod_id >> 8);
  b[258] = static_cast<std::uint8_t>(svn);
  b[259] = static_cast<std::uint8_t>(svn >> 8);
  std::memcpy(b.data() + 320, report_data.data(), 64);
  return b;
}

}  // namespace

struct sim_platform::impl {
  std::string collateral;
  std::array<std::uint8_t, 32> root_pin{};
  quoting_material material;
};

sim_platform::sim_platform(std::int64_t now) : impl_(std::make_unique<impl>()) {
  const std::int64_t from = now - 3600, to = now + 30 * 86400;
  auto root_key = p256(), ca_key = p256(), pck_key = p256(), tcb_key = p256(), attestation = p256();
  auto root = certificate("Intel SGX Root CA", root_key.get(), nullptr, root_key.get(), 1, true, from, to);
  auto ca = certificate("Intel SGX PCK Platform CA", ca_key.get(), root.get(), root_key.get(), 2, true, from, to);
  auto tcb = certificate("Intel SGX TCB Signing", tcb_key.get(), root.get(), root_key.get(), 3, false, from, to);
  auto pck = certificate("Intel SGX PCK Certificate", pck_key.get(), ca.get(), ca_key.get(), 4, false, from, to, sgx_extensions());
  {
    unsigned char* der = nullptr;
    const int n = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(root.get()), &der);
    if (n <= 0) fail("cannot encode the root key");
    impl_->root_pin = sha256({der, static_cast<std::size_t>(n)});
    OPENSSL_free(der);
  }
  const std::string issued = dcap::format_time(from), next = dcap::format_time(to);
  using nlohmann::json;
  json components = json::array();
  for (int i = 0; i < 16; ++i) components.push_back(json::object({{"svn", component_svn}}));
  json tcb_level = json::object();
  tcb_level["tcb"] = json::object({{"sgxtcbcomponents", components}, {"pcesvn", pcesvn}});
  tcb_level["tcbDate"] = issued;
  tcb_level["tcbStatus"] = "UpToDate";
  json tcb_info = json::object();
  tcb_info["id"] = "SGX";
  tcb_info["version"] = 3;
  tcb_info["issueDate"] = issued;
  tcb_info["nextUpdate"] = next;
  tcb_info["fmspc"] = hex(fmspc);
  tcb_info["pceId"] = hex(pce_id);
  tcb_info["tcbType"] = 0;
  tcb_info["tcbEvaluationDataNumber"] = 1;
  tcb_info["tcbLevels"] = json::array({tcb_level});
  json qe_level = json::object();
  qe_level["tcb"] = json::object({{"isvsvn", qe_isvsvn}});
  qe_level["tcbDate"] = issued;
  qe_level["tcbStatus"] = "UpToDate";
  json qe_identity = json::object();
  qe_identity["id"] = "QE";
  qe_identity["version"] = 2;
  qe_identity["issueDate"] = issued;
  qe_identity["nextUpdate"] = next;
  qe_identity["tcbEvaluationDataNumber"] = 1;
  qe_identity["miscselect"] = "00000000";
  qe_identity["miscselectMask"] = "FFFFFFFF";
  qe_identity["attributes"] = "11000000000000000000000000000000";
  qe_identity["attributesMask"] = "FBFFFFFFFFFFFFFF0000000000000000";
  qe_identity["mrsigner"] = hex(qe_mrsigner);
  qe_identity["isvprodid"] = 1;
  qe_identity["tcbLevels"] = json::array({qe_level});
  const std::string tcb_text = tcb_info.dump(), qe_text = qe_identity.dump();
  auto as_bytes = [](const std::string& s) { return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()); };
  const std::string root_pem = pem_of(root.get());
  json c = json::object();
  c["pck_crl_issuer_chain"] = pem_of(ca.get()) + root_pem;
  c["root_ca_crl"] = crl_hex(root.get(), root_key.get(), from, to);
  c["pck_crl"] = crl_hex(ca.get(), ca_key.get(), from, to);
  c["tcb_info_issuer_chain"] = pem_of(tcb.get()) + root_pem;
  c["tcb_info"] = tcb_text;
  c["tcb_info_signature"] = hex(sign_raw(tcb_key.get(), as_bytes(tcb_text)));
  c["qe_identity_issuer_chain"] = pem_of(tcb.get()) + root_pem;
  c["qe_identity"] = qe_text;
  c["qe_identity_signature"] = hex(sign_raw(tcb_key.get(), as_bytes(qe_text)));
  impl_->collateral = c.dump();

  // The QE's part of every quote: its report, whose data binds the attestation key, signed by
  // the PCK key; then the authentication data and the PCK chain.
  unsigned char point[65];
  std::size_t n = 0;
  if (EVP_PKEY_get_octet_string_param(attestation.get(), OSSL_PKEY_PARAM_PUB_KEY, point, sizeof point, &n) != 1 || n != 65 ||
      point[0] != 0x04)
    fail("cannot read the attestation key");
  bytes auth(32);
  for (std::size_t i = 0; i < auth.size(); ++i) auth[i] = static_cast<std::uint8_t>(i);
  std::array<std::uint8_t, 64> qe_data{};
  const auto h = sha256({point + 1, 64}, auth);
  std::memcpy(qe_data.data(), h.data(), 32);
  const std::array<std::uint8_t, 32> no_enclave{};
  const bytes qe_report = report_body(0x11, no_enclave, qe_mrsigner, 1, qe_isvsvn, qe_data);
  const auto qe_sig = sign_raw(pck_key.get(), qe_report);
  const std::string chain = pem_of(pck.get()) + pem_of(ca.get()) + root_pem;
  bytes& part = impl_->material.qe_part;
  part.insert(part.end(), point + 1, point + 65);  // the attestation key itself comes first
  part.insert(part.end(), qe_report.begin(), qe_report.end());
  part.insert(part.end(), qe_sig.begin(), qe_sig.end());
  put16(part, static_cast<std::uint16_t>(auth.size()));
  part.insert(part.end(), auth.begin(), auth.end());
  put16(part, 5);
  put32(part, static_cast<std::uint32_t>(chain.size()));
  part.insert(part.end(), chain.begin(), chain.end());

  bio_ptr b(BIO_new(BIO_s_mem()));
  if (!b || PEM_write_bio_PrivateKey(b.get(), attestation.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("cannot write the attestation key");
  char* data = nullptr;
  const long len = BIO_get_mem_data(b.get(), &data);
  impl_->material.attestation_key_pem.assign(data, static_cast<std::size_t>(len));
}

sim_platform::~sim_platform() = default;
std::string sim_platform::collateral_json() const { return impl_->collateral; }
std::array<std::uint8_t, 32> sim_platform::root_key_sha256() const { return impl_->root_pin; }
quoting_material sim_platform::material() const { return impl_->material; }

struct quote_signer::impl {
  quoting_material material;
  pkey_ptr key;
};

quote_signer::quote_signer(quoting_material m) : impl_(std::make_unique<impl>()) {
  if (m.qe_part.size() < 64) throw std::invalid_argument("tee: the quoting material has no attestation key");
  bio_ptr b(BIO_new_mem_buf(m.attestation_key_pem.data(), static_cast<int>(m.attestation_key_pem.size())));
  impl_->key.reset(b ? PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!impl_->key) fail("the attestation key does not parse");
  impl_->material = std::move(m);
}
quote_signer::~quote_signer() = default;
quote_signer::quote_signer(quote_signer&&) noexcept = default;
quote_signer& quote_signer::operator=(quote_signer&&) noexcept = default;

bytes quote_signer::quote(std::span<const std::uint8_t, 32> mr_enclave, std::span<const std::uint8_t, 64> report_data) const {
  static const std::uint8_t intel_qe_vendor[16] = {0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9,
                                                   0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07};
  static const std::array<std::uint8_t, 32> signer = sha256(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>("troupe tee sim enclave signer"), 29));
  const auto& qe_part = impl_->material.qe_part;
  bytes q;
  q.reserve(48 + 384 + 4 + 64 + qe_part.size());
  put16(q, 3);  // version 3: SGX
  put16(q, 2);  // ECDSA P-256
  put32(q, 0);
  put16(q, qe_isvsvn);
  put16(q, pcesvn);
  q.insert(q.end(), intel_qe_vendor, intel_qe_vendor + 16);
  q.resize(q.size() + 20, 0);  // user data
  // INIT | MODE64BIT, DEBUG clear.
  const bytes body = report_body(0x05, mr_enclave, signer, 0, 1, report_data);
  q.insert(q.end(), body.begin(), body.end());
  const auto sig = sign_raw(impl_->key.get(), q);
  put32(q, static_cast<std::uint32_t>(64 + qe_part.size()));
  q.insert(q.end(), sig.begin(), sig.end());
  q.insert(q.end(), qe_part.begin(), qe_part.end());
  return q;
}

bytes make_quote(const quoting_material& m, std::span<const std::uint8_t, 32> mr_enclave, std::span<const std::uint8_t, 64> report_data) {
  return quote_signer(m).quote(mr_enclave, report_data);
}

bool quote_signature_verifies(const dcap::quote& q) {
  static const std::uint8_t intel_qe_vendor[16] = {0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9,
                                                   0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07};
  if (std::memcmp(q.header.qe_vendor_id.data(), intel_qe_vendor, 16) != 0) return false;
  unsigned char point[65];
  point[0] = 0x04;
  std::memcpy(point + 1, q.attestation_key.data(), 64);
  char group[] = "prime256v1";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, group, 0),
                         OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, point, sizeof point), OSSL_PARAM_construct_end()};
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr);
  EVP_PKEY* key = nullptr;
  const bool loaded = ctx && EVP_PKEY_fromdata_init(ctx) == 1 && EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!loaded) {
    ERR_clear_error();
    return false;
  }
  pkey_ptr k(key);
  sig_ptr sig(ECDSA_SIG_new());
  BIGNUM* r = BN_bin2bn(q.signature.data(), 32, nullptr);
  BIGNUM* s = BN_bin2bn(q.signature.data() + 32, 32, nullptr);
  if (!sig || !r || !s || ECDSA_SIG_set0(sig.get(), r, s) != 1) {
    BN_free(r);
    BN_free(s);
    return false;
  }
  unsigned char* der = nullptr;
  const int n = i2d_ECDSA_SIG(sig.get(), &der);
  if (n <= 0) return false;
  md_ctx_ptr md(EVP_MD_CTX_new());
  const bool ok = md && EVP_DigestVerifyInit(md.get(), nullptr, EVP_sha256(), nullptr, k.get()) == 1 &&
                  EVP_DigestVerify(md.get(), der, static_cast<std::size_t>(n), q.signed_part.data(), q.signed_part.size()) == 1;
  OPENSSL_free(der);
  ERR_clear_error();
  return ok;
}

std::array<std::uint8_t, 32> file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tee: cannot read " + path + " to measure it");
  md_ctx_ptr md(EVP_MD_CTX_new());
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1) fail("SHA-256");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0 && EVP_DigestUpdate(md.get(), buf.data(), static_cast<std::size_t>(in.gcount())) != 1) fail("SHA-256");
  }
  if (in.bad()) throw std::runtime_error("tee: reading " + path + " failed");
  std::array<std::uint8_t, 32> out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(md.get(), out.data(), &n) != 1) fail("SHA-256");
  return out;
}

}  // namespace troupe::federated::tee
