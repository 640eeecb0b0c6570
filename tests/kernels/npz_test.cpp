// load_npz: .npz archives written here with libzip (stored and deflated entries) holding .npy
// arrays built here byte by byte, and the archives NumPy itself wrote (tests/kernels/golden/npz).

#include "npz.hpp"
#include "troupe/kernels/data.hpp"

#include "data_support.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#ifndef TROUPE_GOLDEN_DIR
#error "tests/CMakeLists.txt defines TROUPE_GOLDEN_DIR for kernels_test"
#endif

namespace {

namespace fs = std::filesystem;
using troupe::dtype;
using troupe::tensor;
using bytes = std::vector<std::uint8_t>;

// ---- helpers ---------------------------------------------------------------------------------

// A path in the test's temporary directory, removed at the end of the test.
class temp_path {
public:
  explicit temp_path(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (fs::path(::testing::TempDir()) /
             ("troupe_npz_" + std::to_string(::getpid()) + "_" + info->name() + "_" + name))
                .string();
  }
  ~temp_path() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_path(const temp_path&) = delete;
  temp_path& operator=(const temp_path&) = delete;
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// The bytes of `values`, little- or big-endian.
template <class T>
bytes encode(const std::vector<T>& values, bool big_endian = false) {
  bytes out;
  for (const T v : values) {
    std::array<std::uint8_t, sizeof(T)> b;
    std::memcpy(b.data(), &v, sizeof(T));
    if (big_endian != (std::endian::native == std::endian::big)) std::reverse(b.begin(), b.end());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// A .npy file with `dict` as its header, padded as NumPy pads it (spaces, then '\n', so that
// the data starts at a multiple of 64).
bytes npy_with_header(const std::string& dict, const bytes& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(major), 0};
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::string shape_repr(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// A .npy file as NumPy writes it.
bytes npy(const std::string& descr, const std::vector<std::int64_t>& shape, const bytes& data, int major = 1,
          bool fortran = false) {
  return npy_with_header("{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                             ", 'shape': " + shape_repr(shape) + ", }",
                         data, major);
}

struct entry {
  std::string name;  // "x_train.npy"
  bytes data;
  int method = ZIP_CM_STORE;
};

// Writes a zip archive with libzip, each entry stored or compressed as it asks.
void write_zip(const std::string& path, const std::vector<entry>& entries) {
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(z, nullptr) << "zip_open error " << error;
  for (const entry& e : entries) {
    zip_source_t* src = zip_source_buffer(z, e.data.data(), e.data.size(), 0);
    ASSERT_NE(src, nullptr) << zip_strerror(z);
    const zip_int64_t index = zip_file_add(z, e.name.c_str(), src, ZIP_FL_ENC_UTF_8);
    ASSERT_GE(index, 0) << zip_strerror(z);
    ASSERT_EQ(zip_set_file_compression(z, static_cast<zip_uint64_t>(index), e.method, 0), 0) << zip_strerror(z);
  }
  ASSERT_EQ(zip_close(z), 0) << zip_strerror(z);
}

bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << path;
}

bytes random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

// The four arrays of a small valid data set: u8 images [5, 4, 3] and [3, 4, 3], labels 0..3.
std::vector<entry> valid_entries(int method = ZIP_CM_STORE) {
  return {{"x_train.npy", npy("|u1", {5, 4, 3}, random_bytes(60, 1)), method},
          {"y_train.npy", npy("<i8", {5}, encode<std::int64_t>({0, 3, 1, 1, 2})), method},
          {"x_test.npy", npy("|u1", {3, 4, 3}, random_bytes(36, 2)), method},
          {"y_test.npy", npy("<i8", {3}, encode<std::int64_t>({2, 0, 1})), method}};
}

// `entries` with the one named `name` replaced by (or, when absent, extended with) `data`.
std::vector<entry> with(std::vector<entry> entries, const std::string& name, bytes data) {
  for (auto& e : entries)
    if (e.name == name) {
      e.data = std::move(data);
      return entries;
    }
  entries.push_back({name, std::move(data), ZIP_CM_STORE});
  return entries;
}

std::vector<entry> without(std::vector<entry> entries, const std::string& name) {
  std::erase_if(entries, [&](const entry& e) { return e.name == name; });
  return entries;
}

using data_support::error_of;

// Writes `entries` as an archive and returns load_npz's message on it.
std::string load_error(const std::vector<entry>& entries) {
  temp_path file("bad.npz");
  write_zip(file.path(), entries);
  return error_of([&] { troupe::load_npz(file.path()); });
}

std::vector<double> pixel_reference(const tensor& u8) {
  double sum = 0, squares = 0;
  for (const std::uint8_t v : u8.data<std::uint8_t>()) sum += v / 255.0;
  const double n = static_cast<double>(u8.numel());
  const double mean = sum / n;
  for (const std::uint8_t v : u8.data<std::uint8_t>()) squares += (v / 255.0 - mean) * (v / 255.0 - mean);
  return {mean, std::sqrt(squares / n)};
}

// ---- what loads ------------------------------------------------------------------------------

TEST(Npz, RoundTripsU8ImagesAndLabelsStoredAndDeflated) {
  for (const int method : {ZIP_CM_STORE, ZIP_CM_DEFLATE}) {
    SCOPED_TRACE(method);
    const auto entries = valid_entries(method);
    temp_path file("u8.npz");
    write_zip(file.path(), entries);
    const troupe::labelled_data d = troupe::load_npz(file.path());
    EXPECT_EQ(d.train.images.type(), dtype::u8);
    EXPECT_EQ(d.train.images.shape(), (tensor::shape_type{5, 4, 3}));
    EXPECT_EQ(d.test.images.shape(), (tensor::shape_type{3, 4, 3}));
    const auto x = d.train.images.data<std::uint8_t>();
    EXPECT_TRUE(std::equal(x.begin(), x.end(), random_bytes(60, 1).begin()));
    const auto xt = d.test.images.data<std::uint8_t>();
    EXPECT_TRUE(std::equal(xt.begin(), xt.end(), random_bytes(36, 2).begin()));
    EXPECT_EQ(d.train.labels.type(), dtype::u8);
    EXPECT_EQ(std::vector<std::uint8_t>(d.train.labels.data<std::uint8_t>().begin(), d.train.labels.data<std::uint8_t>().end()),
              (std::vector<std::uint8_t>{0, 3, 1, 1, 2}));
    EXPECT_EQ(std::vector<std::uint8_t>(d.test.labels.data<std::uint8_t>().begin(), d.test.labels.data<std::uint8_t>().end()),
              (std::vector<std::uint8_t>{2, 0, 1}));
    EXPECT_EQ(d.classes, 4);
    const auto ref = pixel_reference(d.train.images);
    EXPECT_NEAR(d.mean, ref[0], 1e-6);
    EXPECT_NEAR(d.stddev, ref[1], 1e-6);
    EXPECT_FALSE(d.client_train.defined());

    // The archive held in memory loads the same.
    const bytes raw = read_file(file.path());
    const auto again = troupe::detail::load_npz_bytes(std::as_bytes(std::span(raw)), "memory");
    EXPECT_EQ(std::memcmp(again.train.images.bytes(), d.train.images.bytes(), d.train.images.nbytes()), 0);
    EXPECT_EQ(again.classes, d.classes);
    EXPECT_EQ(again.mean, d.mean);
  }
}

TEST(Npz, ReadsF32FeaturesInEitherByteOrderAndEveryHeaderVersion) {
  const std::vector<float> train = {1.5f, -2.25f, 3e-7f, 1e30f, -0.0f, 42.0f};
  const std::vector<float> test = {0.125f, -7.0f, 8.5f};
  for (const int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    temp_path file("f32.npz");
    write_zip(file.path(), {{"x_train.npy", npy("<f4", {2, 3}, encode(train), major), ZIP_CM_DEFLATE},
                            {"y_train.npy", npy("|u1", {2}, {1, 0}, major)},
                            {"x_test.npy", npy(">f4", {1, 3}, encode(test, true), major)},
                            {"y_test.npy", npy(">i2", {1}, encode<std::int16_t>({2}, true), major)}});
    const auto d = troupe::load_npz(file.path());
    EXPECT_EQ(d.train.images.type(), dtype::f32);
    EXPECT_EQ(d.train.images.shape(), (tensor::shape_type{2, 3}));
    const auto x = d.train.images.data<float>();
    for (std::size_t i = 0; i < train.size(); ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(x[i]), std::bit_cast<std::uint32_t>(train[i])) << i;
    const auto xt = d.test.images.data<float>();
    for (std::size_t i = 0; i < test.size(); ++i) EXPECT_EQ(xt[i], test[i]) << i;
    EXPECT_EQ(d.test.labels.data<std::uint8_t>()[0], 2);
    EXPECT_EQ(d.classes, 3);
    EXPECT_EQ(d.mean, 0.0f);
    EXPECT_EQ(d.stddev, 1.0f);
  }
}

TEST(Npz, ReadsLabelsAndClientsOfEveryIntegerDtypeInBothByteOrders) {
  const std::vector<std::int64_t> values = {0, 3, 1, 2};
  const auto as = [&](const std::string& descr) -> bytes {
    const bool be = descr[0] == '>';
    const char kind = descr[1];
    switch (descr[2]) {
      case '1': return kind == 'u' ? encode<std::uint8_t>({0, 3, 1, 2}) : encode<std::int8_t>({0, 3, 1, 2});
      case '2': return kind == 'u' ? encode<std::uint16_t>({0, 3, 1, 2}, be) : encode<std::int16_t>({0, 3, 1, 2}, be);
      case '4': return kind == 'u' ? encode<std::uint32_t>({0, 3, 1, 2}, be) : encode<std::int32_t>({0, 3, 1, 2}, be);
      default: return kind == 'u' ? encode<std::uint64_t>({0, 3, 1, 2}, be) : encode<std::int64_t>(values, be);
    }
  };
  for (const std::string descr : {"|u1", "|i1", "<u1", ">i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", ">i2",
                                  ">u2", ">i4", ">u4", ">i8", ">u8"}) {
    SCOPED_TRACE(descr);
    temp_path file("ints.npz");
    write_zip(file.path(), {{"x_train.npy", npy("|u1", {4, 2}, random_bytes(8, 3))},
                            {"y_train.npy", npy(descr, {4}, as(descr))},
                            {"x_test.npy", npy("|u1", {0, 2}, {})},
                            {"y_test.npy", npy(descr, {0}, {})},
                            {"client_train.npy", npy(descr, {4}, as(descr))}});
    const auto d = troupe::load_npz(file.path());
    const auto labels = d.train.labels.data<std::uint8_t>();
    const auto clients = d.client_train.data<std::uint32_t>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(labels[i], values[i]) << i;
      EXPECT_EQ(clients[i], values[i]) << i;
    }
    EXPECT_EQ(d.test.size(), 0);
    EXPECT_EQ(d.classes, 4);
  }
}

TEST(Npz, ReadsClientNumbersUpTo2To32MinusOneWithGaps) {
  temp_path file("clients.npz");
  write_zip(file.path(), with(valid_entries(), "client_train.npy",
                              npy("<i8", {5}, encode<std::int64_t>({7, 0, 4294967295, 7, 0}))));
  const auto d = troupe::load_npz(file.path());
  ASSERT_TRUE(d.client_train.defined());
  EXPECT_EQ(d.client_train.type(), dtype::u32);
  EXPECT_EQ(d.client_train.shape(), (tensor::shape_type{5}));
  const auto c = d.client_train.data<std::uint32_t>();
  EXPECT_EQ(std::vector<std::uint32_t>(c.begin(), c.end()), (std::vector<std::uint32_t>{7, 0, 4294967295u, 7, 0}));
}

TEST(Npz, KeepsImagesOfAnyRankFromTwoToEight) {
  for (const auto& shape : {std::vector<std::int64_t>{3, 5}, std::vector<std::int64_t>{3, 1, 2, 1, 1, 2, 1, 1}}) {
    temp_path file("rank.npz");
    const std::int64_t n = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    auto test_shape = shape;
    test_shape[0] = 1;
    write_zip(file.path(), {{"x_train.npy", npy("|u1", shape, random_bytes(static_cast<std::size_t>(n), 4))},
                            {"y_train.npy", npy("|u1", {3}, {0, 1, 0})},
                            {"x_test.npy", npy("|u1", test_shape, random_bytes(static_cast<std::size_t>(n / 3), 5))},
                            {"y_test.npy", npy("|u1", {1}, {1})}});
    const auto d = troupe::load_npz(file.path());
    EXPECT_EQ(d.train.images.shape(), tensor::shape_type(shape.begin(), shape.end()));
  }
}

TEST(Npz, IgnoresOtherArraysInTheArchive) {
  temp_path file("extra.npz");
  write_zip(file.path(), with(valid_entries(), "class_names.npy", npy("<U5", {2}, bytes(40, 0))));
  EXPECT_EQ(troupe::load_npz(file.path()).classes, 4);
}

TEST(Npz, GivesAStddevOfOneWhenEveryPixelIsEqual) {
  temp_path file("flat.npz");
  write_zip(file.path(), with(valid_entries(), "x_train.npy", npy("|u1", {5, 4, 3}, bytes(60, 51))));
  const auto d = troupe::load_npz(file.path());
  EXPECT_NEAR(d.mean, 0.2f, 1e-7);
  EXPECT_EQ(d.stddev, 1.0f);
}

// What NumPy writes: np.savez (stored, zip64 extra fields in every local header),
// np.savez_compressed (deflated), and either into a stream that cannot seek (data descriptors);
// see tests/kernels/golden/make_npz_golden.py.
TEST(Npz, ReadsWhatNumPySavezAndSavezCompressedWrite) {
  const fs::path dir = fs::path(TROUPE_GOLDEN_DIR) / "npz";
  const auto d = troupe::load_npz((dir / "savez.npz").string());
  ASSERT_EQ(d.train.images.shape(), (tensor::shape_type{6, 4, 5}));
  ASSERT_EQ(d.test.images.shape(), (tensor::shape_type{2, 4, 5}));
  const auto x = d.train.images.data<std::uint8_t>();
  const auto xt = d.test.images.data<std::uint8_t>();
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(x[static_cast<std::size_t>((i * 4 + j) * 5 + k)], (i * 7 + j * 3 + k) % 256);
        if (i < 2) {
          EXPECT_EQ(xt[static_cast<std::size_t>((i * 4 + j) * 5 + k)], (i * 11 + j + k * 5) % 256);
        }
      }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d.train.labels.data<std::uint8_t>()[static_cast<std::size_t>(i)], i % 3);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(d.test.labels.data<std::uint8_t>()[static_cast<std::size_t>(i)], (i + 1) % 3);
  const auto c = d.client_train.data<std::uint32_t>();
  EXPECT_EQ(std::vector<std::uint32_t>(c.begin(), c.end()), (std::vector<std::uint32_t>{0, 2, 2, 0, 5, 2}));
  EXPECT_EQ(d.classes, 3);

