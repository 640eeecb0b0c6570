#pragma once
// Owning pointers to OpenSSL objects, shared by the quote verifier (dcap_verify.cpp) and the
// simulated platform that signs quotes (tee_platform.cpp).

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>

#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

namespace troupe::federated::detail::ossl {

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const noexcept { Free(p); }
};
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;
using crl_ptr = std::unique_ptr<X509_CRL, deleter<X509_CRL, X509_CRL_free>>;
using store_ptr = std::unique_ptr<X509_STORE, deleter<X509_STORE, X509_STORE_free>>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using pkey_ctx_ptr = std::unique_ptr<EVP_PKEY_CTX, deleter<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, deleter<EVP_MD_CTX, EVP_MD_CTX_free>>;
using bio_ptr = std::unique_ptr<BIO, deleter<BIO, BIO_free_all>>;
using sig_ptr = std::unique_ptr<ECDSA_SIG, deleter<ECDSA_SIG, ECDSA_SIG_free>>;
inline void free_x509_stack(STACK_OF(X509) * s) { sk_X509_free(s); }
using x509_stack_ptr = std::unique_ptr<STACK_OF(X509), deleter<STACK_OF(X509), free_x509_stack>>;

/// SHA-256 of a then b.
inline std::array<std::uint8_t, 32> sha256(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b = {}) {
  std::array<std::uint8_t, 32> out{};
  md_ctx_ptr md(EVP_MD_CTX_new());
  unsigned int n = 0;
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1 || EVP_DigestUpdate(md.get(), a.data(), a.size()) != 1 ||
      EVP_DigestUpdate(md.get(), b.data(), b.size()) != 1 || EVP_DigestFinal_ex(md.get(), out.data(), &n) != 1)
    throw std::runtime_error("SHA-256 failed");
  return out;
}

}  // namespace troupe::federated::detail::ossl
