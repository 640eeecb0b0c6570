#pragma once
/// @file
/// The privacy, robustness and compression mechanisms of dp.hpp, robust.hpp, compress.hpp and
/// secagg.hpp as the engine's hooks (update.hpp): client-side transforms and server-side
/// aggregators. What `troupe fedsim` installs for --dp-*, --strategy median|trimmed-mean|krum,
/// --compress, --attack and --secagg.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"
#include "troupe/federated/update.hpp"

namespace troupe::federated {

/// A transform and an aggregator that work together (either may be null).
struct mechanism {
  std::unique_ptr<update_transform> transform;
  std::unique_ptr<federated::aggregator> aggregator;
};

// ---- robust aggregation ----------------------------------------------------------------------------

/// True for the rules make_robust_aggregator knows: "median", "trimmed-mean:B" (B updates dropped
/// from each end of every coordinate), "krum:F" (Krum tolerating F Byzantine clients) and
/// "multi-krum:F:M" (the mean of the M best by Krum's score).
bool is_robust_rule(const std::string& spec);
/// Throws std::invalid_argument for an unknown or malformed rule. The aggregators buffer the
/// round's updates and ignore the clients' weights (a Byzantine client could lie about them).
/// A round with fewer updates than least_updates(spec) (clients failed or were late) is given up
/// (round_aborted).
std::unique_ptr<aggregator> make_robust_aggregator(const std::string& spec);
/// The fewest updates a rule can aggregate: 1 for median, 2B + 1 for trimmed-mean:B, 2F + 3 for
/// krum:F, max(2F + 3, M) for multi-krum:F:M.
std::size_t least_updates(const std::string& spec);

// ---- differential privacy --------------------------------------------------------------------------

struct dp_options {
  double clip = 0;                ///< S: every update is clipped to this L2 norm (initial S when adaptive)
  double noise = 0;               ///< z: the server adds N(0, (z S)²) to the sum
  double delta = 1e-5;            ///< δ of the reported ε
  std::size_t expected_clients = 0;  ///< K: the sum is divided by this fixed denominator
  std::size_t population = 0;     ///< N: the sampling probability is K / N
  bool adaptive = false;          ///< adapt S toward a quantile of the update norms
  double target_quantile = 0.5;   ///< adaptive: γ
  double clip_learning_rate = 0.2;  ///< adaptive: η_C
  double count_noise = 0;         ///< adaptive: σ_b (0: max(K / 20, z); the paper suggests K / 20)
};
/// DP-FedAvg with a fixed denominator (McMahan et al., 2018): clients clip (the transform), the
/// server sums unweighted, adds Gaussian noise, divides by K and reports "epsilon" each round
/// from an RDP accountant (sampling rate K / N, one step per round). Throws
/// std::invalid_argument for a clip or noise that is not positive, a δ outside (0, 1), or K / N
/// not a probability.
mechanism make_differential_privacy(const dp_options& options);

// ---- compression -----------------------------------------------------------------------------------

/// "topk:F" (keep the fraction F of coordinates, with an error-feedback residual per client) or
/// "qsgd:L" (L levels). The transform replaces the update with what the server decodes and
/// reports "uplink_ratio" (bytes on the wire / dense bytes). Throws std::invalid_argument for
/// other specs.
std::unique_ptr<update_transform> make_compression(const std::string& spec);

// ---- attacks ---------------------------------------------------------------------------------------

/// Update attacks by a seeded fraction of the population: "sign-flip:P" (negate the update),
/// "scale:P:X" (multiply it by X). A client is malicious when derive_seed(seed, client) falls in
/// the first P of the range, so the set is fixed for the whole run. Throws
/// std::invalid_argument for other specs.
std::unique_ptr<update_transform> make_update_attack(const std::string& spec, std::uint64_t seed);
/// Whether `client` belongs to the malicious fraction `p` under `seed` (the rule above).
bool is_malicious(std::uint64_t client, double p, std::uint64_t seed);

/// Data attacks: "label-flip:P" (class c becomes 9 - c) or "backdoor:P:T" (a white square in the
/// corner, labelled T) by the same seeded fraction P of the clients.
bool is_data_attack(const std::string& spec);
/// Wraps a trainer factory so that malicious clients train on poisoned copies of their examples
/// (the data is extended once with a poisoned copy of the training set; a malicious client's
/// indices point into the copy). Under a backdoor, evaluations also report "backdoor_success":
/// the fraction of test images of other classes that the model puts in class T once stamped.
/// Throws std::invalid_argument for a malformed spec.
trainer_factory poison_training(trainer_factory inner, const std::string& spec, std::uint64_t seed);

// ---- secure aggregation ----------------------------------------------------------------------------

struct secagg_options {
  double clip = 4.0;          ///< inputs (weight-normalized deltas) are clipped to [-clip, clip]
  double mean_weight = 1.0;   ///< clients send (weight / mean_weight) · delta and that ratio
  std::size_t max_clients = 0;  ///< most participants in a round
  std::size_t degree = 0;     ///< neighbours per client (0: from the round's size)
  bool full_graph = false;    ///< SecAgg (Bonawitz et al.) instead of SecAgg+
  double dropout = 0;         ///< fraction of participants lost after masking (rounded; seeded choice)
  /// Differential privacy on the secure sum (clip and noise 0: none; otherwise validated as by
  /// make_differential_privacy). Each client clips its own update to the current bound S and
  /// masks it unweighted (plus, under adaptive clipping, S when it was not clipped and 0 when
  /// it was); the server unmasks only the sum, takes the unclipped count from its last
  /// coordinate, and noises and divides the sum exactly as DP-FedAvg does. The fixed-point
  /// encoding then clips coordinates to S instead of `clip`: an L2-clipped update has no
  /// coordinate above S, so nothing more is cut, and K inputs sum below 2^31 (resolution
  /// quantum of at most K S / 2^30; the sum is off by at most K / 2 quanta).
  dp_options dp{};
};
/// Secure aggregation of the weighted mean (or, with `dp`, of DP-FedAvg's noised sum): every
/// round, the participants run SecAgg+ through the server (keys, encrypted shares), each masks
/// its update in the transform on its worker thread, and the aggregator adds masked integers
/// and unmasks only the sum. Reports "secagg_survivors" (after "epsilon" and, when adaptive,
/// "dp_clip"). Throws std::invalid_argument for bad options.
mechanism make_secure_aggregation(const secagg_options& options);

// ---- installation ----------------------------------------------------------------------------------

/// Installs what `options` asks for (its mechanism fields and a robust `strategy`) into `sim`, in
/// the order attack, compression, clipping, masking on the client. `mean_weight` is the mean
/// number of examples per client (secure aggregation normalizes weights by it). Throws
/// std::invalid_argument for bad values and for combinations that cannot work: a robust rule
/// with secure aggregation (the rule needs every single update, which the server never sees),
/// a robust rule with differential privacy (the noise is calibrated to the mean's sensitivity).
/// Differential privacy with secure aggregation clips on the clients and noises the secure sum
/// (secagg_options::dp).
void install_mechanisms(simulation& sim, const simulation_options& options, double mean_weight);

}  // namespace troupe::federated
