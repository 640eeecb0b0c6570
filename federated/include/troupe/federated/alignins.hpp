#pragma once
/// @file
/// AlignIns (Xu et al., "Detecting Backdoor Attacks in Federated Learning via Direction
/// Alignment Inspection", CVPR 2025), as its authors' code computes it:
///
///   TDA_i  = cos(Δ_i, w)            the update's cosine with the round's global model w (the
///                                   flattened parameters), x·y / max(‖x‖‖y‖, 1e-6);
///   MPSA_i = |{j ∈ top_k(|Δ_i|) : sign(Δ_ij) = s_j}| / k, with s_j = sign(Σ_i sign(Δ_ij)) the
///            majority sign of coordinate j over the round's updates and k = ⌊0.3 · dim⌋ (at
///            least 1) the update's largest-magnitude coordinates;
///   z(x_i) = |x_i − median(x)| / std(x)  the "MZ-score": the distance to the median over the
///            population standard deviation (numpy's std, ddof 0), 0 when std ≤ 1e-9 — the
///            official code divides by the standard deviation, not by a median absolute
///            deviation;
///   kept   = { i : z(TDA)_i < λ_T and z(MPSA)_i < λ_S }  (λ default 1.0 each);
///   the kept updates are scaled to at most their median L2 norm (torch's median: the lower
///   middle value of an even count) and averaged with the clients' weights. No update kept:
///   the aggregate is zero (the model does not move), as in the official code.
///
/// `--strategy alignins[:LAMBDA_T:LAMBDA_S]` installs it as the server's aggregator
/// (mechanisms.hpp); it buffers the round's updates and needs round_info::global.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/robust.hpp"
#include "troupe/federated/update.hpp"

namespace troupe::federated {

struct alignins_options {
  double lambda_tda = 1.0;     ///< λ_T: the largest TDA z-score kept (exclusive)
  double lambda_mpsa = 1.0;    ///< λ_S: the largest MPSA z-score kept (exclusive)
  double top_fraction = 0.3;   ///< MPSA's share of largest-magnitude coordinates
};

/// What AlignIns found in one round (positions are those of the updates given).
struct alignins_inspection {
  std::vector<double> tda, mpsa, tda_z, mpsa_z;
  std::vector<std::size_t> kept;  ///< ascending
  double clip_norm = 0;           ///< the kept updates' median norm (0 when none is kept)
};

/// cos(u, g) = u·g / max(‖u‖‖g‖, 1e-6), in double.
double alignins_tda(std::span<const float> update, std::span<const float> global);

/// Every update's MPSA against the majority sign of all of them. Throws std::invalid_argument
/// for no updates, unequal lengths or a fraction outside (0, 1].
std::vector<double> alignins_mpsa(std::span<const update_view> updates, double top_fraction = 0.3);

/// |x_i − median(x)| / std(x) (population standard deviation; the median of an even count is
/// the mean of the two middle values), all 0 when std(x) <= 1e-9.
std::vector<double> median_z_scores(std::span<const double> values);

/// Scores the updates and picks those AlignIns keeps. Throws std::invalid_argument for no
/// updates, lengths that differ from each other or from `global`, values that are not finite,
/// or options out of range (λ > 0 and finite, fraction in (0, 1]).
alignins_inspection alignins_inspect(std::span<const update_view> updates, std::span<const float> global,
                                     const alignins_options& options = {});

/// The aggregate: the weighted mean of the kept updates, each scaled to at most the median
/// norm; dim zeros when none is kept. Weights must be >= 0 and finite (see make_weighted_mean).
std::vector<float> alignins_aggregate(std::span<const update_view> updates, std::span<const double> weights,
                                      std::span<const float> global, const alignins_options& options = {},
                                      alignins_inspection* inspection = nullptr);

/// True for "alignins" and "alignins:..." (the spec make_alignins parses).
bool is_alignins(const std::string& spec);
/// "alignins" or "alignins:LAMBDA_T:LAMBDA_S". Throws std::invalid_argument for a malformed spec
/// or a λ that is not positive and finite.
alignins_options parse_alignins(const std::string& spec);
/// The aggregator for `spec`. Its begin() throws std::invalid_argument when the round carries no
/// global model of the updates' length.
std::unique_ptr<aggregator> make_alignins(const std::string& spec);

}  // namespace troupe::federated
