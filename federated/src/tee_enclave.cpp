// The simulated enclave (--tee sim): its actor, its sealing, the sealed updates' encoding, the
// oblivious densification of sparse updates, and the node process it lives in.

#include "tee_enclave.hpp"

#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "tee_tpm.hpp"

TROUPE_REMOTE_CTOR(troupe::federated::tee_enclave, std::string, std::vector<std::uint8_t>, std::vector<std::uint8_t>, std::string)

namespace troupe::federated::tee {
namespace {

void need_sodium() {
  static const bool ok = sodium_init() >= 0;
  if (!ok) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
}

}  // namespace

std::array<std::uint8_t, 32> seal_key(std::span<const std::uint8_t> platform_secret, std::span<const std::uint8_t, 32> mr_enclave) {
  need_sodium();
  if (platform_secret.size() != 32) throw std::invalid_argument("tee: the platform secret must be 32 bytes");
  static const char label[] = "troupe tee seal key, MRENCLAVE policy";
  std::array<std::uint8_t, 32> key{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, platform_secret.data(), platform_secret.size(), key.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(label), sizeof label);
  crypto_generichash_update(&st, mr_enclave.data(), mr_enclave.size());
  crypto_generichash_final(&st, key.data(), key.size());
  return key;
}

bytes seal(std::span<const std::uint8_t, 32> key, std::span<const std::uint8_t> plain) {
  need_sodium();
  bytes out(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES + plain.size() + crypto_aead_xchacha20poly1305_ietf_ABYTES);
  randombytes_buf(out.data(), crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
  unsigned long long n = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out.data() + crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, &n, plain.data(),
                                             plain.size(), nullptr, 0, nullptr, out.data(), key.data());
  return out;
}

bytes open_sealed(std::span<const std::uint8_t, 32> key, std::span<const std::uint8_t> box) {
  need_sodium();
  constexpr std::size_t head = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES, tag = crypto_aead_xchacha20poly1305_ietf_ABYTES;
  if (box.size() < head + tag) throw std::runtime_error("tee: a sealed blob of " + std::to_string(box.size()) + " bytes is too short");
  bytes plain(box.size() - head - tag);
  unsigned long long n = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(plain.data(), &n, nullptr, box.data() + head, box.size() - head, nullptr, 0,
                                                 box.data(), key.data()) != 0)
    throw std::runtime_error("tee: the sealed blob does not open under this enclave's seal key (another measurement or platform, or changed bytes)");
  return plain;
}

void keyed_normal_draws(std::span<const std::uint8_t, 32> key, std::span<double> out) {
  need_sodium();
  if (out.empty()) return;
  // Box–Muller on pairs of 53-bit uniforms: u1 in (0, 1] (safe under the logarithm), u2 in [0, 1).
  std::vector<std::uint64_t> bits(2 * ((out.size() + 1) / 2));
  randombytes_buf_deterministic(bits.data(), bits.size() * sizeof(std::uint64_t), key.data());
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double u1 = (static_cast<double>(bits[i] >> 11) + 1.0) * 0x1p-53;
    const double u2 = static_cast<double>(bits[i + 1] >> 11) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = two_pi * u2;
    out[i] = r * std::cos(theta);
    if (i + 1 < out.size()) out[i + 1] = r * std::sin(theta);
  }
  sodium_memzero(bits.data(), bits.size() * sizeof(std::uint64_t));
}

