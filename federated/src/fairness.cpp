// Fairness (fairness.hpp): the clients' held-out rows, the spread of their accuracies, and
// q-FedAvg's server.

#include "troupe/federated/fairness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "spec.hpp"
#include "troupe/federated/rng.hpp"

namespace troupe::federated {

partition hold_out(partition& part, double fraction, std::uint64_t seed) {
  if (!(fraction >= 0 && fraction < 1)) throw std::invalid_argument("hold_out: the fraction must be in [0, 1)");
  partition train, held;
  const std::size_t clients = part.clients();
  train.offsets.reserve(clients + 1);
  held.offsets.reserve(clients + 1);
  train.offsets.push_back(0);
  held.offsets.push_back(0);
  train.indices.reserve(part.indices.size());
  std::vector<std::uint32_t> shard;
  for (std::size_t c = 0; c < clients; ++c) {
    const auto s = part.shard(c);
    shard.assign(s.begin(), s.end());
    splitmix64 g{derive_seed(seed, c)};
    for (std::size_t i = shard.size(); i > 1; --i) std::swap(shard[i - 1], shard[g.below(i)]);
    const auto k = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(shard.size())));
    held.indices.insert(held.indices.end(), shard.begin(), shard.begin() + static_cast<std::ptrdiff_t>(k));
    train.indices.insert(train.indices.end(), shard.begin() + static_cast<std::ptrdiff_t>(k), shard.end());
    train.offsets.push_back(static_cast<std::uint32_t>(train.indices.size()));
    held.offsets.push_back(static_cast<std::uint32_t>(held.indices.size()));
  }
  part = std::move(train);
  return held;
}

client_accuracy_stats summarize_client_accuracies(std::span<const double> accuracies) {
  std::vector<double> a;
  for (double x : accuracies)
    if (!std::isnan(x)) a.push_back(x);
  client_accuracy_stats s;
  s.clients = a.size();
  if (a.empty()) {
    s.mean = s.std = s.worst10 = s.best10 = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  std::sort(a.begin(), a.end());
  const double n = static_cast<double>(a.size());
  double sum = 0;
  for (double x : a) sum += x;
  s.mean = sum / n;
  double squares = 0;
  for (double x : a) squares += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(squares / n);
  const std::size_t tenth = (a.size() + 9) / 10;  // ⌈n / 10⌉
  double low = 0, high = 0;
  for (std::size_t i = 0; i < tenth; ++i) {
    low += a[i];
    high += a[a.size() - 1 - i];
  }
  s.worst10 = low / static_cast<double>(tenth);
  s.best10 = high / static_cast<double>(tenth);
  return s;
}

namespace {

/// q-FedAvg's server (see the file comment of fairness.hpp).
class qfedavg final : public server_strategy {
public:
  qfedavg(double q, double client_lr) : q_(q), l_(1 / client_lr) {}
  std::string name() const override { return "qfedavg"; }
  client_rule rule() const override { return {.loss_power = q_}; }
  std::size_t update_floats(std::size_t dim) const override { return dim + 1; }
  bool observes() const override { return true; }
  void observe(std::uint64_t client, double weight, std::span<const float> delta) override {
    if (delta.empty()) throw std::invalid_argument("qfedavg: client " + std::to_string(client) + " sent no update");
    const double f = delta.back();
    if (!(f >= 0) || !std::isfinite(f) || !(weight >= 0) || !std::isfinite(weight))
      throw std::invalid_argument("qfedavg: client " + std::to_string(client) + " sent the loss " + std::to_string(f) +
                                  " with the weight " + std::to_string(weight) +
                                  "; both must be finite and >= 0");
    double squares = 0;
    for (std::size_t i = 0; i + 1 < delta.size(); ++i) squares += static_cast<double>(delta[i]) * delta[i];
    // h_k / L = q F^(q-1) L ||d||^2 + F^q, with F^(q-1) = F^q / F (weight = F^q).
    const double slope = q_ > 0 && f > 0 ? q_ * (weight / f) * l_ * squares : 0.0;
    weights_ += weight;
    h_ += slope + weight;
  }
  void apply(std::span<float> x, std::span<const float> aggregate, const round_info&) override {
    if (aggregate.size() != x.size() + 1)
      throw std::invalid_argument("qfedavg: the aggregate has " + std::to_string(aggregate.size()) +
                                  " floats; a model of " + std::to_string(x.size()) + " needs one more (the loss)");
    const double factor = h_ > 0 ? weights_ / h_ : 0.0;
    weights_ = h_ = 0;
    if (factor == 0) return;
    if (!std::isfinite(factor)) throw std::runtime_error("qfedavg: the step's scale is not finite");
    const float f = static_cast<float>(factor);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += f * aggregate[i];
  }

private:
  double q_, l_;
  double weights_ = 0, h_ = 0;  // this round's Σ F^q and Σ h / L
};

}  // namespace

bool is_qfedavg(const std::string& spec) { return detail::split_spec(spec).front() == "qfedavg"; }

double parse_qfedavg(const std::string& spec) {
  const auto p = detail::split_spec(spec);
  if (p[0] != "qfedavg" || p.size() != 2)
    throw std::invalid_argument("'" + spec + "': use qfedavg:Q (Q >= 0; 0 is FedAvg with uniform weights)");
  const double q = detail::spec_number(p[1], "'" + spec + "'");
  if (!(q >= 0 && q <= 100)) throw std::invalid_argument("'" + spec + "': Q must be in [0, 100]");
  return q;
}

std::unique_ptr<server_strategy> make_qfedavg(double q, double client_lr) {
  if (!(q >= 0 && q <= 100)) throw std::invalid_argument("qfedavg: q must be in [0, 100]");
  if (!(client_lr > 0) || !std::isfinite(client_lr))
    throw std::invalid_argument("qfedavg needs the clients' learning rate (L = 1 / lr), positive");
  return std::make_unique<qfedavg>(q, client_lr);
}

}  // namespace troupe::federated
