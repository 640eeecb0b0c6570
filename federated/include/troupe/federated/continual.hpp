#pragma once
/// @file
/// Federated continual learning: T tasks one after another (`troupe fedsim --continual`), and two
/// ways of keeping what the earlier tasks taught (`--cl`), in their federated forms
/// (src/continual.cpp for the rules, src/continual_trainer.cpp for the clients' training and the
/// consolidation at each task's end).
///
/// - Tasks. "permuted:T": task t trains on every image with its pixels reordered by a fixed
///   permutation drawn from the run's seed (task 0 keeps the images as they are); "split:T":
///   class-incremental, task t trains on the examples of classes [t C / T, (t + 1) C / T) of the
///   C classes, and is tested on the test examples of those classes (one head over all C).
/// - ACC and BWT (Lopez-Paz and Ranzato, 2017): a[i][j] the accuracy on task j after training
///   task i; ACC = mean_j a[T-1][j], BWT = mean_{j < T-1} (a[T-1][j] - a[j][j]).
/// - EWC (Kirkpatrick et al., PNAS 2017) in FedCurv's federated form (Shoham et al., 2019): at
///   the end of task t the clients of its last round compute, at the global model theta*_t, the
///   empirical diagonal Fisher of their task examples, F_k = mean over their examples of the
///   squared gradient of the log-likelihood, and send n_k F_k with n_k; the server sums them and
///   divides by sum n_k (the Fisher of the union of their examples). From then on every client
///   adds (lambda / 2) sum_i F_i (theta_i - theta*_i)^2 to its loss, with F the earlier tasks'
///   Fisher diagonals summed and theta* the latest task's optimum (online EWC, ewc_penalty), as
///   a proximal step after each plain SGD step (a term of its gradient under another optimizer).
/// - GPM (Saha, Garg and Roy, ICLR 2021): each linear layer keeps an orthonormal basis M of the
///   inputs the earlier tasks gave it (each input with a trailing 1, so that the bias is the
///   basis's last coordinate and the whole affine output is kept). At the end of task t the
///   clients of its last round take the layer inputs of up to gpm_examples_per_client of their
///   task examples, A_k (rows: examples), subtract their projection on M (A_k - A_k M M^T) and
///   send the SVD of that residual as sigma_j v_j (their local basis scaled by its singular
///   values, every nonzero direction) with ||A_k||_F^2 and ||A_k M||_F^2. The server stacks them:
///   the stack Z has Z^T Z = sum_k of the residuals' A^T A, so its SVD is that of the stacked
///   residual, and the global basis is what a server holding every client's A would build. It adds
///   the smallest k directions whose energy, with the projected one, reaches the threshold (the
///   paper's criterion for the later tasks, which for an empty M is the first task's):
///   ||A M||^2 + sum_{i<k} sigma_i^2 >= threshold ||A||^2. Every SGD step afterwards is projected
///   off the basis: for each layer [dW | db] <- [dW | db] (I - M M^T), which for plain SGD is the
///   gradient's projection g <- g - g M M^T. A layer's outputs on the stored inputs then do not move.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace troupe::federated {

/// The tasks of `--continual`.
struct continual_tasks {
  enum class kind { permuted, split };
  kind type = kind::permuted;
  int tasks = 0;
};
/// "permuted:T" (2 <= T <= 1000) or "split:T" (2 <= T <= 256); throws std::invalid_argument
/// saying what to write otherwise.
continual_tasks parse_continual(const std::string& spec);

/// The method of `--cl`.
struct continual_method {
  enum class kind { none, ewc, gpm };
  kind type = kind::none;
  double lambda = 0;     ///< ewc: the penalty's weight (> 0)
  double threshold = 0;  ///< gpm: the energy threshold, in (0, 1)
};
/// "none", "ewc:LAMBDA" or "gpm:THRESHOLD"; throws std::invalid_argument otherwise.
continual_method parse_cl(const std::string& spec);

/// Examples of its task each client of a task's last round contributes to GPM's representation.
inline constexpr std::size_t gpm_examples_per_client = 50;

/// Task `task`'s order of `pixels` pixels: image' [j] = image[perm[j]]. The identity for task 0;
/// for later tasks a Fisher-Yates shuffle drawn from `seed` and the task.
std::vector<std::uint32_t> task_permutation(std::uint64_t seed, int task, std::size_t pixels);
/// Task `task`'s classes under split:T: [first, last).
std::pair<int, int> split_classes(int task, int tasks, int classes);

