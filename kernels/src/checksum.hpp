#pragma once
// Checksummed files, as weights and optimizer state are saved: a 4-byte magic, the body, and the
// CRC-32 (zlib's) of everything before it, written atomically (troupe/core/file.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/core/codec.hpp"
#include "troupe/core/file.hpp"

namespace troupe::kernels {

/// Whether a parameter named `in_file` in a file of `version` is the one named `expected`.
/// Version 1 files (weights and optimizer state alike) came before sequential named parameters
/// by their path ("2.weight"): a layer's parameter was its bare name ("weight"), which still
/// matches the last part of the path.
inline bool same_parameter(const std::string& in_file, const std::string& expected, std::uint32_t version) {
  if (in_file == expected) return true;
  const auto dot = expected.rfind('.');
  return version == 1 && dot != std::string::npos && in_file == expected.substr(dot + 1);
}

/// Runs one of core's file checks (troupe::check_regular, troupe::check_writable) and hands its
/// reason to fail(why), which throws with the caller's context.
template <class Fail>
void check_file(void (*check)(const std::string&), const std::string& path, Fail&& fail) {
  try {
    check(path);
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
}

/// Appends the CRC-32 of what `w` holds (magic and body) and replaces `path` with it atomically
/// (write_file_atomically: a crash never leaves half a file under `path`). Errors go to
/// fail(why), which throws.
template <class Fail>
void write_checksummed(const std::string& path, byte_writer& w, Fail&& fail) {
  check_file(check_regular, path, fail);
  w.write_raw(crc32(w.buffer()));
  try {
    write_file_atomically(path, w.buffer());
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
}

/// A file read back by read_checksummed: its bytes, and the body between magic and CRC.
struct checksummed_file {
  std::vector<std::byte> bytes;
  std::span<const std::byte> body() const { return {bytes.data() + 4, bytes.size() - 8}; }
};

/// Reads `path` and checks its magic and CRC-32; `kind` names the format in the errors ("weights").
/// Errors go to fail(why), which throws.
template <class Fail>
checksummed_file read_checksummed(const std::string& path, const char (&magic)[4], const char* kind, Fail&& fail) {
  check_file(check_regular, path, fail);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("does not exist or cannot be read");
  const auto size = static_cast<std::streamoff>(in.tellg());
  in.seekg(0);
  // The header first: a large file of another kind is refused without reading it.
  char head[sizeof magic] = {};
  in.read(head, sizeof head);
  if (in.gcount() != static_cast<std::streamsize>(sizeof head) || std::memcmp(head, magic, sizeof magic) != 0)
    fail(std::string("is not a troupe ") + kind + " file (no " + std::string(magic, sizeof magic) + " header)");
  if (size < static_cast<std::streamoff>(sizeof magic + 8))
    fail("is truncated (" + std::to_string(size) + " bytes, with its " + std::string(magic, sizeof magic) + " header)");
  checksummed_file f;
  f.bytes.resize(static_cast<std::size_t>(size));
  std::memcpy(f.bytes.data(), head, sizeof head);
  in.read(reinterpret_cast<char*>(f.bytes.data()) + sizeof head, size - static_cast<std::streamoff>(sizeof head));
  if (in.gcount() != size - static_cast<std::streamoff>(sizeof head)) fail("could not be read whole (it changed while being read?)");
  const std::size_t body_end = f.bytes.size() - 4;
  std::uint32_t stored;
  std::memcpy(&stored, f.bytes.data() + body_end, 4);
  if (crc32(std::span(f.bytes).first(body_end)) != stored) fail("is corrupted or truncated (checksum mismatch)");
  return f;
}

}  // namespace troupe::kernels
