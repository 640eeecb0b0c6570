#pragma once
// The CUDA paths of the kernels module behind plain C++ declarations (no CUDA headers here):
// optim_cuda*.cu and layers_cuda.cu implement them in a build with TROUPE_WITH_CUDA, cuda_none.cpp
// in one without (where no device tensor can exist, so every call is a logic error that throws).
//
// Every function runs on the legacy default stream of the device it is given and returns when
// the work is queued; a result that comes back to the host (a flag, a loss) synchronizes.
// Errors are std::runtime_error naming the CUDA call.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::kernels::cuda {

// ---- optimizer -------------------------------------------------------------------------------

/// How a moment is stored: the values of optimizer::moment::mode.
enum : std::uint8_t { store_none = 0, store_fp32 = 1, store_bf16 = 2, store_int8 = 3 };

struct moment_ref {
  void* data = nullptr;      ///< f32, bf16 words or 8-bit codes
  float* scales = nullptr;   ///< int8: one per block
  std::uint8_t mode = store_none;
  bool is_signed = true;     ///< int8: which dynamic map
  std::uint32_t key = 0;     ///< stochastic rounding
};

/// The per-tensor constants of the host's step (adam_constants and sgd_constants, optim_step.hpp).
struct update_constants {
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0, step_size = 0, inv_bias2_sqrt = 1,
        decay = 1, l2 = 0;
  float lr = 0, momentum = 0, one_minus_dampening = 1, wd = 0;
  float gscale = 1;
  bool nesterov = false;
  bool first = false;  ///< SGD: the momentum buffer starts from this gradient
};

/// One parameter tensor of a step.
struct tensor_update {
  float* p = nullptr;
  const float* g = nullptr;
  std::int64_t n = 0;
  std::int64_t block = 0;  ///< elements per scale of its 8-bit moments (0: none is 8-bit)
  moment_ref m, v, x;      ///< Adam: moments and AMSGrad maximum; SGD: m is the momentum buffer
  update_constants c;
  bool stochastic = false;
  /// 8-bit blocks scaled by this percentile of their new values' magnitudes (quant::block_scale's
  /// selection); 0: by their absmax.
  double percentile = 0;
};

/// Largest 8-bit block the CUDA step handles (a thread block of 512 threads holds a block's new
/// values in registers, 8 per thread).
constexpr std::int64_t max_int8_block = 4096;

/// True when no element of gradient k has a float exponent field (bits & 0x7f800000) at or
/// above limits[k]: 0x7f800000 refuses NaN and infinity; (127 + 63) << 23 also a magnitude of
/// 2^63 or more (one pass over all of them; synchronizes).
bool all_finite(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                const std::vector<std::uint32_t>& limits, int device);

/// Per gradient k, the sum of its squares in double as the host's optimizer computes it (pieces
/// of 65,536 elements, each the sum of its 16 residue classes summed in order, the pieces added in
/// order): the same bits. Synchronizes.
std::vector<double> sums_of_squares(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                                    int device);

/// all_finite and optimizer_step in one go, with no wait between them: the step's kernels read
/// the check's flag on the device and change nothing when it is set. Returns whether the step
/// was applied (waits for the check alone, not for the step).
bool checked_step(bool sgd, const std::vector<tensor_update>& tensors, const std::vector<const float*>& grads,
                  const std::vector<std::int64_t>& sizes, const std::vector<std::uint32_t>& limits, int device);

/// One fused optimizer step over every tensor (SGD when `sgd`, else Adam/AdamW by the constants):
/// one launch for the tensors without 8-bit moments, one for those with (a thread block per
/// quantization block). Throws std::invalid_argument for an 8-bit block over max_int8_block.
void optimizer_step(bool sgd, const std::vector<tensor_update>& tensors, int device);

/// Sets `bytes` at `p` on `device` to zero.
void fill_zero(void* p, std::size_t bytes, int device);

/// Free memory on `device` in bytes, as the driver reports it (blocks kept by the caching
/// allocator count as used).
std::size_t free_memory(int device);

// ---- layers (f32, row-major, contiguous; all pointers on `device`) ----------------------------

/// C[m, n] = alpha * op(A) * op(B) + beta * C through cuBLAS (a handle per device, made at first use).
void gemm(int device, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);
/// y[i, j] += bias[j].
void add_bias_rows(int device, float* y, const float* bias, std::int64_t rows, std::int64_t cols);
/// grad[j] += sum over i of dy[i, j].
void accumulate_column_sums(int device, const float* dy, float* grad, std::int64_t rows, std::int64_t cols);

enum class activation : std::uint8_t { relu, gelu };
/// y = f(x).
void activation_forward(int device, activation f, const float* x, float* y, std::int64_t n);
/// dx = dy * f'(kept): kept is the output for ReLU, the input for GELU (as layers.cpp keeps them).
void activation_backward(int device, activation f, const float* kept, const float* dy, float* dx, std::int64_t n);
/// out = a + b, element by element.
void add(int device, const float* a, const float* b, float* out, std::int64_t n);
/// y = x times dropout_mask's mask of `key` (scale where kept, 0 where dropped).
void dropout(int device, std::uint64_t key, double p, float scale, const float* x, float* y, std::int64_t n);

/// Layer norm of each row (double accumulation, as layers.cpp): y, x-hat and 1/std.
void layer_norm_forward(int device, const float* x, const float* gamma, const float* beta, float eps, float* y,
                        float* xhat, float* rstd, std::int64_t rows, std::int64_t cols);
void layer_norm_backward_input(int device, const float* dy, const float* xhat, const float* rstd, const float* gamma,
                               float* dx, std::int64_t rows, std::int64_t cols);
/// gamma_grad[j] += sum dy * xhat; beta_grad[j] += sum dy.
void layer_norm_backward_weight(int device, const float* dy, const float* xhat, float* gamma_grad, float* beta_grad,
                                std::int64_t rows, std::int64_t cols);

/// Mean softmax cross-entropy of logits [n, c] against int64 labels (on the device); writes
/// d loss / d logits. Returns the loss, or throws std::invalid_argument naming the first label
/// outside 0..c-1 (synchronizes).
double softmax_cross_entropy(int device, const float* logits, const std::int64_t* labels, float* dlogits,
                             std::int64_t n, std::int64_t c);

}  // namespace troupe::kernels::cuda
