#include "troupe/core/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace troupe {

std::uint32_t crc32(std::span<const std::byte> bytes) noexcept {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const std::byte* data = bytes.data();
  std::size_t n = bytes.size();
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

namespace {

/// Where a write to `path` lands: `path` itself, or the file a symbolic link there points to
/// (the link stays a link). Refuses a target that exists and is not a regular file.
std::string write_target(const std::string& path) {
  std::error_code ec;
  std::string target = path;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec))) {
    const auto resolved = std::filesystem::weakly_canonical(path, ec);
    if (ec) throw std::runtime_error("is a symbolic link that cannot be followed (" + ec.message() + ")");
    target = resolved.string();
  }
  check_regular(target);
  return target;
}

/// Creates a new file of its own beside `target` (never one that exists); returns its
/// descriptor and sets `name`, or returns -1 with errno set.
int create_beside(const std::string& target, std::string& name) {
  std::string pattern = target + ".tmp-XXXXXX";
  const int fd = ::mkostemp(pattern.data(), O_CLOEXEC);
  if (fd < 0) return -1;
  name = pattern;
  ::fchmod(fd, 0644);  // mkostemp's 0600 would make the saved file private
  return fd;
}

}  // namespace

void write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  std::string target;
  try {
    target = write_target(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("cannot replace " + path + ": " + e.what());
  }
  std::string tmp = target + ".tmp-XXXXXX";
  int fd = -1;
  bool created = false;
  // Every failure closes what is open, removes the temporary file this call made (never a file
  // that was there before) and says which step failed.
  auto fail = [&](const char* step, const std::string& file) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (created) std::remove(tmp.c_str());
    throw std::runtime_error(std::string("cannot ") + step + " " + file + ": " + std::strerror(err));
  };
  fd = create_beside(target, tmp);
  if (fd < 0) fail("create", tmp);
  created = true;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      fail("write", tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("sync", tmp);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) fail("close", tmp);
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail("rename it to", target);
  // The rename itself is durable once the directory is synced (best effort: some file systems
  // refuse to open a directory for this).
  const auto dir = std::filesystem::path(target).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void check_regular(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw std::runtime_error(std::filesystem::is_directory(st) ? "is a directory, not a file" : "is not a regular file");
}

void check_writable(const std::string& path) {
  const std::string target = write_target(path);
  std::string probe;
  const int fd = create_beside(target, probe);
  if (fd < 0)
    throw std::runtime_error(std::string("cannot be written (") + std::strerror(errno) +
                             "; check the directory exists and is writable)");
  ::close(fd);
  std::remove(probe.c_str());
}

}  // namespace troupe
