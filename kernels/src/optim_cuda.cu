// The optimizer step on a CUDA device: fused multi-tensor kernels for SGD, Adam and AdamW with
// fp32, bf16 and 8-bit block-wise moments.
//
// Reference: optim.cpp's fused loops (adam_fused_loop, sgd_fused_loop) and its storage
// (load_moment / store_moment), element for element. This file is compiled with --fmad=false so
// that no multiply-add is contracted: every operation is the same IEEE operation in the same
// order as on the CPU (sqrtf and division are correctly rounded by default), so fp32 results are
// expected to agree to the bit; the tests allow a few ulp. 8-bit codes use the same map, the
// same block absmax, the exact nearest-entry decision (ties: the lower code; by qmap::estimate's
// arithmetic, with a search for the values it is not sure of) and the same "a nonzero value keeps
// its sign" rule.
//
// A step is two launches (plus the non-finite check before them):
// - elementwise_step: tensors without 8-bit moments, split into chunks of 4096 elements, a
//   thread block per chunk, 4 elements per thread per iteration with 16-byte loads and stores
//   when the tensor's arrays are aligned;
// - blockwise_step: tensors with 8-bit moments, a quantization block at a time per thread block
//   (a grid of as many thread blocks as the SMs hold at once, looping over the quantization
//   blocks): dequantize, update, keep the new values in shared memory, reduce the block's
//   absmax, requantize.
// Both read a device array of tensor descriptors and, per tensor, the index of its first thread
// block (a prefix sum): a thread block finds its tensor by binary search, so a whole list of
// tensors is one launch and what goes to the device per step is O(tensors), not O(blocks).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
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

// The dynamic maps (0: signed, 1: unsigned): values and decision points, from quantize.cpp.
// Global, not __constant__: each thread reads the entry of its own code, and the constant cache
// serializes a warp's reads of different addresses (up to 32 ways); blockwise_step copies them
// to shared memory first.
__device__ float map_values[2][256];
__device__ float map_above[2][256];
__constant__ unsigned char map_zero[2];

// qmap::estimate's tables with keep_nonzero (the rule every 8-bit moment here uses), per map:
// the code comes from a few table reads and one multiply-add instead of an 8-step search, and
// the rare values it is not sure of take the search.
struct estimate_tables {
  int piece[16];        // per exponent slot
  float threshold[16];  // per exponent slot
  float scale[16], offset[16];
  int limit[16];  // per piece
};
__device__ estimate_tables map_estimate[2];

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
  estimate_tables estimate[2];
  for (int s = 0; s < 2; ++s) {
    const auto& map = quant::qmap::dynamic(s == 0);
    std::memcpy(estimate[s].piece, map.exponent_piece(), sizeof estimate[s].piece);
    std::memcpy(estimate[s].threshold, map.exponent_threshold(), sizeof estimate[s].threshold);
    std::memcpy(estimate[s].scale, map.piece_scale(true), sizeof estimate[s].scale);
    std::memcpy(estimate[s].offset, map.piece_offset(true), sizeof estimate[s].offset);
    std::memcpy(estimate[s].limit, map.piece_limit(true), sizeof estimate[s].limit);
  }
  check(cudaMemcpyToSymbol(map_estimate, estimate, sizeof estimate), "cudaMemcpyToSymbol");
  if (uploaded.size() <= static_cast<std::size_t>(device)) uploaded.resize(device + 1, 0);
  uploaded[device] = 1;
}

// ---- element arithmetic (optim.cpp's loops, one element) --------------------------------------

__device__ __forceinline__ float adam_element(const update_constants& c, float p, float grad, float& m, float& v,
                                              float* x) {
  const float param = p * c.decay;
  float g = grad * c.gscale;
  if (c.l2 != 0.0f) g = g + param * c.l2;
  const float mi = c.one_minus_beta1 < 0.5f ? m + c.one_minus_beta1 * (g - m)
                                            : g - (g - m) * (1.0f - c.one_minus_beta1);
  const float vi = v * c.beta2 + c.one_minus_beta2 * g * g;
  float second = vi;
  if (x) {
    second = *x < vi ? vi : *x;  // std::max(vmax, vi), as the CPU (the same operand on a NaN)
    *x = second;
  }
  const float denom = sqrtf(second) * c.inv_bias2_sqrt + c.eps;
  m = mi;
  v = vi;
  return param + (-c.step_size) * mi / denom;
}

