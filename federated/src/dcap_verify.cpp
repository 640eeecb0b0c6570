// A DCAP quote verified against Intel's collateral with OpenSSL. The order of the steps and what
// each proves is told in attest.hpp; the cryptography is OpenSSL's: X.509 path validation with
// CRLs at a chosen time (X509_STORE, X509_VERIFY_PARAM_set_time), ECDSA P-256 over SHA-256 with
// the quote's raw r || s signatures re-encoded as DER, SHA-256 for the attestation key's binding.
//
// The trust anchor is never taken from the input as such: the last certificate of each chain is
// accepted as the root only when it is self-signed and its public key hashes to the pinned value.

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "openssl_ptr.hpp"
#include "dcap_pck.hpp"
#include "dcap_tcb.hpp"
#include "troupe/federated/attest.hpp"

namespace troupe::federated::dcap {

// SHA-256 of the DER SubjectPublicKeyInfo of "CN=Intel SGX Root CA, O=Intel Corporation,
// L=Santa Clara, ST=CA, C=US" (certificate SHA-256 fingerprint 44A0196B...FAB674D3).
const std::array<std::uint8_t, 32> intel_sgx_root_key_sha256 = {
    0xa0, 0xaf, 0x03, 0x12, 0x89, 0xf5, 0xd5, 0xd4, 0x13, 0x2f, 0x91, 0x86, 0x06, 0x8a, 0x7f, 0xc1,
    0x36, 0x28, 0x63, 0x3b, 0xa2, 0x35, 0x77, 0x74, 0x72, 0xe2, 0x9b, 0x6b, 0x6c, 0x67, 0xa4, 0x9e};

namespace {

using detail::pck_extensions;

[[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why); }

using namespace troupe::federated::detail::ossl;

std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

using chain = std::vector<x509_ptr>;

chain load_chain(const std::string& pem, const char* what) {
  bio_ptr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) fail("out of memory");
  chain certs;
  for (;;) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (x == nullptr) {
      const unsigned long e = ERR_peek_last_error();
      // The end of the text is PEM's "no start line"; anything else is a broken certificate.
      if (ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE && !certs.empty()) {
        ERR_clear_error();
        break;
      }
      fail(std::string(what) + ": certificate " + std::to_string(certs.size() + 1) + " does not parse: " + openssl_error());
    }
    certs.emplace_back(x);
  }
  return certs;
}

crl_ptr load_crl(const std::string& text, const char* what) {
  if (text.find("-----BEGIN X509 CRL-----") != std::string::npos) {
    bio_ptr bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
    crl_ptr c(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
    if (!c) fail(std::string(what) + " does not parse: " + openssl_error());
    return c;
  }
  bytes der;
  try {
    der = from_hex(text);
  } catch (const std::invalid_argument& e) {
    fail(std::string(what) + " is neither PEM nor hex DER: " + e.what());
  }
  const unsigned char* p = der.data();
  crl_ptr c(d2i_X509_CRL(nullptr, &p, static_cast<long>(der.size())));
  if (!c) fail(std::string(what) + " does not parse: " + openssl_error());
  if (p != der.data() + der.size()) fail(std::string(what) + " has bytes after its DER");
  return c;
}

std::string common_name(X509* x) {
  X509_NAME* n = X509_get_subject_name(x);
  const int i = X509_NAME_get_index_by_NID(n, NID_commonName, -1);
  if (i < 0) return "";
  const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(n, i));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), static_cast<std::size_t>(ASN1_STRING_length(s)));
}

std::array<std::uint8_t, 32> key_hash(X509* x) {
  unsigned char* der = nullptr;
  const int n = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(x), &der);
  if (n <= 0) fail("cannot encode a public key: " + openssl_error());
  auto h = sha256({der, static_cast<std::size_t>(n)});
  OPENSSL_free(der);
  return h;
}

// The chain's last certificate, which must be the pinned root: self-signed, the pinned key.
X509* pinned_root(const chain& c, const std::array<std::uint8_t, 32>& pin, const char* what) {
  X509* root = c.back().get();
  if (key_hash(root) != pin)
    fail(std::string(what) + " ends in \"" + common_name(root) + "\", whose key is not the pinned root's");
  EVP_PKEY* key = X509_get0_pubkey(root);
  if (key == nullptr || X509_verify(root, key) != 1) fail(std::string(what) + ": the root is not self-signed");
  return root;
}

