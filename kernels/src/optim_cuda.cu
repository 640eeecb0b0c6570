// The optimizer step on a CUDA device: fused multi-tensor kernels for SGD, Adam and AdamW with
// fp32, bf16 and 8-bit block-wise moments.
//
// Reference: optim.cpp's fused loops (adam_fused_loop, sgd_fused_loop) and its storage
// (load_moment / store_moment), element for element. This file is compiled with --fmad=false so
// that no multiply-add is contracted: every operation is the same IEEE operation in the same
// order as on the CPU (sqrtf and division are correctly rounded by default), so fp32 results are
// expected to agree to the bit; the tests allow a few ulp. 8-bit codes use the same map, the
// same block absmax, the exact nearest-entry decision (ties: the lower code; by qmap's bucket
// table and one comparison, as qmap::quantize) and the same "a nonzero value keeps its sign" rule.
//
// A step is up to three launches after the non-finite check (checked_step queues them behind it,
// and they skip themselves when it fails). Each thread steps 8 consecutive elements held in
// registers, with 16-byte loads and stores of fp32 and bf16 arrays (8-byte ones of 8-bit codes)
// where the addresses allow:
// - elementwise_step: tensors without 8-bit moments, in work items of 2048 elements;
// - blockwise_step: tensors with 8-bit moments, a group of threads per quantization block (a
//   warp for blocks of up to 256 elements, else a thread block), looping over the blocks in a
//   grid of as many thread blocks as are resident at once: dequantize, update, reduce the
//   block's absmax across the group, requantize, all from registers.
// Both read a device array of tensor descriptors and, per tensor, the index of its first work
// item (a prefix sum), so a whole list of tensors is one launch and what goes to the device per
// step is O(tensors), not O(blocks); each thread block (or warp) steps a contiguous share of the
// items, finding the first one's tensor by binary search and stepping forward from there.
// Tensors whose 8-bit storage is the plain one (layout<Sgd, true>) take a launch of a kernel
// compiled for it alone; the others, the general kernel that reads the storage per tensor.

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/core/tensor.hpp"

#include "cuda_ops.hpp"
#include "quantize.hpp"

namespace troupe::kernels::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

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

// ---- element arithmetic (optim.cpp's loops, one element) --------------------------------------

/// amsgrad: x is the running maximum of v (read and written); else x is left alone.
__device__ __forceinline__ float adam_element(const update_constants& c, float p, float grad, float& m, float& v,
                                              bool amsgrad, float& x) {
  const float param = p * c.decay;
  float g = grad * c.gscale;
  if (c.l2 != 0.0f) g = g + param * c.l2;
  // m + (1 - beta1) (g - m) or, for beta1 under 0.5, g - (g - m) beta1, as the CPU's lerp; one
  // form for both (x + d (-y) is x - d y to the bit), so that no lane computes the two.
  const bool low = c.one_minus_beta1 < 0.5f;
  const float mi = (low ? m : g) + (g - m) * (low ? c.one_minus_beta1 : -(1.0f - c.one_minus_beta1));
  const float vi = v * c.beta2 + c.one_minus_beta2 * g * g;
  float second = vi;
  if (amsgrad) {
    second = x < vi ? vi : x;  // std::max(vmax, vi), as the CPU (the same operand on a NaN)
    x = second;
  }
  const float denom = sqrtf(second) * c.inv_bias2_sqrt + c.eps;
  m = mi;
  v = vi;
  return param + (-c.step_size) * mi / denom;
}

/// momentum: buf is the momentum buffer (read and written); else it is left alone.
__device__ __forceinline__ float sgd_element(const update_constants& c, float p, float grad, bool momentum, float& buf) {
  float g = grad * c.gscale;
  if (c.wd != 0.0f) g = g + p * c.wd;
  if (momentum) {
    const float b = c.first ? g : buf * c.momentum + g * c.one_minus_dampening;
    buf = b;
    g = c.nesterov ? g + b * c.momentum : b;
  }
  return p + g * (-c.lr);
}

