// The optimizer step on a CUDA device for the tensors with 8-bit block-wise moments:
// blockwise_step, a group of threads per quantization block (a warp for blocks of up to 256
// elements, else a thread block), looping over the blocks in a grid of as many thread blocks as
// are resident at once: dequantize, update, reduce the block's absmax across the group,
// requantize, all from registers. Tensors whose 8-bit storage is the plain one
// (layout<Sgd, true>) take a launch of a kernel compiled for it alone; the others, the general
// kernel that reads the storage per tensor.
//
// Reference: quantize.hpp's block quantization, through optim_state.cpp's store_moment. 8-bit
// codes use the same map, the same block absmax, the exact nearest-entry decision (ties: the
// lower code; by qmap's bucket table and one comparison, as qmap::quantize) and the same "a
// nonzero value keeps its sign" rule. Compiled with --fmad=false (optim_cuda_update.cuh).

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "optim_cuda.cuh"
#include "optim_cuda_update.cuh"
#include "quantize.hpp"

namespace troupe::kernels::cuda {
namespace {

// The dynamic maps (0: signed, 1: unsigned): values, decision points and the bucket table of
// qmap::quantize (a candidate code per sign, exponent and top 7 mantissa bits), from
// quantize.cpp. Global, not __constant__: each thread reads the entry of its own code, and the
// constant cache serializes a warp's reads of different addresses (up to 32 ways);
// blockwise_step copies them to shared memory first.
constexpr unsigned map_buckets = 2 * quant::qmap::buckets;
__device__ float map_values[2][256];
__device__ float map_above[2][256];
__device__ std::uint8_t map_table[2][map_buckets];
__constant__ unsigned char map_zero[2];

/// The maps a thread block reads, in shared memory.
struct shared_maps {
  float values[2][256];
  float above[2][256];
  std::uint8_t table[2][map_buckets];
};

/// The nearest entry's code (ties: the lower one), as qmap::quantize: the candidate of xn's
/// bucket, or the next code when xn lies above the candidate's decision point.
/// `nonnegative`: xn is known to be >= 0 or -0 (a second moment), whose buckets are the
/// positive ones (-0 and +0 share a code).
__device__ __forceinline__ int nearest(float xn, const std::uint8_t* table, const float* above, bool nonnegative) {
  using quant::qmap;
  const std::uint32_t b = __float_as_uint(xn);
  const std::uint32_t a = min(max(b & 0x7fffffffu, qmap::lo_bits), qmap::hi_bits);
  const std::uint32_t bucket = (a - qmap::lo_bits) >> qmap::shift;
  const int c = table[nonnegative ? bucket : bucket + (b >> 31) * qmap::buckets];
  return c + (xn > above[c] ? 1 : 0);
}

/// The 8-bit code of x in a block of inverse scale `inv` (1 / scale, 0 for a scale of 0:
/// quant::quantize_block_reference's rule) on map `map` of `maps`: the nearest entry or, with
/// stochastic rounding, one of the two around x, and a nonzero x never on the zero code.
__device__ __forceinline__ std::uint8_t quantize(float x, float inv, int map, const shared_maps& maps, bool stochastic,
                                                 bool nonnegative, std::uint32_t key, std::uint32_t index) {
  const float xn = x * inv;
  const float* values = maps.values[map];
  int c = nearest(xn, maps.table[map], maps.above[map], nonnegative);
  if (stochastic) {
    const float vc = values[c];
    int a = c, b = c;
    if (xn > vc && c < 255) b = c + 1;
    else if (xn < vc && c > 0) a = c - 1;
    if (a != b) {
      const float va = values[a], vb = values[b];
      const float r = static_cast<float>(random_bits(key, index) >> 8) * 0x1p-24f;
      c = (xn - va) > r * (vb - va) ? b : a;
    }
  }
  if (nonnegative) {
    c += c == map_zero[map] && xn != 0.0f ? 1 : 0;  // xn > 0
  } else if (c == map_zero[map] && xn != 0.0f) {
    if (xn > 0) c = c + 1;
    else if (c > 0) c = c - 1;
  }
  return static_cast<std::uint8_t>(c);
}

/// What one thread block of the finiteness check reads: elements [begin, begin + length) of

/// The largest of each group's values x[q] for the q in `use` (x >= 0): a group is a warp when
/// `group` is 32 (no barrier), else the whole thread block (`scratch`: 3 x 32 floats). Every
/// thread of the group gets them.
__device__ __forceinline__ void group_max(float (&x)[3], const bool (&use)[3], int group, float (*scratch)[32]) {
#pragma unroll
  for (int q = 0; q < 3; ++q)
    if (use[q])
      for (int o = 16; o > 0; o >>= 1) x[q] = fmaxf(x[q], __shfl_xor_sync(0xffffffffu, x[q], o));
  if (group == 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the previous item
  if (lane == 0)
    for (int q = 0; q < 3; ++q) scratch[q][warp] = x[q];
  __syncthreads();
#pragma unroll
  for (int q = 0; q < 3; ++q)
    if (use[q]) {
      x[q] = lane < static_cast<int>(blockDim.x / 32) ? scratch[q][lane] : 0.0f;
      for (int o = 16; o > 0; o >>= 1) x[q] = fmaxf(x[q], __shfl_xor_sync(0xffffffffu, x[q], o));
    }
}

/// The m-th largest (m >= 2, counting equal values) of the group's magnitudes |x[l]|, l < n on
/// each thread: quant::block_scale's selection. m rounds: the group's largest, then its first
/// holder takes one instance of it off. A group is a warp (`group` 32) or the whole thread block
/// (`scratch` rows 0 and 1 between barriers).
__device__ float group_mth_largest(const float (&x)[lanes], int n, std::int64_t m, int group, float (*scratch)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = static_cast<int>(blockDim.x / 32);
  float a[lanes];
#pragma unroll
  for (int l = 0; l < lanes; ++l) a[l] = l < n ? fabsf(x[l]) : -1.0f;  // below every magnitude
  float top = -1.0f;
  for (std::int64_t taken = 0; taken < m; ++taken) {
    float mine = -1.0f;
#pragma unroll
    for (int l = 0; l < lanes; ++l) mine = fmaxf(mine, a[l]);
    top = mine;
    for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
    bool first_warp = true;  // this warp holds the first instance of the group's largest
    if (group != 32) {
      __syncthreads();  // the rows may still be read from the round before
      if (lane == 0) {
        scratch[0][warp] = top;
        scratch[1][warp] = 0.0f;
      }
      __syncthreads();
      top = lane < warps ? scratch[0][lane] : -1.0f;
      for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
      const bool held = __any_sync(0xffffffffu, mine == top);
      __syncthreads();
      if (lane == 0 && held) scratch[1][warp] = 1.0f;
      __syncthreads();
      const unsigned with = __ballot_sync(0xffffffffu, lane < warps && scratch[1][lane] != 0.0f);
      first_warp = warp == __ffs(static_cast<int>(with)) - 1;
    }
    const unsigned holders = __ballot_sync(0xffffffffu, mine == top);
    if (first_warp && lane == __ffs(static_cast<int>(holders)) - 1) {
      bool done = false;
#pragma unroll
      for (int l = 0; l < lanes; ++l)
        if (!done && a[l] == top) a[l] = -1.0f, done = true;
    }
  }
  return top;
}

/// One quantization block (item) of a group: dequantize, update, reduce the absmax of each 8-bit
/// moment across the group, requantize; the tensor's descriptor is at `t`.
template <bool Sgd, bool Plain>
__device__ __forceinline__ void step_block(const tensor_update& t, std::int64_t item, std::int64_t start, int rank,
                                           int group, const shared_maps& maps, float (*scratch)[32]) {
  const std::int64_t k = item - start;  // the block's index in its tensor
  const std::int64_t begin = k * t.block;
  const moment_ref* mos[3] = {&t.m, &t.v, &t.x};
  float scale[3];
  bool use[3];
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    use[q] = layout<Sgd, Plain>::mode(*mos[q], q) == store_int8;
    scale[q] = use[q] ? mos[q]->scales[k] : 0.0f;
  }
  const std::int64_t length = t.n - begin < t.block ? t.n - begin : t.block;
  const int offset = lanes * rank;
  const int n = offset >= length ? 0 : (length - offset < lanes ? static_cast<int>(length - offset) : lanes);
  float nv[3][lanes];
  float absmax[3] = {0, 0, 0};
  if (n > 0) {
    update<Sgd, Plain>(t, begin + offset, n, scale, maps.values, nv[0], nv[1], nv[2]);
#pragma unroll
    for (int q = 0; q < 3; ++q)
      if (use[q])
#pragma unroll
        for (int l = 0; l < lanes; ++l)
          if (l < n) absmax[q] = fmaxf(absmax[q], fabsf(nv[q][l]));
  }
  group_max(absmax, use, group, scratch);
  if (!Plain && t.percentile > 0 && t.percentile < 100) {
    // The block scaled by the m-th largest magnitude, as quant::block_scale (the absmax when that
    // is 0); the rank in double, as there.
    const auto rank = static_cast<std::int64_t>(ceil(t.percentile / 100.0 * static_cast<double>(length)));
    const std::int64_t m = length - (length - 1 < (rank == 0 ? 0 : rank - 1) ? length - 1 : (rank == 0 ? 0 : rank - 1));
    if (m > 1)
      for (int q = 0; q < 3; ++q)
        if (use[q]) {
          const float selected = group_mth_largest(nv[q], n, m, group, scratch);
          if (selected > 0) absmax[q] = selected;
        }
  }
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    if (!use[q]) continue;
    const moment_ref& mo = *mos[q];
    // Below the smallest normal float, 0 (the host's quant::stored_scale: 1/s would be infinite).
    const float s = absmax[q] < 1.17549435e-38f ? 0.0f : absmax[q];
    if (rank == 0) mo.scales[k] = s;
    if (n == 0) continue;
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    const int map = layout<Sgd, Plain>::map(mo, q);
    // The plain layout's second moment is never negative (a sum of squares on the unsigned map).
    const bool nonnegative = Plain && !Sgd && q == 1;
    const std::int64_t i = begin + offset;
    std::uint32_t c[lanes];
#pragma unroll
    for (int l = 0; l < lanes; ++l)
      c[l] = quantize(nv[q][l], inv, map, maps, layout<Sgd, Plain>::stochastic(t), nonnegative, mo.key,
                      static_cast<std::uint32_t>(i + l));
    auto* codes = static_cast<std::uint8_t*>(mo.data);
    if (n == lanes && aligned<8>(codes + i)) {
      __stwb(reinterpret_cast<uint2*>(codes + i), make_uint2(c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24),
                                                             c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24)));
    } else {
#pragma unroll
      for (int l = 0; l < lanes; ++l)
        if (l < n) codes[i + l] = static_cast<std::uint8_t>(c[l]);
    }
  }
}

