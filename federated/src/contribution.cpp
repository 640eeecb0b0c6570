// Shapley values of a round's participants (exact, Monte Carlo, GTG-Shapley) and the tracker
// that values every round of a simulation from the updates it aggregates.

#include "troupe/federated/contribution.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include "spec.hpp"
#include "troupe/core/file.hpp"
#include "troupe/federated/rng.hpp"

namespace troupe::federated {

namespace {

coalition empty_coalition(std::size_t players) { return coalition(std::max<std::size_t>(1, (players + 63) / 64), 0); }
void add_player(coalition& c, std::size_t i) { c[i / 64] |= std::uint64_t{1} << (i % 64); }

struct coalition_hash {
  std::size_t operator()(const coalition& c) const noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull;
    for (std::uint64_t w : c) h = derive_seed(h, w);
    return static_cast<std::size_t>(h);
  }
};

/// The utility of each coalition, computed once per round: the estimators walk the same
/// prefixes again and again.
class cached_utility {
public:
  explicit cached_utility(const coalition_utility& u) : u_(u) {}
  double operator()(const coalition& c) {
    if (std::all_of(c.begin(), c.end(), [](std::uint64_t w) { return w == 0; })) return 0.0;
    const auto it = cache_.find(c);
    if (it != cache_.end()) return it->second;
    const double v = u_(c);
    if (!std::isfinite(v)) throw std::runtime_error("a coalition's utility is not finite");
    cache_.emplace(c, v);
    return v;
  }
  std::size_t evaluations() const noexcept { return cache_.size(); }

private:
  const coalition_utility& u_;
  std::unordered_map<coalition, double, coalition_hash> cache_;
};

coalition everyone(std::size_t players) {
  coalition c = empty_coalition(players);
  for (std::size_t i = 0; i < players; ++i) add_player(c, i);
  return c;
}

/// A uniform order of `players` from `g` (Fisher-Yates), after `first` when it is not npos.
void shuffle_order(std::vector<std::size_t>& order, std::size_t first, splitmix64& g) {
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::size_t from = 0;
  if (first < order.size()) {
    std::swap(order[0], order[first]);
    from = 1;
  }
  for (std::size_t i = order.size(); i > from + 1; --i)
    std::swap(order[i - 1], order[from + g.below(i - from)]);
}

/// Walks `order`, adding each player's marginal contribution to `sum`. With `stop_within` >= 0
/// (GTG's within-round truncation) the walk stops once |total - U(prefix)| <= stop_within: the
/// players left get 0 without an evaluation.
void walk(std::span<const std::size_t> order, cached_utility& u, std::vector<double>& sum, double total = 0,
          double stop_within = -1) {
  coalition c = empty_coalition(sum.size());
  double before = 0;
  for (std::size_t i : order) {
    if (stop_within >= 0 && std::abs(total - before) < stop_within) return;
    add_player(c, i);
    const double after = u(c);
    sum[i] += after - before;
    before = after;
  }
}

void check_exact_players(std::size_t players) {
  if (players > max_exact_players)
    throw std::invalid_argument("--contribution exact enumerates all 2^K coalitions: K = " + std::to_string(players) +
                                " clients in a round is more than " + std::to_string(max_exact_players) +
                                "; use mc:P or gtg:EPS, or fewer --per-round");
}

}  // namespace

contribution_method parse_contribution(const std::string& spec) {
  const auto parts = detail::split_spec(spec);
  const std::string context = "--contribution '" + spec + "'";
  contribution_method m;
  if (parts.size() == 1 && parts[0] == "exact") return m;
  if (parts.size() == 2 && parts[0] == "mc") {
    const double p = detail::spec_number(parts[1], context);
    if (!(p >= 1 && p <= 100000) || p != std::floor(p))
      throw std::invalid_argument(context + ": P (permutations) must be a whole number from 1 to 100000");
    m.type = contribution_method::kind::monte_carlo;
    m.permutations = static_cast<std::size_t>(p);
    return m;
  }
  if (parts.size() == 2 && parts[0] == "gtg") {
    const double eps = detail::spec_number(parts[1], context);
    if (!(eps >= 0 && eps < 1)) throw std::invalid_argument(context + ": EPS must be in [0, 1)");
    m.type = contribution_method::kind::gtg;
    m.epsilon = eps;
    return m;
  }
  throw std::invalid_argument(context + ": use exact, mc:P (P permutations) or gtg:EPS (GTG-Shapley)");
}

