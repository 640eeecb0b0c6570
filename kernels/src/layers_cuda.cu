// The layers' arithmetic on a CUDA device: GEMM through cuBLAS, element-wise activations, bias and
// column sums, layer norm and softmax cross-entropy.
//
// Reference: layers.cpp and losses.cpp (and gemm.cpp's OpenBLAS product), operation for
// operation. Row reductions (layer norm, softmax) accumulate in double as the CPU does, but in a
// tree instead of a sequence, and nvcc may contract multiply-adds; column sums accumulate in
// float in row order exactly as the CPU loops do. The tests compare with the CPU layers at
// abs 1e-5 + rel 1e-4.
//
// cuBLAS is loaded at the first GPU product (dynamic_library.hpp: $TROUPE_CUBLAS_LIBRARY, the
// library CMake found, or libcublas.so.<major> on the loader's path), not linked:
// linking it makes every troupe process map and relocate its 500 MB of code, about 215 MB of
// resident memory before main() runs, whether or not it ever uses a GPU.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/core/tensor.hpp"

#include "cuda_ops.hpp"
#include "dropout_mask.hpp"
#include "dynamic_library.hpp"

namespace troupe::kernels::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}

/// The cuBLAS entry points this file uses, from the library loaded at first use.
struct cublas_api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};

const cublas_api& cublas() {
  static const cublas_api api = [] {
    const std::string versioned = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = detail::open_library("cuBLAS", "TROUPE_CUBLAS_LIBRARY", TROUPE_CUBLAS_LIBRARY,
                                     {versioned.c_str(), "libcublas.so"},
                                     "set TROUPE_CUBLAS_LIBRARY to libcublas.so." + std::to_string(CUBLAS_VER_MAJOR) +
                                         " of a CUDA " + std::to_string(CUBLAS_VER_MAJOR) + " installation");
    cublas_api a;
    a.create = reinterpret_cast<decltype(a.create)>(dlsym(lib, "cublasCreate_v2"));
    a.sgemm = reinterpret_cast<decltype(a.sgemm)>(dlsym(lib, "cublasSgemm_v2"));
    if (!a.create || !a.sgemm) throw std::runtime_error("the cuBLAS loaded lacks cublasCreate_v2 or cublasSgemm_v2");
    return a;
  }();
  return api;
}

/// One cuBLAS handle per device, made at first use and kept for the process.
cublasHandle_t handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard lock(mutex);
  if (static_cast<std::size_t>(device) >= handles.size()) handles.resize(device + 1, nullptr);
  if (!handles[device]) check(cublas().create(&handles[device]), "cublasCreate");
  return handles[device];
}

constexpr int threads = 256;

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(b, 1), 65535 * 16));
}

void launched(const char* what) { check(cudaGetLastError(), what); }

/// A size that cuBLAS takes as int, or a clear error instead of a truncated one.
int as_int(std::int64_t v, const char* what) {
  if (v < 0 || v > 0x7fffffff) throw std::invalid_argument(std::string(what) + " " + std::to_string(v) + " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

/// One thread block per row: the grid's x dimension holds at most 2^31 - 1.
unsigned row_blocks(std::int64_t rows, const char* what) {
  if (rows > 0x7fffffff) throw std::invalid_argument(std::string(what) + ": " + std::to_string(rows) + " rows exceed one launch");
  return static_cast<unsigned>(rows);
}

__global__ void bias_rows_kernel(float* y, const float* bias, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % cols];
}

// One thread per column (grid-stride), rows added in order as the CPU loop does.
__global__ void column_sums_kernel(const float* dy, float* grad, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float acc = grad[j];
    for (std::int64_t i = 0; i < rows; ++i) acc += dy[i * cols + j];
    grad[j] = acc;
  }
}

__device__ __forceinline__ float gelu(float x) { return static_cast<float>(0.5 * x * (1.0 + erf(x / sqrt(2.0)))); }
__device__ __forceinline__ float gelu_derivative(float x) {
  const double cdf = 0.5 * (1.0 + erf(x / sqrt(2.0)));
  const double pdf = exp(-0.5 * static_cast<double>(x) * x) / sqrt(2.0 * M_PI);
  return static_cast<float>(cdf + x * pdf);
}

__global__ void activation_forward_kernel(activation f, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = f == activation::relu ? (x[i] > 0 ? x[i] : 0.0f) : gelu(x[i]);
}