/// Tensors with 8-bit moments: a group of `group` threads per quantization block (lanes elements
/// each, so a block's new values stay in registers), each group stepping a contiguous share of
/// the blocks. A group is a warp (blocks of at most 256 elements; several groups per thread
/// block, no barrier) or the whole thread block. Each thread block first copies the maps' tables
/// to shared memory.
template <bool Sgd, bool Plain>
__global__ void __launch_bounds__(Plain ? threads_per_block : 512, Plain ? 3 : 1)
    blockwise_step(const tensor_update* tensors, const std::int64_t* first, int count, std::int64_t items, int group,
                   const int* skip) {
  if (skip && *skip) return;  // a gradient was not finite: the step changes nothing
  __shared__ float scratch[3][32];
  __shared__ shared_maps maps;
  __shared__ tensor_update slots[threads_per_block / 32];
  for (int c = threadIdx.x; c < 2 * 256; c += blockDim.x) {
    maps.values[c / 256][c % 256] = map_values[c / 256][c % 256];
    maps.above[c / 256][c % 256] = map_above[c / 256][c % 256];
  }
  static_assert(sizeof maps.table % sizeof(int) == 0);
  for (int w = threadIdx.x; w < static_cast<int>(sizeof maps.table / sizeof(int)); w += blockDim.x)
    reinterpret_cast<int*>(maps.table)[w] = reinterpret_cast<const int*>(map_table)[w];
  __syncthreads();
  const int groups_per_block = static_cast<int>(blockDim.x) / group;
  const int index = static_cast<int>(threadIdx.x) / group, rank = static_cast<int>(threadIdx.x) % group;
  std::int64_t begin, end;
  share_of(items, static_cast<std::int64_t>(blockIdx.x) * groups_per_block + index,
           static_cast<std::int64_t>(gridDim.x) * groups_per_block, begin, end);
  // The loop's bounds are the same for every thread of a group.
  if (group == 32) {
    item_walk<warp_sync> walk{tensors, first, count, &slots[index], rank, group, {}};
    for (std::int64_t item = begin; item < end; ++item) {
      walk.to(item);
      step_block<Sgd, Plain>(slots[index], item, walk.start, rank, group, maps, scratch);
    }
  } else {
    item_walk<block_sync> walk{tensors, first, count, &slots[0], rank, group, {}};
    for (std::int64_t item = begin; item < end; ++item) {
      walk.to(item);
      step_block<Sgd, Plain>(slots[0], item, walk.start, rank, group, maps, scratch);
    }
  }
}

