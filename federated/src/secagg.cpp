#include "troupe/federated/secagg.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace troupe::federated::secagg {

namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument("secagg: " + why); }
[[noreturn]] void crypto_failed(const char* what) { throw std::runtime_error(std::string("secagg: OpenSSL failed to ") + what); }

void random_bytes(void* out, std::size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1) crypto_failed("draw random bytes");
}

// ---- X25519, AES-GCM and hashing through OpenSSL's EVP interface ----------------------------------

struct pkey_free { void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); } };
struct pkey_ctx_free { void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); } };
struct cipher_ctx_free { void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); } };
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using cipher_ctx_ptr = std::unique_ptr<EVP_CIPHER_CTX, cipher_ctx_free>;

/// An X25519 public key as an OpenSSL key object. Built through a per-thread import context:
/// EVP_PKEY_new_raw_public_key looks the key type up by name on every call.
pkey_ptr x25519_public(const key& raw) {
  thread_local const std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free> import = [] {
    std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free> ctx(EVP_PKEY_CTX_new_from_name(nullptr, "X25519", nullptr));
    if (!ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1) crypto_failed("set up X25519 key import");
    return ctx;
  }();
  key copy = raw;  // OSSL_PARAM takes a non-const pointer
  OSSL_PARAM params[] = {OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, copy.data(), copy.size()),
                         OSSL_PARAM_construct_end()};
  EVP_PKEY* pk = nullptr;
  if (EVP_PKEY_fromdata(import.get(), &pk, EVP_PKEY_PUBLIC_KEY, params) != 1 || !pk) bad("an X25519 public key is malformed");
  return pkey_ptr(pk);
}

/// An X25519 secret key held as an OpenSSL key object, so that each agreement costs one scalar
/// multiplication (building the object from raw bytes computes the public key once). The
/// derivation context is set up at the first agreement and kept: setting one up looks the
/// algorithm up in OpenSSL's provider store again.
class x25519_secret {
public:
  x25519_secret() = default;
  explicit x25519_secret(const key& raw)
      : raw_(raw), pkey_(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, raw.data(), raw.size())) {
    std::size_t len = public_.size();
    if (!pkey_ || EVP_PKEY_get_raw_public_key(pkey_.get(), public_.data(), &len) != 1 || len != public_.size())
      crypto_failed("derive an X25519 public key");
  }
  static x25519_secret generate() {
    key raw;
    random_bytes(raw.data(), raw.size());
    return x25519_secret(raw);
  }
  const key& raw() const noexcept { return raw_; }
  const key& public_key() const noexcept { return public_; }

  /// The shared secret with `other_public`; a malformed or low-order public key is refused.
  /// Not for concurrent calls on one secret (it reuses its context).
  key agree(const key& other_public) const {
    const pkey_ptr pk = x25519_public(other_public);
    if (!derive_) {
      derive_.reset(EVP_PKEY_CTX_new(pkey_.get(), nullptr));
      if (!derive_ || EVP_PKEY_derive_init(derive_.get()) != 1) {
        derive_.reset();
        crypto_failed("set up an X25519 key agreement");
      }
    }
    key shared;
    std::size_t len = shared.size();
    // Without OpenSSL's peer check: for X25519 it only asks that the key have a public part
    // (and builds a context to ask); the derivation itself refuses low-order points.
    if (EVP_PKEY_derive_set_peer_ex(derive_.get(), pk.get(), 0) != 1 ||
        EVP_PKEY_derive(derive_.get(), shared.data(), &len) != 1 || len != shared.size())
      bad("X25519 key agreement failed (an invalid public key)");
    return shared;
  }

private:
  key raw_{}, public_{};
  pkey_ptr pkey_;
  mutable std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free> derive_;
};

/// SHA-256 of a label and some key material: the seeds and box keys derived from shared secrets.
key derive(const key& material, const char* label) {
  key out;
  static const EVP_MD* sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  unsigned int len = 0;
  thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!sha256 || !md || EVP_DigestInit_ex(md.get(), sha256, nullptr) != 1 ||
      EVP_DigestUpdate(md.get(), label, std::strlen(label)) != 1 ||
      EVP_DigestUpdate(md.get(), material.data(), material.size()) != 1 ||
      EVP_DigestFinal_ex(md.get(), out.data(), &len) != 1 || len != out.size())
    crypto_failed("hash");
  return out;
}

// OpenSSL 3 looks algorithms up by name on every implicit use; fetch each once.
const EVP_CIPHER* cipher(const char* name) {
  const EVP_CIPHER* c = EVP_CIPHER_fetch(nullptr, name, nullptr);
  if (!c) crypto_failed(name);
  return c;
}
const EVP_CIPHER* aes_256_gcm() {
  static const EVP_CIPHER* c = cipher("AES-256-GCM");
  return c;
}
const EVP_CIPHER* aes_128_ctr() {
  static const EVP_CIPHER* c = cipher("AES-128-CTR");
  return c;
}

