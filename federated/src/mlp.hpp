#pragma once
// A multilayer perceptron (linear layers with ReLU between them) trained by plain SGD on one
// flat parameter vector, laid out as kernels::sequential::parameters() lists an MLP's
// parameters: W1 [out, in], b1 [out], W2 [out, in], b2 [out], ...
//
// Two implementations of a training step:
//   step_reference  plain loops: forward, full gradient, then the update, in the textbook order
//   step_fast       AVX2 with FMA or AVX-512 (mlp_rows.inc, written once for both), batches of
//                   at most 16 rows: per weight row, the input gradient
//                   (with the old row), the row's gradient and its update in one pass; the
//                   first layer's input gradient is never computed
// step() takes the fast one when the CPU has AVX2 and the batch fits, the reference
// otherwise. Tests compare both, and the reference with kernels::sequential + optimizer (SGD).
// Tolerance: abs 1e-5 + rel 1e-4 after a few steps (summation orders differ).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::federated::detail {

/// Additions to every gradient (FedProx's proximal term, SCAFFOLD's correction).
struct gradient_extras {
  float mu = 0;                        ///< gradient += mu * (w - center) when center is set
  const float* center = nullptr;       ///< dim floats
  const float* correction = nullptr;   ///< dim floats added to the gradient
};

class flat_mlp {
public:
  /// Layer sizes, input first: {784, 100, 10}.
  explicit flat_mlp(std::vector<int> sizes);
  /// From "mlp:784-100-10" (parsed by kernels::make_mlp, whose errors it passes on).
  static flat_mlp from_spec(const std::string& spec);

  std::size_t dim() const noexcept { return dim_; }
  const std::vector<int>& sizes() const noexcept { return sizes_; }
  int inputs() const noexcept { return sizes_.front(); }
  int outputs() const noexcept { return sizes_.back(); }

  /// One SGD step on the batch x [rows, inputs] with `labels`: w -= lr * (mean-loss gradient +
  /// extras). Returns the summed (not mean) loss of the rows.
  double step(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
              const gradient_extras& extras = {});
  double step_reference(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                        const gradient_extras& extras = {});
  double step_fast(float* w, const float* x, const std::uint8_t* labels, int rows, float lr,
                   const gradient_extras& extras = {});

  /// Forward only: adds the rows' summed loss to `loss` and their correct predictions to
  /// `correct`.
  void evaluate(const float* w, const float* x, const std::uint8_t* labels, int rows,
                double& loss, std::int64_t& correct);

  /// True when step() takes step_fast (AVX2 with FMA, or AVX-512; any batch size).
  static bool fast_available() noexcept;
  /// The instruction set step_fast uses: 2 AVX-512, 1 AVX2 with FMA, 0 none (the reference);
  /// the CPU's best, lowered by limit_simd().
  static int simd_level() noexcept;
  /// Caps simd_level() at `level` (so that tests run every path); returns the previous cap.
  static int limit_simd(int level) noexcept;
  /// Rows per backward tile of step_fast (larger batches go through in tiles).
  static constexpr int backward_tile = 16;

private:
  void reserve(int rows);
  /// logits -> loss sum and dZ = (softmax - onehot) / rows (when dz is not null).
  double softmax_loss(const float* logits, const std::uint8_t* labels, int rows, float* dz,
                      std::int64_t* correct) const;

  std::vector<int> sizes_;
  std::vector<std::size_t> w_offset_, b_offset_;
  std::size_t dim_ = 0;
  int capacity_ = 0;
  std::vector<std::vector<float>> act_;  // act_[l]: the input of layer l (l >= 1), [rows, sizes_[l]]
  std::vector<float> logits_, dz_, dz_prev_, da_, grad_;
};

}  // namespace troupe::federated::detail
