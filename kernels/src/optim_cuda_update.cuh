#pragma once
// One element of the optimizer step on a CUDA device, and the storage of its moments: what both
// step kernels (elementwise_step, optim_cuda_step.cu; blockwise_step, optim_cuda_8bit.cu) run.
//
// Reference: the host step's scalar rules (adam_element, sgd_element in optim_kernels.hpp, the
// element of optim_portable.cpp's fused loops adam_fused_loop and sgd_fused_loop) and its storage
// (load_moment / store_moment in optim_state.cpp), element for element. The step's files are
// compiled with --fmad=false so that no multiply-add is contracted: every operation is the same
// IEEE operation in the same order as on the CPU (sqrtf and division are correctly rounded by
// default), so fp32 results are expected to agree to the bit; the tests allow a few ulp.
//
// Each thread steps `lanes` (8) consecutive elements held in registers, with 16-byte loads and
// stores of fp32 and bf16 arrays (8-byte ones of 8-bit codes) where the addresses allow.

#include <cstddef>
#include <cstdint>

#include "optim_cuda.cuh"

namespace troupe::kernels::cuda {

// ---- element arithmetic (optim_kernels.hpp's adam_element and sgd_element) -------------------

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
/// moments stay in m, v and x (for the caller to quantize the 8-bit ones). `maps`: the 8-bit
/// maps' values (0: signed, 1: unsigned), read only for an 8-bit moment.
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

}  // namespace troupe::kernels::cuda