__global__ void activation_backward_kernel(activation f, const float* kept, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * (f == activation::relu ? (kept[i] > 0 ? 1.0f : 0.0f) : gelu_derivative(kept[i]));
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void dropout_kernel(std::uint64_t key, double p, float scale, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = x[i] * (dropout_mask::kept(key, static_cast<std::uint64_t>(i), p) ? scale : 0.0f);
}

/// The sum of `x` over the thread block; every thread gets it.
__device__ double block_sum(double x, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ double block_max(double x, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// One thread block per row.
__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta, float eps, float* y,
                                          float* xhat, float* rstd, std::int64_t cols) {
  __shared__ double scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* in = x + row * cols;
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += in[j];
  const double mean = block_sum(s, scratch) / static_cast<double>(cols);
  double q = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) q += (in[j] - mean) * (in[j] - mean);
  const double var = block_sum(q, scratch) / static_cast<double>(cols);
  const double r = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) rstd[row] = static_cast<float>(r);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float h = static_cast<float>((in[j] - mean) * r);
    xhat[row * cols + j] = h;
    y[row * cols + j] = h * gamma[j] + beta[j];
  }
}

__global__ void layer_norm_backward_input_kernel(const float* dy, const float* xhat, const float* rstd,
                                                 const float* gamma, float* dx, std::int64_t cols) {
  __shared__ double scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* d = dy + row * cols;
  const float* h = xhat + row * cols;
  double a = 0, b = 0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double dh = static_cast<double>(d[j]) * gamma[j];
    a += dh;
    b += dh * h[j];
  }
  const double mean_dh = block_sum(a, scratch) / static_cast<double>(cols);
  const double mean_dh_h = block_sum(b, scratch) / static_cast<double>(cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double dh = static_cast<double>(d[j]) * gamma[j];
    dx[row * cols + j] = static_cast<float>(rstd[row] * (dh - mean_dh - h[j] * mean_dh_h));
  }
}

__global__ void layer_norm_backward_weight_kernel(const float* dy, const float* xhat, float* gg, float* bg,
                                                  std::int64_t rows, std::int64_t cols) {
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float g = gg[j], b = bg[j];
    for (std::int64_t i = 0; i < rows; ++i) {
      g += dy[i * cols + j] * xhat[i * cols + j];
      b += dy[i * cols + j];
    }
    gg[j] = g;
    bg[j] = b;
  }
}

// One thread block per row; a bad label records the smallest bad row in *bad_row.
__global__ void softmax_ce_kernel(const float* logits, const std::int64_t* labels, float* dlogits, double* losses,
                                  unsigned long long* bad_row, std::int64_t n, std::int64_t c) {
  __shared__ double scratch[32];
  const std::int64_t row = blockIdx.x;
  const std::int64_t y = labels[row];
  if (y < 0 || y >= c) {
    if (threadIdx.x == 0) atomicMin(bad_row, static_cast<unsigned long long>(row));
    return;
  }
  const float* z = logits + row * c;
  double top = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) top = fmax(top, static_cast<double>(z[j]));
  top = block_max(top, scratch);
  const float topf = static_cast<float>(top);  // the CPU takes the max in float
  double s = 0;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) s += exp(static_cast<double>(z[j]) - topf);
  const double sum = block_sum(s, scratch);
  if (threadIdx.x == 0) losses[row] = log(sum) + topf - z[y];
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const double p = exp(static_cast<double>(z[j]) - topf) / sum;
    dlogits[row * c + j] = static_cast<float>((p - (j == y ? 1.0 : 0.0)) / static_cast<double>(n));
  }
}

}  // namespace

void gemm(int device, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  check(cublas().sgemm(handle(device), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                       as_int(n, "gemm: n"), as_int(m, "gemm: m"), as_int(k, "gemm: k"), &alpha, b,
                       as_int(ldb, "gemm: ldb"), a, as_int(lda, "gemm: lda"), &beta, c, as_int(ldc, "gemm: ldc")),
        "cublasSgemm");
}