constexpr std::size_t gcm_nonce = 12, gcm_tag = 16;

/// One cipher context per thread, set up again for every box or stream (allocating one costs
/// more than the AES key schedule).
const cipher_ctx_ptr& thread_cipher() {
  thread_local const cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
  if (!ctx) crypto_failed("allocate a cipher context");
  return ctx;
}

/// AES-256-GCM: nonce || ciphertext || tag.
std::vector<std::uint8_t> seal(const key& k, const std::vector<std::uint8_t>& plain) {
  std::vector<std::uint8_t> box(gcm_nonce + plain.size() + gcm_tag);
  random_bytes(box.data(), gcm_nonce);
  const auto& ctx = thread_cipher();
  int len = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), aes_256_gcm(), nullptr, k.data(), box.data()) != 1 ||
      EVP_EncryptUpdate(ctx.get(), box.data() + gcm_nonce, &len, plain.data(), static_cast<int>(plain.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), box.data() + gcm_nonce + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, gcm_tag, box.data() + gcm_nonce + plain.size()) != 1)
    crypto_failed("encrypt a share");
  return box;
}

/// Opens a box from seal(); false when it fails authentication.
bool open(const key& k, const std::vector<std::uint8_t>& box, std::vector<std::uint8_t>& plain) {
  if (box.size() != gcm_nonce + plain.size() + gcm_tag) return false;
  const auto& ctx = thread_cipher();
  int len = 0;
  std::array<std::uint8_t, gcm_tag> tag;
  std::memcpy(tag.data(), box.data() + box.size() - gcm_tag, gcm_tag);
  return ctx && EVP_DecryptInit_ex(ctx.get(), aes_256_gcm(), nullptr, k.data(), box.data()) == 1 &&
         EVP_DecryptUpdate(ctx.get(), plain.data(), &len, box.data() + gcm_nonce, static_cast<int>(plain.size())) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, gcm_tag, tag.data()) == 1 &&
         EVP_DecryptFinal_ex(ctx.get(), plain.data() + len, &len) == 1;
}

// ---- GF(2^61 - 1) --------------------------------------------------------------------------------

constexpr std::uint64_t prime = (std::uint64_t{1} << 61) - 1;

std::uint64_t add_mod(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t s = a + b;  // < 2^62: no overflow
  return s >= prime ? s - prime : s;
}
std::uint64_t sub_mod(std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : a + prime - b; }
__extension__ typedef unsigned __int128 u128;

std::uint64_t mul_mod(std::uint64_t a, std::uint64_t b) {
  const u128 p = static_cast<u128>(a) * b;
  std::uint64_t r = static_cast<std::uint64_t>(p & prime) + static_cast<std::uint64_t>(p >> 61);
  return r >= prime ? r - prime : r;
}
std::uint64_t pow_mod(std::uint64_t a, std::uint64_t e) {
  std::uint64_t r = 1;
  for (; e; e >>= 1, a = mul_mod(a, a))
    if (e & 1) r = mul_mod(r, a);
  return r;
}
/// Uniform field elements, drawn from OpenSSL's generator in one call per batch.
void random_field_elements(std::span<std::uint64_t> out) {
  random_bytes(out.data(), out.size_bytes());
  for (auto& x : out) {
    x &= prime;  // 61 bits
    while (x == prime) {  // the one 61-bit value outside the field: draw it again
      random_bytes(&x, sizeof x);
      x &= prime;
    }
  }
}

// A 32-byte secret as five field elements: four 7-byte chunks and one 4-byte chunk.
constexpr std::size_t chunk_bytes[5] = {7, 7, 7, 7, 4};

std::array<std::uint64_t, 5> to_chunks(const key& k) {
  std::array<std::uint64_t, 5> out{};
  std::size_t at = 0;
  for (int c = 0; c < 5; ++c) {
    for (std::size_t b = 0; b < chunk_bytes[c]; ++b) out[c] |= std::uint64_t{k[at++]} << (8 * b);
  }
  return out;
}
key from_chunks(const std::array<std::uint64_t, 5>& chunks) {
  key k{};
  std::size_t at = 0;
  for (int c = 0; c < 5; ++c) {
    if (chunks[c] >> (8 * chunk_bytes[c])) throw std::runtime_error("secagg: a reconstructed secret is malformed");
    for (std::size_t b = 0; b < chunk_bytes[c]; ++b) k[at++] = static_cast<std::uint8_t>(chunks[c] >> (8 * b));
  }
  return k;
}

// ---- masks ---------------------------------------------------------------------------------------

