#include <gtest/gtest.h>

#include <troupe/core/file.hpp>

#include <sys/stat.h>

#include <algorithm>
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

/// The names in directory d, sorted.
std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
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
  EXPECT_EQ(names_in(d), std::vector<std::string>{"f.bin"});
  // 0644 less the umask, as any new file.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(static_cast<unsigned>(fs::status(path).permissions() & fs::perms::all), 0644u & ~static_cast<unsigned>(mask));
}

TEST(WriteFileAtomically, NeverTouchesAFileThatIsNotItsOwn) {
  const fs::path d = fresh_dir("atomic_write_others");
  // A file of the user's that looks like a temporary name stays as it was.
  const std::string path = (d / "out.w").string();
  std::ofstream(path + ".tmp") << "precious";
  troupe::write_file_atomically(path, bytes_of("new"));
  troupe::check_writable(path);
  EXPECT_EQ(read_all(path + ".tmp"), "precious");
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"out.w", "out.w.tmp"}));
  // A symbolic link is followed: its file gets the bytes and the link stays a link.
  std::ofstream(d / "real.txt") << "old";
  fs::create_symlink("real.txt", d / "link.txt");
  troupe::write_file_atomically((d / "link.txt").string(), bytes_of("through the link"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d / "link.txt")));
  EXPECT_EQ(read_all(d / "real.txt"), "through the link");
  // A dangling link gets its file; a link to a link is followed to the end.
  fs::create_symlink("later.txt", d / "dangling.txt");
  fs::create_symlink("link.txt", d / "link2.txt");
  troupe::write_file_atomically((d / "dangling.txt").string(), bytes_of("made"));
  troupe::write_file_atomically((d / "link2.txt").string(), bytes_of("twice"));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d / "dangling.txt")));
  EXPECT_EQ(read_all(d / "later.txt"), "made");
  EXPECT_EQ(read_all(d / "real.txt"), "twice");
  // A FIFO is refused and stays a FIFO.
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  try {
    troupe::write_file_atomically(fifo.string(), bytes_of("x"));
    ADD_FAILURE() << "replaced a FIFO";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot replace " + fifo.string() + ": is not a regular file");
  }
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"dangling.txt", "fifo", "later.txt", "link.txt", "link2.txt", "out.w",
                                                    "out.w.tmp", "real.txt"}));
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
  // The target is a directory: refused, and the directory stays.
  const fs::path target = d / "a_directory";
  fs::create_directories(target / "inside");
  try {
    troupe::write_file_atomically(target.string(), bytes_of("x"));
    ADD_FAILURE() << "replaced a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot replace " + target.string() + ": is a directory, not a file");
  }
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_EQ(names_in(d), std::vector<std::string>{"a_directory"});
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
  EXPECT_TRUE(names_in(d).empty());
  troupe::write_file_atomically((d / "old").string(), bytes_of("old"));
  EXPECT_EQ(reason(troupe::check_writable, d / "old"), "");
  EXPECT_EQ(read_all(d / "old"), "old");
  // A directory, or something else that is not a regular file.
  fs::create_directories(d / "dir");
  EXPECT_EQ(reason(troupe::check_regular, d / "dir"), "is a directory, not a file");
  EXPECT_EQ(reason(troupe::check_writable, d / "dir"), "is a directory, not a file");
  EXPECT_EQ(reason(troupe::check_regular, "/dev/null"), "is not a regular file");
  EXPECT_EQ(reason(troupe::check_writable, "/dev/null"), "is not a regular file");
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"dir", "old"}));
  // A directory that does not exist.
  const std::string why = reason(troupe::check_writable, d / "missing" / "f");
  EXPECT_NE(why.find("cannot be written"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(d / "missing"));
}

}  // namespace