// ---- storage ----------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t random_bits(std::uint32_t key, std::uint32_t index) {
  std::uint32_t h = index * 0x9e3779b1u ^ key;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

__device__ __forceinline__ float from_bf16(std::uint16_t h) { return __uint_as_float(static_cast<std::uint32_t>(h) << 16); }

__device__ __forceinline__ std::uint16_t to_bf16(float x, bool stochastic, std::uint32_t key, std::uint32_t index) {
  std::uint32_t b = __float_as_uint(x);
  if (!stochastic) {
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<std::uint16_t>(b >> 16);
  }
  const std::uint32_t sign = b & 0x80000000u;
  std::uint32_t mag = b & 0x7fffffffu;
  const std::uint32_t up = mag + (random_bits(key, index) & 0xffffu);
  mag = (up >> 16) >= 0x7f80u ? mag : up;
  return static_cast<std::uint16_t>((sign | mag) >> 16);
}

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
/// tensor `tensor`.
struct work_item {
  int tensor;
  int length;
  std::int64_t begin;
};

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

/// Work item b of `step` elements (tensor_of's `first`); sizes[k] is tensor k's elements.
__device__ __forceinline__ work_item item_of(std::int64_t b, const std::int64_t* first, int count,
                                             const std::int64_t* sizes, std::int64_t step) {
  const int k = tensor_of(b, first, count);
  const std::int64_t begin = (b - first[k]) * step;
  return {k, static_cast<int>(sizes[k] - begin < step ? sizes[k] - begin : step), begin};
}

constexpr int threads_per_block = 256;
// Each thread steps `lanes` consecutive elements held in registers: two 16-byte accesses per fp32
// array, one per bf16 moment, one 8-byte access per 8-bit moment, when the addresses allow.
constexpr int lanes = 8;
constexpr int chunk = threads_per_block * lanes;  // elements per thread block of the elementwise step

template <std::size_t A, class T>
__device__ __forceinline__ bool aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % A == 0;
}

/// Elements [i, i + n) (n <= lanes) of an fp32 array into r.
__device__ __forceinline__ void load_f32(const float* a, std::int64_t i, int n, float* r) {
  if (n == lanes && aligned<16>(a + i)) {
    const float4 x = *reinterpret_cast<const float4*>(a + i), y = *reinterpret_cast<const float4*>(a + i + 4);
    r[0] = x.x, r[1] = x.y, r[2] = x.z, r[3] = x.w, r[4] = y.x, r[5] = y.y, r[6] = y.z, r[7] = y.w;
  } else {
#pragma unroll
    for (int l = 0; l < lanes; ++l) r[l] = l < n ? a[i + l] : 0.0f;
  }
}

__device__ __forceinline__ void store_f32(float* a, std::int64_t i, int n, const float* r) {
  if (n == lanes && aligned<16>(a + i)) {
    // __stwb: a plain assignment through float4* came out of nvcc 13 as four 4-byte stores.
    __stwb(reinterpret_cast<float4*>(a + i), make_float4(r[0], r[1], r[2], r[3]));
    __stwb(reinterpret_cast<float4*>(a + i + 4), make_float4(r[4], r[5], r[6], r[7]));
  } else {
#pragma unroll
    for (int l = 0; l < lanes; ++l)
      if (l < n) a[i + l] = r[l];
  }
}

