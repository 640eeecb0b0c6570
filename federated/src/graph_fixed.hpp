#pragma once
// The fixed-point terms of graph propagation, shared by the centralised propagate() and the
// FedGCN actors so that both compute the same numbers: each term h_j / sqrt(d_j) is rounded once
// to an int64 in units of 2^-32, the sums are exact integer sums (any order gives the same
// bits), and a node's row is sum * 2^-32 / sqrt(d_i) rounded to float.

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace troupe::federated::detail {

inline constexpr double fixed_unit = 4294967296.0;  // 2^32
/// Terms below 2^16 in magnitude (2^48 units) and at most 16384 per sum cannot overflow.
inline constexpr double fixed_limit = 65536.0;
inline constexpr std::size_t max_fixed_degree = 16384;

inline double inverse_sqrt_degree(std::size_t degree) {
  if (degree > max_fixed_degree)
    throw std::invalid_argument("graph propagation: a node of degree " + std::to_string(degree) + " (at most " +
                                std::to_string(max_fixed_degree) + ")");
  return 1.0 / std::sqrt(static_cast<double>(degree));
}

inline std::int64_t fixed_term(float h, double inv_sqrt_degree) {
  const double v = static_cast<double>(h) * inv_sqrt_degree;
  if (!(std::fabs(v) < fixed_limit))
    throw std::invalid_argument("graph propagation: a feature of " + std::to_string(v) +
                                " after scaling (|x / sqrt(d)| must stay below 65536 and finite)");
  return std::llround(v * fixed_unit);
}

inline float fixed_row_value(std::int64_t sum, double inv_sqrt_degree) {
  return static_cast<float>(static_cast<double>(sum) / fixed_unit * inv_sqrt_degree);
}

}  // namespace troupe::federated::detail