/// The pairwise seed both ends of an edge compute from their own secret and the other's public key.
key mask_seed(const x25519_secret& secret, const key& other_public) {
  return derive(secret.agree(other_public), "troupe secagg pairwise mask");
}

// The mask generator. PRG(seed) is the AES-128-CTR key stream under the seed's first 16 bytes
// from a zero counter, read as little-endian 32-bit words: word w is in block w / 4, whose
// counter is w / 4 as a 128-bit big-endian integer. A client adds k + 1 streams to its input and
// the server takes one stream per survivor out of the sum, so the streams are made chunk by
// chunk: each 16 KiB chunk of the output stays in L1 while every stream passes over it.
constexpr std::size_t chunk_words = 4096;

/// The reference: OpenSSL's EVP AES-128-CTR, one stream after another over the whole vector.
void apply_masks_reference(std::span<std::uint32_t> values, std::span<const mask_term> terms, std::size_t offset) {
  alignas(64) thread_local std::array<std::uint32_t, chunk_words> zeros{}, stream{};
  std::array<std::uint8_t, 16> iv{};
  const std::uint64_t first_block = offset / 4;
  for (int b = 0; b < 8; ++b) iv[15 - b] = static_cast<std::uint8_t>(first_block >> (8 * b));
  const auto& ctx = thread_cipher();
  std::uint32_t* __restrict out = values.data();
  for (const auto& t : terms) {
    if (EVP_EncryptInit_ex(ctx.get(), aes_128_ctr(), nullptr, t.seed.data(), iv.data()) != 1)
      crypto_failed("start the mask generator");
    for (std::size_t at = 0; at < values.size(); at += chunk_words) {
      const std::size_t n = std::min(chunk_words, values.size() - at);
      int len = 0;
      if (EVP_EncryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(stream.data()), &len,
                            reinterpret_cast<const unsigned char*>(zeros.data()), static_cast<int>(n * 4)) != 1)
        crypto_failed("generate a mask");
      const std::uint32_t* __restrict m = stream.data();
      if (t.subtract)
        for (std::size_t i = 0; i < n; ++i) out[at + i] -= m[i];
      else
        for (std::size_t i = 0; i < n; ++i) out[at + i] += m[i];
    }
  }
}

#if defined(__x86_64__)
#define TROUPE_AESNI __attribute__((target("aes,sse4.1")))
#define TROUPE_VAES __attribute__((target("avx512f,avx512bw,vaes,aes,sse4.1")))

template <int Rcon>
TROUPE_AESNI inline __m128i next_round_key(__m128i k) {
  const __m128i g = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(k, Rcon), 0xff);
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  return _mm_xor_si128(k, g);
}

/// The AES-128 key schedule (FIPS 197, 5.2) of the seed's first 16 bytes.
struct aes128_schedule {
  __m128i rk[11];
};
TROUPE_AESNI aes128_schedule expand_key(const key& seed) {
  aes128_schedule s;
  s.rk[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(seed.data()));
  s.rk[1] = next_round_key<0x01>(s.rk[0]);
  s.rk[2] = next_round_key<0x02>(s.rk[1]);
  s.rk[3] = next_round_key<0x04>(s.rk[2]);
  s.rk[4] = next_round_key<0x08>(s.rk[3]);
  s.rk[5] = next_round_key<0x10>(s.rk[4]);
  s.rk[6] = next_round_key<0x20>(s.rk[5]);
  s.rk[7] = next_round_key<0x40>(s.rk[6]);
  s.rk[8] = next_round_key<0x80>(s.rk[7]);
  s.rk[9] = next_round_key<0x1b>(s.rk[8]);
  s.rk[10] = next_round_key<0x36>(s.rk[9]);
  return s;
}

/// Four counter blocks (little-endian block indices) through AES-128.
TROUPE_VAES inline __m512i encrypt_counters(const __m512i* rk, __m512i counter, __m512i reverse) {
  __m512i b = _mm512_xor_si512(_mm512_shuffle_epi8(counter, reverse), rk[0]);
  for (int r = 1; r < 10; ++r) b = _mm512_aesenc_epi128(b, rk[r]);
  return _mm512_aesenclast_epi128(b, rk[10]);
}

template <bool Subtract>
TROUPE_VAES inline __m512i accumulate(__m512i v, __m512i m) {
  return Subtract ? _mm512_sub_epi32(v, m) : _mm512_add_epi32(v, m);
}

