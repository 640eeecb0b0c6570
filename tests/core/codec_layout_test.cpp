// The codec's wire format, byte for byte: little-endian scalars, LEB128 varints, and the length
// prefixes of strings and containers.

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/error.hpp>

#include "codec_support.hpp"

namespace {

using namespace codec_support;

enum class two_bytes : std::uint16_t { value = 0x0102 };

TEST(Codec, LaysOutScalarsLittleEndian) {
  EXPECT_EQ(troupe::encode(std::int32_t{1}), bytes({0x01, 0x00, 0x00, 0x00}));
  EXPECT_EQ(troupe::encode(std::int32_t{-2}), bytes({0xFE, 0xFF, 0xFF, 0xFF}));
  EXPECT_EQ(troupe::encode(std::uint16_t{0x1234}), bytes({0x34, 0x12}));
  EXPECT_EQ(troupe::encode(std::uint64_t{0x0102030405060708}),
            bytes({0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01}));
  EXPECT_EQ(troupe::encode(std::int8_t{-1}), bytes({0xFF}));
  EXPECT_EQ(troupe::encode(1.0f), bytes({0x00, 0x00, 0x80, 0x3F}));
  EXPECT_EQ(troupe::encode(-2.0), bytes({0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xC0}));
  EXPECT_EQ(troupe::encode(true), bytes({0x01}));
  EXPECT_EQ(troupe::encode(false), bytes({0x00}));
  EXPECT_EQ(troupe::encode(two_bytes::value), bytes({0x02, 0x01}));
  EXPECT_EQ(troupe::encode(troupe::errc::decode_error), bytes({0x04, 0x00, 0x00, 0x00}));
}

TEST(Codec, LaysOutVarintsAsLeb128) {
  const std::pair<std::uint64_t, std::vector<std::byte>> cases[] = {
      {0, bytes({0x00})},
      {1, bytes({0x01})},
      {127, bytes({0x7F})},
      {128, bytes({0x80, 0x01})},
      {300, bytes({0xAC, 0x02})},
      {16383, bytes({0xFF, 0x7F})},
      {16384, bytes({0x80, 0x80, 0x01})},
      {std::numeric_limits<std::uint64_t>::max(),
       bytes({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01})},
  };
  for (const auto& [value, expected] : cases) {
    EXPECT_EQ(varint(value), expected) << value;
    byte_reader r(expected);
    EXPECT_EQ(r.read_varint(), value) << hex(expected);
    EXPECT_EQ(r.remaining(), 0u);
  }
}

TEST(Codec, RoundTripsVarintsOfEveryWidth) {
  std::mt19937 rng(kSeed);
  for (int bits = 1; bits <= 64; ++bits) {
    for (int i = 0; i < 20; ++i) {
      std::uint64_t v = draw64(rng) >> (64 - bits);
      v |= std::uint64_t{1} << (bits - 1);  // exactly `bits` significant bits
      const auto encoded = varint(v);
      EXPECT_EQ(encoded.size(), static_cast<std::size_t>((bits + 6) / 7)) << v;
      byte_reader r(encoded);
      EXPECT_EQ(r.read_varint(), v);
      EXPECT_EQ(r.remaining(), 0u);
    }
  }
}

TEST(Codec, LaysOutStringsAndContainersWithVarintLengths) {
  using namespace std::string_literals;
  EXPECT_EQ(troupe::encode(std::string()), bytes({0x00}));
  EXPECT_EQ(troupe::encode("hi"s), bytes({0x02, 'h', 'i'}));
  EXPECT_EQ(troupe::encode("a\0b"s), bytes({0x03, 'a', 0x00, 'b'}));
  const auto long_string = troupe::encode(std::string(300, 'q'));
  ASSERT_EQ(long_string.size(), 302u);
  EXPECT_EQ(long_string[0], std::byte{0xAC});
  EXPECT_EQ(long_string[1], std::byte{0x02});
  const auto long_vector = troupe::encode(std::vector<std::uint8_t>(300, 9));
  ASSERT_EQ(long_vector.size(), 302u);
  EXPECT_EQ(long_vector[0], std::byte{0xAC});
  EXPECT_EQ(long_vector[1], std::byte{0x02});
  EXPECT_EQ(long_vector[301], std::byte{0x09});
  EXPECT_EQ(troupe::encode(std::vector<std::int16_t>{1, -1}), bytes({0x02, 0x01, 0x00, 0xFF, 0xFF}));
  EXPECT_EQ(troupe::encode(std::vector<bool>{true, false, true}), bytes({0x03, 0x01, 0x00, 0x01}));
  EXPECT_EQ(troupe::encode(std::vector<std::string>{"a", ""}), bytes({0x02, 0x01, 'a', 0x00}));
  EXPECT_EQ(troupe::encode(std::vector<std::vector<std::uint8_t>>{{5}, {}}),
            bytes({0x02, 0x01, 0x05, 0x00}));
  EXPECT_EQ(troupe::encode(std::array<std::uint8_t, 3>{1, 2, 3}), bytes({0x01, 0x02, 0x03}));
  EXPECT_EQ(troupe::encode(std::optional<std::int32_t>{}), bytes({0x00}));
  EXPECT_EQ(troupe::encode(std::optional<std::int32_t>{1}), bytes({0x01, 0x01, 0x00, 0x00, 0x00}));
  EXPECT_EQ(troupe::encode(std::pair<std::uint8_t, std::int16_t>{7, 0x0102}),
            bytes({0x07, 0x02, 0x01}));
  EXPECT_EQ(troupe::encode(std::tuple<std::uint8_t, std::string, bool>{1, "z", true}),
            bytes({0x01, 0x01, 'z', 0x01}));
}

TEST(Codec, DecodesFieldsInWireOrder) {
  EXPECT_EQ((troupe::decode<std::tuple<std::uint8_t, std::uint8_t, std::uint8_t>>(
                bytes({1, 2, 3}))),
            std::make_tuple(std::uint8_t{1}, std::uint8_t{2}, std::uint8_t{3}));
  EXPECT_EQ((troupe::decode<std::array<std::uint8_t, 3>>(bytes({4, 5, 6}))),
            (std::array<std::uint8_t, 3>{4, 5, 6}));
  EXPECT_EQ((troupe::decode<std::pair<std::uint8_t, std::uint16_t>>(bytes({7, 8, 9}))),
            (std::pair<std::uint8_t, std::uint16_t>{7, 0x0908}));
}

}  // namespace