std::string describe(const contribution_method& m) {
  switch (m.type) {
    case contribution_method::kind::exact: return "exact";
    case contribution_method::kind::monte_carlo: return "mc:" + std::to_string(m.permutations);
    case contribution_method::kind::gtg: {
      char buf[48];
      std::snprintf(buf, sizeof buf, "gtg:%g", m.epsilon);
      return buf;
    }
  }
  return "?";
}

shapley_estimate exact_shapley(std::size_t players, const coalition_utility& utility) {
  check_exact_players(players);
  shapley_estimate r;
  r.values.assign(players, 0.0);
  if (players == 0) return r;
  cached_utility u(utility);
  const std::size_t count = std::size_t{1} << players;
  std::vector<double> value(count, 0.0);
  for (std::size_t mask = 1; mask < count; ++mask) value[mask] = u(coalition{mask});
  // weight[s] = s! (K - s - 1)! / K!: the share of the orders in which i joins a given S of size s.
  std::vector<double> factorial(players + 1, 1.0);
  for (std::size_t k = 1; k <= players; ++k) factorial[k] = factorial[k - 1] * static_cast<double>(k);
  std::vector<double> weight(players);
  for (std::size_t s = 0; s < players; ++s) weight[s] = factorial[s] * factorial[players - s - 1] / factorial[players];
  for (std::size_t mask = 0; mask < count; ++mask) {
    const auto size = static_cast<std::size_t>(__builtin_popcountll(mask));
    for (std::size_t i = 0; i < players; ++i)
      if (!(mask >> i & 1)) r.values[i] += weight[size] * (value[mask | std::size_t{1} << i] - value[mask]);
  }
  r.evaluations = u.evaluations();
  r.total = value[count - 1];
  return r;
}

std::vector<double> permutation_marginals(std::span<const std::size_t> order, const coalition_utility& utility) {
  std::vector<char> seen(order.size(), 0);
  for (std::size_t i : order) {
    if (i >= order.size() || seen[i]) throw std::invalid_argument("permutation_marginals: not a permutation");
    seen[i] = 1;
  }
  cached_utility u(utility);
  std::vector<double> out(order.size(), 0.0);
  walk(order, u, out);
  return out;
}

shapley_estimate monte_carlo_shapley(std::size_t players, std::size_t permutations, std::uint64_t seed,
                                     const coalition_utility& utility) {
  if (permutations < 1) throw std::invalid_argument("monte_carlo_shapley: at least one permutation");
  shapley_estimate r;
  r.values.assign(players, 0.0);
  if (players == 0) return r;
  cached_utility u(utility);
  splitmix64 g{seed};
  std::vector<std::size_t> order(players);
  for (std::size_t p = 0; p < permutations; ++p) {
    shuffle_order(order, players, g);
    walk(order, u, r.values);
  }
  for (double& v : r.values) v /= static_cast<double>(permutations);
  r.permutations = permutations;
  r.evaluations = u.evaluations();
  r.total = u(everyone(players));
  return r;
}

