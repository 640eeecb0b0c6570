// CUDA device memory for tensors: a caching allocator (freed blocks are kept per device and
// rounded size, and reused), copies in every direction, and the device count.

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <span>  // C++20: this file proves CUDA sources build as C++20
#include <stdexcept>
#include <string>
#include <vector>

#include "device_memory.hpp"
#include "troupe/core/device.hpp"

namespace troupe {

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

bool built_with_cuda() noexcept { return true; }

namespace detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

void select(int index) {
  const int n = cuda_device_count();
  if (index < 0 || index >= n)
    throw std::runtime_error("CUDA device " + std::to_string(index) + " is not available (" +
                             std::to_string(n) + " device(s) found)");
  check(cudaSetDevice(index), "cudaSetDevice");
}

/// Rounds a request so that freed blocks fit later requests of about the same size.
std::size_t rounded(std::size_t bytes) {
  const std::size_t small = 512, large = std::size_t{1} << 20;
  const std::size_t step = bytes < large ? small : large;
  return (bytes + step - 1) / step * step;
}

struct cache {
  std::mutex mutex;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_blocks;
};

cache& the_cache() {
  static cache* c = new cache;  // never destroyed: tensors may outlive static destructors
  return *c;
}

}  // namespace

void* device_allocate(std::size_t bytes, int index) {
  const std::size_t size = rounded(bytes);
  auto& c = the_cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_blocks.find({index, size});
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
  }
  select(index);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    device_release_cache();  // give the cached blocks back and try once more
    e = cudaSetDevice(index);  // releasing visits every device that has cached blocks
    if (e == cudaSuccess) e = cudaMalloc(&p, size);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  check(e, "cudaMalloc");
  return p;
}

void device_free(void* p, std::size_t bytes, int index) noexcept {
  auto& c = the_cache();
  std::lock_guard lock(c.mutex);
  try {
    c.free_blocks[{index, rounded(bytes)}].push_back(p);
  } catch (...) {
    cudaFree(p);
  }
}

void device_copy(void* dst, device dw, const void* src, device sw, std::size_t bytes) {
  if (bytes == 0) return;
  if (!dw.is_cpu() && !sw.is_cpu() && dw.index != sw.index) {
    // Between two devices: a peer copy, documented to wait for the work pending on both.
    select(dw.index);
    check(cudaMemcpyPeer(dst, dw.index, src, sw.index, bytes), "cudaMemcpyPeer");
    return;
  }
  if (!dw.is_cpu()) select(dw.index);
  else if (!sw.is_cpu()) select(sw.index);
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
}

void device_zero(void* p, std::size_t bytes, int index) {
  if (bytes == 0) return;  // (an empty tensor has no storage)
  select(index);
  check(cudaMemset(p, 0, bytes), "cudaMemset");
}

void device_release_cache() noexcept {
  auto& c = the_cache();
  std::lock_guard lock(c.mutex);
  // cudaFree needs the block's device to be current; the caller's device is restored after.
  int current = -1;
  const bool known = cudaGetDevice(&current) == cudaSuccess;
  for (auto& [key, blocks] : c.free_blocks) {
    if (blocks.empty()) continue;
    if (cudaSetDevice(key.first) != cudaSuccess) continue;
    for (void* p : blocks) cudaFree(p);
    blocks.clear();
  }
  if (known) cudaSetDevice(current);
  cudaGetLastError();
}

}  // namespace detail
}  // namespace troupe
