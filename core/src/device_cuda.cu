#include <span>  // C++20: this file proves CUDA sources build as C++20

#include <cuda_runtime.h>

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

}  // namespace troupe