/// How a kernel reads a tensor's storage. Plain fixes it at compile time: every moment present is
/// 8-bit (the first on the signed map, the second on the unsigned one), no AMSGrad maximum, round
/// to nearest; the general form reads it from the descriptor. Code for the plain case is a
/// fraction of the general one's, in instructions and registers.
template <bool Sgd, bool Plain>
struct layout {
  /// The storage of moment q (0: m, 1: v, 2: the AMSGrad maximum).
  __device__ __forceinline__ static std::uint8_t mode(const moment_ref& mo, int q) {
    if constexpr (Plain) return q == 0 || (q == 1 && !Sgd) ? store_int8 : store_none;
    else return mo.mode;
  }
  /// Its 8-bit map: 0 signed, 1 unsigned.
  __device__ __forceinline__ static int map(const moment_ref& mo, int q) {
    if constexpr (Plain) return q == 0 ? 0 : 1;
    else return mo.is_signed ? 0 : 1;
  }
  __device__ __forceinline__ static bool stochastic(const tensor_update& t) {
    if constexpr (Plain) return false;
    else return t.stochastic;
  }
};

/// A moment's elements [i, i + n) in fp32 (8-bit: decoded with the block's scale and map `map`).
__device__ __forceinline__ void load_moment(const moment_ref& mo, std::uint8_t mode, int map, std::int64_t i, int n,
                                            float scale, const float (*maps)[256], float* r) {
  if (mode == store_fp32) {
    load_f32(static_cast<const float*>(mo.data), i, n, r);
  } else if (mode == store_bf16) {
    const auto* h = static_cast<const std::uint16_t*>(mo.data);
    if (n == lanes && aligned<16>(h + i)) {
      const uint4 w = *reinterpret_cast<const uint4*>(h + i);
      const std::uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        r[2 * l] = __uint_as_float(ws[l] << 16);
        r[2 * l + 1] = __uint_as_float(ws[l] & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int l = 0; l < lanes; ++l) r[l] = l < n ? from_bf16(h[i + l]) : 0.0f;
    }
  } else if (mode == store_int8) {
    const auto* c = static_cast<const std::uint8_t*>(mo.data);
    const float* values = maps[map];
    if (n == lanes && aligned<8>(c + i)) {
      const uint2 w = *reinterpret_cast<const uint2*>(c + i);
#pragma unroll
      for (int l = 0; l < lanes; ++l) r[l] = values[((l < 4 ? w.x : w.y) >> (8 * (l % 4))) & 0xffu] * scale;
    } else {
#pragma unroll
      for (int l = 0; l < lanes; ++l) r[l] = l < n ? values[c[i + l]] * scale : 0.0f;
    }
  } else {
#pragma unroll
    for (int l = 0; l < lanes; ++l) r[l] = 0.0f;
  }
}

/// fp32 and bf16 moments (8-bit ones are written per block, after its scale is known).
__device__ __forceinline__ void store_moment(const moment_ref& mo, std::uint8_t mode, std::int64_t i, int n,
                                             bool stochastic, const float* r) {
  if (mode == store_fp32) {
    store_f32(static_cast<float*>(mo.data), i, n, r);
  } else if (mode == store_bf16) {
    auto* h = static_cast<std::uint16_t*>(mo.data);
    std::uint32_t b[lanes];
#pragma unroll
    for (int l = 0; l < lanes; ++l) b[l] = to_bf16(r[l], stochastic, mo.key, static_cast<std::uint32_t>(i + l));
    if (n == lanes && aligned<16>(h + i)) {
      __stwb(reinterpret_cast<uint4*>(h + i),
             make_uint4(b[0] | (b[1] << 16), b[2] | (b[3] << 16), b[4] | (b[5] << 16), b[6] | (b[7] << 16)));
    } else {
#pragma unroll
      for (int l = 0; l < lanes; ++l)
        if (l < n) h[i + l] = static_cast<std::uint16_t>(b[l]);
    }
  }
}

