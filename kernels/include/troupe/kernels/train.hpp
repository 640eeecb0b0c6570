#pragma once
/// @file
/// Training of a model on a dataset: what `troupe train` runs. The loop (data, epochs, progress,
/// test accuracy, saving) is here; how a step runs is an engine: the whole model in this thread
/// by default, or a pipeline of stage actors (troupe/pipeline/runtime.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::kernels {

class layer;
class sequential;

/// What one training step did.
struct step_outcome {
  double loss = 0;      ///< the batch's mean loss
  bool applied = true;  ///< false: the optimizer skipped the step (its gradients were not finite)
};

/// Runs train()'s steps.
class train_engine {
public:
  virtual ~train_engine() = default;
  /// One optimizer step on a batch (rows a multiple of granule()).
  virtual step_outcome step(const tensor& x, const tensor& labels) = 0;
  /// The logits of `x`, without training.
  virtual tensor predict(const tensor& x) = 0;
  /// Copies the trained values into the model train() built (before it saves them).
  virtual void sync(layer& model) = 0;
  /// Batches must have a multiple of this many rows (the last batch of an epoch is cut to one).
  virtual std::int64_t granule() const { return 1; }
};

/// What an engine starts from: the model, initialized (or loaded), its layer sizes, and the
/// optimizer train() configured from its options.
struct engine_setup {
  sequential& model;
  std::vector<std::int64_t> sizes;  ///< mlp_sizes of the model spec
  optimizer_kind kind = optimizer_kind::adamw;
  hyperparameters hp;
  state_options state;
  double cosine_steps = 0;  ///< not 0: the lr follows cosine_lr(cosine_steps) (at least 1); 0: constant
};
using engine_factory = std::function<std::unique_ptr<train_engine>(const engine_setup&)>;

struct train_options {
  std::string dataset = "fashion-mnist";
  std::string data_dir;  ///< empty: the dataset's default location
  std::string model = "mlp:784-256-128-10";
  std::string optimizer = "adamw";
  std::string state = "auto";  ///< optimizer state storage: fp32, bf16, int8 or auto (see optim.hpp)
  std::vector<std::string> fp32_params;  ///< parameters kept in fp32 whatever `state` says ("0.weight")
  int epochs = 8;
  int batch = 64;
  std::uint64_t seed = 0;
  double lr = 1e-3;
  std::optional<double> weight_decay;  ///< unset: 0.01 for adam and adamw, 0 for sgd
  bool cosine = true;  ///< decay the lr to zero along a half cosine over the run
  std::string save;    ///< write the trained weights here (see weights.hpp); empty: do not
  std::string load;    ///< start from these weights instead of a fresh initialization
};

/// Reported as training goes.
struct train_progress {
  int epoch = 0;          ///< 1-based
  std::int64_t step = 0;  ///< within the epoch, 1-based
  std::int64_t steps = 0;
  double loss = 0;         ///< running mean over the epoch so far
  double samples_per_s = 0;
  bool epoch_done = false;
  double test_accuracy = 0;  ///< set when epoch_done
};

struct train_result {
  double test_accuracy = 0;
  double samples_per_s = 0;  ///< training samples per second of training time
  double seconds = 0;        ///< wall time of the whole run, evaluation included
  std::vector<double> epoch_accuracy;
  std::int64_t skipped_steps = 0;  ///< steps the optimizer skipped: their gradients were not finite
};

/// Trains; throws std::invalid_argument for bad options and std::runtime_error for missing data.
/// `make_engine` empty: the whole model steps in this thread.
train_result train(const train_options& options, const std::function<void(const train_progress&)>& report = {},
                   const engine_factory& make_engine = {});

}  // namespace troupe::kernels
