#pragma once
// What optimizer (optim.cpp) dispatches a step to on the host: the per-tensor plan of a step,
// the reference step (optim_reference.cpp), the fast step of one piece of a tensor
// (optim_fast.cpp, which picks the kernels of optim_avx512.cpp, optim_avx2.cpp or
// optim_portable.cpp), the moments' storage seen as fp32 (optim_state.cpp) and the gradient
// checks. (A device step goes to cuda_ops.hpp with the same constants.)
//
// The fast step and the reference step give the same bits in every storage mode, on every
// instruction set (tests/kernels/optim_test.cpp and optim_storage_test.cpp compare them).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "troupe/kernels/optim.hpp"

#include "quantize.hpp"

namespace troupe::kernels::optim {

/// optimizer::moment::mode values.
constexpr std::uint8_t mode_none = 0, mode_fp32 = 1, mode_bf16 = 2, mode_int8 = 3;

/// Adam/AdamW's constants for one tensor at one step.
struct adam_constants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size;
  float inv_bias2_sqrt;  // 1 / sqrt(bias_correction2), rounded once: torch divides by its square root
  float decay, l2, gscale;
};

/// SGD's constants for one tensor at one step.
struct sgd_constants {
  float lr, momentum, one_minus_dampening, wd, gscale;
  bool nesterov;
};

/// How values are rounded into a moment's storage at one step.
struct rounding {
  bool stochastic = false;
  double percentile = 0;
  std::uint32_t key = 0;
};

/// What a step does to one tensor, made once per step by optimizer::do_step.
struct tensor_plan {
  bool absmax_scale;  // the percentile scale is the absmax for this tensor's blocks (scale_is_absmax)
  adam_constants adam;
  sgd_constants sgd;
  bool first;          // SGD: the momentum buffer starts from this gradient
  rounding rm, rv, rx;  // of the first moment, the second and AMSGrad's maximum
  std::size_t piece;   // threads split the tensor into pieces of this many elements (whole chunks)
};

inline std::size_t numel_of(const optimizer::slot& s) { return static_cast<std::size_t>(s.p->value.numel()); }

// ---- the step (optim_reference.cpp, optim_fast.cpp) ---------------------------------------------

/// The reference step of one tensor on the host: one tensor-wide operation at a time, as
/// torch.optim's single-tensor code; compressed moments are decoded to fp32 first and rounded
/// back after (8-bit codes by the nearest-entry search, quant::qmap::quantize_reference).
void reference_step(optimizer_kind kind, optimizer::slot& s, const tensor_plan& plan);

/// The fast step of elements [begin, end) of one tensor on the host (begin on a chunk boundary),
/// on the widest vectors the CPU has (quant::simd_level()). `buffers` is the worker's L1 scratch
/// of scratch_floats(s) floats.
void fast_step(optimizer_kind kind, optimizer::slot& s, const tensor_plan& plan, std::size_t begin, std::size_t end,
               float* buffers);

/// The elements a fast step processes at once: one 8-bit block (all 8-bit moments of a tensor
/// share the block size), or 256 elements of bf16.
std::size_t chunk_of(const optimizer::slot& s);

/// The L1 scratch, in floats, that a worker stepping slot s uses: the 8-bit kernels' block
/// buffers (AVX-512 Adam: two blocks of up to three moments, 32 floats apart; AVX2: three
/// blocks; SGD: two), or three chunks of the portable path.
std::size_t scratch_floats(const optimizer::slot& s);

/// Whether scaling blocks of up to `block` values by percentile p of |x| is scaling by their
/// absmax: quant::block_scale takes the ceil(p / 100 * n)-th smallest |x| of n values, the
/// largest when that rank is n, for every n from 1 (a last, short block) up to `block`. Then
/// the fused kernels, which keep the absmax while they update, serve that percentile too (99.9
/// with blocks of up to 1000).
bool scale_is_absmax(double p, std::int64_t block);

// ---- the gradient checks (optim_fast.cpp) -------------------------------------------------------

/// A float is NaN or infinite when its exponent bits are all ones.
constexpr std::uint32_t exponent_bits = 0x7f800000u;

/// Below this exponent field a gradient's square is finite with room to spare (|g| < 2^63, g^2 <
/// 2^126): what 8-bit second moments need, whose block scale an infinite g^2 made infinite (and
/// every zero code of the block NaN at the next decode).
constexpr std::uint32_t square_finite_bits = static_cast<std::uint32_t>(127 + 63) << 23;

/// The largest exponent field (x & 0x7f800000) among x[0, n): 0x7f800000 when a value is NaN or
/// infinite.
std::uint32_t top_exponent(const float* x, std::size_t n);

/// The sum of x[i]^2 in double, in 16 partial sums (element i goes to sum i % 16) added in
/// order at the end: the same bits on every vector path, and no chain of dependent additions
/// to wait on. (cuda::sums_of_squares gives the same bits on a device.)
double sum_of_squares(const float* x, std::size_t n);

// ---- the moments' storage as fp32 (optim_state.cpp) ---------------------------------------------

/// The dynamic map of an 8-bit moment (signed for the first moment and momentum).
const quant::qmap& map_of(const optimizer::moment& mo);

/// quant::block_options of a moment's 8-bit blocks at one step.
quant::block_options block_opts(const optimizer::moment& mo, const rounding& r);

/// Elements [b, b + n) of a moment as fp32, into `out` (or a pointer into fp32 storage); for
/// 8-bit, b is a block boundary and n at most one block. Null for an absent moment.
float* load_moment(optimizer::moment& mo, std::size_t b, std::size_t n, float* out);

/// Writes back what load_moment() gave, rounding into the moment's storage. `reference`: the
/// 8-bit codes come from the nearest-entry search instead of the table, and stochastic bf16
/// rounds one value at a time.
void store_moment(optimizer::moment& mo, std::size_t b, std::size_t n, const float* x, const rounding& r,
                  bool reference);

/// The whole moment (n elements, on the host) as fp32 values.
std::vector<float> decode(const optimizer::moment& mo, std::size_t n);

}  // namespace troupe::kernels::optim