std::int64_t time_of(const ASN1_TIME* t, const char* what) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) fail(std::string(what) + " has no valid time");
  return static_cast<std::int64_t>(timegm(&tm));
}

// The path from chain[0] to the pinned root, with every certificate checked against `crls` (the
// root CA CRL covers the intermediates and the TCB signing certificate, the PCK CRL the PCK
// certificates) at time `at`. Returns the last second at which it still holds: OpenSSL holds a
// certificate or CRL expired from its notAfter or nextUpdate on, so the second before the
// earliest of those.
std::int64_t verify_path(const chain& c, X509* root, const std::vector<X509_CRL*>& crls, std::int64_t at, const char* what) {
  store_ptr store(X509_STORE_new());
  if (!store || X509_STORE_add_cert(store.get(), root) != 1) fail("cannot build a certificate store: " + openssl_error());
  for (X509_CRL* crl : crls)
    if (X509_STORE_add_crl(store.get(), crl) != 1) fail("cannot add a CRL: " + openssl_error());
  x509_stack_ptr untrusted(sk_X509_new_null());
  for (std::size_t i = 1; i + 1 < c.size(); ++i) sk_X509_push(untrusted.get(), c[i].get());
  store_ctx_ptr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store.get(), c.front().get(), untrusted.get()) != 1)
    fail("cannot start path validation: " + openssl_error());
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_time(param, static_cast<time_t>(at));
  X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL | X509_V_FLAG_X509_STRICT);
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    X509* at_cert = X509_STORE_CTX_get_current_cert(ctx.get());
    ERR_clear_error();
    fail(std::string(what) + ": " + X509_verify_cert_error_string(err) + " (certificate \"" +
         (at_cert ? common_name(at_cert) : std::string("?")) + "\", at " + format_time(at) + ")");
  }
  // The path OpenSSL built must be this chain as given: no certificate skipped or borrowed.
  STACK_OF(X509)* built = X509_STORE_CTX_get0_chain(ctx.get());
  if (static_cast<std::size_t>(sk_X509_num(built)) != c.size())
    fail(std::string(what) + " has " + std::to_string(c.size()) + " certificates, its path " + std::to_string(sk_X509_num(built)));
  std::int64_t until = std::numeric_limits<std::int64_t>::max();
  for (const auto& x : c) until = std::min(until, time_of(X509_get0_notAfter(x.get()), what) - 1);
  for (X509_CRL* crl : crls) until = std::min(until, time_of(X509_CRL_get0_nextUpdate(crl), what) - 1);
  return until;
}

void expect_name(X509* x, std::initializer_list<const char*> names, const char* what) {
  const auto cn = common_name(x);
  for (const char* n : names)
    if (cn == n) return;
  fail(std::string(what) + " is \"" + cn + "\", not " + *names.begin());
}

// ECDSA P-256 with SHA-256; `raw` is r || s, 32 bytes each, big-endian.
bool ecdsa_verify(EVP_PKEY* key, std::span<const std::uint8_t> message, std::span<const std::uint8_t> raw) {
  if (raw.size() != 64) return false;
  sig_ptr sig(ECDSA_SIG_new());
  BIGNUM* r = BN_bin2bn(raw.data(), 32, nullptr);
  BIGNUM* s = BN_bin2bn(raw.data() + 32, 32, nullptr);
  if (!sig || !r || !s || ECDSA_SIG_set0(sig.get(), r, s) != 1) {
    BN_free(r);
    BN_free(s);
    fail("out of memory");
  }
  unsigned char* der = nullptr;
  const int n = i2d_ECDSA_SIG(sig.get(), &der);
  if (n <= 0) fail("cannot encode a signature: " + openssl_error());
  md_ctx_ptr md(EVP_MD_CTX_new());
  const bool ok = md && EVP_DigestVerifyInit(md.get(), nullptr, EVP_sha256(), nullptr, key) == 1 &&
                  EVP_DigestVerify(md.get(), der, static_cast<std::size_t>(n), message.data(), message.size()) == 1;
  OPENSSL_free(der);
  ERR_clear_error();
  return ok;
}

