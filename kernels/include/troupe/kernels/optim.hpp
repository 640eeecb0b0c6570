#pragma once
/// @file
/// Optimizers with PyTorch's torch.optim update rules: SGD (momentum, dampening, Nesterov,
/// weight decay), Adam (L2 weight decay) and AdamW (decoupled weight decay), with AMSGrad.
///
/// Each step is one fused pass over every parameter (the fast path); `reference_step` performs
/// the same arithmetic operation by operation, as torch.optim's single-tensor code does, and is
/// the definition of correctness: both give bit-identical results (tests compare them).
///
/// State is fp32 for now. Non-finite gradients: by default a step whose gradients hold a NaN or
/// an infinity changes nothing (parameters and state stay as they were), returns false and is
/// counted in skipped(); the step count does not advance.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/kernels/layers.hpp"

namespace troupe::kernels {

enum class optimizer_kind { sgd, adam, adamw };

/// "sgd", "adam", "adamw"; throws std::invalid_argument otherwise.
optimizer_kind parse_optimizer_kind(const std::string& name);

struct hyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< Adam, AdamW
  double weight_decay = 0;  ///< L2 for SGD and Adam, decoupled for AdamW
  double momentum = 0, dampening = 0;  ///< SGD
  bool nesterov = false;  ///< SGD (needs momentum > 0 and dampening 0)
  bool amsgrad = false;   ///< Adam, AdamW
};

/// Parameters that share hyperparameters.
struct param_group {
  std::vector<parameter*> params;
  hyperparameters hp;
};

class optimizer {
public:
  /// Throws std::invalid_argument for hyperparameters torch.optim refuses (negative lr, betas
  /// outside [0, 1), Nesterov without momentum or with dampening, ...).
  optimizer(optimizer_kind kind, std::vector<param_group> groups);

  /// Steps every parameter with its gradient. False when a gradient was not finite (nothing
  /// changed; see the file comment).
  bool step();
  /// The same step, performed operation by operation (slow; the definition of correctness).
  bool reference_step();
  /// Sets every gradient to zero.
  void zero_grad();

  /// Called before each step with the step number (1-based) and the group's base lr; returns the
  /// lr to use. Unset: the base lr.
  void set_lr_schedule(std::function<double(std::int64_t step, double base_lr)> schedule);

  std::int64_t steps() const noexcept { return steps_; }
  std::int64_t skipped() const noexcept { return skipped_; }
  /// Bytes of optimizer state (moments, maxima, momentum buffers).
  std::size_t state_bytes() const noexcept;
  optimizer_kind kind() const noexcept { return kind_; }
  std::vector<param_group>& groups() noexcept { return groups_; }

private:
  struct slot {
    parameter* p;
    std::size_t group;
    tensor m, v, vmax;  // Adam: moments and the AMSGrad maximum; SGD: m is the momentum buffer
  };
  bool grads_finite() const;
  bool do_step(bool reference);

  optimizer_kind kind_;
  std::vector<param_group> groups_;
  std::vector<slot> slots_;
  std::function<double(std::int64_t, double)> schedule_;
  std::int64_t steps_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace troupe::kernels
