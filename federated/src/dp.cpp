#include "troupe/federated/dp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "random.hpp"

namespace troupe::federated {

double clip_l2(std::span<float> update, double bound) {
  if (!(bound > 0) || !std::isfinite(bound))
    throw std::invalid_argument("clip_l2: the bound must be positive and finite, got " + std::to_string(bound));
  double squares = 0;
  for (float x : update) squares += static_cast<double>(x) * x;
  // Squares of finite floats cannot overflow a double sum (at most 2^32 of 1.2e77), so only a NaN
  // or an infinity gets here: its norm would leave the update unclipped (NaN > bound is false) or
  // turn it into NaN (inf * 0), and either breaks the bound the privacy analysis relies on.
  if (!std::isfinite(squares))
    throw std::invalid_argument("clip_l2: the update holds a value that is not finite (its squares sum to " +
                                std::to_string(squares) + ")");
  const double norm = std::sqrt(squares);
  if (norm > bound) {
    const auto scale = static_cast<float>(bound / norm);
    for (float& x : update) x *= scale;
  }
  return norm;
}

void add_gaussian_noise(std::span<float> values, double stddev, std::uint64_t seed) {
  if (!(stddev >= 0) || !std::isfinite(stddev))
    throw std::invalid_argument("add_gaussian_noise: stddev must be >= 0 and finite");
  if (stddev == 0) return;
  detail::normal_draws normal(seed);
  for (float& x : values) x = static_cast<float>(x + stddev * normal.next());
}

namespace {

constexpr double neg_inf = -std::numeric_limits<double>::infinity();

/// log(exp(a) + exp(b)) without overflow.
double log_add(double a, double b) {
  if (a == neg_inf) return b;
  if (b == neg_inf) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

/// log(exp(a) - exp(b)) for a >= b.
double log_sub(double a, double b) {
  if (b == neg_inf) return a;
  if (a == b) return neg_inf;
  return a + std::log1p(-std::exp(b - a));
}

/// log(erfc(x)), also where erfc underflows (its asymptotic series for large x).
double log_erfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  const double x2 = x * x;
  // erfc(x) ~ exp(-x²) / (x √π) · (1 - 1/(2x²) + 3/(4x⁴) - 15/(8x⁶))
  return -x2 - std::log(x) - 0.5 * std::log(std::numbers::pi) +
         std::log1p(-0.5 / x2 + 0.75 / (x2 * x2) - 1.875 / (x2 * x2 * x2));
}

/// log of the binomial coefficient C(n, k) for real n and integer k (its absolute value), and its sign.
double log_abs_binomial(double n, double k, bool& negative) {
  // C(n, k) = Γ(n + 1) / (Γ(k + 1) Γ(n - k + 1)); lgamma returns |Γ| and the sign separately.
  int s1 = 1, s2 = 1, s3 = 1;
  const double a = lgamma_r(n + 1, &s1);
  const double b = lgamma_r(k + 1, &s2);
  const double c = lgamma_r(n - k + 1, &s3);
  negative = (s1 * s2 * s3) < 0;
  return a - b - c;
}

/// log A_α for integer α: Σ_k C(α, k) (1 - q)^(α - k) q^k exp((k² - k) / (2σ²)).
double log_a_integer(double q, double sigma, int alpha) {
  double log_a = neg_inf;
  for (int k = 0; k <= alpha; ++k) {
    bool negative = false;
    const double term = log_abs_binomial(alpha, k, negative) + k * std::log(q) +
                        (alpha - k) * std::log1p(-q) + (double(k) * k - k) / (2 * sigma * sigma);
    log_a = log_add(log_a, term);
  }
  return log_a;
}

/// log A_α for fractional α: the two series of Mironov, Talwar and Zhang (2019), Section 3.3.
double log_a_fractional(double q, double sigma, double alpha) {
  double log_a0 = neg_inf, log_a1 = neg_inf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  for (int i = 0;; ++i) {
    bool negative = false;
    const double log_coef = log_abs_binomial(alpha, i, negative);
    const double j = alpha - i;
    const double log_t0 = log_coef + i * std::log(q) + j * std::log1p(-q);
    const double log_t1 = log_coef + j * std::log(q) + i * std::log1p(-q);
    const double log_e0 = std::log(0.5) + log_erfc((i - z0) / (std::numbers::sqrt2 * sigma));
    const double log_e1 = std::log(0.5) + log_erfc((z0 - j) / (std::numbers::sqrt2 * sigma));
    const double log_s0 = log_t0 + (double(i) * i - i) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    if (negative) {
      log_a0 = log_sub(log_a0, log_s0);
      log_a1 = log_sub(log_a1, log_s1);
    } else {
      log_a0 = log_add(log_a0, log_s0);
      log_a1 = log_add(log_a1, log_s1);
    }
    if (std::max(log_s0, log_s1) < -30 || i > 10000) break;
  }
  return log_add(log_a0, log_a1);
}

}  // namespace

double sampled_gaussian_rdp(double q, double sigma, double alpha) {
  if (!(q >= 0 && q <= 1)) throw std::invalid_argument("sampled_gaussian_rdp: q must be in [0, 1]");
  if (!(sigma > 0) || !std::isfinite(sigma))
    throw std::invalid_argument("sampled_gaussian_rdp: sigma must be positive and finite");
  if (!(alpha > 1) || !std::isfinite(alpha))
    throw std::invalid_argument("sampled_gaussian_rdp: the order must be > 1 and finite");
  if (q == 0) return 0;
  // Sampling never costs more than the plain Gaussian, whose RDP is alpha / (2 sigma^2): that is
  // the value at q = 1, and the bound given for orders above largest_exact_rdp_order, where the
  // integer expansion would take alpha terms (and alpha need not fit an int) and the fractional
  // series is summed over fewer terms than it needs.
  if (q == 1 || alpha > largest_exact_rdp_order) return alpha / (2 * sigma * sigma);
  const double log_a = alpha == std::floor(alpha) ? log_a_integer(q, sigma, static_cast<int>(alpha))
                                                   : log_a_fractional(q, sigma, alpha);
  // With the inputs checked above, NaN only comes of infinities cancelling in the sums, which
  // happens when sigma is so small that the true value overflows: no privacy at this order.
  if (std::isnan(log_a)) return std::numeric_limits<double>::infinity();
  return log_a / (alpha - 1);
}

std::vector<double> rdp_accountant::default_orders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int a = 12; a < 64; ++a) orders.push_back(a);
  return orders;
}

