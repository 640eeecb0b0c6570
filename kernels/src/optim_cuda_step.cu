// The optimizer step on a CUDA device for the tensors without 8-bit moments (fp32, bf16 or none):
// elementwise_step, in work items of `chunk` elements. Compiled with --fmad=false
// (optim_cuda_update.cuh says why).

#include <algorithm>

#include "optim_cuda.cuh"
#include "optim_cuda_update.cuh"

namespace troupe::kernels::cuda {
namespace {

/// Tensors without 8-bit moments: work items of `chunk` elements, each thread block stepping a
/// contiguous share of them (a grid of as many thread blocks as are resident at once).
template <bool Sgd>
__global__ void __launch_bounds__(threads_per_block) elementwise_step(const tensor_update* tensors,
                                                                      const std::int64_t* first, int count,
                                                                      std::int64_t items, const int* skip) {
  if (skip && *skip) return;  // a gradient was not finite: the step changes nothing
  __shared__ tensor_update slot;
  item_walk<block_sync> walk{tensors, first, count, &slot, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), {}};
  std::int64_t begin, end;
  share_of(items, blockIdx.x, gridDim.x, begin, end);
  const float none[3] = {0, 0, 0};
  const int offset = lanes * static_cast<int>(threadIdx.x);
  for (std::int64_t item = begin; item < end; ++item) {
    walk.to(item);
    const std::int64_t base = (item - walk.start) * chunk + offset;
    if (base >= slot.n) continue;
    const int n = slot.n - base < lanes ? static_cast<int>(slot.n - base) : lanes;
    float m[lanes], v[lanes], x[lanes];
    update<Sgd, false>(slot, base, n, none, nullptr, m, v, x);  // no 8-bit moment: no map
  }
}

}  // namespace

void launch_elementwise_step(bool sgd, const tensor_update* tensors, const std::int64_t* first, int count,
                             std::int64_t items, const int* skip, int device) {
  const auto grid = static_cast<unsigned>(std::min<std::int64_t>(
      items, sgd ? resident(elementwise_step<true>, threads_per_block, device)
                 : resident(elementwise_step<false>, threads_per_block, device)));
  if (sgd) elementwise_step<true><<<grid, threads_per_block>>>(tensors, first, count, items, skip);
  else elementwise_step<false><<<grid, threads_per_block>>>(tensors, first, count, items, skip);
  launched("elementwise_step launch");
}

}  // namespace troupe::kernels::cuda
