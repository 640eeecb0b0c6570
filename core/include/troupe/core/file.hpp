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

/// Replaces `path` with `bytes` through a new temporary file beside it (`path.tmp-XXXXXX`, never
/// one that exists): write, fsync, rename, fsync of the directory. A crash at any point leaves the
/// old file or the new one, never a mix. A symbolic link is followed (the file it points to is
/// replaced; the link stays); a path that is not a regular file (a directory, a device, a FIFO)
/// is refused. On an error the temporary file is removed, `path` is untouched, and
/// std::runtime_error says which step failed and why ("cannot create /dir/f.tmp-a1B2c3: No such
/// file or directory", "cannot replace /dev/null: is not a regular file").
void write_file_atomically(const std::string& path, std::span<const std::byte> bytes);

/// Refuses a path that exists and is not a regular file (a directory, a device): saving over it
/// would replace it, reading from it cannot work. Throws std::runtime_error with the reason alone
/// ("is a directory, not a file"), for the caller to prefix with what the path is for.
void check_regular(const std::string& path);

/// Whether write_file_atomically(path, ...) could succeed now: `path` (or the file a link there
/// points to) is a regular file or nothing, and a file can be created beside it (one of its own
/// is created and removed; nothing that exists is touched). A long run checks its output this
/// way before it starts instead of failing after. Throws std::runtime_error with the reason
/// alone, as check_regular.
void check_writable(const std::string& path);

}  // namespace troupe
