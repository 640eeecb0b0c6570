#include "troupe/kernels/data.hpp"
#include "troupe/kernels/train.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <limits>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using troupe::dtype;
using troupe::tensor;
using bytes = std::vector<std::uint8_t>;

// ---- helpers ---------------------------------------------------------------------------------

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

void write_plain(const std::string& path, const bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const std::string& path, const bytes& data) {
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr) << path;
  if (!data.empty()) {
    ASSERT_EQ(gzwrite(out, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  }
  ASSERT_EQ(gzclose(out), Z_OK);
}

bytes read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// An IDX file: magic, big-endian dimensions, then `payload` (already big-endian).
bytes idx_file(std::uint8_t type_code, const std::vector<std::uint32_t>& dims, const bytes& payload) {
  bytes out = {0, 0, type_code, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

bytes big_endian(std::span<const std::uint32_t> words) {
  bytes out;
  for (std::uint32_t w : words)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(w >> shift));
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

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(g());
  return out;
}

// Sorted copy of all shards' indices.
std::vector<std::int64_t> all_indices(const std::vector<std::vector<std::int64_t>>& shards) {
  std::vector<std::int64_t> out;
  for (const auto& s : shards) out.insert(out.end(), s.begin(), s.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  return out;
}

// ---- IDX reading -----------------------------------------------------------------------------

TEST(Idx, RoundTripsU8PlainAndGzipped) {
  const bytes pixels = random_bytes(2 * 3 * 5, 1);
  const bytes file = idx_file(0x08, {2, 3, 5}, pixels);
  temp_file plain("u8.idx"), gz("u8.idx.gz");
  write_plain(plain.path(), file);
  write_gzip(gz.path(), file);
  for (const auto* path : {&plain.path(), &gz.path()}) {
    const tensor t = troupe::read_idx(*path);
    EXPECT_EQ(t.type(), dtype::u8) << *path;
    EXPECT_EQ(t.shape(), (tensor::shape_type{2, 3, 5})) << *path;
    const auto data = t.data<std::uint8_t>();
    EXPECT_TRUE(std::equal(data.begin(), data.end(), pixels.begin(), pixels.end())) << *path;
  }
}

TEST(Idx, RoundTripsI32InHostByteOrder) {
  const std::vector<std::int32_t> values = {0x01020304, -1, -123456789, 2147483647, -2147483647 - 1, 42};
  std::vector<std::uint32_t> words(values.size());
  std::transform(values.begin(), values.end(), words.begin(), [](std::int32_t v) { return static_cast<std::uint32_t>(v); });
  const bytes file = idx_file(0x0C, {3, 2}, big_endian(words));
  temp_file plain("i32.idx"), gz("i32.idx.gz");
  write_plain(plain.path(), file);
  write_gzip(gz.path(), file);
  for (const auto* path : {&plain.path(), &gz.path()}) {
    const tensor t = troupe::read_idx(*path);
    EXPECT_EQ(t.type(), dtype::i32);
    EXPECT_EQ(t.shape(), (tensor::shape_type{3, 2}));
    const auto data = t.data<std::int32_t>();
    EXPECT_TRUE(std::equal(data.begin(), data.end(), values.begin(), values.end())) << *path;
  }
}

TEST(Idx, RoundTripsF32InHostByteOrder) {
  const std::vector<float> values = {1.5f, -0.0f, 3.25e-7f, -6.02e23f, 0.1f, 255.0f, -1.0f};
  std::vector<std::uint32_t> words(values.size());
  std::transform(values.begin(), values.end(), words.begin(), [](float v) { return std::bit_cast<std::uint32_t>(v); });
  const bytes file = idx_file(0x0D, {7}, big_endian(words));
  temp_file plain("f32.idx"), gz("f32.idx.gz");
  write_plain(plain.path(), file);
  write_gzip(gz.path(), file);
  for (const auto* path : {&plain.path(), &gz.path()}) {
    const tensor t = troupe::read_idx(*path);
    EXPECT_EQ(t.type(), dtype::f32);
    EXPECT_EQ(t.shape(), (tensor::shape_type{7}));
    const auto data = t.data<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(data[i]), std::bit_cast<std::uint32_t>(values[i])) << *path << " #" << i;
  }
}

TEST(Idx, ReadsAZeroDimensionAsAnEmptyTensor) {
  temp_file plain("empty.idx");
  write_plain(plain.path(), idx_file(0x0D, {0, 4}, {}));
  const tensor t = troupe::read_idx(plain.path());
  EXPECT_EQ(t.shape(), (tensor::shape_type{0, 4}));
  EXPECT_EQ(t.numel(), 0);
}

TEST(Idx, ReadsConcatenatedGzipMembersAsOneStream) {
  const bytes file = idx_file(0x08, {4, 4}, random_bytes(16, 2));
  temp_file first("first.gz"), second("second.gz"), joined("joined.gz");
  write_gzip(first.path(), bytes(file.begin(), file.begin() + 9));
  write_gzip(second.path(), bytes(file.begin() + 9, file.end()));
  bytes both = read_plain(first.path());
  const bytes tail = read_plain(second.path());
  both.insert(both.end(), tail.begin(), tail.end());
  write_plain(joined.path(), both);
  const tensor t = troupe::read_idx(joined.path());
  const auto data = t.data<std::uint8_t>();
  EXPECT_TRUE(std::equal(data.begin(), data.end(), file.begin() + 12, file.end()));
}

TEST(Idx, RejectsEveryTruncationOfAPlainFile) {
  for (const bytes& file : {idx_file(0x08, {2, 3}, random_bytes(6, 3)),
                            idx_file(0x0D, {2}, big_endian(std::array<std::uint32_t, 2>{0x3f800000u, 0xc0000000u}))}) {
    temp_file f("truncated.idx");
    for (std::size_t size = 0; size < file.size(); ++size) {
      write_plain(f.path(), bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(size)));
      const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
      EXPECT_TRUE(contains(what, f.path())) << what;
      EXPECT_TRUE(contains(what, "truncated")) << "at " << size << " bytes: " << what;
    }
  }
}

TEST(Idx, RejectsEveryTruncationOfAGzipFile) {
  temp_file whole("whole.gz"), cut("cut.gz");
  write_gzip(whole.path(), idx_file(0x08, {3, 4}, random_bytes(12, 4)));
  const bytes gz = read_plain(whole.path());
  ASSERT_GT(gz.size(), 20u);
  for (std::size_t size = 0; size < gz.size(); ++size) {
    write_plain(cut.path(), bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(size)));
    const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(cut.path()); });
    EXPECT_TRUE(contains(what, cut.path())) << what;
    EXPECT_TRUE(contains(what, "truncated")) << "at " << size << " bytes: " << what;
  }
}

