#include "troupe/kernels/gemm.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cuda_ops.hpp"
#include "dynamic_library.hpp"

namespace troupe::kernels {
namespace {

// OpenBLAS is loaded when first used, not linked: Debian's build picks its kernels by CPU model
// when it loads and falls back to the oldest (Prescott, SSE3) on models it does not know, which
// is what virtual machines often report. Before it loads, name the core by the features the CPU
// has (unless OPENBLAS_CORETYPE is set already); on this project's machines that is 1.6x faster
// training. Runs before main(), while the process has one thread.
[[maybe_unused]] const bool core_named = [] {
  if (std::getenv("OPENBLAS_CORETYPE")) return false;
  __builtin_cpu_init();
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (core) setenv("OPENBLAS_CORETYPE", core, 0);
  return core != nullptr;
}();

using sgemm_fn = decltype(&cblas_sgemm);

sgemm_fn openblas_sgemm() {
  static const sgemm_fn fn = [] {
    // One BLAS thread (see below), from the start: OpenBLAS makes its pool when it loads, and an
    // idle pool thread still yields in a loop beside the actors' workers.
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    void* lib = detail::open_library("OpenBLAS", "TROUPE_OPENBLAS_LIBRARY", TROUPE_OPENBLAS_LIBRARY,
                                     {"libopenblas.so.0", "libopenblas.so"},
                                     "install Debian's libopenblas-dev (cmake/install-deps.sh does), or set "
                                     "TROUPE_OPENBLAS_LIBRARY to the library's path");
    auto* f = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
    if (!f) throw std::runtime_error("OpenBLAS has no cblas_sgemm");
    // One BLAS thread: OpenBLAS's threads make the small products of a training step slower
    // here (they spin and yield), and their partition of the output changes the rounding with
    // the thread count, which would break bit-identical training. Parallelism comes from actors.
    using set_threads_fn = void (*)(int);
    if (auto* set_threads = reinterpret_cast<set_threads_fn>(dlsym(lib, "openblas_set_num_threads")))
      set_threads(1);
    return f;
  }();
  return fn;
}

struct dims {
  std::int64_t m, n, k;
};

dims check(const tensor& a, bool ta, const tensor& b, bool tb, const tensor& c, bool host_only) {
  auto matrix = [&](const tensor& t, const char* name) {
    if (t.rank() != 2 || t.type() != dtype::f32 || (host_only && !t.where().is_cpu()))
      throw std::invalid_argument(std::string("gemm: ") + name + " must be a 2-D f32 " + (host_only ? "host " : "") +
                                  "tensor, not " + t.str());
    if (t.where() != c.where())
      throw std::invalid_argument(std::string("gemm: ") + name + " is " + t.str() + " but C is on " + c.where().str() +
                                  ": all three must be on one device");
  };
  matrix(a, "A");
  matrix(b, "B");
  matrix(c, "C");
  const std::int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const std::int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n)
    throw std::invalid_argument("gemm: shapes do not agree: op(A) is " + std::to_string(m) + "x" +
                                std::to_string(k) + ", op(B) " + std::to_string(kb) + "x" +
                                std::to_string(n) + ", C " + c.str());
  // The product reads A and B while it writes C: C sharing their storage gives garbage.
  auto overlaps = [&](const tensor& t) {
    return t.nbytes() > 0 && c.nbytes() > 0 && t.where() == c.where() && t.bytes() < c.bytes() + c.nbytes() &&
           c.bytes() < t.bytes() + t.nbytes();
  };
  if (overlaps(a) || overlaps(b)) throw std::invalid_argument("gemm: C overlaps A or B: write the product to a tensor of its own");
  return {m, n, k};
}

}  // namespace

void gemm(const tensor& a, bool ta, const tensor& b, bool tb, tensor& c, float alpha, float beta) {
  const auto d = check(a, ta, b, tb, c, false);
  if (d.m == 0 || d.n == 0) return;
  if (!c.where().is_cpu()) {
    cuda::gemm(c.where().index, ta, tb, d.m, d.n, d.k, alpha, reinterpret_cast<const float*>(a.bytes()), a.dim(1),
               reinterpret_cast<const float*>(b.bytes()), b.dim(1), beta, reinterpret_cast<float*>(c.bytes()), c.dim(1));
    return;
  }
  openblas_sgemm()(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(d.m), static_cast<int>(d.n), static_cast<int>(d.k), alpha,
              a.data<float>().data(), static_cast<int>(a.dim(1)), b.data<float>().data(),
              static_cast<int>(b.dim(1)), beta, c.data<float>().data(), static_cast<int>(c.dim(1)));
}

void gemm_reference(const tensor& a, bool ta, const tensor& b, bool tb, tensor& c, float alpha,
                    float beta) {
  const auto d = check(a, ta, b, tb, c, true);
  auto A = a.data<float>();
  auto B = b.data<float>();
  auto C = c.data<float>();
  const std::int64_t lda = a.dim(1), ldb = b.dim(1);
  for (std::int64_t i = 0; i < d.m; ++i)
    for (std::int64_t j = 0; j < d.n; ++j) {
      double sum = 0;
      for (std::int64_t p = 0; p < d.k; ++p) {
        const double x = ta ? A[p * lda + i] : A[i * lda + p];
        const double y = tb ? B[j * ldb + p] : B[p * ldb + j];
        sum += x * y;
      }
      float& out = C[i * d.n + j];
      out = static_cast<float>(alpha * sum + (beta == 0.0f ? 0.0 : beta * static_cast<double>(out)));
    }
}

}  // namespace troupe::kernels
