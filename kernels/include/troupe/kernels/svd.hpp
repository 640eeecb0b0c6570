#pragma once
/// @file
/// The thin singular value decomposition of a dense matrix, through LAPACK's dgesdd (the LAPACK
/// that Debian's OpenBLAS ships, loaded where the GEMM loads it: see gemm.cpp). Double precision
/// throughout: callers truncate it and compare what they drop with the singular values.
///
/// Reference and tolerance: tests rebuild U diag(s) Vt and compare it with the input (abs
/// 1e-10 on entries of order 1), and check that U and V have orthonormal columns.

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::kernels {

/// a = u * diag(s) * vt, with k = min(rows, cols).
struct svd_result {
  std::int64_t rows = 0, cols = 0, k = 0;
  std::vector<double> u;   ///< rows x k, row-major, orthonormal columns
  std::vector<double> s;   ///< k singular values, descending, >= 0
  std::vector<double> vt;  ///< k x cols, row-major, orthonormal rows
};

/// The thin SVD of the row-major `rows` x `cols` matrix `a`. Throws std::invalid_argument for
/// sizes below 1, a span of another length or values that are not finite, and std::runtime_error
/// when LAPACK cannot be loaded or does not converge.
svd_result svd(std::span<const double> a, std::int64_t rows, std::int64_t cols);

}  // namespace troupe::kernels
