// The GELU's loops (fast_gelu.hpp), built with -O3 -fno-trapping-math so that they vectorize,
// in an AVX2 and a baseline clone chosen at load time.

#include "fast_gelu.hpp"

namespace troupe::kernels::detail {

[[gnu::target_clones("avx2", "default")]] void gelu_rows(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}

[[gnu::target_clones("avx2", "default")]] void gelu_grad_rows(const float* x, const float* dy, float* dx,
                                                               std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_slope(x[i]);
}

}  // namespace troupe::kernels::detail
