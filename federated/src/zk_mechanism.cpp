// --verify-norm: the norm proofs of zkproof.hpp as the engine's hooks (mechanisms.hpp).
//
// The story of an update: the client's transform (on its worker thread) quantizes the update as
// it stands after the other transforms, proves its norm and sends the floats with the proof. The
// server's aggregator quantizes the floats it received the same way, so the opening proof ties
// the commitments to what will be aggregated, verifies, and passes the floats untouched to the
// aggregator it wraps: an honest run aggregates exactly what it would without the check.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/federated/zkproof.hpp"

namespace troupe::federated {
namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

/// What the transform (many worker threads) and the aggregator (the server's thread) share.
struct norm_state {
  norm_verification_options options;
  // Client side, this round.
  std::atomic<std::uint64_t> proofs{0}, prove_us{0}, bytes{0};
  // Server side, this round.
  std::size_t verified = 0;
  double verify_ms = 0;
  std::vector<std::uint64_t> rejected;
};

class norm_prover final : public update_transform {
public:
  explicit norm_prover(std::shared_ptr<norm_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "verify-norm"; }

  void apply(client_update& u, std::span<float>, const round_info&, splitmix64&) const override {
    const zk::norm_params p{.dim = u.delta.size(), .bits = s_->options.bits, .bound = s_->options.bound};
    zk::check_params(p);
    const auto t0 = clock_type::now();
    const auto x = zk::quantize(u.delta, p);
    std::vector<std::uint8_t> proof;
    try {
      proof = zk::prove_norm(x, p);
    } catch (const std::invalid_argument&) {
      // The update breaks the bound: no proof exists. Whatever such a client sends fails; this
      // is the prover with its checks skipped.
      proof = zk::forge_norm(x, p);
    }
    s_->prove_us.fetch_add(static_cast<std::uint64_t>(ms_since(t0) * 1000), std::memory_order_relaxed);
    s_->proofs.fetch_add(1, std::memory_order_relaxed);
    s_->bytes.fetch_add(proof.size(), std::memory_order_relaxed);
    const std::size_t d = u.delta.size();
    u.words.resize(d + 1 + (proof.size() + 3) / 4);
    std::memcpy(u.words.data(), u.delta.data(), d * sizeof(float));
    u.words[d] = static_cast<std::uint32_t>(proof.size());
    u.words.back() = 0;  // the last word's padding
    std::memcpy(u.words.data() + d + 1, proof.data(), proof.size());
    u.wire_bytes = 4 * static_cast<std::uint64_t>(d) + 4 + proof.size();
    u.delta.clear();
  }

  void end_round(const round_info&, std::vector<std::pair<std::string, double>>& metrics) override {
    const auto n = s_->proofs.exchange(0);
    const auto us = s_->prove_us.exchange(0), bytes = s_->bytes.exchange(0);
    metrics.emplace_back("rejected", static_cast<double>(s_->rejected.size()));
    if (n == 0) return;
    metrics.emplace_back("proof_bytes", static_cast<double>(bytes) / static_cast<double>(n));
    metrics.emplace_back("prove_ms", static_cast<double>(us) / 1000.0 / static_cast<double>(n));
    if (s_->verified > 0) metrics.emplace_back("verify_ms", s_->verify_ms / static_cast<double>(s_->verified));
  }

private:
  std::shared_ptr<norm_state> s_;
};

class norm_checker final : public aggregator {
public:
  norm_checker(std::shared_ptr<norm_state> s, std::unique_ptr<aggregator> inner) : s_(std::move(s)), inner_(std::move(inner)) {}
  std::string name() const override { return "verify-norm(" + inner_->name() + ")"; }

  void begin(const round_info& round) override {
    dim_ = round.dim;
    accepted_ = 0;
    s_->verified = 0;
    s_->verify_ms = 0;
    s_->rejected.clear();
    inner_->begin(round);
  }

  void add(std::uint64_t client, double, std::span<const float>) override {
    throw std::logic_error("verify-norm: client " + std::to_string(client) + "'s update came without its proof");
  }