// GTG-Shapley (Liu, Chen, Yu, Liu and Cui, "GTG-Shapley: Efficient and Accurate Participant
// Contribution Evaluation in Federated Learning", ACM TIST 2022). What is implemented here:
//  - gradient-based reconstruction: a coalition's model is the round's starting model plus the
//    weighted mean of its members' updates (the tracker's utility); nobody retrains;
//  - between-round truncation: when |U(all)| < EPS (the round's whole gain, in accuracy), the
//    round is not valued: every value is 0 and only U(all) was evaluated;
//  - within-round truncation: walking an order, once the remaining gain |U(all) - U(prefix)| is
//    below EPS * |U(all)|, the players left get marginal 0 without an evaluation;
//  - guided sampling: order t puts player t mod K first (every player leads equally often, so
//    each one's marginal to the empty coalition, usually the largest, is sampled evenly) and
//    the others in a seeded uniform order;
//  - convergence: at least max(30, K) orders; then it stops when the mean, over the last 10
//    orders, of the relative change of the estimate (L1 norm of the change over the L1 norm of
//    the estimate) is below 5%; at most 10 * max(30, K) orders.
// The minimum, the window of 10 and the 5% are the values the paper's experiments describe;
// with EPS = 0 nothing is truncated and every order's marginals sum to U(all).
shapley_estimate gtg_shapley(std::size_t players, double epsilon, std::uint64_t seed, const coalition_utility& utility) {
  if (!(epsilon >= 0 && epsilon < 1)) throw std::invalid_argument("gtg_shapley: EPS must be in [0, 1)");
  shapley_estimate r;
  r.values.assign(players, 0.0);
  if (players == 0) return r;
  cached_utility u(utility);
  r.total = u(everyone(players));
  if (std::abs(r.total) < epsilon) {
    r.skipped = true;
    r.evaluations = u.evaluations();
    return r;
  }
  const std::size_t least = std::max<std::size_t>(30, players), most = 10 * least, window = 10;
  const double criterion = 0.05;
  splitmix64 g{seed};
  std::vector<std::size_t> order(players);
  std::vector<double> sum(players, 0.0), previous(players, 0.0);
  std::vector<double> changes;  // per order: ||φ_t − φ_{t−1}||_1 / ||φ_t||_1
  const double stop_within = epsilon > 0 ? epsilon * std::abs(r.total) : -1;
  std::size_t t = 0;
  while (t < most) {
    shuffle_order(order, t % players, g);
    walk(order, u, sum, r.total, stop_within);
    ++t;
    double change = 0, norm = 0;
    for (std::size_t i = 0; i < players; ++i) {
      const double now = sum[i] / static_cast<double>(t);
      change += std::abs(now - previous[i]);
      norm += std::abs(now);
      previous[i] = now;
    }
    changes.push_back(norm > 0 ? change / norm : 0.0);
    if (t >= least) {
      double mean = 0;
      for (std::size_t k = changes.size() - window; k < changes.size(); ++k) mean += changes[k];
      if (mean / static_cast<double>(window) < criterion) break;
    }
  }
  r.values = previous;
  r.permutations = t;
  r.evaluations = u.evaluations();
  return r;
}

shapley_estimate estimate_shapley(const contribution_method& m, std::size_t players, std::uint64_t seed,
                                  const coalition_utility& u) {
  switch (m.type) {
    case contribution_method::kind::exact: return exact_shapley(players, u);
    case contribution_method::kind::monte_carlo: return monte_carlo_shapley(players, m.permutations, seed, u);
    case contribution_method::kind::gtg: return gtg_shapley(players, m.epsilon, seed, u);
  }
  throw std::logic_error("estimate_shapley: unknown method");
}

// ---- the tracker ---------------------------------------------------------------------------------

contribution_tracker::contribution_tracker(contribution_method method, std::size_t dim,
                                           std::function<double(std::span<const float>)> accuracy, std::uint64_t seed,
                                           const reward_budget* budget, bool share)
    : method_(method), dim_(dim), accuracy_(std::move(accuracy)), seed_(seed), pays_(budget != nullptr), share_(share) {
  if (!accuracy_) throw std::invalid_argument("contribution_tracker: no accuracy function");
  if (budget) budget_ = *budget;
}

void contribution_tracker::begin(int round) {
  round_ = round;
  clients_.clear();
  weights_.clear();
  deltas_.clear();
}

