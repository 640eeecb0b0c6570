// The GELU's loops (fast_gelu.hpp), built with -O3 -fno-trapping-math so that they vectorize,
// compiled for AVX2 and the baseline and picked by an explicit test of the CPU (not an ifunc from
// target_clones: its resolver runs before the sanitizer runtimes start).

#include "fast_gelu.hpp"

namespace troupe::kernels::detail {
namespace {

[[gnu::always_inline]] inline void gelu_body(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}
[[gnu::always_inline]] inline void gelu_grad_body(const float* x, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_slope(x[i]);
}

[[gnu::target("avx2")]] void gelu_avx2(const float* x, float* y, std::size_t n) { gelu_body(x, y, n); }
void gelu_baseline(const float* x, float* y, std::size_t n) { gelu_body(x, y, n); }
[[gnu::target("avx2")]] void gelu_grad_avx2(const float* x, const float* dy, float* dx, std::size_t n) {
  gelu_grad_body(x, dy, dx, n);
}
void gelu_grad_baseline(const float* x, const float* dy, float* dx, std::size_t n) { gelu_grad_body(x, dy, dx, n); }

bool has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace

void gelu_rows(const float* x, float* y, std::size_t n) { (has_avx2() ? gelu_avx2 : gelu_baseline)(x, y, n); }

void gelu_grad_rows(const float* x, const float* dy, float* dx, std::size_t n) {
  (has_avx2() ? gelu_grad_avx2 : gelu_grad_baseline)(x, dy, dx, n);
}

}  // namespace troupe::kernels::detail