  const auto f = troupe::load_npz((dir / "savez_compressed.npz").string());
  ASSERT_EQ(f.train.images.shape(), (tensor::shape_type{5, 3}));
  ASSERT_EQ(f.test.images.shape(), (tensor::shape_type{2, 3}));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(f.train.images.data<float>()[static_cast<std::size_t>(i * 3 + j)], static_cast<float>(i - 0.25 * j));
      if (i < 2) {
        EXPECT_EQ(f.test.images.data<float>()[static_cast<std::size_t>(i * 3 + j)], static_cast<float>(0.5 * i + j));
      }
    }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f.train.labels.data<std::uint8_t>()[static_cast<std::size_t>(i)], (4 - i) % 4);
  EXPECT_EQ(f.test.labels.data<std::uint8_t>()[1], 3);
  EXPECT_EQ(f.classes, 4);
  EXPECT_FALSE(f.client_train.defined());

  // Written to a stream that cannot seek: the sizes and CRCs follow each entry's data.
  const auto s = troupe::load_npz((dir / "stream.npz").string());
  ASSERT_EQ(s.train.images.shape(), (tensor::shape_type{3, 2}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_EQ(s.train.images.data<std::uint8_t>()[static_cast<std::size_t>(i * 2 + j)], i + 10 * j);
  EXPECT_EQ(s.train.labels.data<std::uint8_t>()[0], 2);
  EXPECT_EQ(s.test.images.data<std::uint8_t>()[1], 9);
  EXPECT_EQ(s.classes, 3);
}

// ---- what is refused, and the message that says why ----------------------------------------

TEST(Npz, NamesTheFileAndTheMissingArray) {
  temp_path file("missing.npz");
  write_zip(file.path(), without(valid_entries(), "y_test.npy"));
  const std::string e = error_of([&] { troupe::load_npz(file.path()); });
  EXPECT_CONTAINS(e, "load_npz: " + file.path() + ": the array y_test is missing");
  EXPECT_CONTAINS(e, "x_train.npy, y_train.npy, x_test.npy");
}

TEST(Npz, RefusesUnsupportedDtypesNamingTheArray) {
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("<f8", {5, 4, 3}, bytes(480, 0)))),
                  "x_train.npy: dtype '<f8' is not supported: x arrays must be uint8");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_test.npy", npy("|i1", {3, 4, 3}, bytes(36, 0)))),
                  "x_test.npy: dtype '|i1' is not supported");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("<f4", {5}, bytes(20, 0)))),
                  "y_train.npy: dtype '<f4' is not supported: it must hold integers");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("|b1", {5}, bytes(5, 0)))),
                  "dtype '|b1' is not supported");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("|i2", {5}, bytes(10, 0)))),
                  "dtype '|i2' is not supported");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_test.npy", npy("|O", {3}, bytes(24, 0)))),
                  "y_test.npy: dtype '|O' is an object array");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy",
                                  npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (5,), }",
                                                  bytes(20, 0)))),
                  "x_train.npy: dtype is a list of fields (a structured array)");
}

