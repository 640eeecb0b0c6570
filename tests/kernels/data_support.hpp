#pragma once
// What the data tests share: a temporary file per test, IDX files plain and gzipped, random bytes,
// and the message of the exception a call throws.

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "troupe/kernels/data.hpp"

namespace data_support {

namespace fs = std::filesystem;
using troupe::dtype;
using troupe::tensor;
using bytes = std::vector<std::uint8_t>;

// A file in the test's temporary directory, removed at the end of the test.
class temp_file {
public:
  explicit temp_file(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (fs::path(::testing::TempDir()) /
             ("troupe_data_" + std::to_string(::getpid()) + "_" + info->name() + "_" + name))
                .string();
  }
  ~temp_file() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

inline void write_gzip(const std::string& path, const bytes& data) {
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr) << path;
  if (!data.empty()) {
    ASSERT_EQ(gzwrite(out, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  }
  ASSERT_EQ(gzclose(out), Z_OK);
}

// An IDX file: magic, big-endian dimensions, then `payload` (already big-endian).
inline bytes idx_file(std::uint8_t type_code, const std::vector<std::uint32_t>& dims, const bytes& payload) {
  bytes out = {0, 0, type_code, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// The message of the E that f throws (a test failure when it throws nothing).
template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return {};
}

// The message of the std::runtime_error `f` throws, or a note that it threw none (which the
// checks on the message then report).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no std::runtime_error)";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(g());
  return out;
}

}  // namespace data_support

/// Expects `part` in `text`, printing the text when it is not there.
#define EXPECT_CONTAINS(text, part)                          \
  do {                                                       \
    const std::string text_ = (text);                        \
    EXPECT_NE(text_.find(part), std::string::npos) << text_; \
  } while (0)