// A P-256 public key from its raw x || y; refused when the point is not on the curve.
pkey_ptr p256_key(std::span<const std::uint8_t, 64> raw) {
  unsigned char point[65];
  point[0] = 0x04;
  std::memcpy(point + 1, raw.data(), 64);
  char group[] = "prime256v1";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, group, 0),
                         OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, point, sizeof point), OSSL_PARAM_construct_end()};
  pkey_ctx_ptr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
  EVP_PKEY* key = nullptr;
  if (!ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1 || EVP_PKEY_fromdata(ctx.get(), &key, EVP_PKEY_PUBLIC_KEY, params) != 1)
    fail("the attestation key is not a P-256 point: " + openssl_error());
  pkey_ptr k(key);
  pkey_ctx_ptr check(EVP_PKEY_CTX_new_from_pkey(nullptr, key, nullptr));
  if (!check || EVP_PKEY_public_check(check.get()) != 1) fail("the attestation key is not a valid P-256 point: " + openssl_error());
  return k;
}

pck_extensions pck_extensions_of(X509* leaf) {
  ASN1_OBJECT* oid = OBJ_txt2obj("1.2.840.113741.1.13.1", 1);
  const int i = X509_get_ext_by_OBJ(leaf, oid, -1);
  ASN1_OBJECT_free(oid);
  if (i < 0) fail("the PCK certificate has no SGX extensions (OID 1.2.840.113741.1.13.1)");
  const ASN1_OCTET_STRING* v = X509_EXTENSION_get_data(X509_get_ext(leaf, i));
  return detail::parse_pck_extensions({ASN1_STRING_get0_data(v), static_cast<std::size_t>(ASN1_STRING_length(v))});
}

// Returns the CRL's nextUpdate.
std::int64_t check_crl(X509_CRL* crl, X509* issuer, std::int64_t at, const char* what) {
  if (X509_NAME_cmp(X509_CRL_get_issuer(crl), X509_get_subject_name(issuer)) != 0)
    fail(std::string(what) + " is not issued by \"" + common_name(issuer) + "\"");
  if (X509_CRL_verify(crl, X509_get0_pubkey(issuer)) != 1) {
    ERR_clear_error();
    fail(std::string(what) + "'s signature does not verify under \"" + common_name(issuer) + "\"");
  }
  const auto from = time_of(X509_CRL_get0_lastUpdate(crl), what);
  const auto to = time_of(X509_CRL_get0_nextUpdate(crl), what);
  if (at < from || at > to)
    fail(std::string(what) + " is valid from " + format_time(from) + " to " + format_time(to) + ", not at " + format_time(at));
  return to;
}

// A signed collateral document: its issuer chain (the TCB signing certificate, then the root), its
// signature over the exact bytes of the JSON body, then its header. Returns the earliest expiry
// of the chain and the document.
std::int64_t check_signed_document(const std::string& issuer_chain, const std::string& body, const std::string& signature_hex,
                           X509_CRL* root_crl, std::int64_t at, const policy& p, const char* what, const std::string& id) {
  const std::string chain_what = std::string(what) + "'s issuer chain";
  const chain c = load_chain(issuer_chain, chain_what.c_str());
  if (c.size() != 2) fail(chain_what + " has " + std::to_string(c.size()) + " certificates, not 2 (signing key, root)");
  X509* root = pinned_root(c, p.root_key_sha256, chain_what.c_str());
  expect_name(c[0].get(), {"Intel SGX TCB Signing"}, (chain_what + "'s signer").c_str());
  const auto chain_until = verify_path(c, root, {root_crl}, at, chain_what.c_str());
  bytes sig;
  try {
    sig = from_hex(signature_hex);
  } catch (const std::invalid_argument& e) {
    fail(std::string(what) + "'s signature is not hex: " + e.what());
  }
  if (sig.size() != 64) fail(std::string(what) + "'s signature has " + std::to_string(sig.size()) + " bytes, not 64 (r || s)");
  const auto* data = reinterpret_cast<const std::uint8_t*>(body.data());
  if (!ecdsa_verify(X509_get0_pubkey(c[0].get()), {data, body.size()}, sig))
    fail(std::string(what) + "'s signature does not verify under the TCB signing key");
  return std::min(chain_until, detail::check_document(body, what, id, at));
}

}  // namespace

