#pragma once
/// @file
/// Neural Cleanse (Wang et al., "Neural Cleanse: Identifying and Mitigating Backdoor Attacks in
/// Neural Networks", IEEE S&P 2019), as its authors' code (visualizer.py, mad_outlier_detection.py)
/// computes it: a backdoor shows as a label that a much smaller trigger reaches than any other.
///
/// For each label t, on clean images x (pixels scaled to [0, 1]):
///
///   x'   = (1 - m) ⊙ x + m ⊙ p          m, p ∈ [0, 1]^pixels, m = σ(μ), p = σ(π)
///   loss = CE(f(x'), t) + λ · |m|_1     the mean over the batch; f sees x' normalized as in training
///
/// Adam (lr 0.1, β = (0.5, 0.9)) steps μ and π; the gradient of the cross-entropy with respect to
/// x' comes from the model's own layers (kernels' backward_input through the whole model). λ
/// follows the paper's schedule, checked once per epoch (steps_per_epoch batches) on the epoch's
/// mean attack success (the share of x' classified t):
///   - λ starts at 0; once the success reaches the threshold (0.99) for `patience` epochs in a row
///     it is set to init_cost (1e-3);
///   - afterwards, `patience` epochs in a row at or above the threshold multiply it by
///     cost_multiplier (2), as many below divide it by cost_multiplier^1.5;
///   - the mask kept is the one of smallest mean |m|_1 among epochs at or above the threshold;
///   - it stops once λ has gone both up and down and the best |m|_1 has not improved for
///     early_stop_patience (25) epochs, or after `epochs` (early_stop_patience 0: always after
///     `epochs`).
/// A label whose success never reaches the threshold keeps its last mask (reached = false).
///
/// The anomaly index of the labels' norms: MAD = 1.4826 · median_i |n_i − median(n)| (the
/// consistency constant makes it a standard deviation for normal data), index_i = |n_i −
/// median(n)| / MAD; a label is flagged when its index is above 2 and its norm below the median.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/kernels/data.hpp"
#include "troupe/kernels/layers.hpp"

namespace troupe::federated {

struct neural_cleanse_options {
  int images = 1000;            ///< clean test images (the first of the split) the triggers must flip
  int batch = 32;
  int epochs = 300;             ///< at most, per label
  int steps_per_epoch = 0;      ///< 0: images / batch (at least 1)
  double lr = 0.1;              ///< Adam's (β1 0.5, β2 0.9)
  double init_cost = 1e-3;      ///< λ once the attack first succeeds
  double attack_success_threshold = 0.99;
  int patience = 5;             ///< epochs before λ changes
  double cost_multiplier = 2;   ///< λ × this going up, ÷ this^1.5 going down
  int early_stop_patience = 25; ///< epochs without a better norm before stopping (0: never stop early)
  double anomaly_threshold = 2; ///< flag labels whose index is above it, on the small side
  std::uint64_t seed = 0;       ///< the masks' and patterns' initial values, the batches' order
};

/// The trigger reverse-engineered for one label.
struct reversed_trigger {
  int label = 0;
  std::vector<float> mask;     ///< [pixels], in [0, 1]
  std::vector<float> pattern;  ///< [pixels], in [0, 1] (× 255 for u8 pixels)
  double l1 = 0;               ///< |mask|_1
  double attack_success = 0;   ///< of the kept mask, over its epoch's batches
  bool reached = false;        ///< the success reached the threshold
  int epochs = 0;              ///< run before stopping
  double final_cost = 0;       ///< λ at the end
};

/// The median-absolute-deviation outlier test of a set of norms.
struct anomaly_report {
  double median = 0;
  double mad = 0;                  ///< 1.4826 · median |n_i − median|
  std::vector<double> index;       ///< |n_i − median| / mad per norm (0 when mad is 0 and n_i = median; infinity otherwise)
  std::vector<int> flagged;        ///< positions with index > threshold and n_i < median, ascending
};

/// The anomaly index of `norms` (Neural Cleanse's mad_outlier_detection; the median of an even
/// count is the mean of the middle two, as numpy's). Throws std::invalid_argument for fewer than
/// two norms or one that is not finite.
anomaly_report mad_anomaly_index(std::span<const double> norms, double threshold = 2);

/// One step's objective: for the raw parameters `mu` and `pi` (m = σ(μ), p = σ(π)), the loss
/// mean CE(f(x'), label) + cost · |m|_1 over `rows` images `x01` (row-major, pixels in [0, 1]),
/// and its gradients with respect to μ and π (written to grad_mu, grad_pi); `correct` (when not
/// null) receives how many x' the model puts in `label`. reverse_engineer_trigger steps on it.
double trigger_objective(kernels::sequential& model, std::span<const float> x01, int rows, float mean, float stddev,
                         int label, std::span<const float> mu, std::span<const float> pi, double cost,
                         std::span<float> grad_mu, std::span<float> grad_pi, std::int64_t* correct = nullptr);

/// Reverse-engineers the smallest trigger that sends `images` (u8 [N, ...], scaled to [0, 1] and
/// normalized with `mean` and `stddev` as the model was trained) to `label`. Throws
/// std::invalid_argument for f32 features (the trigger lives in pixel space), a model that does
/// not take these images or has no such label, or bad options.
reversed_trigger reverse_engineer_trigger(kernels::sequential& model, const tensor& images, float mean, float stddev,
                                          int label, const neural_cleanse_options& o = {});

struct neural_cleanse_result {
  std::vector<reversed_trigger> triggers;  ///< one per label
  anomaly_report anomaly;                  ///< of the triggers' l1, by label
};

/// Every label of the model's output, then the anomaly index of their norms; the clean images
/// are the first o.images of `data.test`.
neural_cleanse_result neural_cleanse(kernels::sequential& model, const labelled_data& data,
                                     const neural_cleanse_options& o = {});

/// The model saved at `path`: a `troupe fedsim --checkpoint` directory (its model is the one the
/// checkpoint names; `spec`, when not empty, must be that one) or a `troupe train --save` weights
/// file of the model `spec` describes. Throws std::invalid_argument naming the path and what
/// does not fit.
std::unique_ptr<kernels::sequential> load_saved_model(const std::string& path, const std::string& spec);

}  // namespace troupe::federated
