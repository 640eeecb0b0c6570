#include "troupe/core/device.hpp"

namespace troupe {

int cuda_device_count() noexcept { return 0; }
bool built_with_cuda() noexcept { return false; }

}  // namespace troupe
