#pragma once
/// @file
/// Training a classifier one batch at a time: any `sequential` on softmax cross-entropy, its
/// gradient (plus optional extra terms), then the optimizer's step. This is the step every
/// federated client takes.
///
///   classifier c(model, opt);
///   auto r = c.step(x, labels, rows);           // x: rows x inputs floats, labels: u8
///
/// Two implementations of a step:
///   step_reference  the layers' forward and backward, the terms added to the gradients, then
///                   optimizer::step(): the definition of correctness
///   step_fused      for an MLP (linear layers with ReLU between them, as make_mlp builds) on
///                   the host, trained by plain SGD (no momentum, no weight decay, no schedule):
///                   AVX2 with FMA or AVX-512, per weight row the input gradient (with the old
///                   row), the row's gradient and its update in one pass; the first layer's
///                   input gradient is never computed. Batches above backward_tile rows go
///                   through in tiles.
/// step() takes the fused one when it applies (fused_available()), the reference otherwise.
/// Tests compare both on fresh random data: abs 1e-5 + rel 1e-4 after a few steps (the
/// summation orders differ).
///
/// A step whose gradients are not finite changes nothing and reports applied = false, as
/// optimizer::step does; the fused step decides it from the loss (a finite loss means finite
/// logits, output gradient and activations) before any weight changes, so a gradient that
/// overflows from finite inputs, or a term that is not finite, shows in the weights instead.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/kernels/layers.hpp"
#include "troupe/kernels/optim.hpp"

namespace troupe::kernels {

/// Added to every gradient before the update: g += mu * (w - center) + correction, where w,
/// center and correction run over the model's parameters in parameters() order as one flat
/// vector (FedProx's proximal term, SCAFFOLD's correction).
struct gradient_terms {
  float mu = 0;
  const float* center = nullptr;      ///< with mu: one float per parameter number, or null
  const float* correction = nullptr;  ///< one float per parameter number, or null
};

struct batch_outcome {
  double loss_sum = 0;  ///< the rows' summed (not mean) loss
  bool applied = true;  ///< false: the gradients were not finite and nothing changed
};

/// Not thread-safe: one thread steps it (it keeps scratch buffers).
class classifier {
public:
  /// `model` and `opt` must outlive the classifier; `opt` must hold the model's parameters.
  /// Throws std::invalid_argument when the model has no parameters, does not take rows of
  /// `inputs` features (a forward of one row is tried), or gives fewer than 2 or more than 256
  /// classes.
  classifier(sequential& model, optimizer& opt, std::int64_t inputs);
  ~classifier();
  classifier(const classifier&) = delete;
  classifier& operator=(const classifier&) = delete;

  /// One step on x [rows, inputs] and labels [rows]: the gradient of the batch's mean loss plus
  /// `terms`, then the optimizer's step. Throws std::invalid_argument for a label outside the
  /// classes or a row count below 1.
  batch_outcome step(const float* x, const std::uint8_t* labels, int rows, const gradient_terms& terms = {});
  batch_outcome step_reference(const float* x, const std::uint8_t* labels, int rows, const gradient_terms& terms = {});
  /// Throws std::logic_error unless fused_available().
  batch_outcome step_fused(const float* x, const std::uint8_t* labels, int rows, const gradient_terms& terms = {});

  /// Forward only: adds the rows' summed loss to `loss_sum` and their correct predictions to
  /// `correct`; when `errors` is not null, writes each row's 0/1 error (1: the top logit is not
  /// its label) to errors[0..rows).
  void evaluate(const float* x, const std::uint8_t* labels, int rows, double& loss_sum, std::int64_t& correct,
                std::uint8_t* errors = nullptr);

  /// True when step() takes step_fused: the CPU has AVX2 with FMA (see simd_level), the model is
  /// an MLP on the host and the optimizer plain SGD over exactly its parameters with one lr.
  bool fused_available() const;
  std::int64_t inputs() const noexcept { return inputs_; }
  std::int64_t classes() const noexcept { return classes_; }
  /// Numbers in the model's parameters.
  std::size_t parameter_count() const noexcept { return count_; }
  /// Copies the parameters from / to one flat vector of parameter_count() floats (nothing to
  /// copy when `values` is flat_parameters() itself).
  void load_flat(const float* values);
  void store_flat(float* values) const;
  /// The parameters themselves as one flat vector: the classifier keeps them as views of one
  /// block, in parameters() order. Empty when they live on a device.
  std::span<float> flat_parameters() noexcept;

  /// The instruction set step_fused uses: 2 AVX-512, 1 AVX2 with FMA, 0 none; the CPU's best,
  /// lowered by limit_simd() (so that tests run every path). limit_simd returns the old cap.
  static int simd_level() noexcept;
  static int limit_simd(int level) noexcept;
  /// Rows per backward tile of step_fused.
  static constexpr int backward_tile = 16;

private:
  void check_batch(const float* x, const std::uint8_t* labels, int rows) const;
  /// logits [rows, classes] -> summed loss; dz = (softmax - onehot) / rows when not null.
  double softmax_loss(const float* logits, const std::uint8_t* labels, int rows, float* dz, std::int64_t* correct,
                      std::uint8_t* errors = nullptr) const;
  void reserve(int rows);

  sequential& model_;
  optimizer& opt_;
  std::vector<parameter*> params_;
  tensor flat_;  // the block every parameter's value is a view of
  std::vector<std::size_t> offset_;  // of each parameter in the flat vector
  std::size_t count_ = 0;
  std::int64_t inputs_ = 0, classes_ = 0;
  /// An MLP's layer sizes, input first (empty: the model is not one).
  std::vector<int> sizes_;
  int capacity_ = 0;
  std::vector<std::vector<float>> act_;  // act_[l]: the input of layer l (l >= 1)
  std::vector<float> logits_, dz_, dz_prev_, da_, grad_;
};

}  // namespace troupe::kernels
