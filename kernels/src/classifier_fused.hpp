#pragma once
// The fused MLP step's row kernels (classifier_fused.cpp, written once in classifier_rows.inc
// for AVX2 with FMA and for AVX-512), for classifier::step_fused and classifier::evaluate.

namespace troupe::kernels::detail {

/// Rows per backward tile (classifier::backward_tile).
inline constexpr int backward_tile = 16;

/// z [R, out] = a [R, in] W^T + b, ReLU when `relu`.
using forward_fn = void (*)(const float* a, int in, const float* w, const float* b, float* z, int out, bool relu);
/// For one layer and R <= backward_tile rows: da [R, in] += dz W with the weights as they were
/// (da may be null), then W, b -= lr * (dz^T a + mu (W - c) + k), row by row in one pass (cw, cb:
/// the proximal centre's rows, kw, kb: the correction's; each may be null). A batch of several
/// tiles carries the gradient's partial sums in gw, gb from one tile to the next (null for a
/// single tile); only the `last` tile adds the terms and changes the weights.
using backward_fn = void (*)(const float* a, int in, const float* dz, int out, float* w, float* b, float* da, float lr,
                             float mu, const float* cw, const float* cb, const float* kw, const float* kb, float* gw,
                             float* gb, bool first, bool last);

/// One instruction set's kernels: forward[n - 1] for n <= forward_tile rows, backward[n - 1]
/// for n <= backward_tile.
struct row_kernels {
  int forward_tile;
  const forward_fn* forward;
  const backward_fn* backward;
};

/// The CPU's best level: 2 AVX-512, 1 AVX2 with FMA, 0 neither.
int cpu_simd_level() noexcept;
/// The kernels for `level` (1 or 2); null for 0.
const row_kernels* row_kernels_for(int level) noexcept;

}  // namespace troupe::kernels::detail