TEST(Idx, RejectsACorruptedGzipStream) {
  temp_file whole("whole.gz"), bad("bad.gz");
  write_gzip(whole.path(), idx_file(0x08, {8, 8}, random_bytes(64, 5)));
  const bytes gz = read_plain(whole.path());
  // Bytes 4..9 of the gzip header (time, flags, OS) are not checked by design; from the
  // compressed data through the CRC-32 and length trailer, every change must be caught.
  for (std::size_t at = 10; at < gz.size(); ++at) {
    bytes changed = gz;
    changed[at] ^= 0xFF;
    write_plain(bad.path(), changed);
    const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(bad.path()); });
    EXPECT_TRUE(contains(what, bad.path())) << "byte " << at << ": " << what;
  }
  bytes wrong_crc = gz;
  wrong_crc[gz.size() - 8] ^= 0x01;
  write_plain(bad.path(), wrong_crc);
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(bad.path()); });
  EXPECT_TRUE(contains(what, "corrupted gzip stream")) << what;
}

TEST(Idx, ACorruptedGzipStreamIsNeverMistakenForTrailingBytes) {
  // Labels 0..9 compress well; a flipped bit may then inflate to more bytes than the dimensions
  // announce. The stream's CRC names the problem, not the count.
  bytes labels(1000);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<unsigned char>((i * 7 + i / 13) % 10);
  temp_file whole("labels.gz"), bad("bad.gz");
  write_gzip(whole.path(), idx_file(0x08, {1000}, labels));
  const bytes gz = read_plain(whole.path());
  for (std::size_t at = 10; at + 8 < gz.size(); ++at)
    for (int bit : {0, 5}) {
      bytes changed = gz;
      changed[at] ^= static_cast<unsigned char>(1 << bit);
      write_plain(bad.path(), changed);
      try {
        troupe::read_idx(bad.path());  // (a flip in a padding bit changes nothing)
      } catch (const std::runtime_error& e) {
        EXPECT_FALSE(contains(e.what(), "trailing bytes")) << "byte " << at << ": " << e.what();
      }
    }
}

