// The drift detectors: DDM (Gama et al., 2004), ADWIN2 (Bifet and Gavaldà, 2007) with its
// plain reference, and the face a simulation's client holds.

#include "troupe/federated/drift.hpp"

#include <cmath>
#include <stdexcept>
#include <unordered_set>

#include "spec.hpp"
#include "troupe/federated/rng.hpp"

namespace troupe::federated {

// ---- DDM ---------------------------------------------------------------------------------------

ddm::ddm(options o) : o_(o) {
  if (o.min_observations < 1) throw std::invalid_argument("ddm: min_observations must be at least 1");
  if (!(o.warning_level > 0 && o.warning_level <= o.drift_level) || !std::isfinite(o.drift_level))
    throw std::invalid_argument("ddm: the levels must satisfy 0 < warning <= drift");
}

drift_signal ddm::observe(bool error) {
  ++n_;
  errors_ += error ? 1 : 0;
  if (n_ < o_.min_observations) return drift_signal::none;
  const double n = static_cast<double>(n_);
  const double p = static_cast<double>(errors_) / n;
  const double s = std::sqrt(p * (1 - p) / n);
  if (!have_min_ || p + s < p_min_ + s_min_) {
    p_min_ = p;
    s_min_ = s;
    have_min_ = true;
  }
  // As MOA's DDM.java: strictly above the levels, and no test at the observation that first set
  // the minimum (there p + s equals p_min + s_min, which with s_min = 0, a first stretch of no
  // errors or of nothing but errors, would be at every level).
  if (n_ == o_.min_observations) return drift_signal::none;
  if (p + s > p_min_ + o_.drift_level * s_min_) {
    reset();
    return drift_signal::drift;
  }
  if (p + s > p_min_ + o_.warning_level * s_min_) return drift_signal::warning;
  return drift_signal::none;
}

void ddm::reset() {
  n_ = errors_ = 0;
  p_min_ = s_min_ = 0;
  have_min_ = false;
}

// ---- ADWIN2 ------------------------------------------------------------------------------------

double adwin::cut_threshold(double n0, double n1, double delta) {
  const double m = 1.0 / (1.0 / n0 + 1.0 / n1);
  const double delta_prime = delta / (n0 + n1);
  return std::sqrt(std::log(4.0 / delta_prime) / (2.0 * m));
}

adwin::adwin(double delta, int buckets_per_level) : delta_(delta), per_level_(buckets_per_level) {
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("adwin: delta must be in (0, 1)");
  if (buckets_per_level < 2) throw std::invalid_argument("adwin: at least 2 buckets per level");
}

void adwin::reset() {
  levels_.clear();
  width_ = 0;
  sum_ = 0;
}

std::size_t adwin::buckets() const noexcept {
  std::size_t n = 0;
  for (const auto& l : levels_) n += l.size();
  return n;
}

std::vector<std::int64_t> adwin::bucket_lengths() const {
  std::vector<std::int64_t> out;
  for (std::size_t k = levels_.size(); k-- > 0;)
    for (std::size_t i = 0; i < levels_[k].size(); ++i) out.push_back(std::int64_t{1} << k);
  return out;
}

// A level holding more than per_level_ buckets merges its two oldest into one of the next
// level (which then holds the newest of that level's buckets: it is younger than all of them).
void adwin::compress() {
  for (std::size_t k = 0; k < levels_.size(); ++k) {
    if (levels_[k].size() <= static_cast<std::size_t>(per_level_)) break;
    const bucket a = levels_[k].front();
    levels_[k].pop_front();
    const bucket b = levels_[k].front();
    levels_[k].pop_front();
    if (k + 1 == levels_.size()) levels_.emplace_back();
    levels_[k + 1].push_back({a.sum + b.sum});
  }
}

adwin_change adwin::find_cut() const {
  if (width_ < 2) return adwin_change::none;
  double n0 = 0, s0 = 0;
  const double n = static_cast<double>(width_);
  for (std::size_t k = levels_.size(); k-- > 0;) {
    const double len = std::ldexp(1.0, static_cast<int>(k));
    for (const bucket& b : levels_[k]) {
      n0 += len;
      s0 += b.sum;
      const double n1 = n - n0;
      if (n1 < 1) return adwin_change::none;
      const double mean0 = s0 / n0, mean1 = (sum_ - s0) / n1;
      if (std::abs(mean0 - mean1) >= cut_threshold(n0, n1, delta_))
        return mean1 > mean0 ? adwin_change::rise : adwin_change::fall;
    }
  }
  return adwin_change::none;
}

void adwin::drop_oldest() {
  while (!levels_.empty() && levels_.back().empty()) levels_.pop_back();
  if (levels_.empty()) return;
  const std::size_t k = levels_.size() - 1;
  width_ -= std::int64_t{1} << k;
  sum_ -= levels_[k].front().sum;
  levels_[k].pop_front();
  while (!levels_.empty() && levels_.back().empty()) levels_.pop_back();
  if (width_ == 0) sum_ = 0;  // no rounding left behind in an empty window
}

adwin_change adwin::observe(double x) {
  if (!(x >= 0 && x <= 1)) throw std::invalid_argument("adwin: observations must be in [0, 1]");
  if (levels_.empty()) levels_.emplace_back();
  levels_[0].push_back({x});
  ++width_;
  sum_ += x;
  compress();
  adwin_change first = adwin_change::none;
  for (adwin_change c; (c = find_cut()) != adwin_change::none;) {
    if (first == adwin_change::none) first = c;
    drop_oldest();
  }
  return first;
}

// ---- the plain reference -------------------------------------------------------------------------

adwin_reference::adwin_reference(double delta) : delta_(delta) {
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("adwin_reference: delta must be in (0, 1)");
}

double adwin_reference::sum() const {
  double s = 0;
  for (double v : window_) s += v;
  return s;
}

bool adwin_reference::cut_holds(std::int64_t n0) const {
  const auto n = static_cast<std::int64_t>(window_.size());
  if (n0 < 1 || n0 >= n) return false;
  double s0 = 0, s1 = 0;
  for (std::int64_t i = 0; i < n; ++i) (i < n0 ? s0 : s1) += window_[static_cast<std::size_t>(i)];
  const double a = static_cast<double>(n0), b = static_cast<double>(n - n0);
  return std::abs(s0 / a - s1 / b) >= adwin::cut_threshold(a, b, delta_);
}

adwin_change adwin_reference::observe(double x) {
  if (!(x >= 0 && x <= 1)) throw std::invalid_argument("adwin_reference: observations must be in [0, 1]");
  window_.push_back(x);
  adwin_change first = adwin_change::none;
  for (;;) {
    const auto n = static_cast<std::int64_t>(window_.size());
    double total = 0;
    for (double v : window_) total += v;
    double s0 = 0;
    adwin_change c = adwin_change::none;
    for (std::int64_t n0 = 1; n0 < n && c == adwin_change::none; ++n0) {
      s0 += window_[static_cast<std::size_t>(n0 - 1)];
      const double a = static_cast<double>(n0), b = static_cast<double>(n - n0);
      const double m0 = s0 / a, m1 = (total - s0) / b;
      if (std::abs(m0 - m1) >= adwin::cut_threshold(a, b, delta_)) c = m1 > m0 ? adwin_change::rise : adwin_change::fall;
    }
    if (c == adwin_change::none) return first;
    if (first == adwin_change::none) first = c;
    window_.pop_front();
  }
}

void adwin_reference::drop(std::int64_t n) {
  for (std::int64_t i = 0; i < n && !window_.empty(); ++i) window_.pop_front();
}

// ---- the clients' detector ---------------------------------------------------------------------

error_detector::error_detector(const std::string& kind) : is_ddm_(kind == "ddm") {
  if (kind != "ddm" && kind != "adwin")
    throw std::invalid_argument("--drift-detect '" + kind + "': use ddm or adwin");
}

bool error_detector::observe(bool error) {
  if (is_ddm_) return ddm_.observe(error) == drift_signal::drift;
  return adwin_.observe(error ? 1.0 : 0.0) == adwin_change::rise;
}

void error_detector::reset() {
  ddm_.reset();
  adwin_.reset();
}

std::size_t error_detector::bytes() const noexcept {
  return sizeof(*this) + (is_ddm_ ? 0 : adwin_.buckets() * sizeof(double));
}

// ---- the injected drift ---------------------------------------------------------------------

/// The run seed's stream for the drifted clients (engine.hpp lists the others).
constexpr std::uint64_t stream_drift = 12;  // see engine.hpp's streams

drift_swap parse_drift(const std::string& spec) {
  const std::string use = "--drift '" + spec + "': use swap:ROUND:FRACTION:A-B (e.g. swap:100:0.3:0-6)";
  const auto parts = detail::split_spec(spec);
  if (parts.size() != 4 || parts[0] != "swap") throw std::invalid_argument(use);
  drift_swap d;
  const double round = detail::spec_number(parts[1], "--drift '" + spec + "' ROUND");
  if (!(round >= 1 && round <= 1e9) || round != std::floor(round))
    throw std::invalid_argument("--drift '" + spec + "': ROUND must be a whole number of at least 1");
  d.round = static_cast<int>(round);
  d.fraction = detail::spec_number(parts[2], "--drift '" + spec + "' FRACTION");
  if (!(d.fraction > 0 && d.fraction <= 1)) throw std::invalid_argument("--drift '" + spec + "': FRACTION must be in (0, 1]");
  const auto dash = parts[3].find('-');
  if (dash == std::string::npos) throw std::invalid_argument(use);
  auto label = [&](const std::string& text) {
    const double v = detail::spec_number(text, "--drift '" + spec + "' label");
    if (!(v >= 0 && v <= 255) || v != std::floor(v))
      throw std::invalid_argument("--drift '" + spec + "': the labels must be whole numbers in [0, 255]");
    return static_cast<int>(v);
  };
  d.a = label(parts[3].substr(0, dash));
  d.b = label(parts[3].substr(dash + 1));
  if (d.a == d.b) throw std::invalid_argument("--drift '" + spec + "': A and B must be two different labels");
  return d;
}

std::vector<char> drifted_clients(const drift_swap& d, std::size_t clients, std::uint64_t seed) {
  const auto k = static_cast<std::uint64_t>(std::llround(d.fraction * static_cast<double>(clients)));
  std::vector<char> out(clients, 0);
  // Floyd's algorithm: k distinct clients with k draws.
  splitmix64 g{derive_seed(seed, stream_drift)};
  std::unordered_set<std::uint64_t> chosen;
  for (std::uint64_t j = clients - k; j < clients; ++j) {
    const std::uint64_t t = g.below(j + 1);
    chosen.insert(chosen.count(t) ? j : t);
  }
  for (auto c : chosen) out[c] = 1;
  return out;
}

}  // namespace troupe::federated