void contribution_tracker::observe(std::uint64_t client, double weight, std::span<const float> delta) {
  if (delta.size() < dim_)
    throw std::invalid_argument("contribution: client " + std::to_string(client) + "'s update has " +
                                std::to_string(delta.size()) + " floats; the model has " + std::to_string(dim_));
  if (method_.type == contribution_method::kind::exact && clients_.size() == max_exact_players)
    check_exact_players(max_exact_players + 1);  // before copying more updates than it can value
  clients_.push_back(client);
  weights_.push_back(weight);
  deltas_.insert(deltas_.end(), delta.begin(), delta.begin() + static_cast<std::ptrdiff_t>(dim_));
}

void contribution_tracker::finish(std::span<const float> global) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t k = clients_.size();
  last_ = {};
  last_gain_ = 0;
  if (k == 0) return;
  if (global.size() != dim_) throw std::invalid_argument("contribution: the global model has the wrong size");
  const double base = accuracy_(global);
  model_.resize(dim_);
  sum_.resize(dim_);
  // A coalition's model: FedAvg's aggregate of its members' updates (their weights; the plain
  // mean when those sum to zero, as the weighted mean does) added to the starting model; with
  // share_ the denominator is the whole round's.
  const double round_weight = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  const coalition_utility utility = [&](const coalition& c) {
    double weight = 0;
    std::size_t members = 0;
    for (std::size_t i = 0; i < k; ++i)
      if (c[i / 64] >> (i % 64) & 1) {
        weight += weights_[i];
        ++members;
      }
    if (share_) {
      weight = round_weight;
      members = k;
    }
    const bool plain = !(weight > 0);
    std::fill(sum_.begin(), sum_.end(), 0.0);
    for (std::size_t i = 0; i < k; ++i) {
      if (!(c[i / 64] >> (i % 64) & 1)) continue;
      const double w = plain ? 1.0 : weights_[i];
      const float* d = deltas_.data() + i * dim_;
      for (std::size_t p = 0; p < dim_; ++p) sum_[p] += w * static_cast<double>(d[p]);
    }
    const double denominator = plain ? static_cast<double>(members) : weight;
    for (std::size_t p = 0; p < dim_; ++p) model_[p] = global[p] + static_cast<float>(sum_[p] / denominator);
    return accuracy_(model_) - base;
  };
  last_ = estimate_shapley(method_, k, derive_seed(seed_, static_cast<std::uint64_t>(round_)), utility);
  last_gain_ = last_.total;
  evaluations_ += 1 + last_.evaluations;
  ++rounds_valued_;
  if (last_.skipped) ++rounds_skipped_;
  std::vector<std::int64_t> rewards;
  if (pays_) rewards = budget_rewards(last_.values, budget_);
  for (std::size_t i = 0; i < k; ++i) {
    auto& t = totals_[clients_[i]];
    t.client = clients_[i];
    ++t.rounds;
    t.value += last_.values[i];
    if (pays_) {
      t.reward += rewards[i];
      paid_ += rewards[i];
    }
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<client_contribution> contribution_tracker::totals() const {
  std::vector<client_contribution> out;
  out.reserve(totals_.size());
  for (const auto& [c, t] : totals_) out.push_back(t);
  return out;
}

void contribution_tracker::write_csv(const std::string& file, const std::function<bool(std::uint64_t)>& malicious) const {
  std::string text = "client,rounds,shapley,reward,malicious\n";
  char line[160];
  for (const auto& [c, t] : totals_) {
    std::snprintf(line, sizeof line, "%llu,%zu,%.9g,%lld.%06lld,%d\n", static_cast<unsigned long long>(c), t.rounds, t.value,
                  static_cast<long long>(t.reward / micro_units), static_cast<long long>(t.reward % micro_units),
                  malicious && malicious(c) ? 1 : 0);
    text += line;
  }
  try {
    write_file_atomically(file, std::as_bytes(std::span<const char>(text)));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot write the --contributions file " + file + ": " + e.what());
  }
}

}  // namespace troupe::federated