TEST(Idx, APipeOrDeviceIsRefusedWithoutWaitingOnIt) {
  temp_file fifo("fifo.gz");
  ASSERT_EQ(::mkfifo(fifo.path().c_str(), 0600), 0);
  std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(fifo.path()); });
  EXPECT_TRUE(contains(what, "not a regular file")) << what;
  what = error_of<std::runtime_error>([&] { troupe::read_idx("/dev/null"); });
  EXPECT_TRUE(contains(what, "not a regular file")) << what;
}

TEST(Idx, RejectsTrailingBytes) {
  const bytes file = idx_file(0x08, {2, 2}, random_bytes(4, 6));
  bytes longer = file;
  longer.push_back(7);
  temp_file plain("long.idx"), gz("long.gz"), garbage("garbage.gz");
  write_plain(plain.path(), longer);
  std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(plain.path()); });
  EXPECT_TRUE(contains(what, "1 trailing bytes")) << what;

  write_gzip(gz.path(), longer);
  what = error_of<std::runtime_error>([&] { troupe::read_idx(gz.path()); });
  EXPECT_TRUE(contains(what, "trailing bytes")) << what;

  write_gzip(garbage.path(), file);
  bytes after = read_plain(garbage.path());
  after.insert(after.end(), {'j', 'u', 'n', 'k'});
  write_plain(garbage.path(), after);
  what = error_of<std::runtime_error>([&] { troupe::read_idx(garbage.path()); });
  EXPECT_TRUE(contains(what, "4 bytes of trailing garbage after the gzip stream")) << what;
}

TEST(Idx, RejectsABadMagic) {
  bytes file = idx_file(0x08, {2}, {1, 2});
  file[1] = 0x08;
  temp_file plain("magic.idx"), gz("magic.gz");
  write_plain(plain.path(), file);
  write_gzip(gz.path(), file);
  for (const auto* path : {&plain.path(), &gz.path()}) {
    const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(*path); });
    EXPECT_TRUE(contains(what, *path)) << what;
    EXPECT_TRUE(contains(what, "bad magic 0x00 0x08")) << what;
  }
}

TEST(Idx, NamesTheUnsupportedTypeCode) {
  temp_file f("type.idx");
  const std::map<std::uint8_t, std::string> unsupported = {{0x09, "(i8)"}, {0x0B, "(i16)"}, {0x0E, "(f64)"}};
  for (const auto& [code, name] : unsupported) {
    write_plain(f.path(), idx_file(code, {1}, bytes(8, 0)));
    const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
    EXPECT_TRUE(contains(what, "not supported")) << what;
    EXPECT_TRUE(contains(what, name)) << what;
  }
  write_plain(f.path(), idx_file(0x42, {1}, bytes(1, 0)));
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
  EXPECT_TRUE(contains(what, "unknown IDX type code 0x42")) << what;
}

TEST(Idx, RejectsRankZero) {
  temp_file f("rank0.idx");
  write_plain(f.path(), {0, 0, 0x08, 0});
  EXPECT_TRUE(contains(error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); }), "rank 0"));
}

TEST(Idx, RejectsDimensionsBeyondTheSizeLimitWithoutAllocating) {
  temp_file f("huge.idx");
  write_plain(f.path(), idx_file(0x0D, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, bytes(16, 1)));
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
  EXPECT_TRUE(contains(what, "header is corrupted")) << what;
}

TEST(Idx, RejectsDimensionsNoTensorMayHaveEvenWithAZero) {
  temp_file f("huge_empty.idx");
  write_plain(f.path(), idx_file(0x0D, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0}, {}));
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
  EXPECT_TRUE(contains(what, "header is corrupted")) << what;
  EXPECT_TRUE(contains(what, f.path())) << what;
}

TEST(Idx, RejectsDimensionsMoreThanAGzipFileCanHold) {
  temp_file gz("small.gz");
  write_gzip(gz.path(), idx_file(0x08, {1u << 30}, bytes(16, 1)));
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(gz.path()); });
  EXPECT_TRUE(contains(what, "more than the compressed file can hold")) << what;
}