  void add_encoded(std::uint64_t client, double weight, std::span<const std::uint32_t> words) override {
    const auto t0 = clock_type::now();
    const std::string why = check(words);
    s_->verify_ms += ms_since(t0);
    ++s_->verified;
    if (!why.empty()) {
      s_->rejected.push_back(client);
      last_reason_ = why;
      return;
    }
    inner_->add(client, weight, delta_);
    ++accepted_;
  }

  std::vector<float> finish() override {
    if (accepted_ == 0 && !s_->rejected.empty())
      throw round_aborted("every update of the round failed its norm proof (the last: " + last_reason_ + ")");
    return inner_->finish();
  }

  std::vector<std::uint64_t> rejected() const override { return s_->rejected; }

private:
  /// Why the words do not carry an update with a valid proof ("" when they do); fills delta_.
  std::string check(std::span<const std::uint32_t> words) {
    if (words.size() < dim_ + 1) return "the update is shorter than the model";
    const std::size_t bytes = words[dim_];
    if (words.size() != dim_ + 1 + (bytes + 3) / 4) return "the proof's length word does not match the words sent";
    delta_.resize(dim_);
    std::memcpy(delta_.data(), words.data(), dim_ * sizeof(float));
    const zk::norm_params p{.dim = dim_, .bits = s_->options.bits, .bound = s_->options.bound};
    std::vector<std::int64_t> x;
    try {
      x = zk::quantize(delta_, p);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    const auto* proof = reinterpret_cast<const std::uint8_t*>(words.data() + dim_ + 1);
    const auto v = zk::verify_norm(std::span(proof, bytes), p, x);
    return v.reason;
  }

  std::shared_ptr<norm_state> s_;
  std::unique_ptr<aggregator> inner_;
  std::size_t dim_ = 0, accepted_ = 0;
  std::vector<float> delta_;
  std::string last_reason_;
};

}  // namespace

mechanism make_norm_verification(const norm_verification_options& options, std::unique_ptr<aggregator> inner) {
  if (!(options.bound > 0) || !std::isfinite(options.bound))
    throw std::invalid_argument("--verify-norm: the bound must be a positive number");
  if (options.bits != 8 && options.bits != 16 && options.bits != 32)
    throw std::invalid_argument("--verify-bits must be 8, 16 or 32, got " + std::to_string(options.bits));
  if (!inner) throw std::invalid_argument("make_norm_verification: null aggregator");
  auto s = std::make_shared<norm_state>();
  s->options = options;
  return {std::make_unique<norm_prover>(s), std::make_unique<norm_checker>(s, std::move(inner))};
}

void check_norm_verification(const simulation_options& o) {
  if (o.verify_norm == 0) {
    if (o.verify_bits != 16) throw std::invalid_argument("--verify-bits is read with --verify-norm");
    return;
  }
  auto refuse = [](const std::string& what) { throw std::invalid_argument("--verify-norm cannot combine with " + what); };
  if (!(o.verify_norm > 0) || !std::isfinite(o.verify_norm))
    throw std::invalid_argument("--verify-norm: the bound must be a positive number");
  if (o.secagg)
    refuse("--secagg yet: the server would verify commitments it cannot link to the masked sum (the blinding factors "
           "derived from the masks' seeds are not built)");
  if (!o.compress.empty()) refuse("--compress (the proof covers the dense update the server receives)");
  if (!o.async.empty()) refuse("--async (FedBuff's steps take plain updates)");
  if (!o.lora.empty()) refuse("--lora (the adapters travel in their own encoding)");
  if (!o.contribution.empty()) refuse("--contribution (the Shapley values need each plain update)");
  if (o.drift_response == "cluster") refuse("--drift-response cluster (the second model takes plain updates)");
  const std::string base = o.strategy.substr(0, o.strategy.find(':'));
  if (base == "qfedavg" || base == "fedgen")
    refuse("--strategy " + o.strategy + " (its server reads each plain update)");
}

}  // namespace troupe::federated
