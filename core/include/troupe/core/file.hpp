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

/// Refuses a path that exists and is not a regular file (a directory, a device): saving over it
/// would replace it, reading from it cannot work. Throws std::runtime_error with the reason alone
/// ("is a directory, not a file"), for the caller to prefix with what the path is for.
void check_regular(const std::string& path);

/// Whether write_file_atomically(path, ...) could succeed now: `path` and `path.tmp` are regular
/// files or nothing, and `path.tmp` can be created (it is created and removed). A long run checks
/// its output this way before it starts instead of failing after. Throws std::runtime_error with
/// the reason alone, as check_regular.
void check_writable(const std::string& path);

}  // namespace troupe
