#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/tee.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "engine.hpp"
#include "spec.hpp"
#include "troupe/federated/alignins.hpp"
#include "troupe/federated/compress.hpp"
#include "troupe/federated/dp.hpp"
#include "troupe/federated/rng.hpp"
#include "troupe/federated/robust.hpp"
#include "troupe/federated/secagg.hpp"
#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument(why); }

/// A number as a person writes it (1e+308, 0.45), not std::to_string's fixed notation.
std::string show(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

double number(const std::string& text, const std::string& spec) { return detail::spec_number(text, "'" + spec + "'"); }

std::size_t count(const std::string& text, const std::string& spec) {
  const double v = number(text, spec);
  if (v < 0 || v != std::floor(v)) bad("'" + spec + "': '" + text + "' is not a whole number >= 0");
  // A count of clients: never more than a simulation holds (and a double beyond 2^64 would not
  // convert at all).
  if (v > static_cast<double>(max_clients))
    bad("'" + spec + "': " + text + " is more than the " + std::to_string(max_clients) + " clients a simulation holds");
  return static_cast<std::size_t>(v);
}

// ---- robust ----------------------------------------------------------------------------------------

class buffered_rule final : public aggregator {
public:
  enum class kind { median, trimmed_mean, krum, geometric_median, norm_bound };
  buffered_rule(std::string name, kind k, std::size_t a, std::size_t b, double bound = 0)
      : name_(std::move(name)), kind_(k), a_(a), b_(b), least_(least_updates(name_)), bound_(bound) {}
  std::string name() const override { return name_; }
  void begin(const round_info& round) override {
    dim_ = round.dim;
    updates_.clear();
  }
  void add(std::uint64_t client, double, std::span<const float> delta) override {
    if (delta.size() != dim_)
      bad("client " + std::to_string(client) + " sent " + std::to_string(delta.size()) + " floats; the round expects " +
          std::to_string(dim_));
    updates_.emplace_back(delta.begin(), delta.end());
  }
  std::vector<float> finish() override {
    if (updates_.empty()) throw std::logic_error(name_ + ": no updates in this round");
    if (updates_.size() < least_)
      throw round_aborted(name_ + " needs at least " + std::to_string(least_) + " updates; this round has " +
                          std::to_string(updates_.size()) + " (clients failed or were late)");
    const std::vector<update_view> views(updates_.begin(), updates_.end());
    switch (kind_) {
      case kind::median: return coordinate_median(views);
      case kind::trimmed_mean: return trimmed_mean(views, a_);
      case kind::krum: return multi_krum(views, a_, b_);
      case kind::geometric_median: return geometric_median(views);
      case kind::norm_bound: return norm_bounded_mean(views, bound_);
    }
    return {};
  }

private:
  std::string name_;
  kind kind_;
  std::size_t a_, b_, least_, dim_ = 0;
  double bound_;
  std::vector<std::vector<float>> updates_;
};

// ---- differential privacy --------------------------------------------------------------------------

/// What the clipping transform and the noising aggregator share. The bound changes only in
/// finish(), between rounds; the engine's messages order that before the next round's clipping.
struct dp_state {
  dp_options options;
  adaptive_clipping clipping;
  rdp_accountant accountant;
  double sum_multiplier = 0;  // z, or z_Δ when adaptive
};

/// Clients sampled per round: more than the K kept under over-selection.
std::size_t sampled_clients(const dp_options& o) { return o.sampled_clients ? o.sampled_clients : o.expected_clients; }

/// The server's half of DP-FedAvg once it holds the sum of the round's clipped updates (added
/// by itself, or unmasked by secure aggregation): N(0, (z S)²) on every coordinate, the division
/// by K, one accountant step and, when adaptive, the bound's update from the centred count of
/// unclipped clients, Σ(b_i - ½) (see adaptive_clipping::update).
/// The draws depend only on the round's seed, so both paths add the same noise.
void noise_sum(dp_state& s, std::span<float> sum, double centred_count, std::uint64_t round_seed) {
  const double stddev = s.sum_multiplier * s.clipping.bound;
  const double k = static_cast<double>(s.options.expected_clients);
  splitmix64 g{derive_seed(round_seed, 0xD1FF)};
  const std::uint64_t noise_seed = g.next();
  add_gaussian_noise(sum, stddev, noise_seed);
  for (float& x : sum) x = static_cast<float>(x / k);
  s.accountant.compose(static_cast<double>(sampled_clients(s.options)) / static_cast<double>(s.options.population),
                       s.options.noise, 1);
  if (s.options.adaptive) s.clipping.update(centred_count, k, g.next());
}

void report_dp(const dp_state& s, std::vector<std::pair<std::string, double>>& metrics) {
  metrics.emplace_back("epsilon", s.accountant.epsilon(s.options.delta).epsilon);
  if (s.options.adaptive) metrics.emplace_back("dp_clip", s.clipping.bound);
}

// The clipping bound, then the accountant's RDP per order.
std::vector<double> save_dp(const dp_state& s) {
  std::vector<double> out{s.clipping.bound};
  out.insert(out.end(), s.accountant.rdp().begin(), s.accountant.rdp().end());
  return out;
}

void check_dp(const dp_state& s, std::span<const double> state, const std::string& who) {
  if (state.empty() || !(state[0] > 0) || !std::isfinite(state[0]))
    bad(who + ": the saved state has no valid clipping bound");
  try {
    s.accountant.check(state.subspan(1));
  } catch (const std::invalid_argument& e) {
    bad(who + ": " + e.what());
  }
}

void load_dp(dp_state& s, std::span<const double> state, const std::string& who) {
  check_dp(s, state, who);
  s.accountant.restore(state.subspan(1));
  s.clipping.bound = state[0];
}

class dp_clip final : public update_transform {
public:
  explicit dp_clip(std::shared_ptr<dp_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "dp-clip"; }
  void apply(client_update& u, std::span<float>, const round_info&, splitmix64&) const override {
    clip_l2(u.delta, s_->clipping.bound);
  }
  void end_round(const round_info&, std::vector<std::pair<std::string, double>>& metrics) override {
    report_dp(*s_, metrics);
  }
  std::vector<double> save_state() const override { return save_dp(*s_); }
  void load_state(std::span<const double> state) override { load_dp(*s_, state, "dp-clip"); }
  void check_state(std::span<const double> state) const override { check_dp(*s_, state, "dp-clip"); }

private:
  std::shared_ptr<dp_state> s_;
};

class dp_noise final : public aggregator {
public:
  explicit dp_noise(std::shared_ptr<dp_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "dp-gaussian"; }
  void begin(const round_info& round) override {
    sum_.assign(round.dim, 0.0);
    centred_ = 0;
    added_ = 0;
    seed_ = round.seed;
  }
  void add(std::uint64_t client, double, std::span<const float> delta) override {
    if (delta.size() != sum_.size())
      bad("client " + std::to_string(client) + " sent " + std::to_string(delta.size()) + " floats; the round expects " +
          std::to_string(sum_.size()));
    double squares = 0;
    for (std::size_t i = 0; i < delta.size(); ++i) {
      sum_[i] += delta[i];
      squares += static_cast<double>(delta[i]) * delta[i];
    }
    // A clipped update sits on the bound (up to float rounding); one below it was not clipped.
    centred_ += std::sqrt(squares) < s_->clipping.bound * (1 - 1e-5) ? 0.5 : -0.5;
    ++added_;
  }
  std::vector<float> finish() override {
    if (added_ == 0) throw std::logic_error("dp-gaussian: no updates in this round");
    std::vector<float> out(sum_.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(sum_[i]);
    noise_sum(*s_, out, centred_, seed_);
    return out;
  }

private:
  std::shared_ptr<dp_state> s_;
  std::vector<double> sum_;
  double centred_ = 0;  // Σ(b_i - ½)
  std::int64_t added_ = 0;
  std::uint64_t seed_ = 0;
};

// ---- compression -----------------------------------------------------------------------------------

class compression final : public update_transform {
public:
  compression(std::string spec, bool topk, double parameter) : spec_(std::move(spec)), topk_(topk), p_(parameter) {}
  std::string name() const override { return spec_; }
  std::size_t client_state_floats(std::size_t dim) const override { return topk_ ? dim : 0; }
  void apply(client_update& u, std::span<float> state, const round_info&, splitmix64& rng) const override {
    if (topk_) {
      const auto sparse = top_k(u.delta, p_, state);
      u.wire_bytes = static_cast<std::uint64_t>(sparse.wire_bytes());
      sparse.densify(u.delta);
    } else {
      const auto q = qsgd(u.delta, static_cast<int>(p_), rng.next());
      u.wire_bytes = static_cast<std::uint64_t>(q.wire_bytes());
      q.dequantize(u.delta);
    }
  }
  void end_round(const round_info& round, std::vector<std::pair<std::string, double>>& metrics) override {
    const double dense = 4.0 * static_cast<double>(round.dim);
    double wire = 0;
    if (topk_) {
      const double k = std::max(1.0, std::round(p_ * static_cast<double>(round.dim)));
      wire = 8.0 * k;
    } else {
      wire = quantized_update{0, static_cast<int>(p_), std::vector<std::int8_t>(round.dim)}.wire_bytes();
    }
    metrics.emplace_back("uplink_ratio", wire / dense);
  }

private:
  std::string spec_;
  bool topk_;
  double p_;
};

// ---- attacks ---------------------------------------------------------------------------------------

class attack final : public update_transform {
public:
  attack(update_attack kind, double p, double factor, std::uint64_t seed)
      : kind_(kind), p_(p), factor_(factor), seed_(seed) {}
  std::string name() const override { return "attack"; }
  void apply(client_update& u, std::span<float>, const round_info&, splitmix64&) const override {
    if (is_malicious(u.client, p_, seed_)) apply_update_attack(kind_, u.delta, factor_);
  }

private:
  update_attack kind_;
  double p_, factor_;
  std::uint64_t seed_;
};

// ---- secure aggregation ----------------------------------------------------------------------------

/// The key stages of a round (advertise, then share), run by the threads that need them: the
/// first client to finish training starts them inside its masking step, every worker that
/// reaches masking before they end takes clients from the same counter, and the last client of
/// a stage hands that stage's messages to the server. So the stages overlap the training of the
/// round's other clients instead of running before it, and no core waits at a barrier while
/// another has training to do.
struct key_exchange {
  std::mutex m;
  std::condition_variable changed;
  int stage = 0;                  // 0: advertise, 1: share, 2: done
  std::size_t next = 0, ended = 0;  // clients taken and finished in this stage
  std::vector<secagg::public_keys> keys;
  std::vector<std::vector<secagg::encrypted_share>> shares;
  std::exception_ptr error;
};

/// One round's protocol state. The clients' halves live here for the round only (in a
/// deployment each would live on its device); the aggregator touches only the server half and
/// what the messages carry.
struct secagg_round {
  secagg::config cfg;
  std::unique_ptr<secagg::graph> graph;
  std::unique_ptr<secagg::server> server;
  std::unordered_map<std::uint64_t, std::size_t> slot;  // client -> index below
  std::vector<secagg::client_id> ids;
  std::vector<secagg::client> clients;
  std::vector<std::vector<secagg::encrypted_share>> inbox;
  std::unique_ptr<key_exchange> exchange;

  /// Returns once every participant has advertised and shared and the server has relayed the
  /// shares (inbox is filled), taking part in the work meanwhile. Thread-safe; rethrows the
  /// stage's error on every caller.
  void exchange_keys() {
    if (!exchange) throw std::logic_error("secagg: a round used before begin()");
    key_exchange& x = *exchange;
    std::unique_lock lock(x.m);
    const std::size_t n = clients.size();
    while (x.stage < 2) {
      if (x.error) std::rethrow_exception(x.error);
      if (x.next == n) {
        x.changed.wait(lock);
        continue;
      }
      const std::size_t i = x.next++;
      const int stage = x.stage;
      lock.unlock();
      std::exception_ptr error;
      try {
        if (stage == 0)
          x.keys[i] = clients[i].advertise();
        else
          x.shares[i] = clients[i].share_keys(server->keys_for(ids[i]));  // the server is read-only here
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (!error && ++x.ended == n) {
        try {  // the stage's last client; the others wait for the next stage
          if (stage == 0) {
            for (const auto& k : x.keys) server->receive_keys(k);
          } else {
            for (const auto& sh : x.shares) server->receive_shares(sh);
            inbox.resize(n);
            for (std::size_t c = 0; c < n; ++c) inbox[c] = server->shares_for(ids[c]);
          }
        } catch (...) {
          error = std::current_exception();
        }
        ++x.stage;
        x.next = x.ended = 0;
        x.changed.notify_all();
      }
      if (error && !x.error) {
        x.error = error;
        x.changed.notify_all();
      }
    }
  }
};

struct secagg_state {
  secagg_options options;
  secagg_round round;
  std::size_t survivors = 0;
  double weight_sum = 0;  // of the round's masked inputs so far (checked against max_weight_sum)
  /// Differential privacy on the sum (null without): the clients clip, the server noises.
  std::shared_ptr<dp_state> dp;
  /// Coordinates after the update's: the weight ratio (weighted mean), the unclipped indicator
  /// (adaptive clipping) or none (fixed clipping).
  std::size_t extra() const { return dp ? (dp->options.adaptive ? 1 : 0) : 1; }
};

class secagg_mask final : public update_transform {
public:
  explicit secagg_mask(std::shared_ptr<secagg_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "secagg"; }
  void apply(client_update& u, std::span<float>, const round_info&, splitmix64&) const override {
    auto& r = s_->round;
    auto it = r.slot.find(u.client);
    if (it == r.slot.end()) throw std::logic_error("secagg: client " + std::to_string(u.client) + " is not in this round");
    if (u.delta.size() + s_->extra() != r.cfg.dim) throw std::logic_error("secagg: the update's length changed within the round");
    // Buffers are reused rather than allocated per client (a fresh 300 KB block costs a page
    // fault per 4 KB): the input in a per-thread scratch, the masked words in u.words' storage,
    // and the delta keeps its capacity so that the engine takes it back.
    thread_local std::vector<float> input;
    input.resize(r.cfg.dim);
    if (s_->dp) {
      // DP-FedAvg: the client clips its own update (unweighted: the sum's sensitivity is S);
      // under adaptive clipping it adds S/2 when it was not clipped, -S/2 when it was, so that
      // the server learns only the centred count Σ(b_i - ½) (that coordinate's sum over S).
      const double bound = s_->dp->clipping.bound;
      const double norm = clip_l2(u.delta, bound);
      std::copy(u.delta.begin(), u.delta.end(), input.begin());
      if (s_->dp->options.adaptive) input.back() = static_cast<float>(norm <= bound ? bound / 2 : -bound / 2);
    } else {
      // The weighted mean (see make_secure_aggregation): (w / W) clip(delta) and (w / W) clip,
      // every coordinate in [-clip, clip] whatever the weight.
      const double most = s_->options.max_weight;
      if (!(u.weight >= 0 && u.weight <= most))
        bad("secagg: client " + std::to_string(u.client) + "'s weight " + show(u.weight) + " is outside [0, " +
            show(most) + "], the range the encoding was made for (max_weight)");
      const double ratio = u.weight / most, clip = s_->options.clip;
      for (std::size_t i = 0; i < u.delta.size(); ++i)
        input[i] = static_cast<float>(std::clamp(static_cast<double>(u.delta[i]), -clip, clip) * ratio);
      input.back() = static_cast<float>(ratio * clip);
    }
    r.exchange_keys();
    u.words = r.clients[it->second].mask(r.inbox[it->second], input, std::move(u.words)).values;
    u.delta.clear();
  }
  void end_round(const round_info&, std::vector<std::pair<std::string, double>>& metrics) override {
    if (s_->dp) report_dp(*s_->dp, metrics);
    metrics.emplace_back("secagg_survivors", static_cast<double>(s_->survivors));
  }
  std::vector<double> save_state() const override { return s_->dp ? save_dp(*s_->dp) : std::vector<double>{}; }
  void load_state(std::span<const double> state) override {
    if (s_->dp)
      load_dp(*s_->dp, state, "secagg with dp");
    else
      update_transform::load_state(state);
  }
  void check_state(std::span<const double> state) const override {
    if (s_->dp)
      check_dp(*s_->dp, state, "secagg with dp");
    else
      update_transform::check_state(state);
  }

private:
  std::shared_ptr<secagg_state> s_;
};

class secagg_sum final : public aggregator {
public:
  explicit secagg_sum(std::shared_ptr<secagg_state> s) : s_(std::move(s)) {}
  std::string name() const override { return "secagg"; }
  void begin(const round_info& round) override {
    auto& r = s_->round;
    r = {};
    s_->survivors = 0;
    if (round.participants.size() < 2)
      throw round_aborted("secure aggregation needs at least two clients in a round; this one has " +
                          std::to_string(round.participants.size()));
    // Under DP every input's L2 norm is at most the bound S, so is each coordinate's magnitude
    // (the unclipped indicator is ±S/2): clipping coordinates to S changes nothing, and the
    // scale keeps the sum of max_clients inputs below 2^31 (see secagg_options::dp).
    // Without DP, a coordinate of the sum is at most clip * (the round's weights) / max_weight.
    const std::size_t most = std::max(s_->options.max_clients, round.participants.size());
    r.cfg = {.dim = round.dim + s_->extra(),
             .clip = s_->dp ? s_->dp->clipping.bound : s_->options.clip,
             .max_clients = most,
             .sum_bound = s_->dp ? 0.0 : s_->options.clip * weight_sum_bound(most) / s_->options.max_weight,
             .degree = s_->options.degree,
             .threshold = 0,
             .full_graph = s_->options.full_graph};
    s_->weight_sum = 0;
    seed_ = round.seed;
    auto& ids = r.ids;
    for (std::uint64_t c : round.participants) {
      if (c > 0xFFFFFFFFull) bad("secagg: client ids above 2^32 are not supported");
      r.slot.emplace(c, ids.size());
      ids.push_back(static_cast<secagg::client_id>(c));
    }
    r.graph = std::make_unique<secagg::graph>(ids, r.cfg);
    r.server = std::make_unique<secagg::server>(r.cfg, *r.graph);
    for (auto id : ids) r.clients.emplace_back(id, r.cfg, *r.graph);
    // The key stages run later, in the clients' masking steps (secagg_round::exchange_keys).
    r.exchange = std::make_unique<key_exchange>();
    r.exchange->keys.resize(ids.size());
    r.exchange->shares.resize(ids.size());
  }
  void add(std::uint64_t client, double, std::span<const float>) override {
    throw std::logic_error("secagg: client " + std::to_string(client) + " sent an unmasked update");
  }
  void add_encoded(std::uint64_t client, double weight, std::span<const std::uint32_t> words) override {
    // The encoding's scale holds for sums of weights up to the bound; beyond it the sum would
    // wrap into a wrong mean. (The engine passes each weight beside its masked input, which is
    // what lets the simulation check this.)
    if (!s_->dp) {
      s_->weight_sum += weight;
      const double bound = weight_sum_bound(s_->round.cfg.max_clients);
      if (!(s_->weight_sum <= bound))
        bad("secagg: the round's weights sum to " + show(s_->weight_sum) + " with client " + std::to_string(client) +
            ", above the " + show(bound) + " the encoding was made for (max_weight_sum)");
    }
    s_->round.server->receive_masked(static_cast<secagg::client_id>(client), words);
  }
  std::vector<float> finish() override {
    auto& r = s_->round;
    r.exchange_keys();  // done already unless no client masked
    const auto request = r.server->request_unmasking();
    // Clients lost after masking: round(dropout * survivors) of them, drawn with the round's seed;
    // they do not answer the request.
    splitmix64 g{derive_seed(seed_, 0x5ECA66)};
    std::vector<secagg::client_id> answering = request.survivors;
    const auto lost = static_cast<std::size_t>(std::llround(s_->options.dropout * static_cast<double>(answering.size())));
    for (std::size_t i = 0; i < lost; ++i) {
      std::swap(answering[i], answering[i + g.below(answering.size() - i)]);
    }
    answering.erase(answering.begin(), answering.begin() + static_cast<std::ptrdiff_t>(lost));
    std::sort(answering.begin(), answering.end());
    std::vector<float> sum;
    std::vector<std::int32_t> exact;
    try {
      for (auto id : answering) r.server->receive_unmask(r.clients[r.slot.at(id)].unmask(request));
      for (auto id : request.dropped) r.server->receive_unmask(r.clients[r.slot.at(id)].unmask(request));
      sum = r.server->finish();
      exact = r.server->integer_sum();
    } catch (const std::runtime_error& e) {  // too few answered: the protocol gives the round up
      r = {};
      throw round_aborted(std::string("secure aggregation could not unmask the sum (") + e.what() +
                          "; lower --secagg-dropout or sample more clients per round)");
    }
    s_->survivors = r.server->survivors();
    r = {};
    if (s_->dp) {
      double centred = 0;  // a whole multiple of ½, up to the fixed point's rounding
      if (s_->dp->options.adaptive) {
        centred = std::round(2 * sum.back() / s_->dp->clipping.bound) / 2;
        sum.pop_back();
      }
      noise_sum(*s_->dp, sum, centred, seed_);
      return sum;
    }
    // Both sums have the same scale: the mean is the ratio of the integers, times clip.
    const std::int32_t total = exact.back();
    if (total <= 0)
      throw round_aborted("secure aggregation: the round's weights sum to zero (its clients hold no examples), and the "
                          "plain mean the weighted mean falls back to would need a second secure sum");
    sum.pop_back();
    const double unit = s_->options.clip / static_cast<double>(total);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(static_cast<double>(exact[i]) * unit);
    return sum;
  }

private:
  /// The most a round of `clients` can weigh in all (secagg_options::max_weight_sum).
  double weight_sum_bound(std::size_t clients) const {
    const auto& o = s_->options;
    return o.max_weight_sum > 0 ? o.max_weight_sum : static_cast<double>(clients) * o.max_weight;
  }

  std::shared_ptr<secagg_state> s_;
  std::uint64_t seed_ = 0;
};

}  // namespace

// ---- factories -------------------------------------------------------------------------------------

bool is_robust_rule(const std::string& spec) {
  const auto name = detail::split_spec(spec).front();
  return name == "median" || name == "trimmed-mean" || name == "krum" || name == "multi-krum" || name == "geomed" ||
         name == "norm-bound" || name == "alignins";
}

std::size_t least_updates(const std::string& spec) {
  const auto p = detail::split_spec(spec);
  auto n = [&](std::size_t i) { return count(p.at(i), spec); };
  if (p[0] == "trimmed-mean") return 2 * n(1) + 1;
  if (p[0] == "krum") return 2 * n(1) + 3;
  if (p[0] == "multi-krum") return std::max(2 * n(1) + 3, n(2));
  return 1;
}

std::unique_ptr<aggregator> make_robust_aggregator(const std::string& spec) {
  const auto p = detail::split_spec(spec);
  using k = buffered_rule::kind;
  if (p[0] == "alignins") return make_alignins(spec);
  if (p[0] == "median" && p.size() == 1) return std::make_unique<buffered_rule>(spec, k::median, 0, 0);
  if (p[0] == "geomed" && p.size() == 1) return std::make_unique<buffered_rule>(spec, k::geometric_median, 0, 0);
  if (p[0] == "norm-bound" && p.size() == 2) {
    const double bound = number(p[1], spec);
    if (!(bound > 0) || !std::isfinite(bound)) bad("'" + spec + "': the norm bound M must be > 0 and finite");
    return std::make_unique<buffered_rule>(spec, k::norm_bound, 0, 0, bound);
  }
  if (p[0] == "trimmed-mean" && p.size() == 2) return std::make_unique<buffered_rule>(spec, k::trimmed_mean, count(p[1], spec), 0);
  if (p[0] == "krum" && p.size() == 2) return std::make_unique<buffered_rule>(spec, k::krum, count(p[1], spec), 1);
  if (p[0] == "multi-krum" && p.size() == 3) {
    const auto m = count(p[2], spec);
    if (m < 1) bad("'" + spec + "': M must be at least 1");
    return std::make_unique<buffered_rule>(spec, k::krum, count(p[1], spec), m);
  }
  bad("unknown robust aggregation rule '" + spec + "' (median, trimmed-mean:B, krum:F, multi-krum:F:M, geomed, norm-bound:M, alignins[:LAMBDA_T:LAMBDA_S])");
}

namespace {

std::shared_ptr<dp_state> make_dp_state(const dp_options& options) {
  if (!(options.clip > 0) || !std::isfinite(options.clip)) bad("--dp-clip must be a positive number");
  if (!(options.noise > 0) || !std::isfinite(options.noise)) bad("--dp-noise must be a positive number");
  if (!(options.delta > 0 && options.delta < 1)) bad("--dp-delta must be in (0, 1)");
  if (options.expected_clients == 0 || options.population < options.expected_clients)
    bad("differential privacy needs 0 < clients per round <= clients");
  if (sampled_clients(options) < options.expected_clients || sampled_clients(options) > options.population)
    bad("differential privacy needs clients per round <= clients sampled per round <= clients, got " +
        std::to_string(options.expected_clients) + ", " + std::to_string(sampled_clients(options)) + " and " +
        std::to_string(options.population));
  // The noise's stddev z S: finite, or the first round's noise is infinite.
  if (!std::isfinite(options.noise * options.clip))
    bad("--dp-noise x --dp-clip (the noise's stddev) must be finite, got " + show(options.noise) + " x " +
        show(options.clip));
  auto s = std::make_shared<dp_state>();
  s->options = options;
  s->clipping.bound = options.clip;
  s->sum_multiplier = options.noise;
  if (options.adaptive) {
    s->clipping.target_quantile = options.target_quantile;
    s->clipping.learning_rate = options.clip_learning_rate;
    // The paper suggests K / 20; with few clients per round that leaves the sum no budget, so at
    // least z (which costs the sum's multiplier a factor 1 / sqrt(3/4) = 1.15).
    s->clipping.count_noise = options.count_noise > 0
                                  ? options.count_noise
                                  : std::max(static_cast<double>(options.expected_clients) / 20, options.noise);
    s->sum_multiplier = s->clipping.sum_noise_multiplier(options.noise);
  }
  return s;
}

}  // namespace

mechanism make_differential_privacy(const dp_options& options) {
  auto s = make_dp_state(options);
  return {std::make_unique<dp_clip>(s), std::make_unique<dp_noise>(s)};
}

std::unique_ptr<update_transform> make_compression(const std::string& spec) {
  const auto p = detail::split_spec(spec);
  if (p.size() == 2 && p[0] == "topk") {
    const double f = number(p[1], spec);
    if (!(f > 0 && f <= 1)) bad("'" + spec + "': the fraction must be in (0, 1]");
    return std::make_unique<compression>(spec, true, f);
  }
  if (p.size() == 2 && p[0] == "qsgd") {
    const double levels = number(p[1], spec);
    if (!(levels >= 1 && levels <= 127) || levels != std::floor(levels))
      bad("'" + spec + "': the levels must be a whole number in [1, 127]");
    return std::make_unique<compression>(spec, false, levels);
  }
  bad("unknown compression '" + spec + "' (topk:F or qsgd:L)");
}

bool is_malicious(std::uint64_t client, double p, std::uint64_t seed) {
  splitmix64 g{derive_seed(seed ^ 0xA77AC4ull, client)};
  return g.uniform01() < p;
}

std::unique_ptr<update_transform> make_update_attack(const std::string& spec, std::uint64_t seed) {
  const auto p = detail::split_spec(spec);
  auto fraction = [&](const std::string& text) {
    const double f = number(text, spec);
    if (!(f >= 0 && f <= 1)) bad("'" + spec + "': the malicious fraction must be in [0, 1]");
    return f;
  };
  if (p.size() == 2 && p[0] == "sign-flip") return std::make_unique<attack>(update_attack::sign_flip, fraction(p[1]), 1.0, seed);
  if (p.size() == 3 && p[0] == "scale")
    return std::make_unique<attack>(update_attack::scale, fraction(p[1]), number(p[2], spec), seed);
  bad("unknown attack '" + spec + "' (sign-flip:P, scale:P:X, label-flip:P or backdoor:P:T)");
}

mechanism make_secure_aggregation(const secagg_options& options) {
  if (!(options.clip > 0) || !std::isfinite(options.clip)) bad("secagg: clip must be positive");
  if (!(options.max_weight > 0) || !std::isfinite(options.max_weight))
    bad("secagg: max_weight must be positive and finite, got " + show(options.max_weight));
  if (!(options.max_weight_sum == 0 || options.max_weight_sum >= options.max_weight) ||
      !std::isfinite(options.max_weight_sum))
    bad("secagg: max_weight_sum must be 0 or at least max_weight, got " + show(options.max_weight_sum));
  if (!(options.dropout >= 0 && options.dropout < 1)) bad("secagg: the dropout fraction must be in [0, 1)");
  if (options.dropout > 0 && options.max_clients >= 2) {
    // The lost clients are drawn at random among those who masked. Every client, lost or not,
    // needs t shares of its secrets from answering neighbours: it survives k - t lost
    // neighbours, whoever they are. Lost clients sit in k neighbourhoods each, so with more than
    // n (k - t) / k of them some neighbourhood holds more than k - t whatever the draw (in the
    // complete graph an answering client sees all of them: more than k - t). Such a fraction
    // could never unmask a full round: refuse it rather than abort every round. Below that, a
    // round unmasks unless the draw puts more than k - t lost clients next to one client.
    const std::size_t n = options.max_clients;
    std::vector<secagg::client_id> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<secagg::client_id>(i + 1);
    const secagg::graph g(ids, {.dim = 1, .max_clients = n, .degree = options.degree, .full_graph = options.full_graph});
    const std::size_t k = g.degree(), spare = k - g.threshold();
    const std::size_t most = k == n - 1 ? spare : n * spare / k;
    const auto lost = static_cast<std::size_t>(std::llround(options.dropout * static_cast<double>(n)));
    if (lost > most)
      bad("--secagg-dropout " + show(options.dropout) + " loses " + std::to_string(lost) + " of a round's " +
          std::to_string(n) + " clients after masking; with " + std::to_string(k) + " neighbours each and " +
          std::to_string(g.threshold()) + " shares to rebuild a secret, no round can unmask once more than " +
          std::to_string(most) + " are lost (lower --secagg-dropout or raise --per-round)");
    // Below that bound a round fails when the draw puts more than k - t lost clients next to
    // one client: estimated over seeded draws, a fraction that gives most full rounds up is
    // refused too (the model would hardly move).
    if (lost > spare) {
      const int draws = 400;
      int failed = 0;
      splitmix64 rng{0x5ECA6D0Full};
      std::vector<secagg::client_id> order = ids;
      std::vector<char> gone(n + 1);
      for (int d = 0; d < draws; ++d) {
        std::fill(gone.begin(), gone.end(), 0);
        for (std::size_t i = 0; i < lost; ++i) {
          std::swap(order[i], order[i + rng.below(n - i)]);
          gone[order[i]] = 1;
        }
        for (auto id : ids) {
          std::size_t near = 0;
          for (auto j : g.neighbours(id)) near += gone[j];
          if (near > spare) {
            ++failed;
            break;
          }
        }
      }
      if (2 * failed > draws)
        bad("--secagg-dropout " + show(options.dropout) + " loses " + std::to_string(lost) + " of a round's " +
            std::to_string(n) + " clients after masking; with " + std::to_string(k) + " neighbours each and " +
            std::to_string(g.threshold()) + " shares to rebuild a secret, a round fails when more than " +
            std::to_string(spare) + " lost clients are one client's neighbours: " + std::to_string(failed) + " of " +
            std::to_string(draws) + " random draws would give the round up (lower --secagg-dropout)");
    }
  }
  {  // the scale a round of max_clients gets must exist (sum_bound below 2^31)
    const std::size_t n = std::max<std::size_t>(options.max_clients, 1);
    const double sum = options.max_weight_sum > 0 ? options.max_weight_sum : static_cast<double>(n) * options.max_weight;
    (void)secagg::config{.dim = 1, .clip = options.clip, .max_clients = n, .sum_bound = options.clip * sum / options.max_weight}
        .scale();
  }
  auto s = std::make_shared<secagg_state>();
  s->options = options;
  if (options.dp.clip != 0 || options.dp.noise != 0) {
    s->dp = make_dp_state(options.dp);
    // The encoding's coordinates are clipped to S: K inputs of S must fit 32-bit fixed point.
    const double most = static_cast<double>(std::max<std::size_t>(options.max_clients, 1)) * options.dp.clip;
    if (most >= 2147483647.0)
      bad("secagg with dp: clients per round x --dp-clip must stay below 2^31 for the fixed-point sum, got " +
          std::to_string(most));
  }
  return {std::make_unique<secagg_mask>(s), std::make_unique<secagg_sum>(s)};
}

void install_mechanisms(simulation& sim, const simulation_options& o, const weight_bounds& weights) {
  check_norm_verification(o);
  if (!o.lora.empty()) {  // check_lora_options refused every other mechanism
    detail::install_lora(sim, o);
    return;
  }
  const bool robust = is_robust_rule(o.strategy), dp = o.dp_clip != 0 || o.dp_noise != 0 || o.dp_adaptive;
  if (dp && !(o.dp_clip > 0 && o.dp_noise > 0))
    bad("differential privacy needs both --dp-clip and --dp-noise, positive");
  if (robust && o.secagg) bad("--strategy " + o.strategy + ": a robust rule needs each update and secure aggregation hides them: pick one");
  if (robust && dp) bad("--strategy " + o.strategy + ": a robust rule with differential privacy is not supported: the noise is calibrated to the mean");
  if (!o.compress.empty() && o.secagg)
    bad("--compress saves uplink bytes on plain updates, and secure aggregation masks every coordinate into a dense "
        "32-bit word (a compressed update would travel as large as a dense one): pick one");
  std::unique_ptr<aggregator> agg;  // set once at the end: --verify-norm wraps it
  if (robust) {
    agg = make_robust_aggregator(o.strategy);
    const std::size_t least = least_updates(o.strategy);
    if (sim.buffer_size() == 0 && sim.cohort_size() < least)
      bad("--strategy " + o.strategy + " needs at least " + std::to_string(least) +
          " updates per round; rounds of " + std::to_string(sim.cohort_size()) + " clients never have them: raise --per-round");
  }
  if (!o.attack.empty() && !is_data_attack(o.attack)) sim.add_transform(make_update_attack(o.attack, o.seed));
  if (!o.compress.empty()) sim.add_transform(make_compression(o.compress));
  if (!o.tee.empty()) {  // the enclave aggregates (and, under DP, noises) alone
    tee::install_tee(sim, o);
    return;
  }
  const dp_options privacy{.clip = o.dp_clip,
                           .noise = o.dp_noise,
                           .delta = o.dp_delta,
                           .expected_clients = sim.cohort_size(),
                           .population = sim.population(),
                           .sampled_clients = sim.sample_size(),
                           .adaptive = o.dp_adaptive};
  if (dp && !o.secagg) {
    // FedBuff: each server step is a Gaussian mechanism over the K buffered updates, divided by
    // K. Who is in a step depends on the clients' speeds, not on a uniform sample, so no
    // amplification by sampling is claimed: the accountant takes q = K / K = 1.
    auto plain = privacy;
    if (const std::size_t k = sim.buffer_size()) plain.expected_clients = plain.population = plain.sampled_clients = k;
    auto m = make_differential_privacy(plain);
    sim.add_transform(std::move(m.transform));
    agg = std::move(m.aggregator);
  }
  if (o.secagg) {
    if (sim.cohort_size() < 2)
      bad("--secagg needs at least two clients per round (a sum of one update hides nothing, and every round would be "
          "given up): raise --per-round");
    // With DP the masking transform clips as well, and the server noises the unmasked sum.
    // A round aggregates at most cohort_size() clients (over-selection samples more and keeps
    // that many), whose weights the simulation knows before the first round.
    auto m = make_secure_aggregation({.max_weight = weights.max,
                                      .max_weight_sum = weights.round_sum,
                                      .max_clients = sim.cohort_size(),
                                      .dropout = o.secagg_dropout,
                                      .dp = dp ? privacy : dp_options{}});
    sim.add_transform(std::move(m.transform));
    agg = std::move(m.aggregator);
  } else if (o.secagg_dropout != 0) {
    bad("a dropout fraction after masking needs secure aggregation");
  }
  if (o.verify_norm != 0) {  // last: it proves the update as the other transforms leave it
    auto m = make_norm_verification({.bound = o.verify_norm, .bits = o.verify_bits}, agg ? std::move(agg) : make_weighted_mean());
    sim.add_transform(std::move(m.transform));
    agg = std::move(m.aggregator);
  }
  if (agg) sim.set_aggregator(std::move(agg));
}

}  // namespace troupe::federated
