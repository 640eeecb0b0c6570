// Reading IDX files, plain and gzipped: their types, shapes and byte order, and the clear error
// for every truncated, corrupted, oversized or missing file.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "data_support.hpp"
#include "troupe/kernels/data.hpp"

namespace {

using namespace data_support;

void write_plain(const std::string& path, const bytes& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good()) << path;
}

bytes read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bytes big_endian(std::span<const std::uint32_t> words) {
  bytes out;
  for (std::uint32_t w : words)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(w >> shift));
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

}  // namespace