/// out[i] ±= PRG word (4 * first_block + i) for i < n: four blocks per 512-bit register, eight
/// registers in flight to cover the AES rounds' latency.
template <bool Subtract>
TROUPE_VAES void add_stream_vaes(const aes128_schedule& s, std::uint64_t first_block, std::uint32_t* out, std::size_t n) {
  __m512i rk[11];
  for (int r = 0; r < 11; ++r) rk[r] = _mm512_maskz_broadcast_i32x4(0xFFFF, s.rk[r]);
  // Counters are kept little-endian (the block index in the low 64 bits of each lane) and
  // byte-reversed into the big-endian counter block that AES encrypts.
  const __m512i reverse = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const auto base = static_cast<long long>(first_block);
  __m512i counter = _mm512_set_epi64(0, base + 3, 0, base + 2, 0, base + 1, 0, base);
  const __m512i four = _mm512_set_epi64(0, 4, 0, 4, 0, 4, 0, 4);
  constexpr int lanes = 8;
  std::size_t i = 0;
  for (; i + 16 * lanes <= n; i += 16 * lanes) {
    __m512i b[lanes];
#pragma GCC unroll 8
    for (int j = 0; j < lanes; ++j) {
      b[j] = _mm512_xor_si512(_mm512_shuffle_epi8(counter, reverse), rk[0]);
      counter = _mm512_add_epi64(counter, four);
    }
#pragma GCC unroll 9
    for (int r = 1; r < 10; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < lanes; ++j) b[j] = _mm512_aesenc_epi128(b[j], rk[r]);
#pragma GCC unroll 8
    for (int j = 0; j < lanes; ++j) {
      std::uint32_t* at = out + i + 16 * j;
      _mm512_storeu_si512(at, accumulate<Subtract>(_mm512_loadu_si512(at), _mm512_aesenclast_epi128(b[j], rk[10])));
    }
  }
  for (; i < n; i += 16) {  // the last few blocks, one register at a time
    const __m512i m = encrypt_counters(rk, counter, reverse);
    counter = _mm512_add_epi64(counter, four);
    const auto live = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    _mm512_mask_storeu_epi32(out + i, live, accumulate<Subtract>(_mm512_maskz_loadu_epi32(live, out + i), m));
  }
}

bool cpu_has_vaes() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("vaes") && __builtin_cpu_supports("aes");
  return has;
}

void apply_masks_vaes(std::span<std::uint32_t> values, std::span<const mask_term> terms, std::size_t offset) {
  std::vector<aes128_schedule> keys(terms.size());
  for (std::size_t t = 0; t < terms.size(); ++t) keys[t] = expand_key(terms[t].seed);
  for (std::size_t at = 0; at < values.size(); at += chunk_words) {
    const std::size_t n = std::min(chunk_words, values.size() - at);
    const std::uint64_t block = (offset + at) / 4;
    for (std::size_t t = 0; t < terms.size(); ++t) {
      if (terms[t].subtract)
        add_stream_vaes<true>(keys[t], block, values.data() + at, n);
      else
        add_stream_vaes<false>(keys[t], block, values.data() + at, n);
    }
  }
}
#else
bool cpu_has_vaes() { return false; }
void apply_masks_vaes(std::span<std::uint32_t> values, std::span<const mask_term> terms, std::size_t offset) {
  apply_masks_reference(values, terms, offset);
}
#endif

// ---- share boxes ---------------------------------------------------------------------------------

struct share_payload {  // what a box carries, 96 bytes
  client_id owner, recipient;
  share mask_key, self_mask;
};
constexpr std::size_t payload_bytes = 4 + 4 + 2 * 6 * 8;

std::vector<std::uint8_t> serialize(const share_payload& p) {
  std::vector<std::uint8_t> out(payload_bytes);
  std::uint8_t* at = out.data();
  auto put = [&](auto v) {
    std::memcpy(at, &v, sizeof v);
    at += sizeof v;
  };
  put(p.owner);
  put(p.recipient);
  for (const share* s : {&p.mask_key, &p.self_mask}) {
    put(s->x);
    for (auto y : s->y) put(y);
  }
  return out;
}
share_payload deserialize(const std::vector<std::uint8_t>& in) {
  share_payload p{};
  const std::uint8_t* at = in.data();
  auto get = [&](auto& v) {
    std::memcpy(&v, at, sizeof v);
    at += sizeof v;
  };
  get(p.owner);
  get(p.recipient);
  for (share* s : {&p.mask_key, &p.self_mask}) {
    get(s->x);
    for (auto& y : s->y) get(y);
  }
  return p;
}

bool contains(const std::vector<client_id>& sorted, client_id id) {
  return std::binary_search(sorted.begin(), sorted.end(), id);
}

}  // namespace

// ---- config and graph ----------------------------------------------------------------------------