TEST(Idx, MissingFashionMnistFileSaysWhichPackageToInstall) {
  const std::string path = std::string(troupe::fashion_mnist_dir) + "/no-such-file-idx1-ubyte.gz";
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(path); });
  EXPECT_TRUE(contains(what, path)) << what;
  EXPECT_TRUE(contains(what, "missing")) << what;
  EXPECT_TRUE(contains(what, "install Debian's dataset-fashion-mnist (cmake/install-deps.sh does)")) << what;
}

TEST(Idx, MissingFileElsewhereSaysOnlyThatItIsMissing) {
  temp_file f("absent.idx");
  const std::string what = error_of<std::runtime_error>([&] { troupe::read_idx(f.path()); });
  EXPECT_TRUE(contains(what, f.path())) << what;
  EXPECT_TRUE(contains(what, "missing")) << what;
  EXPECT_FALSE(contains(what, "dataset-fashion-mnist")) << what;
}

// ---- Fashion-MNIST -----------------------------------------------------------------------------

// A directory of small files shaped like Fashion-MNIST's.
class fake_fashion_mnist {
public:
  fake_fashion_mnist() : dir_("fashion") { fs::create_directories(dir_.path()); }

  void write(const std::string& prefix, std::uint32_t n, std::uint32_t side, bytes labels) {
    write_gzip(path(prefix + "-images-idx3-ubyte.gz"),
               idx_file(0x08, {n, side, side}, random_bytes(std::size_t{n} * side * side, n)));
    write_gzip(path(prefix + "-labels-idx1-ubyte.gz"),
               idx_file(0x08, {static_cast<std::uint32_t>(labels.size())}, labels));
  }
  std::string path(const std::string& name) const { return (fs::path(dir_.path()) / name).string(); }
  const std::string& dir() const { return dir_.path(); }

private:
  temp_file dir_;
};

TEST(FashionMnist, LoadsAConsistentDirectory) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 9, 4});
  fake.write("t10k", 2, 28, {1, 1});
  const troupe::fashion_mnist data = troupe::load_fashion_mnist(fake.dir());
  EXPECT_EQ(data.train.images.shape(), (tensor::shape_type{3, 28, 28}));
  EXPECT_EQ(data.train.size(), 3);
  EXPECT_EQ(data.test.size(), 2);
  EXPECT_EQ(data.train.labels.data<std::uint8_t>()[1], 9);
}

TEST(FashionMnist, RejectsLabelsOutsideZeroToNine) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 10, 4});
  fake.write("t10k", 2, 28, {1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "train-labels-idx1-ubyte.gz")) << what;
  EXPECT_TRUE(contains(what, "label 10 at index 1 is outside 0..9")) << what;
}

TEST(FashionMnist, RejectsDifferentImageAndLabelCounts) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 28, {0, 1, 2});
  fake.write("t10k", 2, 28, {1, 1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "holds 3 labels for the 2 images")) << what;
}

TEST(FashionMnist, RejectsImagesThatAreNot28By28) {
  fake_fashion_mnist fake;
  fake.write("train", 3, 27, {0, 1, 2});
  fake.write("t10k", 2, 28, {1, 1});
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(fake.dir()); });
  EXPECT_TRUE(contains(what, "not u8 images [N, 28, 28]")) << what;
}

TEST(FashionMnist, MissingDirectorySaysWhatToPass) {
  temp_file absent("absent-dir");
  const std::string what = error_of<std::runtime_error>([&] { troupe::load_fashion_mnist(absent.path()); });
  EXPECT_TRUE(contains(what, absent.path())) << what;
  EXPECT_TRUE(contains(what, "pass the directory that holds train-images-idx3-ubyte.gz")) << what;
}

/// An engine that only counts: every other step is skipped, as an optimizer skips a step whose
/// gradients are not finite.
class skipping_engine final : public troupe::kernels::train_engine {
public:
  troupe::kernels::step_outcome step(const tensor&, const tensor&) override { return {1.0, ++steps_ % 2 == 1}; }
  tensor predict(const tensor& x) override { return tensor::zeros({x.shape()[0], 10}); }
  void sync(troupe::kernels::layer&) override {}

private:
  int steps_ = 0;
};

