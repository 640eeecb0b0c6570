// --tee sim's host side: the enclave's node process, the clients' attestation and sealing (a
// transform), and the server's relay to the enclave (an aggregator).
//
// The protocol's story. Enrolment (once per client and enclave, in the first round the client
// joins): the participants new to the enclave each draw a fresh 32-byte nonce; the server relays
// them to the enclave, which answers one quote for the batch, its report data
// SHA-256(its X25519 key || SHA-256(the batch's nonces)). Each new client draws its own X25519
// key pair; its crypto_kx session with the enclave's key gives the key it seals with and the key
// the enclave tags its rounds with. In apply() the new client verifies the quote
// (dcap::verify_quote against the collateral and the pinned test root, remembered as
// tee_state::verified_quotes says) and the policy (the expected MRENCLAVE, DEBUG clear, its own
// nonce in the batch, the key). Every round (begin()): each participant draws a fresh nonce; the
// enclave opens the round and tags round_statement(round, dim, noise, divisor, oblivious, the
// nonces) for each participant under their session's key. apply() (each client, on its worker):
// check its tag and its nonce in the statement; refuse to send anything if any check fails;
// otherwise seal "TEE1 | round | client | weight | update" in its AES-256-GCM box, with
// SHA-256(the statement) as associated data. add_encoded(): the server forwards the box, which
// it cannot open. finish(): the enclave's aggregate. Under --tee swtpm the round's TPM quote
// over the nonces takes the place of the enrolment (it shows the enclave's key); the round's
// tag is checked as under sim.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string_view>
#include <stdexcept>
#include <unordered_map>

#include "tee_enclave.hpp"
#include "tee_tpm.hpp"
#include "troupe/federated/dp.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/simulation.hpp"

extern char** environ;

namespace troupe::federated::tee {
namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument(why); }

std::string random_hex(std::size_t n) {
  bytes b(n);
  randombytes_buf(b.data(), b.size());
  return dcap::to_hex(b);
}

/// The enclave's node process: started with a pipe on its standard input (closing it tells the
/// node to leave) and one on its standard output (its first line says it joined).
class child_process {
public:
  child_process() = default;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
    if (in_ >= 0) close(in_);
    if (pid_ > 0) {
      for (int i = 0; i < 100 && pid_ > 0; ++i) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
        else usleep(20000);
      }
      if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (out_ >= 0) close(out_);
  }

  /// Starts `program tee-enclave --head HEAD` with the cluster token in its environment and
  /// returns the node id it prints once it joined.
  node_id start(const std::string& program, const std::string& head, const std::string& token) {
    int out[2], in[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("tee: cannot make a pipe");
    if (pipe2(in, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      throw std::runtime_error("tee: cannot make a pipe");
    }
    out_ = out[0];
    in_ = in[1];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    std::vector<std::string> args{program, "tee-enclave", "--head", head};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The cluster token through the environment (not the command line, which others can read).
    std::vector<std::string> env_text{"TROUPE_CLUSTER_TOKEN=" + token};
    for (char** e = environ; *e; ++e)
      if (std::string_view(*e).rfind("TROUPE_CLUSTER_TOKEN=", 0) != 0) env_text.emplace_back(*e);
    std::vector<char*> env;
    for (auto& e : env_text) env.push_back(e.data());
    env.push_back(nullptr);
    const int rc = posix_spawn(&pid_, program.c_str(), &fa, nullptr, argv.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(in[0]);
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("tee: cannot start the enclave's node " + program + ": " + std::strerror(rc));
    }
    std::string line;  // {"node":N,"port":P}
    for (auto deadline = clock_type::now() + std::chrono::seconds(60); clock_type::now() < deadline;) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char c;
      if (read(out_, &c, 1) != 1 || c == '\n') break;
      line += c;
    }
    const auto at = line.find("\"node\":");
    if (at == std::string::npos)
      throw std::runtime_error("tee: the enclave's node (" + program + " tee-enclave) did not join" +
                               (line.empty() ? std::string() : ": it said " + line));
    return static_cast<node_id>(std::stoul(line.substr(at + 7)));
  }

private:
  pid_t pid_ = -1;
  int out_ = -1, in_ = -1;
};

