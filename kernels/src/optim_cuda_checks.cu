// The gradients' checks on a CUDA device, before an optimizer step: the finiteness check (a
// flag set when an element's exponent is at or above its tensor's limit) and the sums of squares
// in the host's order (for clipping by norm). Compiled with --fmad=false, as the step.

#include "optim_cuda.cuh"

namespace troupe::kernels::cuda {
namespace {

/// What one thread block of the finiteness check (or 16 threads of the sums of squares) reads:
/// elements [begin, begin + length) of tensor `tensor`.
struct work_item {
  int tensor;
  int length;
  std::int64_t begin;
};

/// Work item b of `step` elements (tensor_of's `first`); sizes[k] is tensor k's elements.
__device__ __forceinline__ work_item item_of(std::int64_t b, const std::int64_t* first, int count,
                                             const std::int64_t* sizes, std::int64_t step) {
  const int k = tensor_of(b, first, count);
  const std::int64_t begin = (b - first[k]) * step;
  return {k, static_cast<int>(sizes[k] - begin < step ? sizes[k] - begin : step), begin};
}

__global__ void finite_check(const float* const* grads, const std::int64_t* sizes, const std::uint32_t* limits,
                             const std::int64_t* first, int count, int* bad) {
  const work_item w = item_of(blockIdx.x, first, count, sizes, finite_chunk);
  const float* g = grads[w.tensor];
  const std::uint32_t limit = limits[w.tensor];
  std::uint32_t any = 0;
  for (std::int64_t i = w.begin + threadIdx.x; i < w.begin + w.length; i += blockDim.x)
    any |= (__float_as_uint(g[i]) & 0x7f800000u) >= limit;
  if (__syncthreads_or(static_cast<int>(any)) && threadIdx.x == 0) *bad = 1;
}

/// The sum of squares of each piece of square_piece elements (a tensor's last may be shorter),
/// in double, in the host's order: 16 threads per piece, thread k summing the elements at k,
/// k + 16, ... in order, then the 16 sums added in order.
__global__ void square_sums(const float* const* grads, const std::int64_t* sizes, const std::int64_t* first, int count,
                            std::int64_t pieces, double* out) {
  const std::int64_t piece = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int k = static_cast<int>(threadIdx.x % 16);
  double s = 0;
  if (piece < pieces) {
    const work_item w = item_of(piece, first, count, sizes, square_piece);
    const float* g = grads[w.tensor];
    for (std::int64_t i = w.begin + k; i < w.begin + w.length; i += 16) {
      const double v = g[i];
      s = s + v * v;  // the square is exact in double: fused or not, the same sum
    }
  }
  double total = 0;
  for (int j = 0; j < 16; ++j) total = total + __shfl_sync(0xffffffffu, s, static_cast<int>(threadIdx.x & 16u) + j);
  if (k == 0 && piece < pieces) out[piece] = total;
}

}  // namespace

void launch_finite_check(unsigned blocks, const float* const* grads, const std::int64_t* sizes,
                         const std::uint32_t* limits, const std::int64_t* first, int count, int* bad) {
  finite_check<<<blocks, threads_per_block>>>(grads, sizes, limits, first, count, bad);
  launched("finite_check launch");
}

void launch_square_sums(const float* const* grads, const std::int64_t* sizes, const std::int64_t* first, int count,
                        std::int64_t pieces, double* out) {
  constexpr int per_block = threads_per_block / 16;
  square_sums<<<static_cast<unsigned>((pieces + per_block - 1) / per_block), threads_per_block>>>(
      grads, sizes, first, count, pieces, out);
  launched("square_sums launch");
}

}  // namespace troupe::kernels::cuda