/// Elements [i, i + n) of tensor t: load, update, store p and the fp32/bf16 moments; the new
/// moments stay in m, v and x (for the caller to quantize the 8-bit ones).
template <bool Sgd, bool Plain>
__device__ __forceinline__ void update(const tensor_update& t, std::int64_t i, int n, const float (&scales)[3],
                                       const float (*maps)[256], float* m, float* v, float* x) {
  using L = layout<Sgd, Plain>;
  const std::uint8_t mm = L::mode(t.m, 0), mv = L::mode(t.v, 1), mx = L::mode(t.x, 2);
  const bool stochastic = L::stochastic(t);
  float p[lanes], g[lanes];
  load_f32(t.p, i, n, p);
  load_f32(t.g, i, n, g);
  load_moment(t.m, mm, L::map(t.m, 0), i, n, scales[0], maps, m);
  load_moment(t.v, mv, L::map(t.v, 1), i, n, scales[1], maps, v);
  load_moment(t.x, mx, L::map(t.x, 2), i, n, scales[2], maps, x);
#pragma unroll
  for (int l = 0; l < lanes; ++l) {
    if constexpr (Sgd) p[l] = sgd_element(t.c, p[l], g[l], mm != store_none, m[l]);
    else p[l] = adam_element(t.c, p[l], g[l], m[l], v[l], mx != store_none, x[l]);
  }
  store_f32(t.p, i, n, p);
  store_moment(t.m, mm, i, n, stochastic, m);
  store_moment(t.v, mv, i, n, stochastic, v);
  store_moment(t.x, mx, i, n, stochastic, x);
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
    update<Sgd, false>(slot, base, n, none, map_values, m, v, x);
  }
}

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

constexpr int finite_chunk = 16384;  // elements per thread block of the finiteness check

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

constexpr std::int64_t square_piece = 1 << 16;  // elements per piece of the host's sums of squares

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

/// A launch's error, if any (cudaErrorNotReady, which a query elsewhere may leave, is none).
void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaErrorNotReady) check(e, what);
}

/// A page-locked host buffer: a copy from (or to) it is asynchronous, where one from pageable
/// memory waits for the device.
struct pinned_buffer {
  std::byte* host = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t done = nullptr;  ///< recorded behind the last copy that uses the buffer
};

/// A device's page-locked buffers, handed out again only once the copy recorded behind them has
/// completed. They live as long as the process (a few, of a few KiB each).
class pinned_pool {
public:
  explicit pinned_pool(int device) : device_(device) {}

  pinned_buffer acquire(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity >= bytes && cudaEventQuery(it->done) == cudaSuccess) {
          const pinned_buffer b = *it;
          free_.erase(it);
          return b;
        }
    }
    pinned_buffer b;
    b.capacity = std::max<std::size_t>(4096, std::bit_ceil(bytes));
    check(cudaSetDevice(device_), "cudaSetDevice");
    void* host = nullptr;
    check(cudaHostAlloc(&host, b.capacity, cudaHostAllocPortable), "cudaHostAlloc");
    b.host = static_cast<std::byte*>(host);
    if (const cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming); e != cudaSuccess) {
      cudaFreeHost(host);
      check(e, "cudaEventCreateWithFlags");
    }
    return b;
  }

  /// Gives b back after recording its event behind the work queued so far (the copies that use
  /// it). Without the event recorded, b is not reused: a copy from it may still be pending.
  void release(const pinned_buffer& b) {
    if (cudaEventRecord(b.done, nullptr) != cudaSuccess) return;
    std::lock_guard lock(mutex_);
    free_.push_back(b);
  }

private:
  int device_;
  std::mutex mutex_;
  std::vector<pinned_buffer> free_;
};

pinned_pool& pool_of(int device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<pinned_pool>> pools;
  std::lock_guard lock(mutex);
  if (pools.size() <= static_cast<std::size_t>(device)) pools.resize(static_cast<std::size_t>(device) + 1);
  auto& p = pools[static_cast<std::size_t>(device)];
  if (!p) p = std::make_unique<pinned_pool>(device);
  return *p;
}