__device__ __forceinline__ float sgd_element(const update_constants& c, float p, float grad, float* buf) {
  float g = grad * c.gscale;
  if (c.wd != 0.0f) g = g + p * c.wd;
  if (buf) {
    const float b = c.first ? g : *buf * c.momentum + g * c.one_minus_dampening;
    *buf = b;
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

/// qmap::estimate with keep_nonzero (the same operations): the code of xn, or -1 when the
/// estimate is not sure.
__device__ __forceinline__ int estimate(float xn, bool is_signed, int zero, const estimate_tables& e) {
  float a = is_signed ? fabsf(xn) : (xn > 0.0f ? xn : 0.0f);
  a = a < 1.0f ? a : 1.0f;
  const std::uint32_t ab = __float_as_uint(a);
  const float ae = a > quant::qmap::est_floor ? a : quant::qmap::est_floor;
  const std::uint32_t slot = (__float_as_uint(ae) >> 24) & 15u;
  const int piece = e.piece[slot] + (a >= e.threshold[slot] ? 1 : 0);
  const float t = fmaf(a, e.scale[piece], e.offset[piece]);
  if (fabsf(t - rintf(t)) < quant::qmap::estimate_margin) return -1;
  std::uint32_t k = t >= 0x1p32f ? 0xffffffffu : __float2uint_rz(t);
  k = min(k, static_cast<std::uint32_t>(e.limit[piece]));
  k = min(k, ab);  // a zero keeps index 0
  int code = static_cast<int>(k);
  if (is_signed) {
    code = (__float_as_uint(xn) >> 31) != 0 ? zero - code : zero + code;
    code = code < 0 ? 0 : code;
  }
  return code;
}

/// The 8-bit code of x in a block of scale `scale` (quant::quantize_block_reference's rule), with
/// the map's values and decision points at `values` and `above` and its estimate tables at `e`.
__device__ __forceinline__ std::uint8_t quantize(float x, float scale, int map, const float* values, const float* above,
                                                 const estimate_tables& e, bool stochastic, std::uint32_t key,
                                                 std::uint32_t index) {
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  const float xn = x * inv;
  if (!stochastic) {
    const int c = estimate(xn, map == 0, map_zero[map], e);
    if (c >= 0) return static_cast<std::uint8_t>(c);
  }
  // The nearest entry: the number of decision points below xn (map_above is sorted).
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (xn > above[mid]) lo = mid + 1;
    else hi = mid;
  }
  int c = lo;
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
  if (c == map_zero[map] && xn != 0.0f) {
    if (xn > 0) c = c + 1;
    else if (c > 0) c = c - 1;
  }
  return static_cast<std::uint8_t>(c);
}

/// maps: the values of both maps (map_values or its copy in shared memory).
__device__ __forceinline__ float load(const moment_ref& mo, std::int64_t i, float scale, const float (*maps)[256]) {
  switch (mo.mode) {
    case store_fp32: return static_cast<const float*>(mo.data)[i];
    case store_bf16: return from_bf16(static_cast<const std::uint16_t*>(mo.data)[i]);
    case store_int8: return maps[mo.is_signed ? 0 : 1][static_cast<const std::uint8_t*>(mo.data)[i]] * scale;
    default: return 0.0f;
  }
}

/// fp32 and bf16 (8-bit moments are written per block).
__device__ __forceinline__ void store(const moment_ref& mo, std::int64_t i, float x, bool stochastic) {
  if (mo.mode == store_fp32) static_cast<float*>(mo.data)[i] = x;
  else if (mo.mode == store_bf16)
    static_cast<std::uint16_t*>(mo.data)[i] = to_bf16(x, stochastic, mo.key, static_cast<std::uint32_t>(i));
}

/// One element of one tensor: load, update, store (8-bit moments: the new value is returned in
/// m_out / v_out / x_out for the caller to quantize).
template <bool Sgd>
__device__ __forceinline__ void update(const tensor_update& t, std::int64_t i, float ms, float vs, float xs,
                                       const float (*maps)[256], float& m_out, float& v_out, float& x_out) {
  float m = load(t.m, i, ms, maps);
  float v = load(t.v, i, vs, maps);
  float x = load(t.x, i, xs, maps);
  if constexpr (Sgd) {
    t.p[i] = sgd_element(t.c, t.p[i], t.g[i], t.m.mode ? &m : nullptr);
  } else {
    t.p[i] = adam_element(t.c, t.p[i], t.g[i], m, v, t.x.mode ? &x : nullptr);
  }
  store(t.m, i, m, t.stochastic);
  store(t.v, i, v, t.stochastic);
  store(t.x, i, x, t.stochastic);
  m_out = m;
  v_out = v;
  x_out = x;
}

/// What one thread block works on: elements [begin, begin + length) of tensor `tensor`.
struct work_item {
  int tensor;
  int length;
  std::int64_t begin;
};

/// Work item b (the thread block's index, or the item a thread block loops to). first[k] is the
/// first item of tensor k (count + 1 entries, non-decreasing); a tensor without elements has none.
__device__ __forceinline__ work_item item_of(std::int64_t b, const std::int64_t* first, int count,
                                             const std::int64_t* sizes, const tensor_update* tensors,
                                             std::int64_t step_if_fixed) {
  int lo = 0, hi = count - 1;  // the last k with first[k] <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (first[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  const std::int64_t n = sizes ? sizes[lo] : tensors[lo].n;
  const std::int64_t step = step_if_fixed ? step_if_fixed : tensors[lo].block;
  const std::int64_t begin = (b - first[lo]) * step;
  return {lo, static_cast<int>(n - begin < step ? n - begin : step), begin};
}

constexpr int threads_per_block = 256;
constexpr int chunk = 4096;  // elements per work item of the elementwise step

/// True when the fp32 arrays of t are 16-byte aligned and its bf16 ones 8-byte aligned.
bool vectorizable(const tensor_update& t) {
  auto aligned = [](const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; };
  if (!aligned(t.p, 16) || !aligned(t.g, 16)) return false;
  for (const moment_ref* mo : {&t.m, &t.v, &t.x}) {
    if (mo->mode == store_fp32 && !aligned(mo->data, 16)) return false;
    if (mo->mode == store_bf16 && !aligned(mo->data, 8)) return false;
  }
  return true;
}

template <bool Sgd>
__device__ __forceinline__ void update4(const tensor_update& t, std::int64_t i) {
  // 16-byte loads and stores of p, g and fp32 moments; 8 bytes of bf16 moments.
  float4 p = *reinterpret_cast<const float4*>(t.p + i);
  const float4 g = *reinterpret_cast<const float4*>(t.g + i);
  float pm[4], pv[4], px[4];
  const moment_ref* mos[3] = {&t.m, &t.v, &t.x};
  float* outs[3] = {pm, pv, px};
  for (int k = 0; k < 3; ++k) {
    const moment_ref& mo = *mos[k];
    float* o = outs[k];
    if (mo.mode == store_fp32) {
      const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(mo.data) + i);
      o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
    } else if (mo.mode == store_bf16) {
      const uint2 a = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(mo.data) + i);
      o[0] = __uint_as_float(a.x << 16), o[1] = __uint_as_float(a.x & 0xffff0000u);
      o[2] = __uint_as_float(a.y << 16), o[3] = __uint_as_float(a.y & 0xffff0000u);
    } else {
      o[0] = o[1] = o[2] = o[3] = 0.0f;
    }
  }
  float ps[4] = {p.x, p.y, p.z, p.w};
  const float gs[4] = {g.x, g.y, g.z, g.w};
  for (int l = 0; l < 4; ++l) {
    if constexpr (Sgd) ps[l] = sgd_element(t.c, ps[l], gs[l], t.m.mode ? &pm[l] : nullptr);
    else ps[l] = adam_element(t.c, ps[l], gs[l], pm[l], pv[l], t.x.mode ? &px[l] : nullptr);
  }
  // __stwb: a plain assignment through float4* came out of nvcc 13 as four 4-byte stores here.
  __stwb(reinterpret_cast<float4*>(t.p + i), make_float4(ps[0], ps[1], ps[2], ps[3]));
  for (int k = 0; k < 3; ++k) {
    const moment_ref& mo = *mos[k];
    const float* o = outs[k];
    if (mo.mode == store_fp32) {
      __stwb(reinterpret_cast<float4*>(static_cast<float*>(mo.data) + i), make_float4(o[0], o[1], o[2], o[3]));
    } else if (mo.mode == store_bf16) {
      std::uint32_t h[4];
      for (int l = 0; l < 4; ++l) h[l] = to_bf16(o[l], t.stochastic, mo.key, static_cast<std::uint32_t>(i + l));
      __stwb(reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(mo.data) + i),
             make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16)));
    }
  }
}

