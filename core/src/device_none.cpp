#include "device_memory.hpp"

#include <cstring>
#include <stdexcept>

#include "troupe/core/device.hpp"

namespace troupe {

int cuda_device_count() noexcept { return 0; }
bool built_with_cuda() noexcept { return false; }

namespace detail {

[[noreturn]] static void no_cuda() {
  throw std::runtime_error("troupe was built without CUDA: tensors live on the CPU only "
                           "(rebuild with -DTROUPE_WITH_CUDA=ON where nvcc is installed)");
}

void* device_allocate(std::size_t, int) { no_cuda(); }
void device_free(void*, std::size_t, int) noexcept {}
void device_copy(void* dst, device dw, const void* src, device sw, std::size_t bytes) {
  if (!dw.is_cpu() || !sw.is_cpu()) no_cuda();
  std::memmove(dst, src, bytes);
}
void device_zero(void*, std::size_t, int) { no_cuda(); }
void device_release_cache() noexcept {}

}  // namespace detail
}  // namespace troupe