void add_bias_rows(int device, float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  if (rows * cols == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  bias_rows_kernel<<<blocks_for(rows * cols), threads>>>(y, bias, rows * cols, cols);
  launched("bias_rows_kernel");
}

void accumulate_column_sums(int device, const float* dy, float* grad, std::int64_t rows, std::int64_t cols) {
  if (cols == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  column_sums_kernel<<<blocks_for(cols), threads>>>(dy, grad, rows, cols);
  launched("column_sums_kernel");
}

void activation_forward(int device, activation f, const float* x, float* y, std::int64_t n) {
  if (n == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  activation_forward_kernel<<<blocks_for(n), threads>>>(f, x, y, n);
  launched("activation_forward_kernel");
}

void activation_backward(int device, activation f, const float* kept, const float* dy, float* dx, std::int64_t n) {
  if (n == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  activation_backward_kernel<<<blocks_for(n), threads>>>(f, kept, dy, dx, n);
  launched("activation_backward_kernel");
}

void add(int device, const float* a, const float* b, float* out, std::int64_t n) {
  if (n == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  add_kernel<<<blocks_for(n), threads>>>(a, b, out, n);
  launched("add_kernel");
}

void dropout(int device, std::uint64_t key, double p, float scale, const float* x, float* y, std::int64_t n) {
  if (n == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  dropout_kernel<<<blocks_for(n), threads>>>(key, p, scale, x, y, n);
  launched("dropout_kernel");
}

void layer_norm_forward(int device, const float* x, const float* gamma, const float* beta, float eps, float* y,
                        float* xhat, float* rstd, std::int64_t rows, std::int64_t cols) {
  if (rows == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  layer_norm_forward_kernel<<<row_blocks(rows, "layer norm"), threads>>>(x, gamma, beta, eps, y, xhat, rstd, cols);
  launched("layer_norm_forward_kernel");
}

void layer_norm_backward_input(int device, const float* dy, const float* xhat, const float* rstd, const float* gamma,
                               float* dx, std::int64_t rows, std::int64_t cols) {
  if (rows == 0) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  layer_norm_backward_input_kernel<<<row_blocks(rows, "layer norm"), threads>>>(dy, xhat, rstd, gamma, dx, cols);
  launched("layer_norm_backward_input_kernel");
}

void layer_norm_backward_weight(int device, const float* dy, const float* xhat, float* gamma_grad, float* beta_grad,
                                std::int64_t rows, std::int64_t cols) {
  check(cudaSetDevice(device), "cudaSetDevice");
  layer_norm_backward_weight_kernel<<<blocks_for(cols), threads>>>(dy, xhat, gamma_grad, beta_grad, rows, cols);
  launched("layer_norm_backward_weight_kernel");
}

double softmax_cross_entropy(int device, const float* logits, const std::int64_t* labels, float* dlogits,
                             std::int64_t n, std::int64_t c) {
  if (n == 0) return std::nan("");  // 0 / 0, as the CPU loop gives
  check(cudaSetDevice(device), "cudaSetDevice");
  // From the caching allocator (it frees cached blocks and retries when the device is full).
  const unsigned grid = row_blocks(n, "softmax cross-entropy");
  tensor scratch = tensor::empty({static_cast<std::int64_t>(n * sizeof(double) + sizeof(unsigned long long))}, dtype::u8,
                                 troupe::device::cuda(device));
  auto* losses = reinterpret_cast<double*>(scratch.bytes());
  auto* bad = reinterpret_cast<unsigned long long*>(losses + n);
  std::vector<double> host(n);
  unsigned long long bad_row = ~0ull;
  check(cudaMemcpy(bad, &bad_row, sizeof bad_row, cudaMemcpyHostToDevice), "cudaMemcpy");
  softmax_ce_kernel<<<grid, threads>>>(logits, labels, dlogits, losses, bad, n, c);
  launched("softmax_ce_kernel");
  check(cudaMemcpy(host.data(), losses, n * sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(&bad_row, bad, sizeof bad_row, cudaMemcpyDeviceToHost), "cudaMemcpy");
  if (bad_row != ~0ull) {
    std::int64_t label = 0;
    check(cudaMemcpy(&label, labels + bad_row, sizeof label, cudaMemcpyDeviceToHost), "cudaMemcpy");
    throw std::invalid_argument("label " + std::to_string(label) + " of row " + std::to_string(bad_row) +
                                " is outside 0.." + std::to_string(c - 1));
  }
  double loss = 0;
  for (double l : host) loss += l;  // in row order, as the CPU loop
  return loss / static_cast<double>(n);
}

}  // namespace troupe::kernels::cuda
