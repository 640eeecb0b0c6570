#pragma once
/// @file
/// Files that must never be found half-written (weights, optimizer state, checkpoints): zlib's
/// CRC-32 to check what is read back, and an atomic replace.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace troupe {

/// zlib's CRC-32 of `bytes` (any length: zlib's 32-bit lengths are fed in pieces).
std::uint32_t crc32(std::span<const std::byte> bytes) noexcept;

/// Replaces `path` with `bytes` through `path.tmp`: write, fsync, rename, fsync of the directory.
/// A crash at any point leaves the old file or the new one, never a mix. On an error the
/// temporary file is removed, `path` is untouched, and std::runtime_error says which step failed
/// and why ("cannot create /dir/f.tmp: No such file or directory").
void write_file_atomically(const std::string& path, std::span<const std::byte> bytes);

}  // namespace troupe