template <bool Sgd, bool Plain>
void launch_blockwise(const tensor_update* tensors, const std::int64_t* first, int count, std::int64_t items,
                      std::int64_t largest_block, const int* skip, int device) {
  // A group of threads per quantization block, `lanes` elements each: a warp for blocks of up
  // to 256 elements (several per thread block), else a thread block of up to 512 threads.
  const auto needed = static_cast<int>((largest_block + lanes - 1) / lanes);
  const int group = needed <= 32 ? 32 : (needed + 31) / 32 * 32;
  const int block_threads = group == 32 ? threads_per_block : group;
  // As many thread blocks as are resident at once, each looping over its share of the items
  // (and copying the maps' 14 KiB of tables once, not once per quantization block).
  const std::int64_t groups_per_block = block_threads / group;
  const auto grid = static_cast<unsigned>(std::min((items + groups_per_block - 1) / groups_per_block,
                                                   resident(blockwise_step<Sgd, Plain>, block_threads, device)));
  blockwise_step<Sgd, Plain><<<grid, block_threads>>>(tensors, first, count, items, group, skip);
  launched("blockwise_step launch");
}

}  // namespace

void use_device(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  static std::mutex mutex;
  static std::vector<char> uploaded;
  std::lock_guard lock(mutex);
  if (static_cast<std::size_t>(device) < uploaded.size() && uploaded[device]) return;
  float values[2][256], above[2][256];
  unsigned char zero[2];
  for (int s = 0; s < 2; ++s) {
    const auto& map = quant::qmap::dynamic(s == 0);
    for (int c = 0; c < 256; ++c) {
      values[s][c] = map.value(static_cast<std::uint8_t>(c));
      above[s][c] = map.above(static_cast<std::uint8_t>(c));
    }
    zero[s] = map.zero_code();
  }
  check(cudaMemcpyToSymbol(map_values, values, sizeof values), "cudaMemcpyToSymbol");
  check(cudaMemcpyToSymbol(map_above, above, sizeof above), "cudaMemcpyToSymbol");
  check(cudaMemcpyToSymbol(map_zero, zero, sizeof zero), "cudaMemcpyToSymbol");
  std::vector<std::uint8_t> table(2 * map_buckets);
  for (int s = 0; s < 2; ++s)
    std::memcpy(table.data() + s * map_buckets, quant::qmap::dynamic(s == 0).table(), map_buckets);
  check(cudaMemcpyToSymbol(map_table, table.data(), table.size()), "cudaMemcpyToSymbol");
  if (uploaded.size() <= static_cast<std::size_t>(device)) uploaded.resize(device + 1, 0);
  uploaded[device] = 1;
}

void launch_blockwise_step(bool sgd, bool plain, const tensor_update* tensors, const std::int64_t* first, int count,
                           std::int64_t items, std::int64_t largest_block, const int* skip, int device) {
  if (plain) {
    sgd ? launch_blockwise<true, true>(tensors, first, count, items, largest_block, skip, device)
        : launch_blockwise<false, true>(tensors, first, count, items, largest_block, skip, device);
  } else {
    sgd ? launch_blockwise<true, false>(tensors, first, count, items, largest_block, skip, device)
        : launch_blockwise<false, false>(tensors, first, count, items, largest_block, skip, device);
  }
}

}  // namespace troupe::kernels::cuda
