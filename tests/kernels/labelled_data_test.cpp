// labelled_data beyond .npz: load_idx_dir on directories of IDX files written here (plain and
// gzip'd), pixel_statistics, and Fashion-MNIST as a labelled_data.

#include "troupe/kernels/data.hpp"

#include "data_support.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace fs = std::filesystem;
using troupe::dtype;
using troupe::tensor;
using bytes = std::vector<std::uint8_t>;

// A directory in the test's temporary directory, removed at the end of the test.
class temp_dir {
public:
  temp_dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(::testing::TempDir()) /
            ("troupe_labelled_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::string path() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

private:
  fs::path path_;
};

// An IDX file: magic, big-endian dimensions, then the values big-endian.
template <class T>
bytes idx(std::uint8_t type_code, const std::vector<std::uint32_t>& dims, const std::vector<T>& values) {
  bytes out = {0, 0, type_code, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  for (const T v : values) {
    std::uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (std::size_t i = sizeof(T); i-- > 0;) out.push_back(b[i]);  // little-endian host to big-endian
  }
  return out;
}

void write(const std::string& path, const bytes& data, bool gzip) {
  if (gzip) {
    gzFile out = gzopen(path.c_str(), "wb");
    ASSERT_NE(out, nullptr) << path;
    ASSERT_EQ(gzwrite(out, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
    ASSERT_EQ(gzclose(out), Z_OK);
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::uint8_t> random_pixels(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> out(n);
  for (auto& v : out) v = static_cast<std::uint8_t>(rng());
  return out;
}

using data_support::error_of;

// The four files of a small data set: u8 images [4, 3, 2] and [2, 3, 2], labels up to 6.
void write_u8_set(const temp_dir& dir, bool gzip_train, bool gzip_test) {
  const std::string tr = gzip_train ? ".gz" : "", te = gzip_test ? ".gz" : "";
  write(dir / ("train-images-idx3-ubyte" + tr), idx<std::uint8_t>(0x08, {4, 3, 2}, random_pixels(24, 1)), gzip_train);
  write(dir / ("train-labels-idx1-ubyte" + tr), idx<std::uint8_t>(0x08, {4}, {6, 0, 2, 2}), gzip_train);
  write(dir / ("t10k-images-idx3-ubyte" + te), idx<std::uint8_t>(0x08, {2, 3, 2}, random_pixels(12, 2)), gzip_test);
  write(dir / ("t10k-labels-idx1-ubyte" + te), idx<std::uint8_t>(0x08, {2}, {1, 5}), gzip_test);
}

// ---- load_idx_dir ---------------------------------------------------------------------------

TEST(IdxDir, LoadsU8ImagesPlainOrGzippedWithTheirOwnStatistics) {
  for (const auto& [gzip_train, gzip_test] : {std::pair{false, false}, std::pair{true, true}, std::pair{false, true}}) {
    SCOPED_TRACE(std::to_string(gzip_train) + std::to_string(gzip_test));
    temp_dir dir;
    write_u8_set(dir, gzip_train, gzip_test);
    const troupe::labelled_data d = troupe::load_idx_dir(dir.path());
    EXPECT_EQ(d.train.images.shape(), (tensor::shape_type{4, 3, 2}));
    EXPECT_EQ(d.test.images.shape(), (tensor::shape_type{2, 3, 2}));
    const auto x = d.train.images.data<std::uint8_t>();
    EXPECT_EQ(std::vector<std::uint8_t>(x.begin(), x.end()), random_pixels(24, 1));
    EXPECT_EQ(d.train.labels.data<std::uint8_t>()[0], 6);
    EXPECT_EQ(d.test.labels.data<std::uint8_t>()[1], 5);
    EXPECT_EQ(d.classes, 7);
    double sum = 0, squares = 0;
    for (const std::uint8_t v : x) sum += v / 255.0;
    const double mean = sum / 24;
    for (const std::uint8_t v : x) squares += (v / 255.0 - mean) * (v / 255.0 - mean);
    EXPECT_NEAR(d.mean, mean, 1e-6);
    EXPECT_NEAR(d.stddev, std::sqrt(squares / 24), 1e-6);
    EXPECT_FALSE(d.client_train.defined());
  }
}

TEST(IdxDir, LoadsF32FeaturesAndI32Labels) {
  temp_dir dir;
  const std::vector<float> train = {0.5f, -1.25f, 3.0f, 1e-20f, 7.0f, -0.0f};
  write(dir / "train-images-idx3-ubyte", idx<float>(0x0D, {3, 2}, train), false);
  write(dir / "train-labels-idx1-ubyte.gz", idx<std::int32_t>(0x0C, {3}, {9, 0, 255}), true);
  write(dir / "t10k-images-idx3-ubyte", idx<float>(0x0D, {1, 2}, {2.0f, 4.0f}), false);
  write(dir / "t10k-labels-idx1-ubyte", idx<std::int32_t>(0x0C, {1}, {3}), false);
  const auto d = troupe::load_idx_dir(dir.path());
  EXPECT_EQ(d.train.images.type(), dtype::f32);
  const auto x = d.train.images.data<float>();
  EXPECT_EQ(std::vector<float>(x.begin(), x.end()), train);
  EXPECT_EQ(d.train.labels.type(), dtype::u8);
  EXPECT_EQ(d.train.labels.data<std::uint8_t>()[2], 255);
  EXPECT_EQ(d.classes, 256);
  EXPECT_EQ(d.mean, 0.0f);
  EXPECT_EQ(d.stddev, 1.0f);
}

TEST(IdxDir, TakesThePlainFileWhenBothExist) {
  temp_dir dir;
  write_u8_set(dir, false, false);
  write(dir / "t10k-labels-idx1-ubyte.gz", idx<std::uint8_t>(0x08, {2}, {9, 9}), true);
  EXPECT_EQ(troupe::load_idx_dir(dir.path()).classes, 7);
}

TEST(IdxDir, NamesTheFileAndTheProblem) {
  {
    temp_dir dir;
    write_u8_set(dir, false, false);
    fs::remove(dir / "t10k-labels-idx1-ubyte");
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }),
                    "load_idx_dir: " + dir.path() + ": neither t10k-labels-idx1-ubyte nor t10k-labels-idx1-ubyte.gz exists");
  }
  {
    temp_dir dir;
    write_u8_set(dir, false, false);
    write(dir / "train-labels-idx1-ubyte", idx<std::int32_t>(0x0C, {4}, {0, 1, 300, 2}), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }),
                    dir / "train-labels-idx1-ubyte" + ": label 300 at index 2 is outside 0..255");
    write(dir / "train-labels-idx1-ubyte", idx<std::int32_t>(0x0C, {4}, {0, -1, 3, 2}), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }), "label -1 at index 1 is outside 0..255");
    write(dir / "train-labels-idx1-ubyte", idx<std::uint8_t>(0x08, {3}, {0, 1, 3}), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }),
                    dir / "train-labels-idx1-ubyte" + ": holds 3 labels for the 4 examples of " +
                        dir / "train-images-idx3-ubyte");
  }
  {
    temp_dir dir;
    write_u8_set(dir, false, false);
    write(dir / "t10k-images-idx3-ubyte", idx<std::uint8_t>(0x08, {2, 2, 3}, random_pixels(12, 3)), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }),
                    dir / "t10k-images-idx3-ubyte" + ": holds u8[2, 2, 3] on cpu: its examples must have");
    write(dir / "t10k-images-idx3-ubyte", idx<float>(0x0D, {2, 3, 2}, std::vector<float>(12, 1.0f)), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }), "holds f32 but");
    write(dir / "train-images-idx3-ubyte", idx<std::int32_t>(0x0C, {4, 6}, std::vector<std::int32_t>(24, 1)), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }),
                    "holds i32[4, 6] on cpu: images must be u8 (pixels 0..255) or f32 (features)");
    write(dir / "train-images-idx3-ubyte", idx<std::uint8_t>(0x08, {24}, random_pixels(24, 1)), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }), "images need a shape (N, ...) of rank 2 to 8");
    write(dir / "train-images-idx3-ubyte", idx<float>(0x0D, {4, 3, 2}, std::vector<float>(24, INFINITY)), false);
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }), "value inf at flat index 0 is not finite");
  }
  {
    temp_dir dir;
    write_u8_set(dir, false, false);
    write(dir / "train-images-idx3-ubyte", {0, 0, 8}, false);  // the file's own error, from read_idx
    EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(dir.path()); }), "read_idx: " + dir / "train-images-idx3-ubyte");
  }
  temp_dir parent;
  EXPECT_CONTAINS(error_of([&] { troupe::load_idx_dir(parent / "absent"); }), "does not exist: pass the directory");
}