const char* to_string(verify_step s) noexcept {
  switch (s) {
    case verify_step::crls: return "crls";
    case verify_step::pck_chain: return "pck_chain";
    case verify_step::tcb_info: return "tcb_info";
    case verify_step::qe_identity: return "qe_identity";
    case verify_step::qe_report_signature: return "qe_report_signature";
    case verify_step::attestation_key: return "attestation_key";
    case verify_step::quote_signature: return "quote_signature";
    case verify_step::qe_tcb: return "qe_tcb";
    case verify_step::tcb_status: return "tcb_status";
    case verify_step::policy: return "policy";
  }
  return "?";
}

std::string check_policy(const quote& q, const policy& p) {
  if (p.nonce.has_value() != p.enclave_key.has_value())
    throw std::invalid_argument("a report data policy needs both the nonce and the enclave key");
  if (p.nonce && p.nonce->size() != 32)
    throw std::invalid_argument("the nonce has " + std::to_string(p.nonce->size()) + " bytes, not 32");
  if (p.enclave_key && p.enclave_key->empty()) throw std::invalid_argument("the enclave key is empty");
  const char* name = q.tee == tee_kind::tdx ? "MRTD" : "MRENCLAVE";
  const auto m = q.measurement();
  if (p.measurement) {
    if (p.measurement->size() != m.size())
      throw std::invalid_argument(std::string("the expected ") + name + " has " + std::to_string(p.measurement->size()) +
                                  " bytes, not the " + std::to_string(m.size()) + " of the " + to_string(q.tee) + " quote's");
    if (!std::equal(m.begin(), m.end(), p.measurement->begin()))
      return std::string(name) + " " + to_hex(m) + " is not the expected " + to_hex(*p.measurement);
  }
  if (q.debug() && !p.allow_debug) return std::string("the ") + (q.tee == tee_kind::tdx ? "trust domain" : "enclave") + " runs in debug mode";
  if (p.nonce) {
    const auto want = sha256(*p.enclave_key, *p.nonce);
    const auto rd = q.report_data();
    if (!std::equal(want.begin(), want.end(), rd.begin()))
      return "report data " + to_hex(rd.first(32)) + " is not SHA-256(enclave key || nonce) = " + to_hex(want);
  }
  return "";
}

