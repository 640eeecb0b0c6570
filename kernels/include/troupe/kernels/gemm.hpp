#pragma once
/// @file
/// Matrix products on f32 tensors (row-major), through OpenBLAS on the CPU and cuBLAS on a CUDA
/// device. A plain reference
/// (gemm_reference) sits beside the fast path; the tests compare them.

#include "troupe/core/tensor.hpp"

namespace troupe::kernels {

/// C = alpha * op(A) * op(B) + beta * C, where op transposes when asked. A, B, C are 2-D f32
/// tensors on one device (host or CUDA); shapes and devices are checked (std::invalid_argument
/// naming them).
void gemm(const tensor& a, bool transpose_a, const tensor& b, bool transpose_b, tensor& c,
          float alpha = 1.0f, float beta = 0.0f);

/// The same, written to be read: three loops, double accumulation (host tensors only).
void gemm_reference(const tensor& a, bool transpose_a, const tensor& b, bool transpose_b,
                    tensor& c, float alpha = 1.0f, float beta = 0.0f);

}  // namespace troupe::kernels