/// Host arrays copied to the device in one asynchronous transfer (through a page-locked buffer)
/// into a block of the caching allocator. The block goes back to the cache when the staging is
/// destroyed; the kernels that read it are queued on the default stream, so a later use of the
/// same block is ordered after them.
class staging {
public:
  template <class T>
  std::size_t add(const std::vector<T>& v) {
    const std::size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
    return at;
  }
  void upload(int device) {
    const std::size_t n = std::max<std::size_t>(bytes_.size(), 16);
    buffer_ = tensor::empty({static_cast<std::int64_t>(n)}, dtype::u8, troupe::device::cuda(device));
    auto& pool = pool_of(device);
    const pinned_buffer b = pool.acquire(n);
    std::memcpy(b.host, bytes_.data(), bytes_.size());
    const cudaError_t e = cudaMemcpyAsync(buffer_.bytes(), b.host, n, cudaMemcpyHostToDevice, nullptr);
    pool.release(b);
    check(e, "cudaMemcpyAsync");
  }
  template <class T>
  T* at(std::size_t offset) {
    return reinterpret_cast<T*>(buffer_.bytes() + offset);
  }

private:
  std::vector<std::byte> bytes_;
  tensor buffer_;
};

/// Tensor k's first thread block when each takes steps[k] elements: sizes.size() + 1 entries.
std::vector<std::int64_t> first_blocks(const std::vector<std::int64_t>& sizes, const std::vector<std::int64_t>& steps) {
  std::vector<std::int64_t> first{0};
  for (std::size_t k = 0; k < sizes.size(); ++k) first.push_back(first.back() + (sizes[k] + steps[k] - 1) / steps[k]);
  return first;
}

unsigned grid_of(const std::vector<std::int64_t>& first) {
  if (first.back() > 0x7fffffff) throw std::invalid_argument("optimizer on CUDA: too many elements for one launch");
  return static_cast<unsigned>(first.back());
}

/// How many thread blocks of `kernel` with `threads` threads the device holds at once (at least 1).
/// Asked of the runtime once per kernel, size and device.
template <class Kernel>
std::int64_t resident(Kernel kernel, int threads, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, std::int64_t> known;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, device);
  {
    std::lock_guard lock(mutex);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  int per_sm = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const std::int64_t n = static_cast<std::int64_t>(std::max(1, per_sm)) * std::max(1, sms);
  std::lock_guard lock(mutex);
  known[key] = n;
  return n;
}

}  // namespace