rdp_accountant::rdp_accountant(std::vector<double> orders) : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {
  if (orders_.empty()) throw std::invalid_argument("rdp_accountant: no orders");
  for (double a : orders_)
    if (!(a > 1) || !std::isfinite(a)) throw std::invalid_argument("rdp_accountant: every order must be > 1 and finite");
}

void rdp_accountant::compose(double q, double sigma, std::int64_t steps) {
  if (steps < 0) throw std::invalid_argument("rdp_accountant: steps must be >= 0");
  for (std::size_t i = 0; i < orders_.size(); ++i)
    rdp_[i] += static_cast<double>(steps) * sampled_gaussian_rdp(q, sigma, orders_[i]);
}

void rdp_accountant::restore(std::span<const double> rdp) {
  check(rdp);
  rdp_.assign(rdp.begin(), rdp.end());
}

void rdp_accountant::check(std::span<const double> rdp) const {
  if (rdp.size() != orders_.size())
    throw std::invalid_argument("rdp_accountant: " + std::to_string(rdp.size()) + " values for " +
                                std::to_string(orders_.size()) + " orders");
  // +infinity is a value compose() makes (next to no noise: no privacy at that order), so a
  // checkpoint of such a run resumes; NaN and negative values are never made.
  for (double v : rdp)
    if (!(v >= 0)) throw std::invalid_argument("rdp_accountant: a restored RDP value is not >= 0");
}

rdp_accountant::spent rdp_accountant::epsilon(double delta) const {
  if (!(delta > 0 && delta < 1)) throw std::invalid_argument("rdp_accountant: delta must be in (0, 1)");
  spent best{std::numeric_limits<double>::infinity(), orders_.front()};
  for (std::size_t i = 0; i < orders_.size(); ++i) {
    const double a = orders_[i];
    const double eps = rdp_[i] + std::log1p(-1 / a) - (std::log(delta) + std::log(a)) / (a - 1);
    if (std::isfinite(eps) && eps < best.epsilon) best = {std::max(eps, 0.0), a};
  }
  return best;
}

void adaptive_clipping::update(double centred_count, double clients, std::uint64_t seed) {
  if (!(clients > 0)) throw std::invalid_argument("adaptive_clipping: clients must be > 0");
  if (!std::isfinite(centred_count)) throw std::invalid_argument("adaptive_clipping: the count must be finite");
  double noisy = centred_count;
  if (count_noise > 0) noisy += count_noise * detail::normal_draws(seed).next();
  bound *= std::exp(-learning_rate * (noisy / clients + 0.5 - target_quantile));
}

double adaptive_clipping::sum_noise_multiplier(double total) const {
  if (!(total > 0)) throw std::invalid_argument("adaptive_clipping: the noise multiplier must be > 0");
  if (!(2 * count_noise > total))
    throw std::invalid_argument("adaptive clipping needs a count noise stddev above half the noise multiplier (" +
                                std::to_string(count_noise) + " <= " + std::to_string(total / 2) + ")");
  return 1 / std::sqrt(1 / (total * total) - 1 / (4 * count_noise * count_noise));
}

}  // namespace troupe::federated
