#pragma once
// CRC-32 (zlib's) of a byte range, for the checksummed files of weights and optimizer state.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace troupe::kernels {

inline std::uint32_t checksum(const std::byte* data, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes lengths as uInt: feed large buffers in pieces.
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace troupe::kernels
