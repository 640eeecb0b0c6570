#pragma once
/// @file
/// Vertical federated learning with split learning (SplitNN; Vepakomma et al., 2018): two parties
/// hold different features of partly the same examples. Party A (the label party) holds the left
/// half of every image's columns (columns 0..13 of a 28 x 28 image; the first half of the
/// features of data that is not an image) and the labels, party B the right half. Each holds
/// its own ID set (a random `overlap` of the training examples, drawn independently); private
/// set intersection (psi.hpp) aligns them, and training uses only the intersection, in the
/// order of its ascending IDs.
///
/// The model is an MLP ("mlp:IN-H1-...-OUT") whose first layer is block-diagonal: each party's
/// bottom model is linear(IN/2 -> H1/2) and ReLU over its own features; the top model (the
/// rest of the MLP: linear(H1 -> H2), ...) sits at A on the two cut layers side by side, A's
/// first. Each step B sends its cut-layer activations for the batch, A sends back their
/// gradient (with Gaussian noise of `cut_noise` per element when set), and each party takes a
/// plain SGD step on its own parameters. The parties are actors of their own kinds
/// (feature_party, label_party) exchanging these as messages.
///
/// Label leakage: the norm attack of Li et al. (ICLR 2022): B scores each example by the L2
/// norm of the cut-layer gradient it receives; the summary reports the AUC of that score for
/// the one-vs-rest label "the example is of class `leakage_class`", over the last epoch's
/// steps (each aligned example once), for the gradients without noise and, with `cut_noise`,
/// for the noised ones B receives.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe {
struct labelled_data;
}

namespace troupe::federated {

struct vertical_options {
  std::string model = "mlp:784-100-10";  ///< an MLP with at least two layers and an even first hidden width
  double overlap = 0.9;    ///< fraction of the training examples in each party's ID set, in (0, 1]
  int epochs = 5;          ///< passes over the aligned examples
  int batch = 10;
  double lr = 0.05;
  std::uint64_t seed = 0;  ///< the ID sets, the weights, the batches and the noise
  double cut_noise = 0;    ///< standard deviation of the noise on the cut-layer gradients sent to B
  /// The class of the one-vs-rest label the norm attack targets; < 0: class 6 (Fashion-MNIST's
  /// shirts, the class it finds best, as the hardest class has the largest gradients), or the
  /// last class of data with fewer.
  int leakage_class = -1;
  int eval_every = 1;      ///< evaluate every N epochs (and after the last)
  bool centralised = true; ///< also train the same model on the same batches in one place
  unsigned threads = 0;    ///< threads of the PSI (0: one per hardware thread)
  std::size_t train_limit = 0, test_limit = 0;  ///< first N examples only (0: all)
  std::string data_dir, data;  ///< as simulation_options' (empty: Fashion-MNIST)
};

/// The layer sizes an MLP spec gives the two bottoms and the top: throws std::invalid_argument,
/// saying what to change, for a spec that cannot be split (not "mlp:", one layer, an odd input
/// or first hidden width) or whose input is not `features`.
struct vertical_shape {
  std::int64_t in_a = 0, in_b = 0, cut = 0;  ///< per party: its features, its cut width
  std::string top;                           ///< "mlp:2cut-...-OUT" or, for one layer, a linear
};
vertical_shape split_shape(const std::string& model, std::int64_t features);

/// A party's bottom model: linear(in -> cut), ReLU, trained by plain SGD. One thread at a time.
class split_bottom {
public:
  split_bottom(std::int64_t in, std::int64_t cut, std::uint64_t seed, double lr);
  /// Activations [rows, cut] of x [rows, in]; keeps what backward needs.
  tensor forward(const tensor& x);
  /// Accumulates the parameters' gradients from the activations' gradient [rows, cut].
  void backward(const tensor& dh);
  /// SGD step on the accumulated gradients, which it then zeroes.
  void step();
  kernels::sequential& model() noexcept { return *model_; }

private:
  std::unique_ptr<kernels::sequential> model_;
  std::unique_ptr<kernels::optimizer> opt_;
  kernels::saved_activations keep_;
};

/// The top model at the label party, on the cut layers side by side. One thread at a time.
class split_top {
public:
  split_top(const vertical_shape& shape, std::uint64_t seed, double lr);
  struct outcome {
    double loss_sum = 0;   ///< summed over the rows
    tensor dh;             ///< gradient of the batch's mean loss for h [rows, 2 cut]
  };
  /// Forward, mean softmax cross-entropy against `labels` (u8 [rows]), backward: accumulates
  /// the top's gradients and returns the cut layers'.
  outcome forward_backward(const tensor& h, const tensor& labels);
  /// Logits of h, nothing kept.
  tensor logits(const tensor& h);
  void step();
  kernels::sequential& model() noexcept { return *model_; }

private:
  std::unique_ptr<kernels::sequential> model_;
  std::unique_ptr<kernels::optimizer> opt_;
  kernels::saved_activations keep_;
};

/// [a | b]: the rows of a and b side by side (same row count).
tensor concat_columns(const tensor& a, const tensor& b);
/// Columns [begin, end) of x.
tensor columns_of(const tensor& x, std::int64_t begin, std::int64_t end);

/// The whole model split learning trains: the MLP `shape` comes from, its first layer
/// block-diagonal (A's bottom weights on A's features and units, B's on B's, zeros elsewhere;
/// its input is A's features then B's), the rest the top's weights.
std::unique_ptr<kernels::sequential> block_diagonal_model(const vertical_shape& shape, split_bottom& a,
                                                          split_bottom& b, split_top& top);
/// Zeroes the gradients of the whole model's first-layer weights off the two blocks, so that a
/// step keeps it block-diagonal.
void mask_off_block_gradients(kernels::sequential& whole, const vertical_shape& shape);

/// The features of each party: positions in an example's flattened features, ascending.
struct feature_split {
  std::vector<std::int64_t> a, b;
};
/// Left and right half of the columns for images [N, H, W] (W even), else the first and
/// second half of the features (an even number).
feature_split split_features(const labelled_data& data);

/// What a vertical run reports.
struct vertical_summary {
  std::size_t ids_a = 0, ids_b = 0, psi_intersection = 0;
  double psi_seconds = 0;
  std::size_t psi_bytes = 0;         ///< the PSI transcript
  int leakage_class = 0;             ///< the class the AUCs are for
  double final_accuracy = 0, final_loss = 0;
  double centralised_accuracy = -1;  ///< < 0: not trained
  std::int64_t steps = 0;
  double bytes_per_step = 0;         ///< both directions: batch positions, activations, gradients
  double label_leakage_auc = 0;
  double label_leakage_auc_noised = -1;  ///< < 0: no noise
  double seconds = 0;
};

struct vertical_progress {
  int epoch = 0, epochs = 0;
  double accuracy = 0, loss = 0, train_loss = 0, seconds = 0;
};

/// Runs the whole protocol: ID sets, PSI, training, evaluation, the centralised baseline.
/// Throws std::invalid_argument for bad options.
vertical_summary run_vertical(const vertical_options& options,
                              const std::function<void(const vertical_progress&)>& report = {});

/// The AUC of `scores` for the binary labels (Mann-Whitney U / (positives * negatives), a tie
/// counting one half): the probability that a random positive scores above a random negative.
/// Throws std::invalid_argument when the sizes differ or a class is absent.
double roc_auc(std::span<const double> scores, std::span<const std::uint8_t> positive);

}  // namespace troupe::federated