/// The host's node, the enclave's node process that joins it, and the enclave actor there.
class enclave_host {
public:
  /// `swtpm`: a TPM measures the program before it starts and quotes for it; otherwise the
  /// simulated SGX platform's test chain.
  enclave_host(const std::string& program, bool swtpm) {
    if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialise (sodium_init)");
    const std::string token = random_hex(16);
    system_config cfg{.threads = 1};
    cfg.node.listen = "127.0.0.1:0";
    cfg.node.token = token;
    // Both ends are this host's processes; on a loaded machine a heartbeat can be seconds late.
    cfg.node.node_timeout = std::chrono::seconds(30);
    sys_ = std::make_unique<actor_system>(cfg);
    std::string tpm;
    if (swtpm) {  // a measured launch: PCR 16 holds the program's hash before it runs
      tpm_ = std::make_unique<swtpm_platform>(file_sha256(program));
      tpm = tpm_->tcti() + "|" + tpm_->ak_context();
    }
    const node_id node = child_.start(program, "127.0.0.1:" + std::to_string(sys_->node_port()), token);
    bytes secret(32);
    randombytes_buf(secret.data(), secret.size());  // the simulated CPU's sealing fuse
    quoting_material m;
    if (!swtpm) {
      platform_ = std::make_unique<sim_platform>(static_cast<std::int64_t>(std::time(nullptr)));
      m = platform_->material();
    }
    enclave_ = sys_->spawn_on<tee_enclave>(node, m.attestation_key_pem, m.qe_part, secret, tpm);
    const auto pk = enclave_.ask(&tee_enclave::public_key).timeout(std::chrono::seconds(60)).get();
    if (pk.size() != 32) throw std::runtime_error("tee: the enclave's key has " + std::to_string(pk.size()) + " bytes");
    std::copy(pk.begin(), pk.end(), public_key_.begin());
  }

  actor_ref<tee_enclave>& enclave() { return enclave_; }
  const sim_platform& platform() const { return *platform_; }
  const swtpm_platform& tpm() const { return *tpm_; }
  const std::array<std::uint8_t, 32>& public_key() const { return public_key_; }

private:
  // Destroyed in reverse: the ref, the platform, the node process (told to leave), the host node.
  std::unique_ptr<actor_system> sys_;
  std::unique_ptr<swtpm_platform> tpm_;
  child_process child_;
  std::unique_ptr<sim_platform> platform_;
  actor_ref<tee_enclave> enclave_;
  std::array<std::uint8_t, 32> public_key_{};
};

/// What the clients' transform and the server's aggregator share. The server's half (begin,
/// add_encoded, finish) runs on the server's thread; each client's half (tee_seal::apply) on a
/// worker, touching its own entry of `clients` (made by begin before the clients run) and the
/// round's fields that begin wrote.
struct tee_state {
  std::unique_ptr<enclave_host> host;
  // The clients' trust: the collateral they fetched, the root they pin, the MRENCLAVE they expect.
  dcap::collateral collateral;
  std::string collateral_text;
  std::array<std::uint8_t, 32> root_pin{};
  bytes expected_measurement;
  // --tee swtpm: the attestation key (provisioned by this run) and PCR 16 as the measured
  // launch of the expected program leaves it.
  bool swtpm = false;
  std::string ak_pem;
  std::array<std::uint8_t, 32> expected_pcr16{};
  // The enclave's key as the server relays it; a client trusts it once a quote bound to its own
  // nonce shows it (sim) or this round's TPM quote does (swtpm).
  key32 box_key{};
  // --tee sim's enrolment: one quote per batch of clients new to this enclave, over their nonces.
  struct batch {
    bytes quote;
    std::vector<bytes> nonces;
  };
  std::vector<batch> batches;
  // Each client's memory of this enclave: its enrolment, what it verified, its box key.
  struct client_session {
    bytes enrol_nonce;
    std::size_t batch = 0;
    bool attested = false;             // sim: its batch's quote verified, with its nonce in it
    std::optional<box_sender> sender;  // its key pair and its session's keys
    bytes round_nonce, round_tag;      // this round's fresh nonce, and the enclave's tag for it
  };
  std::unordered_map<std::uint64_t, client_session> clients;
  // The round: the participants' nonces in order, the round's one TPM quote (swtpm).
  std::uint32_t round = 0;
  std::vector<bytes> nonces;
  tpm_quote round_quote;
  // Top-k's count of coordinates (sparse payloads padded to it); 0: dense payloads.
  double topk_fraction = 0;
  bool oblivious = false;
  // DP-FedAvg in the enclave: clip bound S (0: none), z, K, q, and the accountant (public).
  double clip = 0, noise = 0, expected = 1, sampling = 1, delta = 1e-5;
  rdp_accountant accountant;
  std::atomic<std::int64_t> verify_us{0}, verified{0};
  // Quotes verified in full (dcap::verify_quote but its policy), as the SHA-256 of the quote's
  // bytes, the collateral and the pinned root, and until when; and the platforms so verified (the
  // same over the quote's bytes after its own signature): a later quote of the same platform
  // needs its signature checked only. Verifying a quote is a function of those bytes and the
  // time alone, so the clients, which share this process, share this memory of its results; each
  // client still checks the policy (measurement, debug, its own nonce) itself.
  std::mutex cache_m;
  std::unordered_map<std::string, std::int64_t> verified_quotes, verified_platforms;
};

