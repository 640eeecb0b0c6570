// What the codec refuses to decode, always as decode_error: truncations, huge length prefixes
// (before allocating for them), bad varints, bools and enums, and trailing bytes.

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/error.hpp>
#include <troupe/core/tensor.hpp>

#include "codec_support.hpp"

// ---------------------------------------------------------------------------------------------
// Allocation probe: replaces the global operator new of this test executable so that a test can
// measure the largest single allocation made inside a scope (hostile length prefixes must be
// refused before anything is allocated for them).
// ---------------------------------------------------------------------------------------------

namespace {
std::atomic<bool> probe_active{false};
std::atomic<std::size_t> probe_largest{0};
}  // namespace

void* operator new(std::size_t n) {
  if (probe_active.load(std::memory_order_relaxed)) {
    std::size_t seen = probe_largest.load(std::memory_order_relaxed);
    while (n > seen && !probe_largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Not inlined: the compiler would otherwise pair its built-in operator new with this free().
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace codec_support;

/// Records the largest allocation made while it lives.
class allocation_probe {
public:
  allocation_probe() {
    probe_largest.store(0, std::memory_order_relaxed);
    probe_active.store(true, std::memory_order_relaxed);
  }
  ~allocation_probe() { probe_active.store(false, std::memory_order_relaxed); }
  allocation_probe(const allocation_probe&) = delete;
  allocation_probe& operator=(const allocation_probe&) = delete;
  std::size_t largest() const { return probe_largest.load(std::memory_order_relaxed); }
};

std::vector<std::byte> concat(std::vector<std::byte> a, const std::vector<std::byte>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

enum class bounded : std::int16_t { a, b, c };

}  // namespace

namespace troupe {

template <>
struct enum_bounds<bounded> {
  static constexpr bounded last = bounded::c;
};

}  // namespace troupe

namespace {

TEST(Codec, RejectsEveryTruncation) {
  using namespace std::string_literals;
  std::mt19937 rng(kSeed);
  expect_every_truncation_rejected(random_of<std::int32_t>::make(rng));
  expect_every_truncation_rejected(random_of<std::uint64_t>::make(rng));
  expect_every_truncation_rejected(random_of<double>::make(rng));
  expect_every_truncation_rejected(random_of<long double>::make(rng));
  expect_every_truncation_rejected(true);
  expect_every_truncation_rejected(color::blue);
  expect_every_truncation_rejected(std::string());
  expect_every_truncation_rejected("hello\0world"s);
  expect_every_truncation_rejected(std::string(300, 'w'));  // two-byte length prefix
  expect_every_truncation_rejected(std::vector<std::int32_t>{1, -2, 3, -4, 5});
  expect_every_truncation_rejected(std::vector<std::uint64_t>(200, 0x0123456789abcdefu));
  expect_every_truncation_rejected(std::vector<bool>{true, false, true});
  expect_every_truncation_rejected(std::vector<std::string>{"ab", "", "c\0d"s});
  expect_every_truncation_rejected(std::vector<std::vector<std::int16_t>>{{1, 2}, {}, {3}});
  expect_every_truncation_rejected(std::array<std::int32_t, 3>{7, 8, 9});
  expect_every_truncation_rejected(std::array<std::string, 2>{"x", "yz"});
  expect_every_truncation_rejected(std::optional<std::string>{"opt"});
  expect_every_truncation_rejected(std::optional<std::vector<int>>{std::vector<int>{1, 2}});
  expect_every_truncation_rejected(std::pair<std::string, std::int64_t>{"pair", -1});
  expect_every_truncation_rejected(
      std::tuple<std::uint8_t, std::string, std::vector<double>, std::optional<bool>>{
          9, "tuple", {0.5, 1.5}, true});
  for (int i = 0; i < 20; ++i) {
    expect_every_truncation_rejected(
        random_of<std::tuple<std::vector<std::string>, std::optional<std::int32_t>,
                             std::pair<std::vector<std::vector<std::uint8_t>>, float>>>::make(rng));
  }
}

TEST(Codec, RejectsHugeLengthPrefixesWithoutAllocating) {
  const std::uint64_t lengths[] = {
      std::uint64_t{1} << 60,
      std::uint64_t{1} << 40,
      std::uint64_t{1} << 26,  // small enough to be allocated, if the decoder trusted it
      std::numeric_limits<std::uint64_t>::max(),
      17,  // one more than the payload holds bytes
  };
  const auto payload = std::vector<std::byte>(16, std::byte{0x01});
  for (std::uint64_t n : lengths) {
    SCOPED_TRACE(n);
    const auto input = concat(varint(n), payload);
    std::size_t largest = 0;
    {
      allocation_probe probe;
      EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::vector<int>>(input); }));
      EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::vector<double>>(input); }));
      EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::vector<bool>>(input); }));
      EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::string>(input); }));
      EXPECT_TRUE(
          throws_decode_error([&] { (void)troupe::decode<std::vector<std::string>>(input); }));
      EXPECT_TRUE(throws_decode_error(
          [&] { (void)troupe::decode<std::vector<std::vector<int>>>(input); }));
      EXPECT_TRUE(throws_decode_error(
          [&] { (void)troupe::decode<std::vector<std::pair<int, int>>>(input); }));
      largest = probe.largest();
    }
    // Error messages allocate a little; a trusted length would allocate at least n bytes.
    EXPECT_LT(largest, 4096u);
  }
}

