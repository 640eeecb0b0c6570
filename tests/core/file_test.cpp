#include <gtest/gtest.h>

#include <troupe/core/file.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

fs::path fresh_dir(const char* name) {
  const fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Crc32, IsZlibsOnKnownVectors) {
  EXPECT_EQ(troupe::crc32({}), 0u);
  EXPECT_EQ(troupe::crc32(bytes_of("123456789")), 0xcbf43926u);  // the CRC-32 check value
  EXPECT_EQ(troupe::crc32(bytes_of("The quick brown fox jumps over the lazy dog")), 0x414fa339u);
}

TEST(WriteFileAtomically, WritesAndReplacesLeavingNoTemporaryFile) {
  const fs::path d = fresh_dir("atomic_write");
  const std::string path = (d / "f.bin").string();
  troupe::write_file_atomically(path, bytes_of("first"));
  EXPECT_EQ(read_all(path), "first");
  troupe::write_file_atomically(path, bytes_of(std::string(100000, 'x')));
  EXPECT_EQ(read_all(path), std::string(100000, 'x'));
  troupe::write_file_atomically(path, {});
  EXPECT_EQ(read_all(path), "");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(WriteFileAtomically, AFailureSaysWhyAndLeavesTheOldFile) {
  const fs::path d = fresh_dir("atomic_write_fail");
  // A missing directory: the temporary file cannot be created.
  try {
    troupe::write_file_atomically((d / "missing" / "f.bin").string(), bytes_of("x"));
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  // The target is a directory: the rename fails, the temporary file goes, the directory stays.
  const fs::path target = d / "a_directory";
  fs::create_directories(target / "inside");
  EXPECT_THROW(troupe::write_file_atomically(target.string(), bytes_of("x")), std::runtime_error);
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_FALSE(fs::exists(target.string() + ".tmp"));
  // An old file stays as it was when its replacement cannot be written.
  const std::string path = (d / "kept.bin").string();
  troupe::write_file_atomically(path, bytes_of("old"));
  fs::create_directories(path + ".tmp");  // blocks the temporary file
  EXPECT_THROW(troupe::write_file_atomically(path, bytes_of("new")), std::runtime_error);
  EXPECT_EQ(read_all(path), "old");
  EXPECT_TRUE(fs::is_directory(path + ".tmp"));  // not ours to remove
}

TEST(FileChecks, RefuseDirectoriesAndUnwritablePlacesAndLeaveNothingBehind) {
  const fs::path d = fresh_dir("troupe_file_checks");
  auto reason = [](void (*check)(const std::string&), const fs::path& p) -> std::string {
    try {
      check(p.string());
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  // Nothing there, or a regular file: both fine, and the probe leaves no file behind.
  EXPECT_EQ(reason(troupe::check_regular, d / "absent"), "");
  EXPECT_EQ(reason(troupe::check_writable, d / "absent"), "");
  EXPECT_FALSE(fs::exists(d / "absent"));
  EXPECT_FALSE(fs::exists(d / "absent.tmp"));
  troupe::write_file_atomically((d / "old").string(), bytes_of("old"));
  EXPECT_EQ(reason(troupe::check_writable, d / "old"), "");
  EXPECT_EQ(read_all(d / "old"), "old");
  // A directory where the file or its temporary file would go.
  fs::create_directories(d / "dir");
  EXPECT_EQ(reason(troupe::check_regular, d / "dir"), "is a directory, not a file");
  EXPECT_EQ(reason(troupe::check_writable, d / "dir"), "is a directory, not a file");
  fs::create_directories(d / "blocked.tmp");
  EXPECT_EQ(reason(troupe::check_writable, d / "blocked"), "is a directory, not a file");
  EXPECT_TRUE(fs::is_directory(d / "blocked.tmp"));
  EXPECT_EQ(reason(troupe::check_regular, "/dev/null"), "is not a regular file");
  // A directory that does not exist.
  const std::string why = reason(troupe::check_writable, d / "missing" / "f");
  EXPECT_NE(why.find("cannot be written"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(d / "missing"));
}

}  // namespace