// SHA-256 over each field's length (8 bytes, little-endian) and bytes: no two triples share an
// encoding, whatever their lengths.
std::string digest_key(std::span<const std::uint8_t> a, std::string_view b, std::span<const std::uint8_t> c) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  auto field = [&](const void* data, std::size_t n) {
    std::array<std::uint8_t, 8> len{};
    for (std::size_t i = 0; i < len.size(); ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(n) >> (8 * i));
    crypto_hash_sha256_update(&st, len.data(), len.size());
    crypto_hash_sha256_update(&st, static_cast<const unsigned char*>(data), n);
  };
  field(a.data(), a.size());
  field(b.data(), b.size());
  field(c.data(), c.size());
  std::string out(32, '\0');
  crypto_hash_sha256_final(&st, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

class tee_seal final : public update_transform {
public:
  explicit tee_seal(std::shared_ptr<tee_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "tee"; }
  void apply(client_update& u, std::span<float>, const round_info& round, splitmix64&) const override {
    auto it = s_->clients.find(u.client);
    if (it == s_->clients.end() || it->second.round_nonce.empty())
      throw std::logic_error("tee: client " + std::to_string(u.client) + " is not in this round");
    auto& c = it->second;
    const auto t0 = clock_type::now();
    // The enclave's key: this round's TPM quote (swtpm), or the client's enrolment quote (sim).
    // Then, either way, the round's tag under the session with that key.
    if (s_->swtpm) attest_tpm(u.client, c.round_nonce);
    else if (!c.attested) attest_session(u.client, c);
    const auto aad = check_round(u.client, c, round);
    s_->verify_us += std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t0).count();
    ++s_->verified;
    seal_update(u, round, *c.sender, aad);
  }

private:
  [[noreturn]] static void refuse(std::uint64_t client, const std::string& why) {
    throw std::runtime_error("tee: client " + std::to_string(client) + " refuses the enclave: " + why);
  }

  // The client checks that its nonce is in the list the quote covers and the quote itself.
  void attest_tpm(std::uint64_t client, const bytes& nonce) const {
    if (std::find(s_->nonces.begin(), s_->nonces.end(), nonce) == s_->nonces.end()) refuse(client, "its nonce is not in the quoted list");
    const auto qualifying = batch_qualifying(s_->box_key, s_->nonces);
    if (auto why = verify_tpm_quote(s_->round_quote, s_->ak_pem, qualifying, s_->expected_pcr16); !why.empty())
      refuse(client, "TPM quote: " + why);
  }

  // Once per client and enclave: the quote of its enrolment batch, bound to the enclave's key and
  // to the batch's nonces, its own among them.
  void attest_session(std::uint64_t client, tee_state::client_session& c) const {
    if (c.batch >= s_->batches.size()) throw std::logic_error("tee: client " + std::to_string(client) + " has no enrolment");
    const auto& b = s_->batches[c.batch];
    if (std::find(b.nonces.begin(), b.nonces.end(), c.enrol_nonce) == b.nonces.end()) refuse(client, "its nonce is not in the quoted list");
    const auto list = nonce_list_digest(b.nonces);
    dcap::policy p;
    p.measurement = s_->expected_measurement;
    p.nonce = bytes(list.begin(), list.end());
    p.enclave_key = bytes(s_->box_key.begin(), s_->box_key.end());
    p.root_key_sha256 = s_->root_pin;
    dcap::quote q;
    try {
      q = dcap::parse_quote(b.quote);
    } catch (const std::invalid_argument& e) {
      refuse(client, std::string("its quote is malformed: ") + e.what());
    }
    verify_platform_and_signature(client, q, b.quote, p);
    if (auto why = dcap::check_policy(q, p); !why.empty()) refuse(client, "its quote failed at policy: " + why);
    c.attested = true;
  }

  // Every step of dcap::verify_quote but the policy, remembered (tee_state::verified_quotes).
  void verify_platform_and_signature(std::uint64_t client, const dcap::quote& q, const bytes& quote_bytes, const dcap::policy& p) const {
    const auto at = static_cast<std::int64_t>(std::time(nullptr));
    const std::size_t platform_at = q.signed_part.size() + 4 + 64;
    const auto whole = digest_key(quote_bytes, s_->collateral_text, s_->root_pin);
    const auto platform = digest_key(std::span(quote_bytes).subspan(platform_at), s_->collateral_text, s_->root_pin);
    auto fresh = [&](const std::unordered_map<std::string, std::int64_t>& m, const std::string& k) {
      const auto f = m.find(k);
      return f != m.end() && at <= f->second;
    };
    {
      std::lock_guard lock(s_->cache_m);
      if (fresh(s_->verified_quotes, whole)) return;
      if (fresh(s_->verified_platforms, platform)) {
        if (!quote_signature_verifies(q)) refuse(client, "its quote failed at quote_signature");
        s_->verified_quotes[whole] = s_->verified_platforms[platform];
        return;
      }
    }
    const auto v = dcap::verify_quote(q, s_->collateral, at, p);
    if (!v.ok()) refuse(client, std::string("its quote failed at ") + dcap::to_string(*v.failed) + ": " + v.error);
    if (!v.tcb_accepted) refuse(client, "TCB status " + v.tcb_status);
    // Verified in full: remembered for an hour, or until the first certificate, CRL or collateral
    // document it rested on expires, whichever comes first.
    std::lock_guard lock(s_->cache_m);
    s_->verified_quotes[whole] = s_->verified_platforms[platform] = std::min(at + 3600, v.valid_until);
  }

  // Every round: the enclave this client attested (the only other holder of their session's
  // key) tagged that it opened this round, with the parameters the client expects, after the
  // client drew its nonce.
  // Returns the statement's digest, its box's associated data.
  std::array<std::uint8_t, 32> check_round(std::uint64_t client, const tee_state::client_session& c, const round_info& round) const {
    if (std::find(s_->nonces.begin(), s_->nonces.end(), c.round_nonce) == s_->nonces.end())
      refuse(client, "its round nonce is not in the round's statement");
    const auto statement = round_statement(static_cast<std::uint32_t>(round.round), static_cast<std::uint64_t>(round.dim),
                                           stddev(*s_), s_->expected, s_->oblivious, s_->nonces);
    const auto want = round_tag(c.sender->rx, statement, client);
    if (c.round_tag.size() != want.size() || sodium_memcmp(c.round_tag.data(), want.data(), want.size()) != 0)
      refuse(client, "the round's tag is not its session's with the enclave it attested (another round, other parameters or another key)");
    return statement_digest(statement);
  }

  void seal_update(client_update& u, const round_info& round, const box_sender& sender, std::span<const std::uint8_t> aad) const {
    if (s_->clip > 0) clip_l2(u.delta, s_->clip);
    update_payload payload;
    payload.round = static_cast<std::uint32_t>(round.round);
    payload.client = u.client;
    payload.weight = u.weight;
    payload.dim = static_cast<std::uint32_t>(u.delta.size());
    std::span<const float> values = u.delta;
    if (s_->topk_fraction > 0) {
      // Top-k left its zeros in place: send the kept coordinates, padded to k entries so that
      // the box's length says nothing of how many were non-zero.
      const auto k = static_cast<std::size_t>(std::max(1.0, std::round(s_->topk_fraction * static_cast<double>(u.delta.size()))));
      payload.sparse = true;
      for (std::size_t i = 0; i < u.delta.size(); ++i)
        if (u.delta[i] != 0.0f) {
          payload.index.push_back(static_cast<std::uint32_t>(i));
          payload.value.push_back(u.delta[i]);
        }
      while (payload.index.size() < k) {
        payload.index.push_back(0xFFFFFFFFu);
        payload.value.push_back(0.0f);
      }
      values = payload.value;
    }
    // The plaintext is encode_payload(payload): its head, the positions, the values, sealed
    // from where they lie.
    const auto head = payload_head(payload, static_cast<std::uint32_t>(values.size()));
    const auto as_bytes = [](auto s) { return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size_bytes()); };
    const std::span<const std::uint32_t> index = payload.index;
    const std::size_t size = box_overhead + head.size() + index.size_bytes() + values.size_bytes();
    // Words: the box's length in bytes, then the box.
    std::vector<std::uint32_t> words(1 + (size + 3) / 4, 0u);
    words[0] = static_cast<std::uint32_t>(size);
    seal_box(sender, aad, {head, as_bytes(index), as_bytes(values)}, {reinterpret_cast<std::uint8_t*>(words.data() + 1), size});
    u.words = std::move(words);
    u.wire_bytes = size;
    u.delta.clear();
  }