TEST(Npz, RefusesFortranOrder) {
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("|u1", {5, 4, 3}, bytes(60, 0), 1, true))),
                  "x_train.npy: fortran_order is True");
}

TEST(Npz, RefusesShapesThatDisagree) {
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("|u1", {4}, {0, 1, 2, 3}))),
                  "y_train.npy: holds 4 labels for the 5 examples of x_train.npy");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_test.npy", npy("|u1", {4}, {0, 1, 2, 3}))),
                  "y_test.npy: holds 4 labels for the 3 examples of x_test.npy");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_test.npy", npy("|u1", {3, 3, 4}, bytes(36, 0)))),
                  "x_test.npy: holds u8[3, 3, 4] on cpu: its examples must have x_train.npy's shape [4, 3]");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_test.npy", npy("<f4", {3, 4, 3}, bytes(144, 0)))),
                  "x_test.npy: holds f32 but x_train.npy holds u8");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "client_train.npy", npy("|u1", {6}, bytes(6, 0)))),
                  "client_train.npy: holds 6 client numbers for the 5 examples of x_train.npy");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("|u1", {5, 1}, bytes(5, 0)))),
                  "y_train.npy: shape (5, 1) has rank 2: it must be 1-D");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("|u1", {5}, bytes(5, 0)))),
                  "x_train.npy: shape (5,) has rank 1: x needs (N, ...)");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("|u1", {1, 1, 1, 1, 1, 1, 1, 1, 5}, bytes(5, 0)))),
                  "has rank 9");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("|u1", {0, 4, 3}, {}))),
                  "x_train.npy: holds no examples");
}