int run_enclave_node(const std::string& head) {
  try {
    system_config cfg{.threads = 2};
    cfg.node.listen = "127.0.0.1:0";
    cfg.node.head = head;
    // Both ends of the link are this host's processes; under a loaded machine a heartbeat can be
    // late by seconds without the enclave being gone.
    cfg.node.node_timeout = std::chrono::seconds(30);
    actor_system sys(cfg);
    std::printf("{\"node\":%u,\"port\":%u}\n", sys.node(), sys.node_port());
    std::fflush(stdout);
    char buf[64];
    while (std::fread(buf, 1, sizeof buf, stdin) > 0) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tee enclave node: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace troupe::federated::tee

namespace troupe::federated {

tee_enclave::tee_enclave(std::string attestation_key_pem, std::vector<std::uint8_t> qe_part, std::vector<std::uint8_t> platform_secret,
                         std::string tpm)
    : platform_secret_(std::move(platform_secret)) {
  if (!attestation_key_pem.empty())
    signer_ = std::make_unique<tee::quote_signer>(tee::quoting_material{std::move(attestation_key_pem), std::move(qe_part)});
  if (!tpm.empty()) {
    const auto bar = tpm.find('|');
    if (bar == std::string::npos) throw std::invalid_argument("tee enclave: the TPM is \"TCTI|AK_CONTEXT\"");
    tpm_tcti_ = tpm.substr(0, bar);
    tpm_ak_ = tpm.substr(bar + 1);
  }
  tee::need_sodium();
  if (platform_secret_.size() != 32) throw std::invalid_argument("tee enclave: the platform secret must be 32 bytes");
  // The measurement: this program's bytes (what SGX's MRENCLAVE is to an enclave's pages).
  mr_enclave_ = tee::file_sha256("/proc/self/exe");
  crypto_box_keypair(pk_.data(), sk_.data());
  randombytes_buf(noise_key_.data(), noise_key_.size());
}

std::vector<std::uint8_t> tee_enclave::public_key() { return {pk_.begin(), pk_.end()}; }
std::vector<std::uint8_t> tee_enclave::measurement() { return {mr_enclave_.begin(), mr_enclave_.end()}; }

std::vector<std::uint8_t> tee_enclave::attest(std::vector<std::vector<std::uint8_t>> nonces) {
  if (!signer_) throw std::logic_error("tee enclave: no quoting material (this enclave was started for --tee swtpm)");
  if (nonces.empty()) throw std::invalid_argument("tee enclave: no nonces to attest to");
  for (const auto& n : nonces)
    if (n.size() != 32) throw std::invalid_argument("tee enclave: a nonce has " + std::to_string(n.size()) + " bytes, not 32");
  std::array<std::uint8_t, 64> report{};
  const auto h = tee::batch_qualifying(pk_, nonces);
  std::copy(h.begin(), h.end(), report.begin());
  return signer_->quote(mr_enclave_, report);
}

std::vector<std::vector<std::uint8_t>> tee_enclave::tpm_quote(std::vector<std::vector<std::uint8_t>> nonces) {
  if (tpm_tcti_.empty()) throw std::logic_error("tee enclave: no TPM (this enclave was started for --tee sim)");
  for (const auto& n : nonces)
    if (n.size() != 32) throw std::invalid_argument("tee enclave: a nonce has " + std::to_string(n.size()) + " bytes, not 32");
  const auto q = tee::quote_with_tpm(tpm_tcti_, tpm_ak_, tee::batch_qualifying(pk_, nonces));
  return {q.attest, q.signature};
}

std::vector<std::vector<std::uint8_t>> tee_enclave::begin(std::uint32_t round, std::uint64_t dim, double noise_stddev, double divisor,
                                                          bool oblivious, std::vector<std::vector<std::uint8_t>> nonces,
                                                          std::vector<std::uint64_t> clients, std::vector<std::vector<std::uint8_t>> keys) {
  if (!(noise_stddev >= 0) || !std::isfinite(noise_stddev) || !(divisor > 0) || !std::isfinite(divisor))
    throw std::invalid_argument("tee enclave: bad noise parameters");
  if (clients.size() != nonces.size() || keys.size() != nonces.size())
    throw std::invalid_argument("tee enclave: " + std::to_string(nonces.size()) + " nonces, " + std::to_string(clients.size()) +
                                " clients and " + std::to_string(keys.size()) + " keys");
  for (std::size_t i = 0; i < nonces.size(); ++i) {
    if (nonces[i].size() != 32) throw std::invalid_argument("tee enclave: a nonce has " + std::to_string(nonces[i].size()) + " bytes, not 32");
    if (keys[i].size() != 32) throw std::invalid_argument("tee enclave: a client's key has " + std::to_string(keys[i].size()) + " bytes, not 32");
  }
  // A round number opens once, whether its round was released or failed: opening it again (with
  // fewer boxes, the same boxes again, or other parameters) would let the host difference two
  // releases into one client's update, or release a box under a statement its client never saw.
  if (open_) throw std::logic_error("tee enclave: round " + std::to_string(round_) + " is still open");
  if (last_begun_ && round <= *last_begun_)
    throw std::invalid_argument("tee enclave: round " + std::to_string(round) + " after round " + std::to_string(*last_begun_) +
                                " was begun (a round number opens once)");
  // The participants' sessions, checked before anything changes: a client listed twice, or under
  // another key than the one pinned at its first round, refuses the round.
  std::vector<participant> ps(clients.size());
  for (std::size_t i = 0; i < clients.size(); ++i) {
    const auto who = "tee enclave: client " + std::to_string(clients[i]);
    for (std::size_t j = 0; j < i; ++j)
      if (clients[j] == clients[i]) throw std::invalid_argument(who + " is listed twice");
    ps[i].id = clients[i];
    if (const auto it = clients_.find(clients[i]); it != clients_.end()) {
      if (!std::equal(keys[i].begin(), keys[i].end(), it->second.pk.begin())) throw std::invalid_argument(who + ": its key is another than its first");
      ps[i].key = it->second;
      continue;
    }
    std::copy(keys[i].begin(), keys[i].end(), ps[i].key.pk.begin());
    try {
      ps[i].key.keys = tee::session_with(pk_, sk_, std::span<const std::uint8_t, 32>(keys[i].data(), 32));
    } catch (const std::exception& e) {
      throw std::invalid_argument(who + ": " + e.what());
    }
  }
  last_begun_ = round;  // burnt from here on, whatever becomes of this round
  for (const auto& p : ps) clients_.emplace(p.id, p.key);
  participants_ = std::move(ps);
  round_ = round;
  dim_ = dim;
  stddev_ = noise_stddev;
  divisor_ = divisor;
  oblivious_ = oblivious;
  open_ = true;
  added_ = 0;
  error_.clear();
  if (stddev_ > 0) {
    mean_.reset();
    sum_.assign(dim, 0.0);
  } else {
    if (!mean_) mean_ = make_weighted_mean();
    round_info info;
    info.round = static_cast<int>(round);
    info.dim = dim;
    mean_->begin(info);
  }
  // What each client checks before it seals: the enclave it attested (the only other holder of
  // their session's key) opened this round, with these parameters, after it drew its nonce. Its
  // box is then sealed with this statement's digest as associated data: it opens in no other.
  const auto statement = tee::round_statement(round, dim, noise_stddev, divisor, oblivious, nonces);
  statement_digest_ = tee::statement_digest(statement);
  std::vector<std::vector<std::uint8_t>> tags;
  tags.reserve(participants_.size());
  for (const auto& p : participants_) {
    const auto tag = tee::round_tag(p.key.keys.tx, statement, p.id);
    tags.emplace_back(tag.begin(), tag.end());
  }
  return tags;
}

void tee_enclave::add(std::uint64_t client, std::vector<std::byte> box) {
  if (!open_ || !error_.empty()) return;
  try {
    const auto it = std::find_if(participants_.begin(), participants_.end(), [&](const participant& p) { return p.id == client; });
    if (it == participants_.end()) throw std::runtime_error("it is not a participant of round " + std::to_string(round_));
    if (it->added) throw std::runtime_error("it sent a second box");
    const std::span<std::uint8_t> sealed(reinterpret_cast<std::uint8_t*>(box.data()), box.size());
    if (sealed.size() < tee::box_overhead) throw std::runtime_error("a box shorter than its header");
    if (!std::equal(it->key.pk.begin(), it->key.pk.end(), sealed.begin()))
      throw std::runtime_error("its box is under another key than its own in this round");
    // Opened where it arrived (box_header = 44 bytes in: the floats stay 4-byte aligned).
    const auto plain = tee::open_box_in_place(it->key.keys.rx, statement_digest_, sealed);
    if (plain.empty()) throw std::runtime_error("its box does not open under its key with the enclave and this round's statement");
    struct wipe {
      std::span<std::uint8_t> b;
      ~wipe() { sodium_memzero(b.data(), b.size()); }
    } wiped{sealed};
    const auto p = tee::decode_payload_view(plain);
    if (p.client != client) throw std::runtime_error("its box is client " + std::to_string(p.client) + "'s");
    if (p.round != round_) throw std::runtime_error("its box is for round " + std::to_string(p.round));
    if (p.dim != dim_) throw std::runtime_error("its update has " + std::to_string(p.dim) + " coordinates");
    if (!std::isfinite(p.weight)) throw std::runtime_error("its weight is not finite");
    for (float v : p.value)
      if (!std::isfinite(v)) throw std::runtime_error("its update has a value that is not finite");
    it->added = true;
    std::span<const float> delta = p.value;
    if (p.sparse) {
      scratch_.resize(dim_);
      tee::densify(p.index, p.value, scratch_, oblivious_);
      delta = scratch_;
    }
    if (stddev_ > 0) {
      for (std::size_t i = 0; i < delta.size(); ++i) sum_[i] += delta[i];
    } else {
      mean_->add(client, p.weight, delta);
    }
    ++added_;
  } catch (const std::exception& e) {
    error_ = "client " + std::to_string(client) + ": " + e.what();
  }
}

std::vector<float> tee_enclave::finish() {
  if (!open_) throw std::logic_error("tee enclave: finish() without begin()");
  open_ = false;
  participants_.clear();
  if (!error_.empty()) throw std::runtime_error("the enclave refused the round's updates: " + error_);
  if (added_ == 0) throw std::logic_error("tee enclave: no updates in this round");
  if (stddev_ == 0) return mean_->finish();
  // DP-FedAvg's server step (as dp-gaussian does it), with noise the host cannot know: a
  // ChaCha20 stream under a key derived from the enclave's own noise key, the round and fresh
  // randomness.
  std::array<std::uint8_t, 32> key{};
  std::array<std::uint8_t, 4 + 16> r{};
  std::memcpy(r.data(), &round_, sizeof round_);
  randombytes_buf(r.data() + 4, 16);
  crypto_generichash(key.data(), key.size(), r.data(), r.size(), noise_key_.data(), noise_key_.size());
  draws_.resize(sum_.size());
  tee::keyed_normal_draws(key, draws_);
  sodium_memzero(key.data(), key.size());
  std::vector<float> out(sum_.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>((sum_[i] + stddev_ * draws_[i]) / divisor_);
  sodium_memzero(draws_.data(), draws_.size() * sizeof(double));
  return out;
}

std::vector<std::uint8_t> tee_enclave::checkpoint() {
  std::vector<std::uint8_t> state;
  state.insert(state.end(), pk_.begin(), pk_.end());
  state.insert(state.end(), sk_.begin(), sk_.end());
  state.insert(state.end(), noise_key_.begin(), noise_key_.end());
  auto out = tee::seal(tee::seal_key(platform_secret_, mr_enclave_), state);
  sodium_memzero(state.data(), state.size());
  return out;
}

void tee_enclave::restore(std::vector<std::uint8_t> sealed) {
  auto state = tee::open_sealed(tee::seal_key(platform_secret_, mr_enclave_), sealed);
  if (state.size() != 96) throw std::runtime_error("tee enclave: a checkpoint of " + std::to_string(state.size()) + " bytes, not 96");
  std::memcpy(pk_.data(), state.data(), 32);
  std::memcpy(sk_.data(), state.data() + 32, 32);
  std::memcpy(noise_key_.data(), state.data() + 64, 32);
  clients_.clear();
  sodium_memzero(state.data(), state.size());
}

}  // namespace troupe::federated
