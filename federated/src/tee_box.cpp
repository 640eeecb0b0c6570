// The clients' boxes to the enclave: crypto_kx session keys (libsodium), AES-256-GCM (OpenSSL's
// EVP, which uses the CPU's AES and carry-less multiply instructions: about 3x libsodium's
// XSalsa20-Poly1305 on a 318 KB update here).

#include "tee_box.hpp"

#include <openssl/evp.h>
#include <sodium.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>

namespace troupe::federated::tee {
namespace {

struct cipher_free {
  void operator()(EVP_CIPHER_CTX* c) const noexcept { EVP_CIPHER_CTX_free(c); }
};
using cipher_ptr = std::unique_ptr<EVP_CIPHER_CTX, cipher_free>;

// One context per thread, reset by each Init: making one costs more than a small box.
EVP_CIPHER_CTX* context() {
  thread_local cipher_ptr c(EVP_CIPHER_CTX_new());
  if (!c) throw std::runtime_error("tee box: OpenSSL cannot make a cipher context");
  return c.get();
}

}  // namespace

box_sender make_sender(const key32& enclave_key) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
  box_sender s;
  crypto_kx_keypair(s.public_key.data(), s.secret_key.data());
  if (crypto_kx_client_session_keys(s.rx.data(), s.tx.data(), s.public_key.data(), s.secret_key.data(), enclave_key.data()) != 0)
    throw std::runtime_error("tee box: the enclave's key is not a usable X25519 key");
  return s;
}

enclave_session session_with(const key32& enclave_public, const key32& enclave_secret, std::span<const std::uint8_t, 32> client_key) {
  enclave_session k;
  if (crypto_kx_server_session_keys(k.rx.data(), k.tx.data(), enclave_public.data(), enclave_secret.data(), client_key.data()) != 0)
    throw std::runtime_error("the client's key is not a usable X25519 key");
  return k;
}

std::array<std::uint8_t, 32> round_tag(const key32& key, std::span<const std::uint8_t> statement, std::uint64_t client) {
  std::array<std::uint8_t, 32> out{};
  std::array<std::uint8_t, 8> id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(client >> (8 * i));
  crypto_generichash_state st;
  crypto_generichash_init(&st, key.data(), key.size(), out.size());
  crypto_generichash_update(&st, statement.data(), statement.size());
  crypto_generichash_update(&st, id.data(), id.size());
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

void seal_box(const box_sender& from, std::span<const std::uint8_t> aad, std::initializer_list<std::span<const std::uint8_t>> parts,
              std::span<std::uint8_t> out) {
  if (aad.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) throw std::invalid_argument("tee box: associated data too long");
  std::size_t total = 0;
  for (const auto& p : parts) total += p.size();
  if (out.size() != box_overhead + total) throw std::invalid_argument("tee box: the output is not the box's length");
  std::copy(from.public_key.begin(), from.public_key.end(), out.begin());
  std::uint8_t* nonce = out.data() + 32;
  randombytes_buf(nonce, 12);
  EVP_CIPHER_CTX* c = context();
  std::uint8_t* at = out.data() + box_header;
  int n = 0;
  bool ok = EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr, from.tx.data(), nonce) == 1 &&
            (aad.empty() || EVP_EncryptUpdate(c, nullptr, &n, aad.data(), static_cast<int>(aad.size())) == 1);
  for (const auto& p : parts) {
    if (!ok || p.empty()) continue;
    ok = EVP_EncryptUpdate(c, at, &n, p.data(), static_cast<int>(p.size())) == 1;
    at += n;
  }
  ok = ok && EVP_EncryptFinal_ex(c, at, &n) == 1;
  at += n;
  ok = ok && at == out.data() + box_header + total && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, box_tag, at) == 1;
  if (!ok) throw std::runtime_error("tee box: AES-256-GCM failed");
}

namespace {

// Decrypts box's ciphertext into out (which may be the ciphertext itself: GCM decrypts in place).
bool decrypt(const key32& rx, std::span<const std::uint8_t> aad, std::span<const std::uint8_t> box, std::uint8_t* out) {
  const std::size_t len = box.size() - box_overhead;
  EVP_CIPHER_CTX* c = context();
  int n = 0, m = 0;
  std::array<std::uint8_t, box_tag> tag{};
  std::copy(box.end() - box_tag, box.end(), tag.begin());
  return aad.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()) &&
         EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), nullptr, rx.data(), box.data() + 32) == 1 &&
         (aad.empty() || EVP_DecryptUpdate(c, nullptr, &m, aad.data(), static_cast<int>(aad.size())) == 1) &&
         EVP_DecryptUpdate(c, out, &n, box.data() + box_header, static_cast<int>(len)) == 1 &&
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, box_tag, tag.data()) == 1 && EVP_DecryptFinal_ex(c, out + n, &m) == 1 &&
         static_cast<std::size_t>(n + m) == len;
}

bool fits(std::span<const std::uint8_t> box) {
  return box.size() >= box_overhead && box.size() - box_overhead <= static_cast<std::size_t>(std::numeric_limits<int>::max());
}

}  // namespace

bool open_box(const key32& rx, std::span<const std::uint8_t> aad, std::span<const std::uint8_t> box, std::vector<std::uint8_t>& plain) {
  if (!fits(box)) return false;
  plain.resize(box.size() - box_overhead);
  const bool ok = decrypt(rx, aad, box, plain.data());
  if (!ok) sodium_memzero(plain.data(), plain.size());
  return ok;
}

std::span<const std::uint8_t> open_box_in_place(const key32& rx, std::span<const std::uint8_t> aad, std::span<std::uint8_t> box) {
  if (!fits(box)) return {};
  const auto plain = box.subspan(box_header, box.size() - box_overhead);
  if (decrypt(rx, aad, box, plain.data())) return plain;
  sodium_memzero(plain.data(), plain.size());
  return {};
}

}  // namespace troupe::federated::tee