TEST(Npz, RefusesLabelsAndClientsOutOfRange) {
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_train.npy", npy("<i4", {5}, encode<std::int32_t>({0, 1, -1, 2, 3})))),
                  "y_train.npy: label -1 at index 2 is outside 0..255");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_test.npy", npy(">u2", {3}, encode<std::uint16_t>({0, 256, 1}, true)))),
                  "y_test.npy: label 256 at index 1 is outside 0..255");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "y_test.npy",
                                  npy("<u8", {3}, encode<std::uint64_t>({0, 1, std::numeric_limits<std::uint64_t>::max()})))),
                  "label 18446744073709551615 at index 2");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "client_train.npy",
                                  npy("<i8", {5}, encode<std::int64_t>({0, 1, 4294967296, 2, 3})))),
                  "client_train.npy: client index 4294967296 at index 2 is outside 0..4294967295");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "client_train.npy", npy("|i1", {5}, encode<std::int8_t>({0, -3, 1, 2, 3})))),
                  "client_train.npy: client index -3 at index 1");
  EXPECT_CONTAINS(load_error(with(with(valid_entries(), "y_train.npy", npy("|u1", {5}, bytes(5, 0))), "y_test.npy",
                                  npy("|u1", {3}, bytes(3, 0)))),
                  "y_train.npy: every label of both splits is 0: a classifier needs at least 2 classes");
}