double config::scale() const {
  if (!(clip > 0) || !std::isfinite(clip)) bad("clip must be positive and finite");
  if (max_clients == 0) bad("max_clients must be at least 1");
  if (!(sum_bound >= 0) || !std::isfinite(sum_bound))
    bad("sum_bound must be >= 0 and finite, got " + std::to_string(sum_bound));
  const double bound = sum_bound > 0 ? sum_bound : static_cast<double>(max_clients) * clip;
  // Rounding to nearest adds up to half a unit per input: that much room stays free too.
  const double limit = (2147483647.0 - 0.5 * static_cast<double>(max_clients)) / bound;
  if (limit < 1) bad("the sum's bound " + std::to_string(bound) + " is too large for 32-bit fixed point");
  return std::exp2(std::floor(std::log2(limit)));
}

graph::graph(std::vector<client_id> clients, const config& cfg) : clients_(std::move(clients)) {
  std::sort(clients_.begin(), clients_.end());
  const std::size_t n = clients_.size();
  if (n < 2) bad("a round needs at least two clients");
  if (std::adjacent_find(clients_.begin(), clients_.end()) != clients_.end()) bad("client ids repeat");
  std::size_t k = cfg.degree;
  if (cfg.full_graph) {
    k = n - 1;
  } else if (k == 0) {
    // Bell et al.: a degree logarithmic in n. H(k, n) is k-connected (it stays connected after
    // any k - 1 losses) and, with threshold k/2 + 1, each client's secrets survive up to k/2 - 1
    // lost or colluding neighbours: 2 ceil(log2 n), so 14 for 100 clients, 20 for 1000.
    k = 2 * static_cast<std::size_t>(std::ceil(std::log2(static_cast<double>(n))));
  }
  if (k >= n - 1) {
    k = n - 1;  // complete graph
  } else if (k % 2) {
    bad("the degree must be even (or at least clients - 1), got " + std::to_string(k));
  }
  if (k == 0) bad("the degree must be positive");
  degree_ = k;
  threshold_ = cfg.threshold ? cfg.threshold : k / 2 + 1;
  if (threshold_ < 1 || threshold_ > k)
    bad("the threshold must be in [1, " + std::to_string(k) + "], got " + std::to_string(threshold_));
  for (std::size_t i = 0; i < n; ++i) {
    auto& nb = neighbours_[clients_[i]];
    if (k == n - 1) {
      for (std::size_t j = 0; j < n; ++j)
        if (j != i) nb.push_back(clients_[j]);
    } else {
      for (std::size_t d = 1; d <= k / 2; ++d) {
        nb.push_back(clients_[(i + d) % n]);
        nb.push_back(clients_[(i + n - d) % n]);
      }
    }
    std::sort(nb.begin(), nb.end());
  }
}

const std::vector<client_id>& graph::neighbours(client_id id) const {
  auto it = neighbours_.find(id);
  if (it == neighbours_.end()) bad("client " + std::to_string(id) + " is not in this round");
  return it->second;
}

// ---- Shamir --------------------------------------------------------------------------------------

std::vector<share> split_secret(const key& secret, std::size_t threshold, std::size_t count) {
  if (threshold < 1 || threshold > count) bad("a threshold must be in [1, shares]");
  const auto chunks = to_chunks(secret);
  std::vector<share> shares(count);
  for (std::size_t i = 0; i < count; ++i) shares[i].x = i + 1;
  for (int c = 0; c < 5; ++c) {
    std::vector<std::uint64_t> coef(threshold);
    random_field_elements(std::span(coef).subspan(1));
    coef[0] = chunks[c];
    for (auto& s : shares) {
      std::uint64_t y = 0;  // Horner
      for (std::size_t d = threshold; d-- > 0;) y = add_mod(mul_mod(y, s.x), coef[d]);
      s.y[c] = y;
    }
  }
  return shares;
}

key reconstruct_secret(std::span<const share> shares, std::size_t threshold) {
  std::vector<const share*> use;
  for (const auto& s : shares) {
    if (s.x == 0 || s.x >= prime) continue;
    if (std::none_of(use.begin(), use.end(), [&](const share* u) { return u->x == s.x; })) use.push_back(&s);
    if (use.size() == threshold) break;
  }
  if (threshold == 0 || use.size() < threshold)
    throw std::runtime_error("secagg: " + std::to_string(use.size()) + " shares cannot reconstruct a secret that needs " +
                             std::to_string(threshold));
  std::array<std::uint64_t, 5> chunks{};
  for (std::size_t i = 0; i < use.size(); ++i) {
    // Lagrange basis at 0: Π_{j≠i} x_j / (x_j - x_i)
    std::uint64_t num = 1, den = 1;
    for (std::size_t j = 0; j < use.size(); ++j) {
      if (j == i) continue;
      num = mul_mod(num, use[j]->x);
      den = mul_mod(den, sub_mod(use[j]->x, use[i]->x));
    }
    const std::uint64_t basis = mul_mod(num, pow_mod(den, prime - 2));
    for (int c = 0; c < 5; ++c) chunks[c] = add_mod(chunks[c], mul_mod(use[i]->y[c], basis));
  }
  return from_chunks(chunks);
}

