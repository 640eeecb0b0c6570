#include "troupe/core/file.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
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
/// (followed through links to links; the link stays a link, and a dangling one gets its file).
/// Refuses a target that exists and is not a regular file.
std::string write_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path target = path;
  std::error_code ec;
  for (int depth = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++depth) {
    if (depth == 40) throw std::runtime_error("is a chain of more than 40 symbolic links");
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) throw std::runtime_error("is a symbolic link that cannot be read (" + ec.message() + ")");
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  check_regular(target.string());
  return target.string();
}

/// Creates a new file of its own beside `target` (never one that exists; the umask applies);
/// returns its descriptor and sets `name`, or returns -1 with errno set.
int create_beside(const std::string& target, std::string& name) {
  static constexpr char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 pick{std::random_device{}() ^ static_cast<std::uint64_t>(::getpid())};
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = target + ".tmp-";
    for (int i = 0; i < 6; ++i) candidate += letters[pick() % (sizeof letters - 1)];
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      name = std::move(candidate);
      return fd;
    }
    if (errno != EEXIST) return -1;
  }
  return -1;  // (errno is EEXIST)
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