TEST(Npz, RefusesFeaturesThatAreNotFinite) {
  const std::vector<float> x = {1, 2, 3, std::numeric_limits<float>::quiet_NaN(), 5, 6};
  const std::string e = load_error({{"x_train.npy", npy("<f4", {2, 3}, encode(std::vector<float>{1, 2, 3, 4, 5, 6}))},
                                    {"y_train.npy", npy("|u1", {2}, {0, 1})},
                                    {"x_test.npy", npy("<f4", {2, 3}, encode(x))},
                                    {"y_test.npy", npy("|u1", {2}, {0, 1})}});
  EXPECT_CONTAINS(e, "x_test.npy: value nan at flat index 3 is not finite");
}

TEST(Npz, RefusesTruncatedDataAndTrailingBytes) {
  bytes x = npy("|u1", {5, 4, 3}, random_bytes(60, 1));
  for (const int method : {ZIP_CM_STORE, ZIP_CM_DEFLATE}) {
    auto cut = valid_entries(method);
    cut[0].data = bytes(x.begin(), x.end() - 1);
    EXPECT_CONTAINS(load_error(cut), "x_train.npy: truncated: shape (5, 4, 3) of '|u1' needs 60 bytes of data, the entry holds 59");
    auto longer = valid_entries(method);
    longer[0].data = x;
    longer[0].data.push_back(0);
    EXPECT_CONTAINS(load_error(longer), "x_train.npy: 1 trailing bytes after the 60 bytes of data");
  }
  // Every cut inside the header is refused too.
  for (std::size_t n = 0; n < x.size(); n += 5)
    EXPECT_NE(load_error(with(valid_entries(), "x_train.npy", bytes(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n)))),
              "(no std::runtime_error)")
        << n;
}

