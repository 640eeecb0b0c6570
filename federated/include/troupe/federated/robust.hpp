#pragma once
/// @file
/// Byzantine-robust aggregation of one round's client updates, and the attacks that measure it.
///
/// Aggregators (each unweighted: a Byzantine client could lie about its sample count):
/// - coordinate-wise median (Yin et al., 2018); with an even count, the mean of the two middle values;
/// - coordinate-wise trimmed mean (Yin et al., 2018): per coordinate, drop the `trim` largest and
///   `trim` smallest values and average the rest;
/// - Krum and Multi-Krum (Blanchard et al., 2017): each update's score is the sum of squared L2
///   distances to its n - f - 2 nearest other updates; Krum returns the update with the lowest
///   score, Multi-Krum the mean of the m lowest-scoring ones. Needs n > 2f + 2.
/// - the geometric median (RFA, Pillutla et al., 2022): the point minimizing the sum of L2
///   distances to the updates, by the smoothed Weiszfeld iteration from their mean;
/// - norm bounding (Sun et al., 2019): the mean of the updates, each first scaled down to an L2
///   norm of at most M.
/// All of them read every update of the round, so unlike the mean they buffer the round's updates.
/// Ties are broken by position, so results depend only on the inputs and their order.
///
/// Attacks, applied by the malicious clients: on the update (sign flip, scaling — as in model
/// replacement) or on the data (label flipping, a pixel-pattern backdoor with a target label).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace troupe::federated {

using update_view = std::span<const float>;

/// Throws std::invalid_argument when there are no updates, their lengths differ or one holds a
/// value that is not finite (NaN has no place in an order; every rule here refuses it).
std::vector<float> coordinate_median(std::span<const update_view> updates);

/// Throws std::invalid_argument also when 2 * trim >= updates.size().
std::vector<float> trimmed_mean(std::span<const update_view> updates, std::size_t trim);

struct krum_choice {
  std::vector<std::size_t> selected;  ///< positions of the chosen updates, best first
  std::vector<double> scores;         ///< every update's score
};
/// Scores the updates and selects the `m` best (m = 1: Krum). Throws std::invalid_argument unless
/// updates.size() > 2 * byzantine + 2 and 1 <= m <= updates.size().
krum_choice krum_select(std::span<const update_view> updates, std::size_t byzantine, std::size_t m = 1);

/// The mean of the updates krum_select chooses.
std::vector<float> multi_krum(std::span<const update_view> updates, std::size_t byzantine, std::size_t m = 1);

/// The smoothed Weiszfeld iteration: z ← Σ β_i u_i / Σ β_i with β_i = 1 / max(ν, ‖z − u_i‖), from
/// the mean, until the sum of distances improves by less than `tolerance` of itself or after
/// `iterations` steps. In double precision, so the result depends only on the inputs and their
/// order. Throws std::invalid_argument also for ν <= 0 or iterations < 1.
std::vector<float> geometric_median(std::span<const update_view> updates, int iterations = 100, double nu = 1e-6,
                                    double tolerance = 1e-6);

/// The mean of the updates, each scaled to an L2 norm of at most `bound`. Throws
/// std::invalid_argument also unless bound > 0 and finite.
std::vector<float> norm_bounded_mean(std::span<const update_view> updates, double bound);

// ---- attacks --------------------------------------------------------------------------------------

/// Update-side attacks: negate (and scale by `factor`), or scale by `factor`.
enum class update_attack { none, sign_flip, scale };
void apply_update_attack(update_attack attack, std::span<float> update, double factor);

/// Label flipping: class c becomes classes - 1 - c.
inline std::uint8_t flip_label(std::uint8_t label, int classes = 10) {
  return static_cast<std::uint8_t>(classes - 1 - label);
}

/// The backdoor trigger: a `size` x `size` white square whose corner is `margin` pixels from the
/// bottom-right of a row-major `side` x `side` u8 image.
void stamp_backdoor(std::span<std::uint8_t> image, int side = 28, int size = 4, int margin = 1);

}  // namespace troupe::federated