public:
  void end_round(const round_info&, std::vector<std::pair<std::string, double>>& metrics) override {
    const auto n = s_->verified.exchange(0);
    const auto us = s_->verify_us.exchange(0);
    if (s_->noise > 0) metrics.emplace_back("epsilon", s_->accountant.epsilon(s_->delta).epsilon);
    metrics.emplace_back("tee_verify_ms", n > 0 ? static_cast<double>(us) / 1000.0 / static_cast<double>(n) : 0.0);
  }

  static double stddev(const tee_state& s) { return s.noise > 0 ? s.noise * s.clip : 0.0; }

private:
  std::shared_ptr<tee_state> s_;
};

class tee_relay final : public aggregator {
public:
  explicit tee_relay(std::shared_ptr<tee_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "tee"; }
  void begin(const round_info& round) override {
    auto& s = *s_;
    s.round = static_cast<std::uint32_t>(round.round);
    for (auto& [id, c] : s.clients) c.round_nonce.clear();
    auto& e = s.host->enclave();
    // Enrolment: the participants new to this enclave draw a nonce each (their own draw); the
    // enclave answers one quote over the batch.
    if (!s.swtpm) {
      tee_state::batch b;
      for (auto c : round.participants) {
        auto& session = s.clients[c];
        if (!session.enrol_nonce.empty()) continue;
        session.enrol_nonce.assign(32, 0);
        randombytes_buf(session.enrol_nonce.data(), session.enrol_nonce.size());
        session.batch = s.batches.size();
        b.nonces.push_back(session.enrol_nonce);
      }
      if (!b.nonces.empty()) {
        b.quote = e.ask(&tee_enclave::attest, b.nonces).timeout(std::chrono::seconds(120)).get();
        s.batches.push_back(std::move(b));
      }
    }
    std::vector<bytes> nonces, keys;
    for (auto c : round.participants) {
      auto& session = s.clients[c];
      bytes n(32);
      randombytes_buf(n.data(), n.size());  // the client's own draws: its nonce, and once its key pair
      nonces.push_back(n);
      session.round_nonce = std::move(n);
      if (!session.sender) session.sender = make_sender(s.box_key);
      keys.emplace_back(session.sender->public_key.begin(), session.sender->public_key.end());
    }
    if (s.swtpm) {
      auto q = e.ask(&tee_enclave::tpm_quote, nonces).timeout(std::chrono::seconds(120)).get();
      if (q.size() != 2) throw std::runtime_error("tee: the enclave's TPM quote has " + std::to_string(q.size()) + " parts");
      s.round_quote = {std::move(q[0]), std::move(q[1])};
    }
    auto tags = e.ask(&tee_enclave::begin, s.round, static_cast<std::uint64_t>(round.dim), tee_seal::stddev(s), s.expected, s.oblivious,
                      nonces, std::vector<std::uint64_t>(round.participants.begin(), round.participants.end()), keys)
                    .timeout(std::chrono::seconds(120))
                    .get();
    if (tags.size() != round.participants.size())
      throw std::runtime_error("tee: the enclave answered " + std::to_string(tags.size()) + " round tags");
    for (std::size_t i = 0; i < tags.size(); ++i) s.clients[round.participants[i]].round_tag = std::move(tags[i]);
    s.nonces = std::move(nonces);
  }
  void add(std::uint64_t client, double, std::span<const float>) override {
    throw std::logic_error("tee: client " + std::to_string(client) + " sent an unsealed update");
  }
  void add_encoded(std::uint64_t client, double, std::span<const std::uint32_t> words) override {
    // In 64 bits: near 2^32 the 32-bit sum wraps to a one-word size.
    if (words.empty() || (std::size_t{words[0]} + 3) / 4 + 1 != words.size())
      throw std::invalid_argument("tee: client " + std::to_string(client) + "'s sealed update is malformed");
    const auto* first = reinterpret_cast<const std::byte*>(words.data() + 1);
    s_->host->enclave().tell(&tee_enclave::add, client, std::vector<std::byte>(first, first + words[0]));
  }
  std::vector<float> finish() override {
    auto out = s_->host->enclave().ask(&tee_enclave::finish).timeout(std::chrono::seconds(600)).get();
    if (s_->noise > 0) s_->accountant.compose(s_->sampling, s_->noise, 1);
    return out;
  }

private:
  std::shared_ptr<tee_state> s_;
};