TEST(Npz, RefusesAHeaderThatLiesAboutItsSize) {
  bytes x = npy("|u1", {5, 4, 3}, random_bytes(60, 1));
  bytes longer = x;
  longer[8] = 0xff;  // 255 + 256 * 0: more than the entry holds after its 10 bytes
  longer[9] = 0x00;
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", longer)),
                  "x_train.npy: the .npy header announces 255 bytes but the entry holds only " +
                      std::to_string(x.size() - 10) + " after its first 10");
  bytes shorter = x;
  shorter[8] = static_cast<std::uint8_t>(shorter[8] - 16);  // the header's '\n' falls into the data
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", shorter)),
                  "x_train.npy: malformed .npy header: the header does not end with '\\n'");
  // Too large to be a NumPy header, and larger than the entry.
  bytes v2 = npy("|u1", {5, 4, 3}, random_bytes(60, 1), 2);
  const std::uint32_t size = v2[8] | v2[9] << 8;
  v2[11] = 0x7f;
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", v2)),
                  "the .npy header announces " + std::to_string((std::uint32_t{0x7f} << 24) + size) + " bytes");
  // Larger than NumPy writes for these dtypes, though the entry holds it.
  bytes big = npy("|u1", {5, 4, 3}, bytes(80000, 0), 2);
  big[8] = 0x80;  // 70016 = 0x11180
  big[9] = 0x11;
  big[10] = 0x01;
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", big)),
                  "the .npy header announces 70016 bytes, more than the 65536 this reader accepts");
}