TEST(Train, CountsTheStepsTheOptimizerSkipped) {
  fake_fashion_mnist fake;
  fake.write("train", 10, 28, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  fake.write("t10k", 2, 28, {1, 1});
  troupe::kernels::train_options o;
  o.data_dir = fake.dir();
  o.model = "mlp:784-8-10";
  o.epochs = 2;
  o.batch = 2;
  const auto result = troupe::kernels::train(o, {}, [](const troupe::kernels::engine_setup&) {
    return std::make_unique<skipping_engine>();
  });
  EXPECT_EQ(result.skipped_steps, 5);  // 10 steps, the even ones skipped
}

class InstalledFashionMnist : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    if (fs::exists(fs::path(troupe::fashion_mnist_dir) / "train-images-idx3-ubyte.gz"))
      data_ = std::make_unique<troupe::fashion_mnist>(troupe::load_fashion_mnist());
  }
  static void TearDownTestSuite() { data_.reset(); }
  void SetUp() override {
    if (!data_)
      GTEST_SKIP() << "Fashion-MNIST is not installed under " << troupe::fashion_mnist_dir
                   << ": install Debian's dataset-fashion-mnist (cmake/install-deps.sh does)";
  }
  static inline std::unique_ptr<troupe::fashion_mnist> data_;
};

TEST_F(InstalledFashionMnist, Has60000And10000ImagesOf28By28) {
  EXPECT_EQ(data_->train.images.shape(), (tensor::shape_type{60000, 28, 28}));
  EXPECT_EQ(data_->train.labels.shape(), (tensor::shape_type{60000}));
  EXPECT_EQ(data_->test.images.shape(), (tensor::shape_type{10000, 28, 28}));
  EXPECT_EQ(data_->test.labels.shape(), (tensor::shape_type{10000}));
}

TEST_F(InstalledFashionMnist, HasEachClassExactly6000TimesInTrainAnd1000InTest) {
  for (const auto& [split, expected] : {std::pair{&data_->train, 6000}, std::pair{&data_->test, 1000}}) {
    std::array<int, 10> counts{};
    for (std::uint8_t label : split->labels.data<std::uint8_t>()) {
      ASSERT_LT(label, 10);
      ++counts[label];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[static_cast<std::size_t>(c)], expected) << "class " << c;
  }
}

TEST_F(InstalledFashionMnist, NormalizesTrainingPixelsToMeanZeroAndStdOne) {
  const tensor x = troupe::normalize(data_->train.images);
  ASSERT_EQ(x.shape(), (tensor::shape_type{60000, 784}));
  double sum = 0.0, squares = 0.0;
  for (float v : x.data<float>()) {
    sum += v;
    squares += double{v} * v;
  }
  const double n = static_cast<double>(x.numel());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(std::sqrt(squares / n - mean * mean), 1.0, 2e-3);
}

// ---- normalization -----------------------------------------------------------------------------

TEST(Normalize, MapsEveryPixelValueAndFlattensEachImage) {
  bytes all(256);
  for (int v = 0; v < 256; ++v) all[static_cast<std::size_t>(v)] = static_cast<std::uint8_t>(255 - v);
  const tensor images = tensor::from<std::uint8_t>(all, {4, 8, 8});
  const tensor x = troupe::normalize(images, 0.25f, 0.5f);
  EXPECT_EQ(x.type(), dtype::f32);
  ASSERT_EQ(x.shape(), (tensor::shape_type{4, 64}));
  const auto data = x.data<float>();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double expected = (all[i] / 255.0 - 0.25) / 0.5;
    EXPECT_NEAR(data[i], expected, 1e-6 + 1e-6 * std::abs(expected)) << "pixel " << int(all[i]);
  }
}

TEST(Normalize, UsesFashionMnistConstantsByDefault) {
  const tensor x = troupe::normalize(tensor::from<std::uint8_t>({0, 255}, {2, 1}));
  EXPECT_NEAR(x.data<float>()[0], -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(x.data<float>()[1], (1.0 - 0.2860) / 0.3530, 1e-6);
}

TEST(Normalize, RejectsNonU8ImagesAndABadStd) {
  const tensor f = tensor::from<float>({1.0f, 2.0f}, {2, 1});
  EXPECT_THROW(troupe::normalize(f), std::invalid_argument);
  const tensor u = tensor::from<std::uint8_t>({1, 2}, {2, 1});
  EXPECT_THROW(troupe::normalize(u, 0.5f, 0.0f), std::invalid_argument);
  EXPECT_THROW(troupe::normalize(u, 0.5f, -1.0f), std::invalid_argument);
  EXPECT_THROW(troupe::normalize(u, NAN, 1.0f), std::invalid_argument);
}

// ---- shuffling ---------------------------------------------------------------------------------

TEST(ShuffledIndices, IsAPermutation) {
  for (std::int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = troupe::shuffled_indices(n, 11);
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, iota(n)) << "n = " << n;
  }
}