namespace {

/// A list of tensors for one launch: descriptors, and each tensor's first work item.
struct launch_list {
  std::vector<tensor_update> tensors;
  std::vector<std::int64_t> sizes, steps;
  std::int64_t largest_block = 1;
  void add(const tensor_update& t, std::int64_t step) {
    tensors.push_back(t);
    sizes.push_back(t.n);
    steps.push_back(step);
    largest_block = std::max(largest_block, t.block);
  }
};

/// True when t's storage is the plain 8-bit layout (layout<Sgd, true>), in blocks a warp steps
/// (the plain kernel is built for 3 thread blocks of 256 threads per SM).
bool plain_8bit(bool sgd, const tensor_update& t) {
  if (t.block > 32 * lanes) return false;
  const bool m = t.m.mode == store_int8 && t.m.is_signed;
  const bool v = sgd ? t.v.mode == store_none : t.v.mode == store_int8 && !t.v.is_signed;
  return m && v && t.x.mode == store_none && !t.stochastic && t.percentile == 0;
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

/// The finiteness check of a step's gradients, staged.
struct check_plan {
  std::vector<std::int64_t> first;
  std::size_t grads_at = 0, sizes_at = 0, limits_at = 0, first_at = 0, flag_at = 0;

  void stage(staging& s, const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
             const std::vector<std::uint32_t>& limits) {
    first = first_blocks(sizes, std::vector<std::int64_t>(sizes.size(), finite_chunk));
    grads_at = s.add(grads);
    sizes_at = s.add(sizes);
    limits_at = s.add(limits);
    first_at = s.add(first);
    flag_at = s.add(std::vector<int>{0});
  }
  bool empty() const { return first.back() == 0; }
  /// Sets the flag at flag(s) when a gradient fails.
  void launch(staging& s) const {
    if (empty()) return;
    finite_check<<<grid_of(first), threads_per_block>>>(s.at<const float* const>(grads_at), s.at<std::int64_t>(sizes_at),
                                                        s.at<std::uint32_t>(limits_at), s.at<std::int64_t>(first_at),
                                                        static_cast<int>(first.size() - 1), flag(s));
    launched("finite_check launch");
  }
  int* flag(staging& s) const { return s.at<int>(flag_at); }
};

/// The launches of an optimizer step, staged: three lists, a launch each: tensors without
/// 8-bit moments (chunks of `chunk`), with plain 8-bit ones and with others (a quantization
/// block per group of threads).
struct step_plan {
  launch_list lists[3];
  std::vector<std::int64_t> firsts[3];
  std::int64_t items[3] = {0, 0, 0};
  std::size_t tensors_at[3] = {0, 0, 0}, first_at[3] = {0, 0, 0};

  /// Throws std::invalid_argument for an 8-bit block the kernels do not take.
  step_plan(bool sgd, const std::vector<tensor_update>& tensors) {
    for (const auto& t : tensors) {
      const bool int8 = t.m.mode == store_int8 || t.v.mode == store_int8 || t.x.mode == store_int8;
      if (int8 && (t.block < 1 || t.block > max_int8_block))
        throw std::invalid_argument("optimizer on CUDA: 8-bit blocks of " + std::to_string(t.block) +
                                    " elements; the CUDA step handles at most " + std::to_string(max_int8_block));
      if (!int8) lists[0].add(t, chunk);
      else if (plain_8bit(sgd, t)) lists[1].add(t, t.block);
      else lists[2].add(t, t.block);
    }
    for (int k = 0; k < 3; ++k) {
      firsts[k] = first_blocks(lists[k].sizes, lists[k].steps);
      items[k] = static_cast<std::int64_t>(grid_of(firsts[k]));
    }
  }
  bool empty() const { return items[0] == 0 && items[1] == 0 && items[2] == 0; }
  void stage(staging& s) {
    for (int k = 0; k < 3; ++k) {
      tensors_at[k] = s.add(lists[k].tensors);
      first_at[k] = s.add(firsts[k]);
    }
  }
  /// The kernels return at once when `skip` (a device flag, or null) is set.
  void launch(bool sgd, staging& s, const int* skip, int device) const {
    for (int k = 0; k < 3; ++k) {
      if (items[k] == 0) continue;
      const auto* dt = s.at<const tensor_update>(tensors_at[k]);
      const auto* first = s.at<const std::int64_t>(first_at[k]);
      const int count = static_cast<int>(lists[k].tensors.size());
      const std::int64_t n = items[k], largest = lists[k].largest_block;
      if (k == 0) {
        const auto grid = static_cast<unsigned>(std::min<std::int64_t>(
            n, sgd ? resident(elementwise_step<true>, threads_per_block, device)
                   : resident(elementwise_step<false>, threads_per_block, device)));
        if (sgd) elementwise_step<true><<<grid, threads_per_block>>>(dt, first, count, n, skip);
        else elementwise_step<false><<<grid, threads_per_block>>>(dt, first, count, n, skip);
        launched("elementwise_step launch");
      } else if (k == 1) {
        sgd ? launch_blockwise<true, true>(dt, first, count, n, largest, skip, device)
            : launch_blockwise<false, true>(dt, first, count, n, largest, skip, device);
      } else {
        sgd ? launch_blockwise<true, false>(dt, first, count, n, largest, skip, device)
            : launch_blockwise<false, false>(dt, first, count, n, largest, skip, device);
      }
    }
  }
};

/// Copies the device flag at `flag` into a page-locked buffer behind the work queued so far,
/// then (after the caller queues more) waits for that copy alone: read() returns the flag.
class flag_reader {
public:
  flag_reader(int* flag, int device) : pool_(pool_of(device)), buffer_(pool_.acquire(sizeof(int))) {
    cudaError_t e = cudaMemcpyAsync(buffer_.host, flag, sizeof(int), cudaMemcpyDeviceToHost, nullptr);
    if (e == cudaSuccess) e = cudaEventRecord(buffer_.done, nullptr);
    error_ = e;
  }
  flag_reader(const flag_reader&) = delete;
  flag_reader& operator=(const flag_reader&) = delete;
  ~flag_reader() { pool_.release(buffer_); }
  int read() {
    if (error_ == cudaSuccess) error_ = cudaEventSynchronize(buffer_.done);
    check(error_, "reading the finiteness flag");
    int v = 0;
    std::memcpy(&v, buffer_.host, sizeof v);
    return v;
  }

private:
  pinned_pool& pool_;
  pinned_buffer buffer_;
  cudaError_t error_;
};

}  // namespace

bool all_finite(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                const std::vector<std::uint32_t>& limits, int device) {
  staging s;
  check_plan check;
  check.stage(s, grads, sizes, limits);
  if (check.empty()) return true;
  use_device(device);
  s.upload(device);
  check.launch(s);
  return flag_reader(check.flag(s), device).read() == 0;
}

std::vector<double> sums_of_squares(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                                    int device) {
  std::vector<double> sums(grads.size(), 0.0);
  const auto first = first_blocks(sizes, std::vector<std::int64_t>(sizes.size(), square_piece));
  const std::int64_t pieces = first.back();
  if (pieces == 0) return sums;
  staging s;
  const std::size_t grads_at = s.add(grads), sizes_at = s.add(sizes), first_at = s.add(first);
  const std::size_t out_at = s.add(std::vector<double>(static_cast<std::size_t>(pieces), 0.0));
  use_device(device);
  s.upload(device);
  constexpr int per_block = threads_per_block / 16;
  square_sums<<<static_cast<unsigned>((pieces + per_block - 1) / per_block), threads_per_block>>>(
      s.at<const float* const>(grads_at), s.at<std::int64_t>(sizes_at), s.at<std::int64_t>(first_at),
      static_cast<int>(first.size() - 1), pieces, s.at<double>(out_at));
  launched("square_sums launch");
  std::vector<double> partial(static_cast<std::size_t>(pieces));
  check(cudaMemcpy(partial.data(), s.at<double>(out_at), partial.size() * sizeof(double), cudaMemcpyDeviceToHost),
        "cudaMemcpy (sums of squares)");
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::int64_t b = first[k]; b < first[k + 1]; ++b) sums[k] += partial[static_cast<std::size_t>(b)];
  return sums;
}

void optimizer_step(bool sgd, const std::vector<tensor_update>& tensors, int device) {
  step_plan plan(sgd, tensors);
  if (plan.empty()) return;
  use_device(device);
  staging s;
  plan.stage(s);
  s.upload(device);
  plan.launch(sgd, s, nullptr, device);
}

bool checked_step(bool sgd, const std::vector<tensor_update>& tensors, const std::vector<const float*>& grads,
                  const std::vector<std::int64_t>& sizes, const std::vector<std::uint32_t>& limits, int device) {
  step_plan plan(sgd, tensors);
  staging s;
  check_plan check;
  check.stage(s, grads, sizes, limits);
  if (check.empty() && plan.empty()) return true;
  plan.stage(s);
  use_device(device);
  s.upload(device);
  check.launch(s);
  flag_reader flag(check.flag(s), device);
  plan.launch(sgd, s, check.flag(s), device);
  return flag.read() == 0;
}

void fill_zero(void* p, std::size_t bytes, int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaMemset(p, 0, bytes), "cudaMemset");
}

std::size_t free_memory(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

}  // namespace troupe::kernels::cuda