TEST(Npz, RefusesShapesLargerThanTheEntryWithoutAllocatingThem) {
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy("|u1", {1LL << 30, 1LL << 20}, bytes(60, 0)))),
                  "x_train.npy: truncated: shape (1073741824, 1048576) of '|u1' needs " + std::to_string(1LL << 50) +
                      " bytes of data, the entry holds 60");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy",
                                  npy("<f4", {std::numeric_limits<std::int64_t>::max(), 3}, bytes(60, 0)))),
                  "is no tensor's (too many elements)");
  // A zero dimension does not excuse the others.
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_test.npy", npy("|u1", {0, 1LL << 62, 1LL << 62}, {}))),
                  "is no tensor's");
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy_with_header(
                                      "{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999, 1), }", {}))),
                  "a dimension of the shape does not fit in 64 bits");
}

TEST(Npz, RefusesMalformedHeaders) {
  const auto refused = [](const std::string& dict, const std::string& why) {
    EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", npy_with_header(dict, random_bytes(60, 1)))), why);
  };
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3), 'descr': '|u1'}", "the key 'descr' appears twice");
  refused("{'descr': '|u1', 'fortran_order': False}", "the key 'shape' is missing");
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3), 'extra': 1}", "unknown key 'extra'");
  refused("{'descr': '|u1', 'fortran_order': 0, 'shape': (5, 4, 3)}", "fortran_order must be True or False");
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (60)}", "the shape (60) is no tuple");
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (5, -4, 3)}", "negative dimension");
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (05, 4, 3)}", "leading zero");
  refused("{'descr': '|u1' 'fortran_order': False, 'shape': (5, 4, 3)}", "expected ',' or '}'");
  refused("{'descr': '|u1', 'fortran_order': False, 'shape': (5, 4, 3)} x", "unexpected text after the dictionary");
  refused("{'descr': '|u\\x31', 'fortran_order': False, 'shape': (5, 4, 3)}", "unexpected character in a string");
  refused("['descr', '|u1']", "expected '{'");
  // The same dictionary, well formed, loads (so the refusals above are the changes' doing).
  temp_path file("ok.npz");
  write_zip(file.path(), with(valid_entries(), "x_train.npy",
                              npy_with_header("{\"shape\":(5,4,3),\"fortran_order\":False,\"descr\":\"|u1\"}", random_bytes(60, 1))));
  EXPECT_EQ(troupe::load_npz(file.path()).train.images.shape(), (tensor::shape_type{5, 4, 3}));
}

TEST(Npz, RefusesABadMagicAndUnknownVersions) {
  bytes x = npy("|u1", {5, 4, 3}, random_bytes(60, 1));
  bytes magic = x;
  magic[1] = 'n';
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", magic)),
                  "x_train.npy: not a .npy array (it does not start with \\x93NUMPY)");
  bytes version = x;
  version[6] = 4;
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", version)), ".npy version 4.0 is not one this reader knows");
  version[6] = 1;
  version[7] = 1;
  EXPECT_CONTAINS(load_error(with(valid_entries(), "x_train.npy", version)), ".npy version 1.1");
}

TEST(Npz, RefusesCorruptedEntryData) {
  for (const int method : {ZIP_CM_STORE, ZIP_CM_DEFLATE}) {
    SCOPED_TRACE(method);
    temp_path file("crc.npz");
    write_zip(file.path(), with(valid_entries(method), "x_train.npy", npy("|u1", {1000, 4}, random_bytes(4000, 9))));
    // The first entry's local header: "PK\3\4", its compressed size at 18, name and extra
    // field lengths at 26 and 28, then the name, the extra field and the data.
    bytes raw = read_file(file.path());
    ASSERT_GT(raw.size(), 30u);
    ASSERT_EQ(raw[0], 'P');
    ASSERT_EQ(raw[3], 4);
    const auto u16 = [&](std::size_t at) { return std::size_t{raw[at]} | std::size_t{raw[at + 1]} << 8; };
    const std::size_t size = u16(18) | u16(20) << 16;
    const std::size_t data = 30 + u16(26) + u16(28);
    ASSERT_GT(size, 3000u);  // random pixels do not compress
    raw[data + size / 2] ^= 0x40;
    write_file(file.path(), raw);
    const std::string e = error_of([&] { troupe::load_npz(file.path()); });
    EXPECT_CONTAINS(e, "x_train.npy: corrupted entry (");
    if (method == ZIP_CM_STORE) EXPECT_CONTAINS(e, "(CRC error)");
  }
}

