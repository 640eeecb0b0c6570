#pragma once
// The GELU of the host layers (layers.cpp) and the exp of the attention (attention.cpp), in
// float and branch-free so that the loops vectorize: erf by Abramowitz and Stegun 7.1.26
// (absolute error below 1.5e-7) over an exp by Cephes' polynomial (relative error about 1e-7).
// The reference is the exact x * Phi(x) in double (gelu_reference);
// tests/kernels/gpt_layers_test.cpp compares them within 4e-7 * (1 + |x|).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace troupe::kernels::detail {

/// e^x for x in [-87, 88] (clamped there), about 1 ulp. Its ?: become selects (no branch in
/// the loops) under -fno-trapping-math.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (no rounding instruction needed).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
}

/// Phi(x) = (1 + erf(x / sqrt 2)) / 2 and e = exp(-x^2 / 2), which the derivative shares.
inline float normal_cdf(float x, float& e) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  e = exp_approx(-z * z);
  const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  const float erf_abs = 1.0f - poly * e;
  return 0.5f + 0.5f * std::copysign(erf_abs, x);
}

inline float gelu_value(float x) {
  float e;
  return x * normal_cdf(x, e);
}

/// d GELU / dx = Phi(x) + x phi(x).
inline float gelu_slope(float x) {
  float e;
  const float cdf = normal_cdf(x, e);
  return cdf + x * e * 0.39894228040143268f;
}

/// y = GELU(x) over n elements (fast_gelu.cpp: vectorized, AVX2 where the CPU has it; the same
/// results either way, as no operation is reordered or fused).
void gelu_rows(const float* x, float* y, std::size_t n);
/// dx = dy * GELU'(x) over n elements.
void gelu_grad_rows(const float* x, const float* dy, float* dx, std::size_t n);

/// The definition, in double: x Phi(x) and its derivative.
inline double gelu_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_slope_reference(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

}  // namespace troupe::kernels::detail