TEST(ShuffledIndices, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  EXPECT_EQ(troupe::shuffled_indices(1000, 7), troupe::shuffled_indices(1000, 7));
  EXPECT_NE(troupe::shuffled_indices(1000, 7), troupe::shuffled_indices(1000, 8));
  EXPECT_NE(troupe::shuffled_indices(1000, 7), iota(1000));
}

TEST(ShuffledIndices, GivesTheDocumentedSequenceOnEveryStandardLibrary) {
  // std::mt19937_64(42), Fisher–Yates from the back, bounded draws by rejection.
  const std::vector<std::int64_t> pinned = {1, 7, 9, 0, 3, 8, 4, 2, 5, 6};
  EXPECT_EQ(troupe::shuffled_indices(10, 42), pinned);
}

TEST(ShuffledIndices, DrawsEveryPermutationOfFourAboutEquallyOften) {
  std::map<std::vector<std::int64_t>, int> counts;
  constexpr int draws = 24000;
  for (int seed = 0; seed < draws; ++seed) ++counts[troupe::shuffled_indices(4, static_cast<std::uint64_t>(seed))];
  ASSERT_EQ(counts.size(), 24u);
  // Each count is binomial(24000, 1/24): mean 1000, standard deviation 31.
  for (const auto& [perm, count] : counts) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

TEST(ShuffledIndices, RejectsANegativeCount) {
  EXPECT_THROW(troupe::shuffled_indices(-1, 0), std::invalid_argument);
}

// ---- IID shards --------------------------------------------------------------------------------

TEST(ShardIid, CoversEveryIndexExactlyOnceWithSizesWithinOne) {
  const auto shards = troupe::shard_iid(1003, 10, 5);
  ASSERT_EQ(shards.size(), 10u);
  EXPECT_EQ(all_indices(shards), iota(1003));
  for (std::size_t c = 0; c < shards.size(); ++c) EXPECT_EQ(shards[c].size(), c < 3 ? 101u : 100u) << c;
}

TEST(ShardIid, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  EXPECT_EQ(troupe::shard_iid(500, 7, 1), troupe::shard_iid(500, 7, 1));
  EXPECT_NE(troupe::shard_iid(500, 7, 1), troupe::shard_iid(500, 7, 2));
}

TEST(ShardIid, GivesEmptyShardsWhenClientsOutnumberExamples) {
  const auto shards = troupe::shard_iid(3, 5, 0);
  EXPECT_EQ(all_indices(shards), iota(3));
  EXPECT_TRUE(shards[3].empty() && shards[4].empty());
}

TEST(ShardIid, RejectsFewerThanOneClient) {
  const std::string what = error_of<std::invalid_argument>([] { troupe::shard_iid(10, 0, 0); });
  EXPECT_TRUE(contains(what, "clients must be at least 1")) << what;
  EXPECT_THROW(troupe::shard_iid(-1, 2, 0), std::invalid_argument);
}

// ---- Dirichlet shards --------------------------------------------------------------------------

// 10 classes of 600 examples each, in a shuffled order.
tensor ten_class_labels() {
  bytes labels(6000);
  const auto order = troupe::shuffled_indices(6000, 99);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(order[i] % 10);
  return tensor::from<std::uint8_t>(labels, {6000});
}

struct skew {
  double classes_per_client;  // classes holding at least one example of the client
  double total_variation;     // mean distance between a client's label mix and the global one
};

skew measure(const tensor& labels, const std::vector<std::vector<std::int64_t>>& shards) {
  const auto y = labels.data<std::uint8_t>();
  skew out{0.0, 0.0};
  for (const auto& shard : shards) {
    std::array<double, 10> counts{};
    for (std::int64_t i : shard) counts[y[static_cast<std::size_t>(i)]] += 1.0;
    double tv = 0.0;
    for (double c : counts) {
      out.classes_per_client += c > 0 ? 1.0 : 0.0;
      tv += std::abs(c / static_cast<double>(shard.size()) - 0.1);
    }
    out.total_variation += tv / 2.0;
  }
  out.classes_per_client /= static_cast<double>(shards.size());
  out.total_variation /= static_cast<double>(shards.size());
  return out;
}

TEST(ShardDirichlet, CoversEveryIndexExactlyOnce) {
  const tensor labels = ten_class_labels();
  for (double alpha : {0.05, 0.1, 0.5, 1.0, 100.0}) {
    const auto shards = troupe::shard_dirichlet(labels, 20, alpha, 3);
    ASSERT_EQ(shards.size(), 20u);
    EXPECT_EQ(all_indices(shards), iota(6000)) << "alpha " << alpha;
    for (const auto& s : shards) EXPECT_GE(s.size(), 1u) << "alpha " << alpha;
  }
}

TEST(ShardDirichlet, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  const tensor labels = ten_class_labels();
  EXPECT_EQ(troupe::shard_dirichlet(labels, 20, 0.5, 1), troupe::shard_dirichlet(labels, 20, 0.5, 1));
  EXPECT_NE(troupe::shard_dirichlet(labels, 20, 0.5, 1), troupe::shard_dirichlet(labels, 20, 0.5, 2));
}

TEST(ShardDirichlet, SmallAlphaIsMoreSkewedThanLargeAlpha) {
  const tensor labels = ten_class_labels();
  const skew small = measure(labels, troupe::shard_dirichlet(labels, 20, 0.1, 4));
  const skew large = measure(labels, troupe::shard_dirichlet(labels, 20, 100.0, 4));
  EXPECT_LT(small.classes_per_client, 6.0);
  EXPECT_GT(small.total_variation, 0.5);
  EXPECT_EQ(large.classes_per_client, 10.0);
  EXPECT_LT(large.total_variation, 0.1);
}

TEST(ShardDirichlet, GivesEveryClientAtLeastMinSize) {
  const tensor labels = ten_class_labels();
  const auto shards = troupe::shard_dirichlet(labels, 30, 0.1, 6, 50);
  EXPECT_EQ(all_indices(shards), iota(6000));
  for (const auto& s : shards) EXPECT_GE(s.size(), 50u);
}

TEST(ShardDirichlet, AcceptsI32AndI64Labels) {
  const std::vector<std::int32_t> y32 = {0, 3, 3, 1, 0, 2, 1, 3};
  const std::vector<std::int64_t> y64(y32.begin(), y32.end());
  const auto a = troupe::shard_dirichlet(tensor::from<std::int32_t>(y32, {8}), 2, 1.0, 9);
  const auto b = troupe::shard_dirichlet(tensor::from<std::int64_t>(y64, {8}), 2, 1.0, 9);
  EXPECT_EQ(a, b);
  EXPECT_EQ(all_indices(a), iota(8));
}

TEST(ShardDirichlet, RejectsBadArgumentsSayingWhatToChange) {
  const tensor labels = ten_class_labels();
  for (double alpha : {0.0, -1.0, static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    const std::string what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 4, alpha, 0); });
    EXPECT_TRUE(contains(what, "alpha must be positive")) << what;
  }
  std::string what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 0, 1.0, 0); });
  EXPECT_TRUE(contains(what, "clients must be at least 1")) << what;
  what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 100, 1.0, 0, 61); });
  EXPECT_TRUE(contains(what, "lower min_size or use fewer clients")) << what;
  EXPECT_THROW(troupe::shard_dirichlet(labels, 4, 1.0, 0, -1), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<std::uint8_t>({1, 2}, {1, 2}), 1, 1.0, 0), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<std::int32_t>({1, -2}, {2}), 1, 1.0, 0), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<float>({1.0f}, {1}), 1, 1.0, 0), std::invalid_argument);
}