/// ACC and BWT from each task's accuracy right after its training (`after[j]` = a[j][j]) and at
/// the end (`final[j]` = a[T-1][j]). Throws std::invalid_argument for spans of different or
/// zero lengths. With one task BWT is 0.
struct continual_scores {
  double acc = 0, bwt = 0;
};
continual_scores score_tasks(std::span<const double> after, std::span<const double> final);

/// EWC's penalty over the tasks consolidated so far, in its online form (Schwarz et al., 2018,
/// with gamma = 1; Huszar, PNAS 2018): the tasks' Fisher diagonals summed, around the latest
/// optimum, (lambda / 2) sum_i (sum_t F_t,i) (theta_i - theta*_T,i)^2. The latest optimum was
/// trained under the earlier tasks' penalty and holds them; Kirkpatrick et al.'s sum of one
/// penalty per task, each around its own optimum, pulls the parameters back towards the first
/// optima and undoes what the later tasks learnt in the parameters left free.
class ewc_penalty {
public:
  /// Adds a task's Fisher diagonal to the sum and makes `optimum` the anchor (equal lengths, the
  /// model's size; std::invalid_argument otherwise).
  void add_task(std::vector<float> fisher, std::vector<float> optimum);
  std::size_t tasks() const noexcept { return tasks_; }
  /// The largest summed diagonal (the penalty's largest curvature, over lambda).
  double largest_diagonal() const;
  /// (lambda / 2) sum_i F_i (theta_i - theta*_i)^2 with F the summed diagonals, in double.
  double value(std::span<const float> theta, double lambda) const;
  /// out = lambda F (theta - theta*) (overwrites `out`).
  void gradient(std::span<const float> theta, float lambda, std::span<float> out) const;
  /// The penalty's proximal step for an SGD step of rate `lr` (theta: the model after the step on
  /// the data's loss): theta <- argmin_x ||x - theta||^2 / (2 lr) + penalty(x)
  /// = (theta + lr lambda F theta*) / (1 + lr lambda F), elementwise, computed as
  /// theta - lr lambda F (theta - theta*) / (1 + lr lambda F) (so that theta* stays put exactly).
  /// Stable for every lambda, where the explicit step diverges at lr lambda F >= 2.
  void proximal(std::span<float> theta, double lr, double lambda) const;

private:
  std::vector<float> fisher_, optimum_;
  std::size_t tasks_ = 0;
};

/// A GPM basis of one layer's (augmented) inputs: `k` orthonormal columns of `rows` numbers,
/// column j at m[j * rows].
struct gpm_basis {
  std::size_t rows = 0, k = 0;
  std::vector<double> m;
};

/// The smallest k such that projected + sum_{i<k} sigma_i^2 >= threshold * total (0 when the
/// projected energy already reaches it; sigma.size() when even all of them fall short).
std::size_t energy_rank(std::span<const double> sigma, double total, double projected, double threshold);

/// What one client sends GPM's server for one layer: its residual's directions scaled by their
/// singular values (`count` rows of `rows` numbers, row-major) and two energies.
struct gpm_summary {
  std::size_t rows = 0, count = 0;
  std::vector<double> directions;
  double total = 0;      ///< ||A||_F^2
  double projected = 0;  ///< ||A M||_F^2
  /// Bytes on the wire: 4 per number sent (the directions and the two energies).
  std::uint64_t wire_bytes() const noexcept { return 4 * (static_cast<std::uint64_t>(count) * rows + 2); }
};

/// A client's summary of its layer inputs `a` (`n` rows of basis.rows numbers, row-major, the
/// trailing 1 included) against `basis`. Throws std::invalid_argument for a span of another size.
gpm_summary gpm_summarize(std::span<const double> a, std::size_t n, const gpm_basis& basis);
/// The server's step: appends to `basis` the directions of the stacked summaries that the
/// threshold criterion keeps; returns how many were added.
std::size_t gpm_merge(gpm_basis& basis, std::span<const gpm_summary> summaries, double threshold);

/// [dW | db] <- [dW | db] - ([dW | db] M) M^T for a layer of `out` rows: `dw` is out x (rows-1)
/// row-major, `db` out numbers (the plain loops: the trainer's reference).
void gpm_project_reference(std::span<float> dw, std::span<float> db, std::size_t out, const gpm_basis& basis);

}  // namespace troupe::federated
