#pragma once
/// @file
/// Federated learning across clients of different model architectures, by knowledge
/// distillation (`--client-models SPEC,SPEC,...`, assigned to the clients round-robin):
///
///   fedavg  FedAvg within each architecture: each keeps its own global model, averaged over
///           the round's clients of that architecture (the baseline).
///   feddf   FedDF (Lin et al., NeurIPS 2020): FedAvg within each architecture, then each
///           architecture's model is distilled on unlabeled proxy data (held out of the training
///           set) towards the ensemble of the round's client models, the mean of their logits:
///           KL(softmax(t / T) || softmax(s / T)), Adam.
///   fedmd   FedMD (Li and Wang, 2019): no averaging of parameters; each client keeps its own
///           model. Transfer learning first (its model trained on the public labelled set, held
///           out of the training set, then on its own data); then each round the sampled
///           clients' logits on a public subset are averaged into the consensus, each digests
///           it (L1 between its logits and the consensus on that subset) and revisits its own
///           data.
///
/// The server's proxy / public set is the last `public_examples` training examples (after
/// --train-limit); the clients' data is partitioned from the rest.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/federated/simulation.hpp"

namespace troupe::federated {

/// "SPEC,SPEC,..." split at the commas outside parentheses (layer descriptions hold commas).
/// Throws std::invalid_argument for an empty list or piece and unbalanced parentheses.
std::vector<std::string> split_model_list(const std::string& list);

/// mean over rows of T^2 KL(softmax(t_i / T) || softmax(s_i / T)) (Hinton et al.'s scale); when
/// ds is not null, writes its gradient with respect to the student logits s [rows, classes].
double kl_distillation(const float* student, const float* teacher, int rows, int classes, double temperature, float* ds);
/// mean over rows and classes of |s - t|; when ds is not null, writes its gradient (sign / n,
/// 0 where equal).
double l1_distillation(const float* student, const float* teacher, int rows, int classes, float* ds);
/// out = the element-wise mean of the logit blocks (all the same size), summed in order.
void mean_logits(std::span<const std::vector<float>> blocks, std::vector<float>& out);

/// A model of one architecture with its own Adam optimizer, for logits and distillation steps
/// (FedDF's server, FedMD's digest).
class distiller {
public:
  /// Throws std::invalid_argument as detail::make_model does, and when the model does not take
  /// `inputs` features.
  distiller(const std::string& spec, std::int64_t inputs, double lr);
  ~distiller();
  std::size_t parameter_count() const;
  void load(std::span<const float> flat);
  void store(std::span<float> flat) const;
  /// Logits of `rows` rows x [rows, inputs] into out [rows, classes].
  void logits(const float* x, int rows, std::vector<float>& out);
  int classes() const noexcept { return classes_; }
  enum class loss { kl, l1 };
  /// One Adam step towards the teacher logits on x; returns the loss before the step.
  double step(const float* x, const float* teacher, int rows, loss kind, double temperature = 1.0);
  /// Forgets the Adam moments (a fresh distillation).
  void reset();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  int classes_ = 0;
};

/// How far a heterogeneous run got (run_heterogeneous's report).
struct heterogeneous_progress {
  int round = 0;
  int rounds = 0;
  bool evaluated = false;
  std::vector<double> accuracies;  ///< per architecture (fedmd: mean over its clients) when evaluated
  double train_loss = 0;
  double distill_loss = 0;          ///< feddf: the last distillation step's, per architecture mean
  double seconds = 0;
};

struct heterogeneous_summary {
  int rounds = 0;
  std::vector<std::string> models;
  std::vector<double> accuracies;  ///< final, per architecture
  double mean_accuracy = 0;
  double seconds = 0;
  double peak_rss_mb = 0;
};

/// Runs options.rounds rounds of options.strategy ("fedavg", "feddf" or "fedmd") over the
/// architectures of `models` (split_model_list of --client-models). Throws std::invalid_argument
/// for options it cannot take (mechanisms, other strategies, asynchronous rounds...).
heterogeneous_summary run_heterogeneous(const simulation_options& options, const std::vector<std::string>& models,
                                        const std::function<void(const heterogeneous_progress&)>& report = {},
                                        shared_data data = nullptr);

}  // namespace troupe::federated