// ---- pixel_statistics ------------------------------------------------------------------------

TEST(PixelStatistics, MatchesATwoPassComputationOnFreshPixels) {
  for (const unsigned seed : {1u, 2u, 3u}) {
    const auto pixels = random_pixels(1000 + seed * 77, seed);
    const tensor t = tensor::from<std::uint8_t>(pixels, {static_cast<std::int64_t>(pixels.size())});
    double sum = 0, squares = 0;
    for (const std::uint8_t v : pixels) sum += v / 255.0;
    const double mean = sum / static_cast<double>(pixels.size());
    for (const std::uint8_t v : pixels) squares += (v / 255.0 - mean) * (v / 255.0 - mean);
    const troupe::pixel_stats s = troupe::pixel_statistics(t);
    EXPECT_NEAR(s.mean, mean, 1e-6);
    EXPECT_NEAR(s.stddev, std::sqrt(squares / static_cast<double>(pixels.size())), 1e-6);
  }
  const troupe::pixel_stats empty = troupe::pixel_statistics(tensor::empty({0, 3}, dtype::u8));
  EXPECT_EQ(empty.mean, 0.0f);
  EXPECT_EQ(empty.stddev, 0.0f);
  EXPECT_THROW(troupe::pixel_statistics(tensor::zeros({3}, dtype::f32)), std::invalid_argument);
}

