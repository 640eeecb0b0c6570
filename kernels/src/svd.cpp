#include "troupe/kernels/svd.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "dynamic_library.hpp"

namespace troupe::kernels {
namespace {

// LAPACK's Fortran entry point; the trailing length is the hidden length of JOBZ that gfortran
// passes for character arguments.
using dgesdd_fn = void (*)(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
                           const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork,
                           int* info, std::size_t jobz_length);

dgesdd_fn lapack_dgesdd() {
  static const dgesdd_fn fn = [] {
    void* lib = detail::open_library("OpenBLAS", "TROUPE_OPENBLAS_LIBRARY", TROUPE_OPENBLAS_LIBRARY,
                                     {"libopenblas.so.0", "libopenblas.so"},
                                     "install Debian's libopenblas-dev (cmake/install-deps.sh does), or set "
                                     "TROUPE_OPENBLAS_LIBRARY to the library's path");
    auto* f = reinterpret_cast<dgesdd_fn>(dlsym(lib, "dgesdd_"));
    if (!f) throw std::runtime_error("the loaded OpenBLAS has no LAPACK (dgesdd_ is missing)");
    return f;
  }();
  return fn;
}

}  // namespace

svd_result svd(std::span<const double> a, std::int64_t rows, std::int64_t cols) {
  if (rows < 1 || cols < 1 || rows > INT_MAX / 8 || cols > INT_MAX / 8)
    throw std::invalid_argument("svd: a " + std::to_string(rows) + " x " + std::to_string(cols) + " matrix is out of range");
  if (a.size() != static_cast<std::size_t>(rows * cols))
    throw std::invalid_argument("svd: " + std::to_string(a.size()) + " values for a " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " matrix");
  if (!std::all_of(a.begin(), a.end(), [](double v) { return std::isfinite(v); }))
    throw std::invalid_argument("svd: the matrix holds a value that is not finite");
  // LAPACK is column-major: the row-major rows x cols matrix is the column-major cols x rows
  // matrix a^T = V S U^T. So LAPACK's U (cols x k, column-major) is our Vt (k x cols, row-major)
  // and its VT (k x rows, column-major) our U (rows x k, row-major).
  const int m = static_cast<int>(cols), n = static_cast<int>(rows), k = std::min(m, n);
  svd_result r;
  r.rows = rows;
  r.cols = cols;
  r.k = k;
  r.s.resize(static_cast<std::size_t>(k));
  r.vt.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(m));
  r.u.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(k));
  std::vector<double> work_a(a.begin(), a.end());  // dgesdd overwrites its input
  std::vector<int> iwork(8 * static_cast<std::size_t>(k));
  const char jobz = 'S';
  const int lda = m, ldu = m, ldvt = k, query = -1;
  int info = 0;
  double size = 0;
  const dgesdd_fn f = lapack_dgesdd();
  f(&jobz, &m, &n, work_a.data(), &lda, r.s.data(), r.vt.data(), &ldu, r.u.data(), &ldvt, &size, &query, iwork.data(),
    &info, 1);
  if (info != 0) throw std::runtime_error("svd: LAPACK's workspace query failed (info " + std::to_string(info) + ")");
  const int lwork = std::max(1, static_cast<int>(size));
  std::vector<double> work(static_cast<std::size_t>(lwork));
  f(&jobz, &m, &n, work_a.data(), &lda, r.s.data(), r.vt.data(), &ldu, r.u.data(), &ldvt, work.data(), &lwork,
    iwork.data(), &info, 1);
  if (info > 0) throw std::runtime_error("svd: LAPACK's dgesdd did not converge");
  if (info < 0) throw std::runtime_error("svd: LAPACK's dgesdd refused argument " + std::to_string(-info));
  return r;
}

}  // namespace troupe::kernels
