// The optimizer's fast step on the host: for one piece of a tensor, the kernel its storage and
// the CPU's instruction set call for (quant::simd_level(): optim_avx512.cpp at 2,
// optim_avx2.cpp at 1, optim_portable.cpp at 0), and the gradient checks picked the same way.
//
// Storage the fused kernels do not take goes through the chunk path: one chunk at a time decoded
// into fp32 buffers that stay in L1 (load_moment), the fp32 kernel, and rounded back
// (store_moment). Every path gives the reference step's bits (optim_reference.cpp).

#include <algorithm>
#include <cmath>
#include <utility>

#include "optim_kernels.hpp"

namespace troupe::kernels::optim {

namespace {

/// Whether adam_compressed takes this slot: every option of bf16 and 8-bit state (the first
/// moment like v or fp32), on AVX2 and AVX-512, except on AVX2 an fp32 first moment with 8-bit v:
/// there the chunk path (v decoded into L1 by a loop of table lookups, then the stream kernel) measured
/// 0.026 s/step against the fused loop's 0.035 (AdamW, 20 M parameters, Zen 3), while with both
/// moments 8-bit the fused loop is the faster (0.037 against 0.043).
bool fused_compressed(optimizer_kind kind, const optimizer::slot& s) {
  if (quant::simd_level() < 1 || kind == optimizer_kind::sgd) return false;
  const auto &m = s.m, &v = s.v, &x = s.vmax;
  if (x.mode != mode_none && (x.mode != v.mode || x.block != v.block)) return false;
  const bool same = m.mode == v.mode && m.block == v.block;
  if (v.mode == mode_int8 && !same && quant::simd_level() < 2) return false;
  return (same || m.mode == mode_fp32) && (v.mode == mode_bf16 || v.mode == mode_int8);
}

/// The fused step over elements [begin, end) of a slot (begin on a block boundary for 8-bit):
/// bf16 or 8-bit moments converted in registers, no fp32 copy of them. absmax_scale: the 8-bit
/// blocks' percentile scale is their absmax (scale_is_absmax).
void adam_compressed(optimizer::slot& s, std::size_t begin, std::size_t end, const adam_constants& c,
                     const rounding& rm, const rounding& rv, const rounding& rx, bool absmax_scale, float* buffers) {
  const bool avx512 = quant::simd_level() >= 2;
  if (s.v.mode == mode_bf16) {
    float* p = s.p->value.data<float>().data() + begin;
    const float* g = std::as_const(*s.p).grad.data<float>().data() + begin;
    std::uint16_t* v = s.v.data.data<std::uint16_t>().data() + begin;
    std::uint16_t* x = s.vmax.mode == mode_bf16 ? s.vmax.data.data<std::uint16_t>().data() + begin : nullptr;
    const draw_keys keys{rm.key, rv.key, rx.key, static_cast<std::uint32_t>(begin)};
    auto stream = [&](auto* m) {
      if (avx512) avx512::adam_bf16(p, g, m, v, x, end - begin, c, keys, rv.stochastic);
      else avx2::adam_bf16(p, g, m, v, x, end - begin, c, keys, rv.stochastic);
    };
    // The first moment bf16 like v, or fp32 (first_moment_fp32).
    if (s.m.mode == mode_fp32) stream(s.m.data.data<float>().data() + begin);
    else stream(s.m.data.data<std::uint16_t>().data() + begin);
    return;
  }
  // `buffers` (scratch_floats) holds the new values of up to three moments: one block each on
  // AVX2; two blocks each, 32 floats apart, on AVX-512 (that kernel quantizes the block before
  // while it updates one).
  if (avx512) avx512::adam_int8(s, begin, end, c, rm, rv, rx, absmax_scale, buffers);
  else avx2::adam_int8(s, begin, end, c, rm, rv, rx, absmax_scale, buffers);
}

}  // namespace

bool scale_is_absmax(double p, std::int64_t block) {
  if (p <= 0 || p >= 100) return true;
  for (std::int64_t n = 1; n <= block; ++n)
    if (static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(n))) < static_cast<std::size_t>(n)) return false;
  return true;
}

std::size_t chunk_of(const optimizer::slot& s) {
  for (const auto* mo : {&s.m, &s.v, &s.vmax})
    if (mo->mode == mode_int8) return static_cast<std::size_t>(mo->block);
  return 256;
}

std::size_t scratch_floats(const optimizer::slot& s) { return 6 * chunk_of(s) + 64; }

