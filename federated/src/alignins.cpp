// AlignIns (alignins.hpp): the two alignment scores, their median-centred z-scores, the filter,
// the median-norm clipping and the weighted mean of what is kept.

#include "troupe/federated/alignins.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "filtering.hpp"
#include "spec.hpp"

namespace troupe::federated {

namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument("alignins: " + why); }

std::size_t check(std::span<const update_view> updates) {
  if (updates.empty()) bad("no updates");
  const std::size_t dim = updates[0].size();
  for (std::size_t i = 0; i < updates.size(); ++i) {
    if (updates[i].size() != dim)
      bad("updates have different lengths (" + std::to_string(dim) + " and " + std::to_string(updates[i].size()) + ")");
    for (std::size_t j = 0; j < dim; ++j)
      if (!std::isfinite(updates[i][j]))
        bad("update " + std::to_string(i) + " holds " + std::to_string(updates[i][j]) + " at coordinate " +
            std::to_string(j) + " (updates must be finite)");
  }
  return dim;
}

void check_options(const alignins_options& o) {
  if (!(o.lambda_tda > 0) || !std::isfinite(o.lambda_tda)) bad("LAMBDA_T must be positive and finite");
  if (!(o.lambda_mpsa > 0) || !std::isfinite(o.lambda_mpsa)) bad("LAMBDA_S must be positive and finite");
  if (!(o.top_fraction > 0 && o.top_fraction <= 1)) bad("the top fraction must be in (0, 1]");
}

int sign(float x) { return (x > 0) - (x < 0); }

double norm(std::span<const float> u) {
  double s = 0;
  for (float x : u) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

}  // namespace

double alignins_tda(std::span<const float> update, std::span<const float> global) {
  if (update.size() != global.size())
    bad("the update has " + std::to_string(update.size()) + " floats and the global model " +
        std::to_string(global.size()));
  double dot = 0;
  for (std::size_t j = 0; j < update.size(); ++j) dot += static_cast<double>(update[j]) * global[j];
  return dot / std::max(norm(update) * norm(global), 1e-6);
}

std::vector<double> alignins_mpsa(std::span<const update_view> updates, double top_fraction) {
  const std::size_t dim = check(updates);
  if (!(top_fraction > 0 && top_fraction <= 1)) bad("the top fraction must be in (0, 1]");
  std::vector<int> votes(dim, 0);
  for (const auto& u : updates)
    for (std::size_t j = 0; j < dim; ++j) votes[j] += sign(u[j]);
  const auto k = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::floor(static_cast<double>(dim) * top_fraction)));
  std::vector<double> out;
  std::vector<std::uint32_t> order(dim);
  for (const auto& u : updates) {
    std::iota(order.begin(), order.end(), 0u);
    // The k largest magnitudes; equal magnitudes by position, so the set is fixed by the inputs.
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     [&](std::uint32_t a, std::uint32_t b) {
                       const float x = std::abs(u[a]), y = std::abs(u[b]);
                       return x > y || (x == y && a < b);
                     });
    std::size_t agree = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::uint32_t j = order[i];
      agree += sign(u[j]) == (votes[j] > 0) - (votes[j] < 0);
    }
    out.push_back(static_cast<double>(agree) / static_cast<double>(k));
  }
  return out;
}

std::vector<double> median_z_scores(std::span<const double> values) {
  const std::size_t n = values.size();
  std::vector<double> out(n, 0.0);
  if (n == 0) return out;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(n);
  double squares = 0;
  for (double v : values) squares += (v - mean) * (v - mean);
  const double std_dev = std::sqrt(squares / static_cast<double>(n));
  if (std_dev <= 1e-9) return out;
  for (std::size_t i = 0; i < n; ++i) out[i] = std::abs(values[i] - median) / std_dev;
  return out;
}

alignins_inspection alignins_inspect(std::span<const update_view> updates, std::span<const float> global,
                                     const alignins_options& options) {
  check_options(options);
  const std::size_t dim = check(updates);
  if (global.size() != dim)
    bad("the updates have " + std::to_string(dim) + " floats and the global model " + std::to_string(global.size()));
  alignins_inspection r;
  for (const auto& u : updates) r.tda.push_back(alignins_tda(u, global));
  r.mpsa = alignins_mpsa(updates, options.top_fraction);
  r.tda_z = median_z_scores(r.tda);
  r.mpsa_z = median_z_scores(r.mpsa);
  std::vector<double> norms;
  for (std::size_t i = 0; i < updates.size(); ++i)
    if (r.tda_z[i] < options.lambda_tda && r.mpsa_z[i] < options.lambda_mpsa) {
      r.kept.push_back(i);
      norms.push_back(norm(updates[i]));
    }
  if (!norms.empty()) {
    // torch.median: the lower of the two middle values of an even count.
    const auto mid = norms.begin() + static_cast<std::ptrdiff_t>((norms.size() - 1) / 2);
    std::nth_element(norms.begin(), mid, norms.end());
    r.clip_norm = *mid;
  }
  return r;
}

