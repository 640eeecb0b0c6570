#pragma once
/// @file
/// Single-process training of a model on a dataset: what `troupe train` runs.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace troupe::kernels {

struct train_options {
  std::string dataset = "fashion-mnist";
  std::string data_dir;  ///< empty: the dataset's default location
  std::string model = "mlp:784-256-128-10";
  std::string optimizer = "adamw";
  std::string state = "auto";  ///< optimizer state storage: fp32, bf16, int8 or auto (see optim.hpp)
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
};

/// Trains; throws std::invalid_argument for bad options and std::runtime_error for missing data.
train_result train(const train_options& options,
                   const std::function<void(const train_progress&)>& report = {});

}  // namespace troupe::kernels
