#pragma once
/// @file
/// What accelerators this process can use.

namespace troupe {

/// The number of usable CUDA devices: 0 when troupe was built without CUDA, when no driver is
/// installed, or when the driver refuses (any error means "no device"). @threadsafe
int cuda_device_count() noexcept;

/// True when troupe was built with its CUDA paths (TROUPE_WITH_CUDA).
bool built_with_cuda() noexcept;

}  // namespace troupe