TEST(ShardDirichlet, GivesUpWhenMinSizeCannotBeMet) {
  // One class of ten split by Dirichlet(0.001) between two clients almost never lands 5 and 5.
  const tensor labels = tensor::from<std::uint8_t>(bytes(10, 0), {10});
  const std::string what = error_of<std::runtime_error>([&] { troupe::shard_dirichlet(labels, 2, 0.001, 0, 5); });
  EXPECT_TRUE(contains(what, "lower min_size, raise alpha or use fewer clients")) << what;
}

// ---- batching ----------------------------------------------------------------------------------

TEST(GatherRows, CopiesTheSelectedRows) {
  std::mt19937 g(12);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(10 * 7);
  for (float& v : values) v = u(g);
  const tensor source = tensor::from<float>(values, {10, 7});
  const std::vector<std::int64_t> rows = {3, 0, 9, 3};
  tensor out = tensor::empty({4, 7});
  troupe::gather_rows(source, rows, out);
  const auto got = out.data<float>();
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < 7; ++j)
      EXPECT_EQ(got[i * 7 + j], values[static_cast<std::size_t>(rows[i]) * 7 + j]) << i << ", " << j;
}

TEST(GatherRows, FlattensU8ImagesIntoRows) {
  const bytes pixels = random_bytes(5 * 28 * 28, 13);
  const tensor images = tensor::from<std::uint8_t>(pixels, {5, 28, 28});
  const std::vector<std::int64_t> rows = {4, 1};
  tensor out = tensor::empty({2, 784}, dtype::u8);
  troupe::gather_rows(images, rows, out);
  const auto got = out.data<std::uint8_t>();
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 784, pixels.begin() + 4 * 784));
  EXPECT_TRUE(std::equal(got.begin() + 784, got.end(), pixels.begin() + 784, pixels.begin() + 2 * 784));

  const tensor fresh = troupe::gather_rows(images, rows);
  EXPECT_EQ(fresh.shape(), (tensor::shape_type{2, 28, 28}));
  const auto again = fresh.data<std::uint8_t>();
  EXPECT_TRUE(std::equal(again.begin(), again.end(), got.begin(), got.end()));
}

