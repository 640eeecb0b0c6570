#pragma once
// Device memory behind troupe::buffer: implemented by device_cuda.cu (caching allocator) or by
// device_none.cpp (a build without CUDA, where every request for a device fails clearly).

#include <cstddef>

#include "troupe/core/tensor.hpp"

namespace troupe::detail {

void* device_allocate(std::size_t bytes, int index);
void device_free(void* p, std::size_t bytes, int index) noexcept;
/// Copies between any two places (host or device).
void device_copy(void* dst, device dst_where, const void* src, device src_where, std::size_t bytes);
void device_zero(void* p, std::size_t bytes, int index);
void device_release_cache() noexcept;

}  // namespace troupe::detail
