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
/// "multi-krum:F:M" (the mean of the M best by Krum's score), "geomed", "norm-bound:M",
/// and "alignins[:LAMBDA_T:LAMBDA_S]" (AlignIns, alignins.hpp: weighted, unlike the others).
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
  std::size_t population = 0;     ///< N: the sampling probability is sampled_clients / N
  /// Clients sampled per round (0: K). Over-selection samples more than the K it keeps: the
  /// accountant takes the sampled count (no client is in a round more often than that).
  std::size_t sampled_clients = 0;
  bool adaptive = false;          ///< adapt S toward a quantile of the update norms
  double target_quantile = 0.5;   ///< adaptive: γ
  double clip_learning_rate = 0.2;  ///< adaptive: η_C
  double count_noise = 0;         ///< adaptive: σ_b (0: max(K / 20, z); the paper suggests K / 20)
};
/// DP-FedAvg with a fixed denominator (McMahan et al., 2018): clients clip (the transform), the
/// server sums unweighted, adds Gaussian noise, divides by K and reports "epsilon" each round
/// from an RDP accountant (sampling rate K / N, one step per round). Throws
/// std::invalid_argument for a clip or noise that is not positive, a δ outside (0, 1), K and the
/// sampled count not 0 < K <= sampled <= N, or a noise stddev z S that is not finite.
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
  double clip = 4.0;            ///< update coordinates are clipped to [-clip, clip] (before weighting)
  double max_weight = 1.0;      ///< the largest weight of one client (a larger one is an error)
  double max_weight_sum = 0;    ///< the largest sum of a round's weights (0: max_clients · max_weight)
  std::size_t max_clients = 0;  ///< most participants in a round
  std::size_t degree = 0;     ///< neighbours per client (0: from the round's size)
  bool full_graph = false;    ///< SecAgg (Bonawitz et al.) instead of SecAgg+
  double dropout = 0;         ///< fraction of participants lost after masking (rounded; seeded choice)
  /// Differential privacy on the secure sum (clip and noise 0: none; otherwise validated as by
  /// make_differential_privacy). Each client clips its own update to the current bound S and
  /// masks it unweighted (plus, under adaptive clipping, S/2 when it was not clipped and -S/2
  /// when it was); the server unmasks only the sum, takes the centred count of unclipped
  /// clients from its last coordinate, and noises and divides the sum exactly as DP-FedAvg does. The fixed-point
  /// encoding then clips coordinates to S instead of `clip`: an L2-clipped update has no
  /// coordinate above S, so nothing more is cut, and K inputs sum below 2^31 (resolution
  /// quantum of at most K S / 2^30; the sum is off by at most K / 2 quanta). The weights are
  /// not used.
  dp_options dp{};
};
/// Secure aggregation of the weighted mean (or, with `dp`, of DP-FedAvg's noised sum): every
/// round, the participants run SecAgg+ through the server (keys, encrypted shares), each masks
/// its update in the transform on its worker thread, and the aggregator adds masked integers
/// and unmasks only the sum. Reports "secagg_survivors" (after "epsilon" and, when adaptive,
/// "dp_clip").
///
/// The weighted mean's encoding: client k with weight w_k masks (w_k / W) · clip(Δ_k) and, as
/// one more coordinate, (w_k / W) · clip, W being max_weight; every input coordinate is then in
/// [-clip, clip], and a coordinate of the sum within clip · max_weight_sum / W, which fixes the
/// fixed-point scale (secagg::config::sum_bound). The server divides each summed coordinate by
/// the last one, in the integers: the weighted mean of the clipped updates, off by at most
/// K / 2 quanta of clip · max_weight_sum / (W 2^30) in the sum divided by the round's weights
/// over W. A weight outside [0, max_weight] (or not finite) is an error in the client's
/// transform, a round whose weights sum above max_weight_sum one in the aggregator's add (the
/// simulation passes the weights beside the masked inputs, which is how it can tell), and a round
/// whose weights sum to zero is given up (round_aborted): the plain mean that the unmasked
/// weighted mean falls back to would need a second sum.
///
/// Throws std::invalid_argument for bad options, and for a dropout fraction that leaves no full
/// round of max_clients able to unmask (see docs/federated/privacy.md).
mechanism make_secure_aggregation(const secagg_options& options);

// ---- zero-knowledge norm proofs ---------------------------------------------------------------------

struct norm_verification_options {
  double bound = 0;  ///< B: the L2 bound every update is proved to keep
  int bits = 16;     ///< k: bits per quantized coordinate (8, 16 or 32)
};
/// RoFL's norm check (zkproof.hpp) as hooks. The transform (last in the chain) quantizes the
/// client's update, proves ‖x‖ <= B_q (a client whose update breaks the bound cannot, and sends
/// what the prover makes with its checks skipped, which never verifies) and sends the update with
/// its proof as words: d floats, the proof's length, its bytes. The aggregator verifies each
/// proof against the quantization of the floats it received (the opening binds the two), hands
/// the updates that pass to `inner` unchanged and leaves the others out, reporting them
/// (aggregator::rejected); a round whose every update fails is given up (round_aborted). The
/// transform reports per round "rejected", "proof_bytes", "prove_ms" and "verify_ms" (means per
/// client). Throws std::invalid_argument for a bound that is not positive and finite or other
/// bits.
mechanism make_norm_verification(const norm_verification_options& options, std::unique_ptr<aggregator> inner);
/// Throws std::invalid_argument, naming the option, for what --verify-norm cannot combine with:
/// secure aggregation (its commitments' link to the masked sum is not built yet), compression,
/// FedBuff, LoRA, strategies and options that observe each plain update (qfedavg, fedgen,
/// --contribution, --drift-response cluster).
void check_norm_verification(const simulation_options& options);

// ---- installation ----------------------------------------------------------------------------------

/// What secure aggregation's fixed-point range needs to know of the clients' weights (their
/// numbers of examples under FedAvg, 1 under SCAFFOLD), all known before the first round.
struct weight_bounds {
  double max = 1;        ///< the largest weight of any client (> 0)
  double round_sum = 0;  ///< the largest sum of the weights of one round's clients (0: per round · max)
};

/// Installs what `options` asks for (its mechanism fields and a robust `strategy`) into `sim`, in
/// the order attack, compression, clipping, masking on the client. `weights` bounds the weights
/// the clients send (secure aggregation's encoding is made for them). Throws
/// std::invalid_argument for bad values and for combinations that cannot work: a robust rule
/// with secure aggregation (the rule needs every single update, which the server never sees),
/// a robust rule with differential privacy (the noise is calibrated to the mean's sensitivity).
/// Differential privacy with secure aggregation clips on the clients and noises the secure sum
/// (secagg_options::dp).
void install_mechanisms(simulation& sim, const simulation_options& options, const weight_bounds& weights);

}  // namespace troupe::federated