TEST(GatherRows, RejectsOutOfRangeIndices) {
  const tensor source = tensor::from<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  tensor out = tensor::empty({1, 2});
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{3}, std::int64_t{1} << 40}) {
    const std::vector<std::int64_t> rows = {bad};
    const std::string what = error_of<std::out_of_range>([&] { troupe::gather_rows(source, rows, out); });
    EXPECT_TRUE(contains(what, "row index " + std::to_string(bad))) << what;
  }
}

TEST(GatherRows, RejectsMismatchedShapesDtypesAndOverlap) {
  const tensor source = tensor::from<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const std::vector<std::int64_t> rows = {0, 2};
  tensor wrong_rows = tensor::empty({3, 2});
  tensor wrong_width = tensor::empty({2, 3});
  tensor wrong_type = tensor::empty({2, 2}, dtype::u8);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_rows), std::invalid_argument);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_width), std::invalid_argument);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_type), std::invalid_argument);
  tensor inside = source.slice(1, 3);
  const std::string what = error_of<std::invalid_argument>([&] { troupe::gather_rows(source, rows, inside); });
  EXPECT_TRUE(contains(what, "overlaps")) << what;
}

TEST(BatchIterator, WalksTheListInBatchesWithASmallerLastOne) {
  const auto indices = troupe::shuffled_indices(10, 1);
  troupe::batch_iterator batches(indices, 4);
  EXPECT_EQ(batches.count(), 3);
  std::vector<std::size_t> sizes;
  std::vector<std::int64_t> seen;
  while (auto batch = batches.next()) {
    sizes.push_back(batch->size());
    seen.insert(seen.end(), batch->begin(), batch->end());
  }
  EXPECT_EQ(sizes, (std::vector<std::size_t>{4, 4, 2}));
  EXPECT_EQ(seen, indices);
  EXPECT_FALSE(batches.next().has_value());
  // A batch larger than the list: one batch (the count must not overflow).
  EXPECT_EQ(troupe::batch_iterator(indices, std::numeric_limits<std::int64_t>::max()).count(), 1);
}

TEST(BatchIterator, DropsThePartialLastBatchWhenAsked) {
  const auto indices = iota(10);
  troupe::batch_iterator batches(indices, 4, /*drop_last=*/true);
  EXPECT_EQ(batches.count(), 2);
  int n = 0;
  while (auto batch = batches.next()) {
    EXPECT_EQ(batch->size(), 4u);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

TEST(BatchIterator, StartsAgainAfterReset) {
  const auto indices = iota(5);
  troupe::batch_iterator batches(indices, 5);
  ASSERT_TRUE(batches.next().has_value());
  EXPECT_FALSE(batches.next().has_value());
  batches.reset();
  const auto batch = batches.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->front(), 0);
}

TEST(BatchIterator, RejectsABatchSizeBelowOne) {
  const auto indices = iota(5);
  EXPECT_THROW(troupe::batch_iterator(indices, 0), std::invalid_argument);
}

}  // namespace