namespace {

/// out[i] = the fixed-point word of in[i]; true when some input is infinite or NaN. Compiled
/// again for AVX-512 and AVX2 below and picked by the CPU's features (the baseline build leaves
/// the double-to-integer conversions scalar); every version computes the same IEEE operations.
/// The choice is an explicit test, not an ifunc (target_clones): an ifunc resolver runs before
/// sanitizer runtimes start, and ThreadSanitizer builds crashed there.
[[gnu::always_inline]] inline bool encode_words_body(const float* __restrict in, std::size_t n, double clip, double scale,
                                                     std::uint32_t* __restrict o) noexcept {
  std::uint32_t non_finite = 0;  // an exponent of all ones (an integer test, so that it vectorizes)
  for (std::size_t i = 0; i < n; ++i) {
    non_finite |= (std::bit_cast<std::uint32_t>(in[i]) & 0x7F800000u) == 0x7F800000u;
    const double y = std::min(std::max(static_cast<double>(in[i]), -clip), clip) * scale;  // |y| < 2^31 / max_clients
    o[i] = static_cast<std::uint32_t>(static_cast<std::int32_t>(y + (y < 0 ? -0.5 : 0.5)));  // nearest, halves away from 0
  }
  return non_finite != 0;
}

bool encode_words_baseline(const float* in, std::size_t n, double clip, double scale, std::uint32_t* o) noexcept {
  return encode_words_body(in, n, clip, scale, o);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) bool encode_words_avx512(const float* in, std::size_t n, double clip, double scale,
                                                            std::uint32_t* o) noexcept {
  return encode_words_body(in, n, clip, scale, o);
}
__attribute__((target("avx2"))) bool encode_words_avx2(const float* in, std::size_t n, double clip, double scale,
                                                       std::uint32_t* o) noexcept {
  return encode_words_body(in, n, clip, scale, o);
}
#endif

bool encode_words(const float* in, std::size_t n, double clip, double scale, std::uint32_t* o) noexcept {
  using fn = bool (*)(const float*, std::size_t, double, double, std::uint32_t*) noexcept;
  static const fn chosen = [] () -> fn {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return &encode_words_avx512;
    if (__builtin_cpu_supports("avx2")) return &encode_words_avx2;
#endif
    return &encode_words_baseline;
  }();
  return chosen(in, n, clip, scale, o);
}

/// The fixed-point encoding of `input` into out[0, dim) as mod-2^32 words (what encode() returns).
void encode_into(std::span<const float> input, const config& cfg, std::uint32_t* out) {
  if (input.size() != cfg.dim)
    bad("an input has " + std::to_string(input.size()) + " values, the round expects " + std::to_string(cfg.dim));
  if (encode_words(input.data(), input.size(), cfg.clip, cfg.scale(), out)) bad("an input is not finite");
}

}  // namespace

std::vector<std::int32_t> encode(std::span<const float> input, const config& cfg) {
  std::vector<std::int32_t> out(input.size());
  encode_into(input, cfg, reinterpret_cast<std::uint32_t*>(out.data()));
  return out;
}

bool fast_masks_available() noexcept { return cpu_has_vaes(); }

void apply_masks(std::span<std::uint32_t> values, std::span<const mask_term> terms, std::size_t offset, bool reference) {
  if (offset % 4) bad("a mask slice must start at a whole AES block (a multiple of 4 words), got " + std::to_string(offset));
  if (reference || !cpu_has_vaes())
    apply_masks_reference(values, terms, offset);
  else
    apply_masks_vaes(values, terms, offset);
}

// ---- client --------------------------------------------------------------------------------------

struct client::state {
  client_id id;
  config cfg;
  std::vector<client_id> neighbours;
  std::size_t threshold;
  x25519_secret enc_secret, mask_secret;
  key self_seed;
  struct peer {
    public_keys keys;
    key box_key;  // agreed from the encryption keys, the same at both ends of the edge
  };
  std::map<client_id, peer> peers;                    // neighbours that advertised keys
  std::map<client_id, share_payload> held;            // shares this client holds for others
  std::vector<client_id> shared;                      // neighbours whose shares arrived (sorted)
  bool advertised = false, keys_shared = false, masked = false;
};

client::client(client_id id, const config& cfg, const graph& g) : s_(std::make_unique<state>()) {
  s_->id = id;
  s_->cfg = cfg;
  s_->neighbours = g.neighbours(id);
  s_->threshold = g.threshold();
}
client::~client() = default;
client::client(client&&) noexcept = default;
client& client::operator=(client&&) noexcept = default;