void fast_step(optimizer_kind kind, optimizer::slot& s, const tensor_plan& pl, std::size_t begin, std::size_t end,
               float* buffers) {
  const int level = quant::simd_level();
  float* p = s.p->value.data<float>().data();
  const float* g = std::as_const(*s.p).grad.data<float>().data();
  // The fp32 kernel over elements [b, b + n) with fp32 moments (null: absent).
  auto kernel = [&](std::size_t b, std::size_t n, float* m, float* v, float* x) {
    if (kind == optimizer_kind::sgd) {
      if (level >= 2) avx512::sgd_fp32(p + b, g + b, m, n, pl.sgd, pl.first);
      else if (level == 1) avx2::sgd_fp32(p + b, g + b, m, n, pl.sgd, pl.first);
      else portable::sgd_fp32(p + b, g + b, m, n, pl.sgd, pl.first);
    } else if (level >= 2) {
      avx512::adam_fp32(p + b, g + b, m, v, x, n, pl.adam);
    } else if (level == 1) {
      avx2::adam_fp32(p + b, g + b, m, v, x, n, pl.adam);
    } else {
      portable::adam_fp32(p + b, g + b, m, v, x, n, pl.adam);
    }
  };
  const bool all_fp32 = s.m.mode <= mode_fp32 && s.v.mode <= mode_fp32 && s.vmax.mode <= mode_fp32;
  if (all_fp32) {
    auto at = [&](optimizer::moment& mo) {
      return mo.mode == mode_fp32 ? mo.data.data<float>().data() + begin : nullptr;
    };
    kernel(begin, end - begin, at(s.m), at(s.v), at(s.vmax));
    return;
  }
  if (kind == optimizer_kind::sgd && s.m.mode == mode_bf16 && level >= 1) {
    std::uint16_t* buf = s.m.data.data<std::uint16_t>().data() + begin;
    const std::size_t n = end - begin;
    // Stochastic rounding draws by (key, index in the tensor); rounding to nearest draws nothing.
    const bool stochastic = pl.rm.stochastic;
    const std::uint32_t key = stochastic ? pl.rm.key : 0, at = stochastic ? static_cast<std::uint32_t>(begin) : 0;
    if (level >= 2) avx512::sgd_bf16(p + begin, g + begin, buf, n, pl.sgd, pl.first, stochastic, key, at);
    else avx2::sgd_bf16(p + begin, g + begin, buf, n, pl.sgd, pl.first, stochastic, key, at);
    return;
  }
  if (kind == optimizer_kind::sgd && s.m.mode == mode_int8 && level >= 1) {
    const std::size_t block = static_cast<std::size_t>(s.m.block);
    std::uint8_t* mc = s.m.data.data<std::uint8_t>().data();
    float* msc = s.m.scales.data<float>().data();
    const auto& map = map_of(s.m);
    const double percentile = pl.absmax_scale ? 0.0 : pl.rm.percentile;
    if (level >= 2 && s.m.is_signed)
      avx512::sgd_int8(p, g, mc, msc, map, begin, end, block, pl.sgd, pl.first, buffers, pl.rm.key, percentile,
                       pl.rm.stochastic);
    else
      avx2::sgd_int8(p, g, mc, msc, map, block_opts(s.m, pl.rm), begin, end, block, pl.sgd, pl.first, buffers,
                     pl.rm.key, percentile);
    return;
  }
  if (kind != optimizer_kind::sgd && fused_compressed(kind, s)) {
    adam_compressed(s, begin, end, pl.adam, pl.rm, pl.rv, pl.rx, pl.absmax_scale, buffers);
    return;
  }
  // Other compressed moments: one chunk at a time through buffers that stay in L1.
  const std::size_t chunk = chunk_of(s);
  for (std::size_t b = begin; b < end; b += chunk) {
    const std::size_t n = std::min(chunk, end - b);
    float* m = load_moment(s.m, b, n, buffers);
    float* v = load_moment(s.v, b, n, buffers + chunk);
    float* x = load_moment(s.vmax, b, n, buffers + 2 * chunk);
    kernel(b, n, m, v, x);
    store_moment(s.m, b, n, m, pl.rm, false);
    store_moment(s.v, b, n, v, pl.rv, false);
    store_moment(s.vmax, b, n, x, pl.rx, false);
  }
}

std::uint32_t top_exponent(const float* x, std::size_t n) {
  const int level = quant::simd_level();
  if (level >= 2) return avx512::top_exponent(x, n);
  if (level == 1) return avx2::top_exponent(x, n);
  return portable::top_exponent(x, n);
}

double sum_of_squares(const float* x, std::size_t n) {
  if (quant::simd_level() >= 2) return avx512::sum_of_squares(x, n);
  double sums[16] = {};
  return portable::sum_of_squares(x, n, sums);
}

}  // namespace troupe::kernels::optim
