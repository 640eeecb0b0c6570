#pragma once
// The client model the image trainers step (the mlp trainer, --continual's): the options' model
// spec built with kernels' layers, its optimizer with the clients' state storage, and the
// classifier that steps them, checked against the images' size and classes.

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::federated::detail {

struct classifier_stack {
  /// Throws std::invalid_argument naming the spec when the model does not fit images of `pixels`
  /// pixels and `classes` classes. `on_device`: the model moves to --device.
  classifier_stack(const simulation_options& o, int pixels, int classes, bool on_device);

  /// The initial global model: the saved one with --finetune-from, else a fresh one from `seed`.
  void initial_weights(std::span<float> out, std::uint64_t seed) const;

  std::string spec, finetune_from;
  std::unique_ptr<kernels::sequential> model;
  std::unique_ptr<kernels::optimizer> opt;
  std::unique_ptr<kernels::classifier> net;
};

}  // namespace troupe::federated::detail