// ---- Fashion-MNIST as labelled_data -------------------------------------------------------------

static_assert(std::is_same_v<troupe::fashion_mnist, troupe::labelled_data>);

TEST(LabelledData, FashionMnistKeepsItsConstantsAndTenClasses) {
  temp_dir dir;
  for (const std::string prefix : {"train", "t10k"}) {
    write(dir / (prefix + "-images-idx3-ubyte.gz"), idx<std::uint8_t>(0x08, {2, 28, 28}, random_pixels(1568, 4)), true);
    write(dir / (prefix + "-labels-idx1-ubyte.gz"), idx<std::uint8_t>(0x08, {2}, {0, 1}), true);
  }
  const troupe::fashion_mnist d = troupe::load_fashion_mnist(dir.path());
  EXPECT_EQ(d.classes, 10);  // not 2: Fashion-MNIST has ten classes whatever a subset holds
  EXPECT_EQ(d.mean, troupe::fashion_mnist_mean);
  EXPECT_EQ(d.stddev, troupe::fashion_mnist_std);
  EXPECT_FALSE(d.client_train.defined());
}

TEST(LabelledData, FashionMnistConstantsAreItsTrainingPixelStatistics) {
  if (!fs::exists(fs::path(troupe::fashion_mnist_dir) / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed under " << troupe::fashion_mnist_dir;
  const auto d = troupe::load_fashion_mnist();
  const troupe::pixel_stats s = troupe::pixel_statistics(d.train.images);
  EXPECT_NEAR(s.mean, troupe::fashion_mnist_mean, 5e-5);
  EXPECT_NEAR(s.stddev, troupe::fashion_mnist_std, 5e-5);
}

}  // namespace
