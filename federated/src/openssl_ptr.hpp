#pragma once
// Owning pointers to OpenSSL objects, shared by the quote verifier (dcap_verify.cpp) and the
// simulated platform that signs quotes (tee_platform.cpp).

#include <memory>

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

}  // namespace troupe::federated::detail::ossl
