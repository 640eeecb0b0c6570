#include "troupe/kernels/gemm.hpp"

#include <cblas.h>

#include <stdexcept>
#include <string>

namespace troupe::kernels {
namespace {

struct dims {
  std::int64_t m, n, k;
};

dims check(const tensor& a, bool ta, const tensor& b, bool tb, const tensor& c) {
  auto matrix = [](const tensor& t, const char* name) {
    if (t.rank() != 2 || t.type() != dtype::f32 || !t.where().is_cpu())
      throw std::invalid_argument(std::string("gemm: ") + name + " must be a 2-D f32 host tensor, not " + t.str());
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
  return {m, n, k};
}

}  // namespace

void gemm(const tensor& a, bool ta, const tensor& b, bool tb, tensor& c, float alpha, float beta) {
  const auto d = check(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(d.m), static_cast<int>(d.n), static_cast<int>(d.k), alpha,
              a.data<float>().data(), static_cast<int>(a.dim(1)), b.data<float>().data(),
              static_cast<int>(b.dim(1)), beta, c.data<float>().data(), static_cast<int>(c.dim(1)));
}

void gemm_reference(const tensor& a, bool ta, const tensor& b, bool tb, tensor& c, float alpha,
                    float beta) {
  const auto d = check(a, ta, b, tb, c);
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