TEST(Codec, RejectsOverlongVarint) {
  // 11 bytes: ten with the continuation bit, then a terminator.
  const auto eleven = bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00});
  EXPECT_TRUE(throws_decode_error([&] {
    byte_reader r(eleven);
    (void)r.read_varint();
  }));
  const auto all_ones = std::vector<std::byte>(11, std::byte{0xFF});
  EXPECT_TRUE(throws_decode_error([&] {
    byte_reader r(all_ones);
    (void)r.read_varint();
  }));
  EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::string>(eleven); }));
  EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::vector<int>>(eleven); }));
  // A long (non-minimal) but in-range varint of ten bytes is still a varint.
  const auto ten_zero = bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00});
  byte_reader r(ten_zero);
  EXPECT_EQ(r.read_varint(), 0u);
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(Codec, RejectsVarintBeyond64Bits) {
  // The tenth byte carries bit 63 only; anything above it does not fit in 64 bits and must not
  // wrap around to a small value.
  for (int last : {0x02, 0x40, 0x7F}) {
    SCOPED_TRACE(last);
    const auto input = bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, last});
    EXPECT_TRUE(throws_decode_error([&] {
      byte_reader r(input);
      (void)r.read_varint();
    }));
    EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::vector<int>>(input); }));
  }
  const auto top_bit = bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01});
  byte_reader r(top_bit);
  EXPECT_EQ(r.read_varint(), std::uint64_t{1} << 63);
}

TEST(Codec, RejectsBoolByteOtherThanZeroOrOne) {
  EXPECT_FALSE(troupe::decode<bool>(bytes({0x00})));
  EXPECT_TRUE(troupe::decode<bool>(bytes({0x01})));
  for (int b : {0x02, 0x10, 0x80, 0xFF}) {
    SCOPED_TRACE(b);
    EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<bool>(bytes({b})); }));
    EXPECT_TRUE(throws_decode_error(
        [&] { (void)troupe::decode<std::optional<std::int8_t>>(bytes({b, 0x05})); }));
    EXPECT_TRUE(throws_decode_error(
        [&] { (void)troupe::decode<std::vector<bool>>(bytes({0x03, 0x01, b, 0x00})); }));
    EXPECT_TRUE(throws_decode_error(
        [&] { (void)troupe::decode<std::tuple<int, bool>>(bytes({1, 0, 0, 0, b})); }));
  }
}

TEST(Codec, RejectsEnumValuesPastTheLastItsTypeNames) {
  for (auto v : {bounded::a, bounded::b, bounded::c}) EXPECT_TRUE(round_trips(v));
  for (int raw : {3, 1000, -1}) {
    SCOPED_TRACE(raw);
    const auto r = static_cast<std::int16_t>(raw);
    EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<bounded>(troupe::encode(r)); }));
  }
  EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<troupe::dtype>(bytes({200})); }));
  EXPECT_EQ(troupe::decode<troupe::dtype>(bytes({5})), troupe::dtype::u8);
  // Without bounds an enum travels as its raw value (color's 7 is no enumerator).
  EXPECT_EQ(static_cast<int>(troupe::decode<color>(bytes({7}))), 7);
}

TEST(Codec, RejectsTrailingBytesAfterAValue) {
  using namespace std::string_literals;
  const auto extra = bytes({0x00});
  EXPECT_TRUE(throws_decode_error(
      [&] { (void)troupe::decode<std::int32_t>(concat(troupe::encode(std::int32_t{5}), extra)); }));
  EXPECT_TRUE(throws_decode_error(
      [&] { (void)troupe::decode<std::string>(concat(troupe::encode("ab"s), extra)); }));
  EXPECT_TRUE(throws_decode_error([&] {
    (void)troupe::decode<std::vector<int>>(concat(troupe::encode(std::vector<int>{1, 2}), extra));
  }));
  EXPECT_TRUE(throws_decode_error([&] {
    (void)troupe::decode<std::optional<int>>(concat(troupe::encode(std::optional<int>{}), extra));
  }));
  EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::tuple<>>(extra); }));
  EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<std::array<int, 0>>(extra); }));
  // The same bytes decode through a byte_reader, which leaves the trailing byte unread.
  const auto buf = concat(troupe::encode(std::int32_t{5}), extra);
  byte_reader r(buf);
  EXPECT_EQ(troupe::codec<std::int32_t>::decode(r), 5);
  EXPECT_EQ(r.remaining(), 1u);
}

TEST(Codec, ReportsDecodeErrorsAsSystemErrors) {
  try {
    (void)troupe::decode<std::int64_t>(bytes({1, 2, 3}));
    FAIL() << "a three-byte int64 decoded";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), troupe::errc::decode_error);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

}  // namespace