std::string program_of(const simulation_options& o) {
  if (!o.tee_program.empty()) return o.tee_program;
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

}  // namespace

void install_tee(simulation& sim, const simulation_options& o) {
  if (o.tee != "sim" && o.tee != "swtpm")
    bad("--tee " + o.tee + ": sim (a simulated SGX enclave) or swtpm (a software TPM's quotes); this machine has no SGX, TDX or SEV");
  if (o.tee_root != "test")
    bad(o.tee == "sim" ? "--tee sim's quotes are signed by a test key chain made at run time, not by Intel: the clients "
                         "accept them only with --tee-root test"
                       : "--tee swtpm's attestation key is made by this run in a software TPM (no manufacturer's "
                         "certificate): the clients accept it only with --tee-root test");
  auto refuse = [](const std::string& what, const std::string& why) { bad("--tee cannot combine with " + what + ": " + why); };
  if (o.secagg) refuse("--secagg", "the enclave already hides each update from the server: pick one");
  if (o.verify_norm > 0) refuse("--verify-norm", "the norm proofs check plain updates, which the server never sees here");
  if (!o.async.empty()) refuse("--async", "the enclave aggregates synchronous rounds");
  if (is_robust_rule(o.strategy)) refuse("--strategy " + o.strategy, "the enclave computes the (weighted) mean only");
  const std::string base = o.strategy.substr(0, o.strategy.find(':'));
  if (base == "qfedavg" || base == "fedgen") refuse("--strategy " + o.strategy, "it needs each plain update");
  if (!o.contribution.empty()) refuse("--contribution", "valuing clients needs each plain update");
  if (o.drift_response == "cluster") refuse("--drift-response cluster", "the second model needs plain updates");
  if (o.dp_adaptive) refuse("--dp-adaptive", "adaptive clipping's count is not computed in the enclave");
  if (!o.checkpoint.empty())
    refuse("--checkpoint", "the simulated platform's sealing secret lives only as long as its process, so a later run "
                           "could not open the enclave's sealed state");
  if (o.secagg_dropout != 0) refuse("--secagg-dropout", "it needs --secagg");
  const bool topk = o.compress.rfind("topk:", 0) == 0;
  if (o.tee_oblivious && !topk)
    bad("--tee-oblivious changes how the enclave adds sparse updates: it needs --compress topk:F (dense updates are added "
        "coordinate by coordinate already)");

  auto s = std::make_shared<tee_state>();
  const auto m = file_sha256(program_of(o));  // what the clients expect to run
  s->swtpm = o.tee == "swtpm";
  s->host = std::make_unique<enclave_host>(program_of(o), s->swtpm);
  s->box_key = s->host->public_key();
  if (s->swtpm) {
    s->ak_pem = s->host->tpm().ak_pem();
    s->expected_pcr16 = pcr_after_extend(m);
  } else {
    s->collateral_text = s->host->platform().collateral_json();
    s->collateral = dcap::parse_collateral(s->collateral_text);
    s->root_pin = s->host->platform().root_key_sha256();
    s->expected_measurement.assign(m.begin(), m.end());
  }
  if (topk) s->topk_fraction = std::stod(o.compress.substr(5));
  s->oblivious = o.tee_oblivious;
  if (o.dp_clip != 0 || o.dp_noise != 0) {
    if (!(o.dp_clip > 0 && o.dp_noise > 0)) bad("differential privacy needs both --dp-clip and --dp-noise, positive");
    if (!(o.dp_delta > 0 && o.dp_delta < 1)) bad("--dp-delta must be in (0, 1)");
    if (!std::isfinite(o.dp_clip * o.dp_noise)) bad("--dp-noise x --dp-clip (the noise's stddev) must be finite");
    s->clip = o.dp_clip;
    s->noise = o.dp_noise;
    s->delta = o.dp_delta;
    s->expected = static_cast<double>(sim.cohort_size());
    s->sampling = static_cast<double>(sim.sample_size()) / static_cast<double>(sim.population());
  }
  sim.add_transform(std::make_unique<tee_seal>(s));
  sim.set_aggregator(std::make_unique<tee_relay>(s));
}

}  // namespace troupe::federated::tee
