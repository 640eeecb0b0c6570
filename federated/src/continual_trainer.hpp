#pragma once
// --continual's trainer: the options' MLP trained by SGD as the mlp trainer does, on the task of
// the job's round (its permutation, or its classes), with EWC's gradient term or GPM's projection
// at every step; and the clients' part of the consolidation at each task's end (their Fisher
// diagonal, their GPM summaries). The state the clients read (the penalty, the bases) is shared
// by every trainer of one factory and written by the server between rounds only.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "batches.hpp"
#include "classifier_stack.hpp"
#include "troupe/federated/continual.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated::detail {

/// Shared by the trainers of one factory. The server writes it between rounds (consolidation,
/// tasks_seen); the clients read it while they train.
struct continual_state {
  continual_tasks tasks;
  continual_method method;
  int task_rounds = 0;
  std::uint64_t seed = 0;  // of the permutations (stream_continual)
  /// EWC's penalty as a proximal step after each plain SGD step (ewc_penalty::proximal); with
  /// another client optimizer its gradient is added to the step's.
  bool ewc_proximal = true;
  /// Tasks whose test accuracy evaluations report (those trained so far, the current one included).
  std::atomic<int> seen{1};
  ewc_penalty ewc;
  /// GPM: per linear layer, the basis (double) and its float copy for the steps.
  std::vector<gpm_basis> bases;
  std::vector<std::vector<float>> bases_f;
  /// Bytes the consolidations' messages took (Fisher diagonals, GPM summaries).
  std::uint64_t uplink_bytes = 0;

  /// The task a round trains (1-based rounds; rounds past the last task train the last).
  int task_of(int round) const {
    const int t = round <= 0 ? 0 : (round - 1) / task_rounds;
    return t < tasks.tasks ? t : tasks.tasks - 1;
  }
};

class continual_trainer final : public local_trainer {
public:
  continual_trainer(shared_data data, const simulation_options& o, std::shared_ptr<continual_state> state);
  std::size_t dim() const override { return stack_.net->parameter_count(); }
  std::span<float> working_model() override { return stack_.net->flat_parameters(); }
  void initialize(std::span<float> model, std::uint64_t seed) override;
  local_result train(const local_job& job, std::span<float> model, splitmix64& rng) override;
  /// "accuracy": the mean over the tasks seen so far; "task_J_accuracy" for each (J from 1).
  evaluation evaluate(std::span<const float> model) override;
  void check_optimizer_state(std::span<const std::byte> state) override;

  const std::shared_ptr<continual_state>& state() const noexcept { return state_; }
  /// The linear layers' sizes: inputs (without the bias) and outputs, first layer first.
  const std::vector<std::pair<std::size_t, std::size_t>>& layer_sizes() const noexcept { return sizes_; }

  /// A client's part of EWC's consolidation: n F (the sum over its examples of `task` in `shard`
  /// of the squared gradient of the log-likelihood at `model`) into `sum` (resized to dim()).
  /// Returns n.
  std::size_t fisher_sum(std::span<const std::uint32_t> shard, int task, std::span<const float> model,
                         std::vector<double>& sum);
  /// A client's part of GPM's: the inputs of every linear layer (a trailing 1 appended) for up
  /// to `limit` of its examples of `task` (a seeded choice from `rng`), as rows.
  std::vector<std::vector<double>> layer_inputs(std::span<const std::uint32_t> shard, int task, std::span<const float> model,
                                                std::size_t limit, splitmix64& rng, std::size_t& rows);
  /// Projects the change of the model since `before` off the bases (the fast path: GEMMs).
  void project_step(const float* before);

private:
  /// The examples of `shard` that belong to `task` (split: of its classes; permuted: all).
  std::span<const std::uint32_t> task_rows(std::span<const std::uint32_t> shard, int task);
  /// Reorders the pixels of `rows` rows in batches_.x() by the task's permutation.
  void permute(int task, std::size_t rows);
  /// Accuracy and loss of the loaded model on task `task`'s test examples.
  evaluation evaluate_task(int task);

  shared_data data_;
  image_batches batches_;
  classifier_stack stack_;
  std::shared_ptr<continual_state> state_;
  std::size_t test_limit_;
  int pixels_ = 0;
  std::vector<std::vector<std::uint32_t>> perms_;  // per task (permuted)
  std::vector<std::pair<std::size_t, std::size_t>> sizes_;  // per linear layer: in, out
  std::vector<std::size_t> offsets_;                        // per linear layer: its weight's flat offset
  std::vector<std::uint32_t> order_, rows_, test_rows_;
  std::vector<float> pixel_scratch_, correction_, before_;
  tensor d_, t_;                  // GPM's scratch: [dW | db] and its product with M
  std::vector<tensor> m_;         // per layer: M^T as a tensor
  std::vector<std::size_t> m_k_;  // its columns
};

/// The factory of continual_trainers sharing one state.
trainer_factory make_continual_trainer_factory(const simulation_options& o);

}  // namespace troupe::federated::detail