template <bool Sgd>
__global__ void elementwise_step(const tensor_update* tensors, const unsigned char* vector_ok, const std::int64_t* first,
                                 int count) {
  const work_item w = item_of(blockIdx.x, first, count, nullptr, tensors, chunk);
  const tensor_update& t = tensors[w.tensor];
  const std::int64_t end = w.begin + w.length;
  if (vector_ok[w.tensor]) {
    for (std::int64_t i = w.begin + 4 * static_cast<std::int64_t>(threadIdx.x); i < end; i += 4 * blockDim.x) {
      if (i + 4 <= end) {
        update4<Sgd>(t, i);
      } else {
        float m, v, x;
        for (std::int64_t j = i; j < end; ++j) update<Sgd>(t, j, 0, 0, 0, map_values, m, v, x);
      }
    }
  } else {
    float m, v, x;
    for (std::int64_t i = w.begin + threadIdx.x; i < end; i += blockDim.x)
      update<Sgd>(t, i, 0, 0, 0, map_values, m, v, x);
  }
}

/// The largest value of `x` over the thread block (x >= 0); every thread gets it.
__device__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// The 8-bit step: each thread block copies the maps' tables to shared memory once, then steps
/// quantization blocks items, items + gridDim.x, ... (a grid of a few thread blocks per SM: one
/// thread block per quantization block would copy the 4.7 KiB of tables for every 256 elements).
template <bool Sgd>
__global__ void blockwise_step(const tensor_update* tensors, const std::int64_t* first, int count, std::int64_t items) {
  extern __shared__ float values[];  // new values of the 8-bit moments: 3 x block
  __shared__ float scratch[32];
  __shared__ float maps[2][256], aboves[2][256];
  __shared__ estimate_tables estimates[2];
  for (int c = threadIdx.x; c < 2 * 256; c += blockDim.x) {
    maps[c / 256][c % 256] = map_values[c / 256][c % 256];
    aboves[c / 256][c % 256] = map_above[c / 256][c % 256];
  }
  static_assert(sizeof(estimate_tables) % sizeof(int) == 0);
  for (int w = threadIdx.x; w < static_cast<int>(sizeof estimates / sizeof(int)); w += blockDim.x)
    reinterpret_cast<int*>(estimates)[w] = reinterpret_cast<const int*>(map_estimate)[w];
  __syncthreads();
  // The loop's bounds are the same for every thread of the block (block_max synchronizes).
  for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const work_item w = item_of(item, first, count, nullptr, tensors, 0);
    const tensor_update& t = tensors[w.tensor];
    const std::int64_t k = w.begin / t.block;
    const moment_ref* mos[3] = {&t.m, &t.v, &t.x};
    float scale[3], absmax[3] = {0, 0, 0};
    for (int q = 0; q < 3; ++q) scale[q] = mos[q]->mode == store_int8 ? mos[q]->scales[k] : 0.0f;
    for (int j = threadIdx.x; j < w.length; j += blockDim.x) {
      float out[3];
      update<Sgd>(t, w.begin + j, scale[0], scale[1], scale[2], maps, out[0], out[1], out[2]);
      for (int q = 0; q < 3; ++q)
        if (mos[q]->mode == store_int8) {
          values[q * t.block + j] = out[q];
          absmax[q] = fmaxf(absmax[q], fabsf(out[q]));
        }
    }
    for (int q = 0; q < 3; ++q) {
      const moment_ref& mo = *mos[q];
      if (mo.mode != store_int8) continue;
      // synchronizes: every value is in shared memory. Below the smallest normal float, 0 (the
      // host's quant::stored_scale: 1/s would be infinite).
      float s = block_max(absmax[q], scratch);
      if (s < 1.17549435e-38f) s = 0.0f;
      auto* codes = static_cast<std::uint8_t*>(mo.data);
      const int map = mo.is_signed ? 0 : 1;
      for (int j = threadIdx.x; j < w.length; j += blockDim.x) {
        const std::int64_t i = w.begin + j;
        codes[i] = quantize(values[q * t.block + j], s, map, maps[map], aboves[map], estimates[map], t.stochastic,
                            mo.key, static_cast<std::uint32_t>(i));
      }
      if (threadIdx.x == 0) mo.scales[k] = s;
    }
    __syncthreads();  // the next item's values overwrite these
  }
}

