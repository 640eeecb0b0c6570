#include "troupe/federated/secagg.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include <openssl/evp.h>
#include <openssl/rand.h>

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

/// An X25519 secret key held as an OpenSSL key object, so that each agreement costs one scalar
/// multiplication (building the object from raw bytes computes the public key once).
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
  key agree(const key& other_public) const {
    pkey_ptr pk(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, other_public.data(), other_public.size()));
    if (!pk) bad("an X25519 public key is malformed");
    std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free> ctx(EVP_PKEY_CTX_new(pkey_.get(), nullptr));
    key shared;
    std::size_t len = shared.size();
    if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 || EVP_PKEY_derive_set_peer(ctx.get(), pk.get()) != 1 ||
        EVP_PKEY_derive(ctx.get(), shared.data(), &len) != 1 || len != shared.size())
      bad("X25519 key agreement failed (an invalid public key)");
    return shared;
  }

private:
  key raw_{}, public_{};
  pkey_ptr pkey_;
};

/// SHA-256 of a label and some key material: the seeds and box keys derived from shared secrets.
key derive(const key& material, const char* label) {
  key out;
  static const EVP_MD* sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  unsigned int len = 0;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
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

/// AES-256-GCM: nonce || ciphertext || tag.
std::vector<std::uint8_t> seal(const key& k, const std::vector<std::uint8_t>& plain) {
  std::vector<std::uint8_t> box(gcm_nonce + plain.size() + gcm_tag);
  random_bytes(box.data(), gcm_nonce);
  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
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
  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
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

/// values[i] += PRG(seed)[i] (or -=, mod 2^32). The generator is AES-128-CTR keyed by the seed's
/// first half (each seed keys one stream), run in 16 KiB pieces that stay in the L1 cache.
void apply_mask(std::span<std::uint32_t> values, const key& seed, bool subtract) {
  constexpr std::size_t words = 4096;
  alignas(64) static thread_local std::array<std::uint32_t, words> zeros{}, stream{};
  static const std::array<std::uint8_t, 16> iv{};
  cipher_ctx_ptr ctx(EVP_CIPHER_CTX_new());
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), aes_128_ctr(), nullptr, seed.data(), iv.data()) != 1)
    crypto_failed("start the mask generator");
  std::uint32_t* __restrict out = values.data();
  for (std::size_t at = 0; at < values.size(); at += words) {
    const std::size_t n = std::min(words, values.size() - at);
    int len = 0;
    if (EVP_EncryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(stream.data()), &len,
                          reinterpret_cast<const unsigned char*>(zeros.data()), static_cast<int>(n * 4)) != 1)
      crypto_failed("generate a mask");
    const std::uint32_t* __restrict m = stream.data();
    if (subtract)
      for (std::size_t i = 0; i < n; ++i) out[at + i] -= m[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[at + i] += m[i];
  }
}

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
  const double limit = 2147483647.0 / (static_cast<double>(max_clients) * clip);
  if (limit < 1) bad("max_clients * clip is too large for 32-bit fixed point");
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

std::vector<std::int32_t> encode(std::span<const float> input, const config& cfg) {
  if (input.size() != cfg.dim)
    bad("an input has " + std::to_string(input.size()) + " values, the round expects " + std::to_string(cfg.dim));
  float poison = 0;  // NaN or infinity makes it NaN
  for (float x : input) poison += x * 0.0f;
  if (poison != 0.0f) bad("an input is not finite");
  const double scale = cfg.scale(), clip = cfg.clip;
  std::vector<std::int32_t> out(input.size());
  const float* __restrict in = input.data();
  std::int32_t* __restrict o = out.data();
  for (std::size_t i = 0; i < input.size(); ++i) {
    const double y = std::min(std::max(static_cast<double>(in[i]), -clip), clip) * scale;  // |y| < 2^31 / max_clients
    o[i] = static_cast<std::int32_t>(y + (y < 0 ? -0.5 : 0.5));  // nearest, halves away from 0
  }
  return out;
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

masked_input client::mask(std::span<const encrypted_share> received, std::span<const float> input) {
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
  const auto encoded = encode(input, s_->cfg);
  masked_input out{s_->id, std::vector<std::uint32_t>(encoded.begin(), encoded.end())};
  apply_mask(out.values, s_->self_seed, false);
  for (client_id j : s_->shared)
    apply_mask(out.values, mask_seed(s_->mask_secret, s_->peers.at(j).keys.masking), s_->id > j);
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
  for (client_id id : request.survivors)
    apply_mask(sum, reconstruct_secret(s_->self_mask_shares[id], t), true);
  for (client_id d : request.dropped) {
    const x25519_secret secret(reconstruct_secret(s_->mask_key_shares[d], t));
    if (secret.public_key() != s_->keys.at(d).masking) throw std::runtime_error("secagg: a reconstructed mask key does not match its public key");
    // Survivor j added +PRG when j < d, -PRG when j > d (its sign for the edge); take it back out.
    for (client_id j : s_->g->neighbours(d))
      if (contains(request.survivors, j)) apply_mask(sum, mask_seed(secret, s_->keys.at(j).masking), j < d);
  }
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