TEST(Npz, RefusesEntriesCompressedOtherwiseOrEncrypted) {
  if (zip_compression_method_supported(ZIP_CM_BZIP2, 1)) {
    auto entries = valid_entries();
    entries[1].method = ZIP_CM_BZIP2;
    EXPECT_CONTAINS(load_error(entries), "y_train.npy: compression method 12 is not supported");
  }
  if (!zip_encryption_method_supported(ZIP_EM_AES_256, 1)) GTEST_SKIP() << "this libzip cannot encrypt";
  temp_path file("secret.npz");
  {
    int error = 0;
    zip_t* z = zip_open(file.path().c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    ASSERT_NE(z, nullptr);
    const std::vector<entry> entries = valid_entries();  // read by zip_close
    for (const entry& e : entries) {
      const zip_int64_t i = zip_file_add(z, e.name.c_str(), zip_source_buffer(z, e.data.data(), e.data.size(), 0), 0);
      ASSERT_GE(i, 0);
      if (e.name == "x_test.npy") {
        ASSERT_EQ(zip_file_set_encryption(z, static_cast<zip_uint64_t>(i), ZIP_EM_AES_256, "pw"), 0);
      }
    }
    ASSERT_EQ(zip_close(z), 0);
  }
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(file.path()); }), "x_test.npy: the entry is encrypted");
}

TEST(Npz, SaysWhatIsWrongWithTheFileItself) {
  temp_path absent("absent.npz");
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(absent.path()); }), "load_npz: " + absent.path() + ": the file is missing");
  temp_path dir("dir");
  fs::create_directories(dir.path());
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(dir.path()); }), "is a directory");
  temp_path text("text.npz");
  write_file(text.path(), {'h', 'e', 'l', 'l', 'o'});
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(text.path()); }), "not a zip archive");
  temp_path single("single.npy");
  write_file(single.path(), npy("|u1", {5, 4, 3}, random_bytes(60, 1)));
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(single.path()); }), "is a single .npy array, not an .npz archive");
  const bytes empty;
  EXPECT_CONTAINS(error_of([&] { troupe::detail::load_npz_bytes(std::as_bytes(std::span(empty)), "empty"); }),
                  "load_npz: empty: is empty: not a zip archive");
  temp_path empty_file("empty.npz");
  write_file(empty_file.path(), {});
  EXPECT_CONTAINS(error_of([&] { troupe::load_npz(empty_file.path()); }), "is empty: not a zip archive");
  // A cut archive: every prefix is refused, none crashes.
  temp_path whole("whole.npz");
  write_zip(whole.path(), valid_entries(ZIP_CM_DEFLATE));
  const bytes raw = read_file(whole.path());
  for (std::size_t n = 0; n < raw.size(); n += 7) {
    const std::span<const std::uint8_t> part(raw.data(), n);
    EXPECT_NE(error_of([&] { troupe::detail::load_npz_bytes(std::as_bytes(part), "cut"); }), "(no std::runtime_error)") << n;
  }
}

TEST(NpzArray, ReadsOneArrayHeldInMemory) {
  const bytes raw = npy("<u2", {3}, encode<std::uint16_t>({4, 0, 65535}));
  const tensor c = troupe::detail::read_npy_bytes(std::as_bytes(std::span(raw)), troupe::detail::npy_role::clients, "c");
  EXPECT_EQ(c.type(), dtype::u32);
  EXPECT_EQ(c.data<std::uint32_t>()[2], 65535u);
  EXPECT_CONTAINS(error_of([&] {
                    troupe::detail::read_npy_bytes(std::as_bytes(std::span(raw)), troupe::detail::npy_role::labels, "l");
                  }),
                  "l: label 65535 at index 2");
}

}  // namespace