public_keys client::advertise() {
  if (s_->advertised) bad("client " + std::to_string(s_->id) + " advertised twice");
  s_->enc_secret = x25519_secret::generate();
  s_->mask_secret = x25519_secret::generate();
  s_->advertised = true;
  return {s_->id, s_->enc_secret.public_key(), s_->mask_secret.public_key()};
}

std::vector<encrypted_share> client::share_keys(std::span<const public_keys> neighbours) {
  if (!s_->advertised) bad("share_keys before advertise");
  for (const auto& k : neighbours)
    if (contains(s_->neighbours, k.id) && !s_->peers.count(k.id))
      s_->peers[k.id] = {k, derive(s_->enc_secret.agree(k.encryption), "troupe secagg share box")};
  if (s_->peers.size() < s_->threshold)
    bad("client " + std::to_string(s_->id) + " has " + std::to_string(s_->peers.size()) +
        " neighbours left, fewer than the threshold " + std::to_string(s_->threshold));
  random_bytes(s_->self_seed.data(), s_->self_seed.size());
  // Shares are evaluated at x = (position among all neighbours) + 1, so every holder's x differs.
  const auto key_shares = split_secret(s_->mask_secret.raw(), s_->threshold, s_->neighbours.size());
  const auto seed_shares = split_secret(s_->self_seed, s_->threshold, s_->neighbours.size());
  std::vector<encrypted_share> out;
  for (std::size_t i = 0; i < s_->neighbours.size(); ++i) {
    const client_id to = s_->neighbours[i];
    auto peer = s_->peers.find(to);
    if (peer == s_->peers.end()) continue;
    const auto plain = serialize({s_->id, to, key_shares[i], seed_shares[i]});
    encrypted_share e{s_->id, to, seal(peer->second.box_key, plain)};
    out.push_back(std::move(e));
  }
  s_->keys_shared = true;
  return out;
}

masked_input client::mask(std::span<const encrypted_share> received, std::span<const float> input,
                          std::vector<std::uint32_t> storage) {
  if (!s_->keys_shared) bad("mask before share_keys");
  for (const auto& e : received) {
    if (e.to != s_->id) bad("a share addressed to " + std::to_string(e.to) + " reached " + std::to_string(s_->id));
    auto peer = s_->peers.find(e.from);
    if (peer == s_->peers.end()) bad("a share from " + std::to_string(e.from) + ", who is not a neighbour");
    std::vector<std::uint8_t> plain(payload_bytes);
    if (!open(peer->second.box_key, e.box, plain))
      bad("a share from " + std::to_string(e.from) + " failed authentication");
    const auto p = deserialize(plain);
    if (p.owner != e.from || p.recipient != s_->id) bad("a share box names the wrong parties");
    s_->held[p.owner] = p;
  }
  s_->shared.clear();
  for (const auto& [owner, _] : s_->held) s_->shared.push_back(owner);  // std::map: sorted
  storage.resize(s_->cfg.dim);  // every word is written below
  masked_input out{s_->id, std::move(storage)};
  encode_into(input, s_->cfg, out.values.data());
  std::vector<mask_term> terms;
  terms.reserve(s_->shared.size() + 1);
  terms.push_back({s_->self_seed, false});
  for (client_id j : s_->shared) terms.push_back({mask_seed(s_->mask_secret, s_->peers.at(j).keys.masking), s_->id > j});
  apply_masks(out.values, terms);
  s_->masked = true;
  return out;
}

unmask_response client::unmask(const unmask_request& request) const {
  if (!s_->masked) bad("unmask before mask");
  unmask_response out{s_->id, {}, {}};
  for (client_id d : request.dropped)
    if (std::find(request.survivors.begin(), request.survivors.end(), d) != request.survivors.end())
      bad("client " + std::to_string(d) + " is named both survivor and dropped: refusing to reveal both secrets");
  for (client_id id : request.survivors)
    if (auto it = s_->held.find(id); it != s_->held.end()) out.self_mask_shares.emplace_back(id, it->second.self_mask);
  for (client_id id : request.dropped)
    if (auto it = s_->held.find(id); it != s_->held.end()) out.mask_key_shares.emplace_back(id, it->second.mask_key);
  return out;
}

// ---- server --------------------------------------------------------------------------------------

struct server::state {
  config cfg;
  const graph* g;
  std::map<client_id, public_keys> keys;
  std::map<client_id, std::vector<encrypted_share>> mailbox;  // by recipient
  std::vector<client_id> shared;                              // sent shares (sorted on use)
  std::vector<client_id> survivors;                           // sent a masked input
  std::vector<std::uint32_t> sum;
  std::map<client_id, std::vector<share>> self_mask_shares, mask_key_shares;
};

