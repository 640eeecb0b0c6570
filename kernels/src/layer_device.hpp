#pragma once
// Where the layers compute (layers.cpp, layers_compose.cpp, losses.cpp): on a device tensor,
// the arithmetic runs where the parameters (or, for layers without parameters, the input) live,
// through cuda_ops.hpp, and inputs elsewhere are refused.

#include <stdexcept>
#include <string>
#include <utility>

#include "troupe/core/tensor.hpp"

namespace troupe::kernels::detail {

inline bool on_device(const tensor& t) { return !t.where().is_cpu(); }
/// A tensor's floats for a device kernel; the layers compute in f32 (the host path's data<float>
/// checks the same).
inline const float* fp(const tensor& t) {
  if (t.type() != dtype::f32) throw std::invalid_argument("the layers compute in f32; got " + t.str());
  return reinterpret_cast<const float*>(t.bytes());
}
inline float* fp(tensor& t) { return const_cast<float*>(fp(std::as_const(t))); }

inline void check_device(const tensor& x, device where, const std::string& who) {
  if (x.where() != where)
    throw std::invalid_argument(who + ": the input " + x.str() + " is not on " + where.str() +
                                ", where the parameters are: move it with .to()");
}

}  // namespace troupe::kernels::detail
