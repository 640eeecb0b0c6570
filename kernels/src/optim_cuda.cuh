#pragma once
// What the files of the optimizer step on a CUDA device share: error checks, the work items the
// kernels walk, and the launch of each kernel, which its own file defines:
// - optim_cuda_step.cu: elementwise_step, the tensors without 8-bit moments;
// - optim_cuda_8bit.cu: blockwise_step, the tensors with 8-bit moments, and the 8-bit maps;
// - optim_cuda_checks.cu: the gradients' finiteness check and sums of squares;
// - optim_cuda.cu: the host side (what a step stages, uploads and launches; cuda_ops.hpp's
//   functions).
// One element's update and its storage are in optim_cuda_update.cuh.

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_ops.hpp"

namespace troupe::kernels::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

/// A launch's error, if any (cudaErrorNotReady, which a query elsewhere may leave, is none).
inline void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaErrorNotReady) check(e, what);
}

constexpr int threads_per_block = 256;
// Each thread steps `lanes` consecutive elements held in registers: two 16-byte accesses per fp32
// array, one per bf16 moment, one 8-byte access per 8-bit moment, when the addresses allow.
constexpr int lanes = 8;
constexpr int chunk = threads_per_block * lanes;  // elements per thread block of the elementwise step
constexpr int finite_chunk = 16384;  // elements per thread block of the finiteness check
constexpr std::int64_t square_piece = 1 << 16;  // elements per piece of the host's sums of squares

// ---- work items (device) ------------------------------------------------------------------------

/// The tensor of work item b: the last k with first[k] <= b, where first[k] is the first item of
/// tensor k (count + 1 entries, non-decreasing; a tensor without elements has none).
__device__ __forceinline__ int tensor_of(std::int64_t b, const std::int64_t* first, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (first[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/// The work items [begin, end) of one group of threads (a thread block or a warp), in order: the
/// tensor of the first is found by binary search, the next ones by stepping forward, and the
/// descriptor of each tensor is copied to shared memory (`slot`) once, when the group reaches it.
/// Every thread of the group walks the same items; `sync` orders the group's threads.
template <class Sync>
struct item_walk {
  const tensor_update* tensors;
  const std::int64_t* first;
  int count;
  tensor_update* slot;
  int rank, size;  // this thread's place in the group, and the group's size
  Sync sync;
  int k = -1;              // the tensor of the current item
  std::int64_t start = 0;  // its first item
  std::int64_t next = 0;   // the first item past it

  /// Moves to `item` (not before the previous one), loading its tensor's descriptor when the
  /// tensor changes.
  __device__ __forceinline__ void to(std::int64_t item) {
    if (item < next) return;
    if (k < 0) k = tensor_of(item, first, count);
    while (first[k + 1] <= item) ++k;  // skips tensors without elements
    start = first[k];
    next = first[k + 1];
    static_assert(sizeof(tensor_update) % sizeof(int) == 0);
    sync();  // the group is done with the previous descriptor
    for (int w = rank; w < static_cast<int>(sizeof(tensor_update) / sizeof(int)); w += size)
      reinterpret_cast<int*>(slot)[w] = reinterpret_cast<const int*>(tensors + k)[w];
    sync();
  }
};

struct block_sync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
struct warp_sync {
  __device__ __forceinline__ void operator()() const { __syncwarp(); }
};

/// The contiguous share [begin, end) of `items` for group `index` of `groups`.
__device__ __forceinline__ void share_of(std::int64_t items, std::int64_t index, std::int64_t groups,
                                         std::int64_t& begin, std::int64_t& end) {
  const std::int64_t per = (items + groups - 1) / groups;
  begin = index * per;
  end = begin + per < items ? begin + per : items;
}

// ---- launches (host) ----------------------------------------------------------------------------

/// Makes `device` current and, the first time, uploads the 8-bit maps to it (optim_cuda_8bit.cu).
void use_device(int device);

/// How many thread blocks of `kernel` with `threads` threads the device holds at once (at least 1).
/// Asked of the runtime once per kernel, size and device (optim_cuda.cu).
std::int64_t resident_blocks(const void* kernel, int threads, int device);
template <class Kernel>
std::int64_t resident(Kernel kernel, int threads, int device) {
  return resident_blocks(reinterpret_cast<const void*>(kernel), threads, device);
}

// The kernels of a step read `items` work items of the tensors at `tensors` (`count` of them),
// tensor k's first item at first[k] (count + 1 entries), and return at once when `skip` (a device
// flag, or null) is set.

/// elementwise_step (optim_cuda_step.cu): tensors without 8-bit moments, items of `chunk` elements.
void launch_elementwise_step(bool sgd, const tensor_update* tensors, const std::int64_t* first, int count,
                             std::int64_t items, const int* skip, int device);

/// blockwise_step (optim_cuda_8bit.cu): tensors with 8-bit moments, an item per quantization block
/// (of at most `largest_block` elements); `plain`: every tensor's storage is the plain 8-bit
/// layout (layout<Sgd, true>, optim_cuda_update.cuh).
void launch_blockwise_step(bool sgd, bool plain, const tensor_update* tensors, const std::int64_t* first, int count,
                           std::int64_t items, std::int64_t largest_block, const int* skip, int device);

/// finite_check (optim_cuda_checks.cu) over `blocks` items of finite_chunk elements of the
/// gradients (tensor k: grads[k], sizes[k] elements, first item first[k]): sets *bad when an
/// element of gradient k has a float exponent field at or above limits[k].
void launch_finite_check(unsigned blocks, const float* const* grads, const std::int64_t* sizes,
                         const std::uint32_t* limits, const std::int64_t* first, int count, int* bad);

/// square_sums (optim_cuda_checks.cu): out[b] is the sum of squares of piece b (square_piece
/// elements) of the gradients, in the host's order.
void launch_square_sums(const float* const* grads, const std::int64_t* sizes, const std::int64_t* first, int count,
                        std::int64_t pieces, double* out);

}  // namespace troupe::kernels::cuda