__global__ void finite_check(const float* const* grads, const std::int64_t* sizes, const std::uint32_t* limits,
                             const std::int64_t* first, int count, int* bad) {
  const work_item w = item_of(blockIdx.x, first, count, sizes, nullptr, 4 * chunk);
  const float* g = grads[w.tensor];
  const std::uint32_t limit = limits[w.tensor];
  std::uint32_t any = 0;
  for (std::int64_t i = w.begin + threadIdx.x; i < w.begin + w.length; i += blockDim.x)
    any |= (__float_as_uint(g[i]) & 0x7f800000u) >= limit;
  if (__syncthreads_or(static_cast<int>(any)) && threadIdx.x == 0) *bad = 1;
}

/// Host arrays copied to the device in one transfer, from the caching allocator.
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
    buffer_ = tensor::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes_.size(), 16))}, dtype::u8,
                            troupe::device::cuda(device));
    check(cudaMemcpy(buffer_.bytes(), bytes_.data(), bytes_.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
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

}  // namespace

bool all_finite(const std::vector<const float*>& grads, const std::vector<std::int64_t>& sizes,
                const std::vector<std::uint32_t>& limits, int device) {
  const auto first = first_blocks(sizes, std::vector<std::int64_t>(sizes.size(), 4 * chunk));
  if (first.back() == 0) return true;
  use_device(device);
  staging s;
  const auto g_at = s.add(grads), n_at = s.add(sizes), l_at = s.add(limits), f_at = s.add(first),
             flag_at = s.add(std::vector<int>{0});
  s.upload(device);
  finite_check<<<grid_of(first), threads_per_block>>>(s.at<const float* const>(g_at), s.at<std::int64_t>(n_at),
                                                      s.at<std::uint32_t>(l_at), s.at<std::int64_t>(f_at),
                                                      static_cast<int>(sizes.size()), s.at<int>(flag_at));
  check(cudaGetLastError(), "finite_check launch");
  int bad = 0;
  check(cudaMemcpy(&bad, s.at<int>(flag_at), sizeof bad, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return bad == 0;
}

void optimizer_step(bool sgd, const std::vector<tensor_update>& tensors, int device) {
  // Two lists: tensors without 8-bit moments (chunks of `chunk`) and with (one block each).
  std::vector<tensor_update> plain, blocked;
  std::vector<std::int64_t> plain_n, plain_step, blocked_n, blocked_step;
  std::vector<unsigned char> vector_ok;
  std::int64_t largest_block = 1;
  for (const auto& t : tensors) {
    const bool int8 = t.m.mode == store_int8 || t.v.mode == store_int8 || t.x.mode == store_int8;
    if (int8 && (t.block < 1 || t.block > max_int8_block))
      throw std::invalid_argument("optimizer on CUDA: 8-bit blocks of " + std::to_string(t.block) +
                                  " elements; the CUDA step handles at most " + std::to_string(max_int8_block));
    if (int8) {
      blocked.push_back(t);
      blocked_n.push_back(t.n);
      blocked_step.push_back(t.block);
      largest_block = std::max(largest_block, t.block);
    } else {
      plain.push_back(t);
      plain_n.push_back(t.n);
      plain_step.push_back(chunk);
      vector_ok.push_back(vectorizable(t) ? 1 : 0);
    }
  }
  const auto plain_first = first_blocks(plain_n, plain_step), blocked_first = first_blocks(blocked_n, blocked_step);
  if (plain_first.back() == 0 && blocked_first.back() == 0) return;
  use_device(device);
  staging s;
  const auto p_at = s.add(plain), v_at = s.add(vector_ok), pf_at = s.add(plain_first), b_at = s.add(blocked),
             bf_at = s.add(blocked_first);
  s.upload(device);
  // The limit of dynamic shared memory is always the largest block's, never this launch's size:
  // another thread stepping on the same device between a smaller setting and this launch would
  // make the launch fail. Set before either launch, so that a failure here changes nothing.
  const int shared_limit = static_cast<int>(3 * max_int8_block * sizeof(float));
  if (blocked_first.back() > 0) {
    if (sgd)
      check(cudaFuncSetAttribute(blockwise_step<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_limit),
            "cudaFuncSetAttribute");
    else
      check(cudaFuncSetAttribute(blockwise_step<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_limit),
            "cudaFuncSetAttribute");
  }
  if (plain_first.back() > 0) {
    const auto grid = grid_of(plain_first);
    const auto* dt = s.at<const tensor_update>(p_at);
    const auto* ok = s.at<unsigned char>(v_at);
    const auto* first = s.at<std::int64_t>(pf_at);
    const int count = static_cast<int>(plain.size());
    if (sgd) elementwise_step<true><<<grid, threads_per_block>>>(dt, ok, first, count);
    else elementwise_step<false><<<grid, threads_per_block>>>(dt, ok, first, count);
    check(cudaGetLastError(), "elementwise_step launch");
  }
  if (blocked_first.back() > 0) {
    const auto grid = grid_of(blocked_first);
    const auto* dt = s.at<const tensor_update>(b_at);
    const auto* first = s.at<std::int64_t>(bf_at);
    const int count = static_cast<int>(blocked.size());
    const std::size_t shared = 3 * static_cast<std::size_t>(largest_block) * sizeof(float);
    // A few thread blocks per SM, as many as fit at once, loop over the items.
    int per_sm = 0, sms = 0;
    check(sgd ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, blockwise_step<true>, threads_per_block, shared)
              : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, blockwise_step<false>, threads_per_block, shared),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    const auto items = static_cast<std::int64_t>(grid);
    const auto resident = static_cast<std::int64_t>(std::max(1, per_sm) * std::max(1, sms));
    const auto launched = static_cast<unsigned>(std::min(items, resident));
    if (sgd) blockwise_step<true><<<launched, threads_per_block, shared>>>(dt, first, count, items);
    else blockwise_step<false><<<launched, threads_per_block, shared>>>(dt, first, count, items);
    check(cudaGetLastError(), "blockwise_step launch");
  }
  // The staging buffer goes back to the cache when this returns; the kernels reading it are
  // queued on the default stream, so a later use of the same block is ordered after them.
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
