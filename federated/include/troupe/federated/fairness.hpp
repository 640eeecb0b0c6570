#pragma once
/// @file
/// Fairness across clients: per-client evaluation on held-out examples (`--eval-clients`) and
/// q-FedAvg (`--strategy qfedavg:Q`, Li et al., "Fair Resource Allocation in Federated Learning",
/// ICLR 2020, Algorithm 2).
///
/// q-FedAvg, with L = 1 / lr (the clients' learning rate) and F_k client k's mean loss on its
/// shard at the global model w before it trains: the client trains as FedAvg's does to w_k and
/// sends Δw_k = L (w − w_k) and F_k; the server forms
///   Δ_k = F_k^q Δw_k,   h_k = q F_k^(q−1) ‖Δw_k‖² + L F_k^q,   w ← w − Σ Δ_k / Σ h_k.
/// In this engine the client sends its delta d_k = w_k − w with F_k as one more float, weighted
/// F_k^q; FedAvg's weighted mean gives Σ F_k^q d_k / Σ F_k^q, and the strategy steps
///   w ← w + [Σ F_k^q d_k / Σ F_k^q] · Σ F_k^q / Σ (h_k / L),   h_k / L = q F_k^(q−1) L ‖d_k‖² + F_k^q,
/// which is the step above (Δw_k = −L d_k). With q = 0 every weight is 1 and Σ h_k / L is the
/// number of clients, so the factor is exactly 1: FedAvg with uniform weights, bit for bit.
/// F_k travels as a float (rounded to 24 bits) for the h_k term; its weight F_k^q is the client's
/// exact double. A client whose loss is 0 weighs 0 and adds nothing to Σ h_k (its F^(q−1) term,
/// infinite for q < 1, is taken as 0).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/partition.hpp"
#include "troupe/federated/strategy.hpp"

namespace troupe::federated {

// ---- per-client evaluation ---------------------------------------------------------------------

/// Splits each client's shard: a seeded uniform ⌊fraction · n⌋ of its n examples (its own
/// shuffle, from derive_seed(seed, client)) go to the returned partition (the held-out rows),
/// the rest stay in `part` (rewritten, same clients, in the shuffled order). Throws
/// std::invalid_argument for a fraction outside [0, 1).
partition hold_out(partition& part, double fraction, std::uint64_t seed);

/// The spread of the clients' accuracies.
struct client_accuracy_stats {
  std::size_t clients = 0;  ///< accuracies summarized (clients with at least one held-out row)
  double mean = 0;
  double std = 0;           ///< population standard deviation
  double worst10 = 0;       ///< the mean of the lowest ⌈n / 10⌉ accuracies
  double best10 = 0;        ///< the mean of the highest ⌈n / 10⌉ accuracies
};
/// NaN entries (clients without held-out rows) are skipped; all NaN or none: clients = 0 and NaN
/// statistics.
client_accuracy_stats summarize_client_accuracies(std::span<const double> accuracies);

// ---- q-FedAvg ----------------------------------------------------------------------------------

/// True for "qfedavg:..." .
bool is_qfedavg(const std::string& spec);
/// Q of "qfedavg:Q". Throws std::invalid_argument unless Q is a number >= 0 (and at most 100: the
/// weights F^q must stay finite).
double parse_qfedavg(const std::string& spec);
/// q-FedAvg's server for clients stepping at `client_lr` (L = 1 / client_lr). Throws
/// std::invalid_argument for a q out of range or a learning rate that is not positive.
std::unique_ptr<server_strategy> make_qfedavg(double q, double client_lr);

}  // namespace troupe::federated