std::vector<float> alignins_aggregate(std::span<const update_view> updates, std::span<const double> weights,
                                      std::span<const float> global, const alignins_options& options,
                                      alignins_inspection* inspection) {
  if (weights.size() != updates.size())
    bad(std::to_string(updates.size()) + " updates and " + std::to_string(weights.size()) + " weights");
  alignins_inspection r = alignins_inspect(updates, global, options);
  const std::size_t dim = updates[0].size();
  std::vector<float> out(dim, 0.0f);
  if (!r.kept.empty()) {
    // The kept updates through FedAvg's own weighted mean: when none is scaled, the result is
    // FedAvg's bit for bit.
    auto mean = make_weighted_mean();
    round_info info;
    info.dim = dim;
    mean->begin(info);
    std::vector<float> scaled;
    for (std::size_t i : r.kept) {
      const double n = norm(updates[i]);
      if (n > r.clip_norm && n > 0) {
        const double scale = r.clip_norm / n;
        scaled.assign(updates[i].begin(), updates[i].end());
        for (float& x : scaled) x = static_cast<float>(x * scale);
        mean->add(i, weights[i], scaled);
      } else {
        mean->add(i, weights[i], updates[i]);
      }
    }
    out = mean->finish();
  }
  if (inspection) *inspection = std::move(r);
  return out;
}

bool is_alignins(const std::string& spec) { return detail::split_spec(spec).front() == "alignins"; }

alignins_options parse_alignins(const std::string& spec) {
  const auto p = detail::split_spec(spec);
  if (p[0] != "alignins" || (p.size() != 1 && p.size() != 3))
    throw std::invalid_argument("'" + spec + "': use alignins or alignins:LAMBDA_T:LAMBDA_S (the z-score bounds of TDA "
                                "and MPSA, 1.0 each by default)");
  alignins_options o;
  if (p.size() == 3) {
    o.lambda_tda = detail::spec_number(p[1], "'" + spec + "'");
    o.lambda_mpsa = detail::spec_number(p[2], "'" + spec + "'");
    if (!(o.lambda_tda > 0) || !(o.lambda_mpsa > 0))
      throw std::invalid_argument("'" + spec + "': LAMBDA_T and LAMBDA_S must be positive");
  }
  return o;
}

namespace {

class alignins_rule final : public detail::filtering_aggregator {
public:
  alignins_rule(std::string spec, alignins_options o) : spec_(std::move(spec)), options_(o) {}
  std::string name() const override { return spec_; }
  void begin(const round_info& round) override {
    if (round.global.size() != round.dim)
      throw std::invalid_argument(spec_ + " compares each update with the round's global model, and the round carries " +
                                  (round.global.empty() ? std::string("none")
                                                        : std::to_string(round.global.size()) + " floats of it") +
                                  " for updates of " + std::to_string(round.dim));
    global_.assign(round.global.begin(), round.global.end());
    updates_.clear();
    weights_.clear();
    clients_.clear();
    filtered_.clear();
  }
  void add(std::uint64_t client, double weight, std::span<const float> delta) override {
    if (delta.size() != global_.size())
      throw std::invalid_argument("client " + std::to_string(client) + " sent " + std::to_string(delta.size()) +
                                  " floats; the round expects " + std::to_string(global_.size()));
    if (!(weight >= 0) || !std::isfinite(weight))
      throw std::invalid_argument(spec_ + ": client " + std::to_string(client) + "'s weight is " + std::to_string(weight) +
                                  "; weights must be finite and >= 0");
    updates_.emplace_back(delta.begin(), delta.end());
    weights_.push_back(weight);
    clients_.push_back(client);
  }
  std::vector<float> finish() override {
    if (updates_.empty()) throw std::logic_error(spec_ + ": no updates in this round");
    const std::vector<update_view> views(updates_.begin(), updates_.end());
    alignins_inspection r;
    auto out = alignins_aggregate(views, weights_, global_, options_, &r);
    filtered_.clear();
    std::size_t k = 0;
    for (std::size_t i = 0; i < clients_.size(); ++i) {
      if (k < r.kept.size() && r.kept[k] == i) {
        ++k;
      } else {
        filtered_.push_back(clients_[i]);
      }
    }
    return out;
  }
  std::vector<std::uint64_t> filtered() const override { return filtered_; }

private:
  std::string spec_;
  alignins_options options_;
  std::vector<float> global_;
  std::vector<std::vector<float>> updates_;
  std::vector<double> weights_;
  std::vector<std::uint64_t> clients_, filtered_;
};

}  // namespace

std::unique_ptr<aggregator> make_alignins(const std::string& spec) {
  auto o = parse_alignins(spec);
  check_options(o);
  return std::make_unique<alignins_rule>(spec, o);
}

}  // namespace troupe::federated
