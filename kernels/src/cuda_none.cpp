// A build without CUDA: no tensor can live on a device (core refuses to allocate one), so these
// are reached only by a logic error; each says what is missing.

#include <stdexcept>

#include "cuda_ops.hpp"

namespace troupe::kernels::cuda {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("troupe was built without CUDA: kernels run on the CPU only "
                           "(rebuild with -DTROUPE_WITH_CUDA=ON where nvcc is installed)");
}
}  // namespace

bool all_finite(const std::vector<const float*>&, const std::vector<std::int64_t>&, const std::vector<std::uint32_t>&, int) {
  no_cuda();
}
std::vector<double> sums_of_squares(const std::vector<const float*>&, const std::vector<std::int64_t>&, int) {
  no_cuda();
}
void optimizer_step(bool, const std::vector<tensor_update>&, int) { no_cuda(); }
bool checked_step(bool, const std::vector<tensor_update>&, const std::vector<const float*>&,
                  const std::vector<std::int64_t>&, const std::vector<std::uint32_t>&, int) {
  no_cuda();
}
void fill_zero(void*, std::size_t, int) { no_cuda(); }
std::size_t free_memory(int) { no_cuda(); }
void gemm(int, bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t, const float*,
          std::int64_t, float, float*, std::int64_t) {
  no_cuda();
}
void add_bias_rows(int, float*, const float*, std::int64_t, std::int64_t) { no_cuda(); }
void accumulate_column_sums(int, const float*, float*, std::int64_t, std::int64_t) { no_cuda(); }
void activation_forward(int, activation, const float*, float*, std::int64_t) { no_cuda(); }
void activation_backward(int, activation, const float*, const float*, float*, std::int64_t) { no_cuda(); }
void add(int, const float*, const float*, float*, std::int64_t) { no_cuda(); }
void dropout(int, std::uint64_t, double, float, const float*, float*, std::int64_t) { no_cuda(); }
void layer_norm_forward(int, const float*, const float*, const float*, float, float*, float*, float*, std::int64_t,
                        std::int64_t) {
  no_cuda();
}
void layer_norm_backward_input(int, const float*, const float*, const float*, const float*, float*, std::int64_t,
                               std::int64_t) {
  no_cuda();
}
void layer_norm_backward_weight(int, const float*, const float*, float*, float*, std::int64_t, std::int64_t) {
  no_cuda();
}
double softmax_cross_entropy(int, const float*, const std::int64_t*, float*, std::int64_t, std::int64_t) { no_cuda(); }

}  // namespace troupe::kernels::cuda
