#pragma once
/// @file
/// Differential privacy for federated averaging (DP-FedAvg, McMahan et al., 2018): each client's
/// update is clipped to an L2 norm, the server adds Gaussian noise to the sum, and a Rényi-DP
/// accountant for the sampled Gaussian mechanism (Mironov, Talwar and Zhang, 2019) reports the
/// (ε, δ) spent so far.
///
/// The ε for a given δ uses the conversion of Balle et al. (2020), as Opacus ≥ 1.0 does:
///   ε = min over orders α of  RDP(α) + log((α - 1) / α) - (log δ + log α) / (α - 1).
///
/// Adaptive clipping follows Andrew et al. (2021), "Differentially Private Learning with Adaptive
/// Clipping": the bound moves geometrically toward a target quantile of the clients' update norms,
/// using a noised count of the clients that were not clipped; the noise that count needs is taken
/// out of the sum's noise so that the total privacy cost stays that of the configured multiplier.
///
/// Noise here is drawn from a seeded, non-cryptographic generator: right for simulation and
/// reproducibility, not for protecting real data (Mironov 2012 discusses floating-point attacks).

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::federated {

/// Scales `update` in place so that its L2 norm is at most `bound` (> 0); returns the norm it had.
/// Throws std::invalid_argument for a bound that is not positive and finite, and for an update
/// holding NaN or an infinity (it could not be clipped to the bound).
double clip_l2(std::span<float> update, double bound);

/// Adds independent N(0, stddev²) noise to every coordinate. The draws depend only on `seed`.
void add_gaussian_noise(std::span<float> values, double stddev, std::uint64_t seed);

/// RDP of one step of the sampled Gaussian mechanism with sampling probability q, noise
/// multiplier sigma (noise stddev / sensitivity) at order alpha > 1. Integer orders use the exact
/// binomial expansion, fractional ones the two-sided series of Mironov et al.; both in log space.
/// q = 0 gives 0, q = 1 the plain Gaussian alpha / (2 sigma²). Orders above
/// largest_exact_rdp_order also give alpha / (2 sigma²), an upper bound (sampling never costs
/// more than the plain Gaussian) that is close there, where the expansions would need more terms
/// than are summed. Throws std::invalid_argument for q outside [0, 1], sigma <= 0, alpha <= 1
/// or alpha infinite.
double sampled_gaussian_rdp(double q, double sigma, double alpha);
/// The largest order sampled_gaussian_rdp evaluates exactly (see there).
inline constexpr double largest_exact_rdp_order = 10000;

/// (ε, δ) accounting over a sequence of sampled Gaussian steps.
class rdp_accountant {
public:
  /// Orders 1.1, 1.2, ..., 10.9, then 12, 13, ..., 63: Opacus' default alphas, which skip 11
  /// (kept as they are, so that ε matches Opacus' and checkpoints keep their number of orders).
  static std::vector<double> default_orders();

  explicit rdp_accountant(std::vector<double> orders = default_orders());

  /// Adds `steps` steps with sampling probability q and noise multiplier sigma.
  void compose(double q, double sigma, std::int64_t steps = 1);

  struct spent {
    double epsilon;  ///< smallest ε over the orders (infinity when nothing finite)
    double order;    ///< the order that gave it
  };
  /// The ε spent for this δ in (0, 1). Throws std::invalid_argument otherwise.
  spent epsilon(double delta) const;

  const std::vector<double>& orders() const noexcept { return orders_; }
  const std::vector<double>& rdp() const noexcept { return rdp_; }
  /// Replaces the RDP spent so far (one value per order, as rdp() gives it: a checkpoint's).
  /// Throws std::invalid_argument, changing nothing, for what check refuses.
  void restore(std::span<const double> rdp);
  /// Throws std::invalid_argument for another count than orders() or a NaN or negative value.
  void check(std::span<const double> rdp) const;

private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

/// Adaptive clipping state (Andrew et al., 2021, Algorithm 1 with geometric updates).
struct adaptive_clipping {
  double bound = 0.1;             ///< current clipping bound C
  double target_quantile = 0.5;   ///< γ: the fraction of updates that should go unclipped
  double learning_rate = 0.2;     ///< η_C
  double count_noise = 0;         ///< σ_b: stddev of the noise on the unclipped count (in clients)

  /// Updates the bound from the round's centred count Σ(b_i - ½) (b_i = 1 for a client whose
  /// update was not clipped, 0 for one that was), noised with `count_noise` drawn from `seed`:
  ///   C ← C · exp(-η_C (b̃ - γ)),  b̃ = (Σ(b_i - ½) + N(0, σ_b²)) / clients + ½,
  /// `clients` being the expected number per round. Centred, one client more or less moves the
  /// noised value by ½, the sensitivity sum_noise_multiplier's formula assumes (a plain count
  /// moves by 1, and the round would cost more than the multiplier it reports).
  void update(double centred_count, double clients, std::uint64_t seed);

  /// The noise multiplier left for the sum when the whole round must cost that of multiplier
  /// `total` (the paper's Theorem 1): z_Δ = (total⁻² - (2 σ_b)⁻²)^(-1/2). With count_noise 0 the
  /// count is not private and this throws; so it does when 2 σ_b <= total. Throws
  /// std::invalid_argument then.
  double sum_noise_multiplier(double total) const;
};

}  // namespace troupe::federated