verification verify_quote(const quote& q, const collateral& c, std::int64_t at, const policy& p) {
  (void)check_policy(q, p);  // a malformed policy is the caller's error: thrown before any step
  verification v;
  v.tee = q.tee;
  const auto m = q.measurement(), rd = q.report_data();
  v.measurement.assign(m.begin(), m.end());
  v.report_data.assign(rd.begin(), rd.end());
  v.debug = q.debug();
  ERR_clear_error();

  auto until = [&](std::int64_t t) { v.valid_until = std::min(v.valid_until, t); };
  auto step = [&](verify_step s, auto&& body) {
    if (v.failed) return;
    try {
      body();
      v.passed.push_back(s);
    } catch (const std::exception& e) {
      v.failed = s;
      v.error = e.what();
      ERR_clear_error();
    }
  };
  const bool tdx = q.tee == tee_kind::tdx;
  crl_ptr root_crl, pck_crl;
  chain pck;
  pck_extensions ext;
  pkey_ptr attestation_key;
  detail::tcb_level qe_level;

  step(verify_step::crls, [&] {
    const chain issuers = load_chain(c.pck_crl_issuer_chain, "the PCK CRL's issuer chain");
    if (issuers.size() != 2) fail("the PCK CRL's issuer chain has " + std::to_string(issuers.size()) + " certificates, not 2");
    X509* root = pinned_root(issuers, p.root_key_sha256, "the PCK CRL's issuer chain");
    root_crl = load_crl(c.root_ca_crl, "the root CA CRL");
    pck_crl = load_crl(c.pck_crl, "the PCK CRL");
    until(check_crl(root_crl.get(), root, at, "the root CA CRL"));
    until(verify_path(issuers, root, {root_crl.get()}, at, "the PCK CRL's issuer chain"));
    until(check_crl(pck_crl.get(), issuers[0].get(), at, "the PCK CRL"));
  });
  step(verify_step::pck_chain, [&] {
    pck = load_chain(q.pck_chain_pem, "the PCK certificate chain");
    if (pck.size() != 3) fail("the PCK certificate chain has " + std::to_string(pck.size()) + " certificates, not 3");
    X509* root = pinned_root(pck, p.root_key_sha256, "the PCK certificate chain");
    expect_name(pck[0].get(), {"Intel SGX PCK Certificate"}, "the PCK certificate");
    expect_name(pck[1].get(), {"Intel SGX PCK Platform CA", "Intel SGX PCK Processor CA"}, "the PCK issuer");
    until(verify_path(pck, root, {root_crl.get(), pck_crl.get()}, at, "the PCK certificate chain"));
    ext = pck_extensions_of(pck[0].get());
  });
  step(verify_step::tcb_info, [&] {
    until(check_signed_document(c.tcb_info_issuer_chain, c.tcb_info, c.tcb_info_signature, root_crl.get(), at, p, "the TCB info",
                                tdx ? "TDX" : "SGX"));
    detail::check_tcb_info_platform(c.tcb_info, ext);
    v.fmspc = to_hex(ext.fmspc);
  });
  step(verify_step::qe_identity, [&] {
    until(check_signed_document(c.qe_identity_issuer_chain, c.qe_identity, c.qe_identity_signature, root_crl.get(), at, p,
                                "the QE identity", tdx ? "TD_QE" : "QE"));
  });
  step(verify_step::qe_report_signature, [&] {
    if (!ecdsa_verify(X509_get0_pubkey(pck[0].get()), q.qe_report_raw, q.qe_report_signature))
      fail("the QE report's signature does not verify under the PCK certificate's key");
  });
  step(verify_step::attestation_key, [&] {
    const auto want = sha256(q.attestation_key, q.qe_auth_data);
    const auto& got = q.qe_report.report_data;
    if (!std::equal(want.begin(), want.end(), got.begin()) || std::any_of(got.begin() + 32, got.end(), [](auto b) { return b != 0; }))
      fail("the QE report data is not SHA-256(attestation key || QE authentication data) followed by 32 zeros");
    attestation_key = p256_key(q.attestation_key);
  });
  step(verify_step::quote_signature, [&] {
    if (!ecdsa_verify(attestation_key.get(), q.signed_part, q.signature))
      fail("the quote's signature does not verify under the attestation key");
    static const std::uint8_t intel_qe_vendor[16] = {0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9,
                                                     0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07};
    if (std::memcmp(q.header.qe_vendor_id.data(), intel_qe_vendor, 16) != 0)
      fail("the QE vendor ID " + to_hex(q.header.qe_vendor_id) + " is not Intel's");
  });
  step(verify_step::qe_tcb, [&] {
    qe_level = detail::match_qe_identity(c.qe_identity, q.qe_report);
    v.qe_tcb_status = qe_level.status;
  });
  step(verify_step::tcb_status, [&] {
    detail::tcb_level module;
    if (tdx) {
      module = detail::match_tdx_module(c.tcb_info, q);
      v.tdx_module_tcb_status = module.status;
    }
    const auto platform = detail::match_platform_tcb(c.tcb_info, q, ext);
    v.platform_tcb_status = platform.status;
    v.tcb_date = platform.date;
    std::string status = platform.status;
    if (tdx) status = detail::converge_status(status, module.status);
    status = detail::converge_status(status, qe_level.status);
    for (const detail::tcb_level* l : std::initializer_list<const detail::tcb_level*>{&platform, &module, &qe_level})
      v.advisory_ids.insert(v.advisory_ids.end(), l->advisory_ids.begin(), l->advisory_ids.end());
    std::sort(v.advisory_ids.begin(), v.advisory_ids.end());
    v.advisory_ids.erase(std::unique(v.advisory_ids.begin(), v.advisory_ids.end()), v.advisory_ids.end());
    v.tcb_status = status;
    if (status == "Revoked")
      fail("the TCB is Revoked (platform " + platform.status + ", QE " + qe_level.status +
           (tdx ? ", TDX module " + module.status : std::string()) + ")");
    v.tcb_accepted = std::find(p.accepted_tcb_statuses.begin(), p.accepted_tcb_statuses.end(), status) != p.accepted_tcb_statuses.end();
  });
  step(verify_step::policy, [&] {
    if (auto why = check_policy(q, p); !why.empty()) fail(why);
  });
  return v;
}

}  // namespace troupe::federated::dcap