server::server(const config& cfg, const graph& g) : s_(std::make_unique<state>()) {
  s_->cfg = cfg;
  s_->g = &g;
  s_->sum.assign(cfg.dim, 0);
  cfg.scale();  // validates clip and max_clients
}
server::~server() = default;

void server::receive_keys(const public_keys& keys) {
  s_->g->neighbours(keys.id);  // throws for a client outside the round
  if (!s_->keys.emplace(keys.id, keys).second) bad("client " + std::to_string(keys.id) + " advertised twice");
}

std::vector<public_keys> server::keys_for(client_id id) const {
  std::vector<public_keys> out;
  for (client_id j : s_->g->neighbours(id))
    if (auto it = s_->keys.find(j); it != s_->keys.end()) out.push_back(it->second);
  return out;
}

void server::receive_shares(std::span<const encrypted_share> shares) {
  if (shares.empty()) return;
  const client_id from = shares.front().from;
  if (!s_->keys.count(from)) bad("shares from " + std::to_string(from) + ", who advertised no keys");
  if (contains(s_->shared, from))
    bad("client " + std::to_string(from) + " shared twice");
  for (const auto& e : shares) {
    if (e.from != from) bad("one client's shares name several senders");
    if (!contains(s_->g->neighbours(from), e.to)) bad("a share for a client that is not a neighbour");
    s_->mailbox[e.to].push_back(e);
  }
  s_->shared.push_back(from);
  std::sort(s_->shared.begin(), s_->shared.end());
}

std::vector<encrypted_share> server::shares_for(client_id id) const {
  auto it = s_->mailbox.find(id);
  return it == s_->mailbox.end() ? std::vector<encrypted_share>{} : it->second;
}

void server::receive_masked(const masked_input& input) { receive_masked(input.id, input.values); }

void server::receive_masked(client_id id, std::span<const std::uint32_t> values) {
  if (!contains(s_->shared, id)) bad("a masked input from " + std::to_string(id) + ", who shared no keys");
  if (std::find(s_->survivors.begin(), s_->survivors.end(), id) != s_->survivors.end())
    bad("client " + std::to_string(id) + " sent two masked inputs");
  if (values.size() != s_->cfg.dim)
    bad("a masked input has " + std::to_string(values.size()) + " values, the round expects " +
        std::to_string(s_->cfg.dim));
  std::uint32_t* __restrict sum = s_->sum.data();
  const std::uint32_t* __restrict in = values.data();
  for (std::size_t i = 0; i < values.size(); ++i) sum[i] += in[i];
  s_->survivors.push_back(id);
}

unmask_request server::request_unmasking() const {
  unmask_request r;
  r.survivors = s_->survivors;
  std::sort(r.survivors.begin(), r.survivors.end());
  for (client_id id : s_->shared)
    if (!contains(r.survivors, id)) r.dropped.push_back(id);
  return r;
}

void server::receive_unmask(const unmask_response& response) {
  const auto& neighbours = s_->g->neighbours(response.from);
  for (const auto& [owner, sh] : response.self_mask_shares)
    if (contains(neighbours, owner)) s_->self_mask_shares[owner].push_back(sh);
  for (const auto& [owner, sh] : response.mask_key_shares)
    if (contains(neighbours, owner)) s_->mask_key_shares[owner].push_back(sh);
}

std::size_t server::survivors() const noexcept { return s_->survivors.size(); }

std::vector<float> server::finish() {
  const auto request = request_unmasking();
  const std::size_t t = s_->g->threshold();
  std::vector<std::uint32_t> sum = s_->sum;
  std::vector<mask_term> terms;  // every stream to take out, then one pass over the sum
  for (client_id id : request.survivors) terms.push_back({reconstruct_secret(s_->self_mask_shares[id], t), true});
  for (client_id d : request.dropped) {
    const x25519_secret secret(reconstruct_secret(s_->mask_key_shares[d], t));
    if (secret.public_key() != s_->keys.at(d).masking) throw std::runtime_error("secagg: a reconstructed mask key does not match its public key");
    // Survivor j added +PRG when j < d, -PRG when j > d (its sign for the edge); take it back out.
    for (client_id j : s_->g->neighbours(d))
      if (contains(request.survivors, j)) terms.push_back({mask_seed(secret, s_->keys.at(j).masking), j < d});
  }
  apply_masks(sum, terms);
  decoded_.resize(sum.size());
  std::vector<float> out(sum.size());
  const double scale = s_->cfg.scale();
  for (std::size_t i = 0; i < sum.size(); ++i) {
    decoded_[i] = std::bit_cast<std::int32_t>(sum[i]);
    out[i] = static_cast<float>(decoded_[i] / scale);
  }
  return out;
}

}  // namespace troupe::federated::secagg
