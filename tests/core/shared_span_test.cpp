// shared_span and the writer's splices: a long run is written from its owner's memory, not
// copied; the pieces written in order are the same bytes as the copying encoding; a decoded span
// points into the reader's buffer when the reader knows its owner, and is a copy otherwise; and
// hostile bytes are refused.

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/core/shared_span.hpp"

namespace {

using troupe::byte_writer;
using troupe::encoded_pieces;
using troupe::shared_span;

std::shared_ptr<std::vector<float>> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 5.0f);
  auto v = std::make_shared<std::vector<float>>(n);
  for (auto& x : *v) x = d(rng);
  return v;
}

std::vector<std::byte> joined(const encoded_pieces& p) {
  std::vector<std::byte> out;
  p.for_each_piece([&](std::span<const std::byte> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

// The plain reference of the format: count, zero padding to 4 bytes from the start, the floats.
std::vector<std::byte> reference_encoding(std::uint8_t prefix_bytes, std::span<const float> values) {
  std::vector<std::byte> out(prefix_bytes, std::byte{0x5a});
  byte_writer w;
  w.write_varint(values.size());
  auto count = w.take();
  out.insert(out.end(), count.begin(), count.end());
  while (out.size() % alignof(float) != 0) out.push_back(std::byte{0});
  const auto* b = reinterpret_cast<const std::byte*>(values.data());
  out.insert(out.end(), b, b + values.size_bytes());
  return out;
}

TEST(SharedSpan, ALongRunIsSplicedFromItsOwnMemoryAndThePiecesAreTheReferenceBytes) {
  for (std::uint8_t prefix : {0, 1, 2, 3, 5}) {
    auto data = random_floats(5000, prefix);
    shared_span<float> view({data->data() + 7, 4000}, data);
    byte_writer w;
    for (std::uint8_t i = 0; i < prefix; ++i) w.write_raw(std::uint8_t{0x5a});
    troupe::codec<shared_span<float>>::encode(w, view);
    auto pieces = w.take_pieces();
    ASSERT_EQ(pieces.splices.size(), 1u);
    EXPECT_EQ(pieces.splices[0].run.data(), reinterpret_cast<const std::byte*>(data->data() + 7));  // not copied
    EXPECT_EQ(pieces.splices[0].owner, std::static_pointer_cast<const void>(data));
    const auto expect = reference_encoding(prefix, std::span<const float>(data->data() + 7, 4000));
    EXPECT_EQ(pieces.size(), expect.size());
    EXPECT_EQ(joined(pieces), expect) << "prefix " << int(prefix);
    EXPECT_EQ(std::move(pieces).flatten(), expect);
  }
}

TEST(SharedSpan, AShortRunOrOneWithoutOwnerIsCopied) {
  auto data = random_floats(100, 1);
  byte_writer w;
  troupe::codec<shared_span<float>>::encode(w, shared_span<float>({data->data(), 100}, data));  // 400 bytes
  EXPECT_TRUE(w.take_pieces().splices.empty());
  auto big = random_floats(4096, 2);
  byte_writer w2;
  troupe::codec<shared_span<float>>::encode(w2, shared_span<float>({big->data(), big->size()}, nullptr));
  auto p = w2.take_pieces();
  EXPECT_TRUE(p.splices.empty());
  EXPECT_EQ(p.bytes, reference_encoding(0, *big));
}

TEST(SharedSpan, TakeAndBufferCopyTheSplicedRunsIn) {
  auto data = random_floats(3000, 3);
  auto value = std::make_tuple(std::uint64_t{42}, shared_span<float>({data->data(), 3000}, data), std::string("after"));
  const auto pieces = troupe::encode_pieces(value);
  EXPECT_EQ(pieces.splices.size(), 1u);
  const auto flat = troupe::encode(value);
  EXPECT_EQ(joined(pieces), flat);
  byte_writer w;
  troupe::codec<decltype(value)>::encode(w, value);
  EXPECT_EQ(w.buffer(), flat);
  EXPECT_EQ(w.size(), flat.size());
}

TEST(SharedSpan, DecodesAsAViewOfTheOwnedBufferAndAsACopyWithoutOwner) {
  auto data = random_floats(2000, 4);
  auto value = std::make_tuple(std::uint8_t{1}, shared_span<float>({data->data(), 2000}, data));
  auto buffer = std::make_shared<std::vector<std::byte>>(troupe::encode(value));
  auto viewed = troupe::decode<decltype(value)>(*buffer, buffer);
  const auto& got = std::get<1>(viewed);
  ASSERT_EQ(got.size(), 2000u);
  const auto* begin = buffer->data();
  EXPECT_GE(reinterpret_cast<const std::byte*>(got.data()), begin);
  EXPECT_LT(reinterpret_cast<const std::byte*>(got.data()), begin + buffer->size());  // points into the frame
  EXPECT_EQ(got.owner(), std::static_pointer_cast<const void>(buffer));
  EXPECT_EQ(std::memcmp(got.data(), data->data(), 2000 * sizeof(float)), 0);

  auto copied = troupe::decode<decltype(value)>(*buffer);
  const auto& c = std::get<1>(copied);
  EXPECT_TRUE(reinterpret_cast<const std::byte*>(c.data()) < begin ||
              reinterpret_cast<const std::byte*>(c.data()) >= begin + buffer->size());
  EXPECT_EQ(std::memcmp(c.data(), data->data(), 2000 * sizeof(float)), 0);
  buffer.reset();
  EXPECT_EQ(std::memcmp(got.data(), data->data(), 2000 * sizeof(float)), 0);  // the view keeps it alive
}

TEST(SharedSpan, AViewOfAnUnalignedBufferIsACopy) {
  auto data = random_floats(1500, 5);
  auto encoded = troupe::encode(shared_span<float>({data->data(), 1500}, data));
  // The same bytes one byte into a buffer: the floats are no longer 4-byte aligned.
  auto shifted = std::make_shared<std::vector<std::byte>>(encoded.size() + 1);
  std::memcpy(shifted->data() + 1, encoded.data(), encoded.size());
  auto got = troupe::decode<shared_span<float>>(std::span<const std::byte>(*shifted).subspan(1), shifted);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(got.data()) % alignof(float), 0u);
  EXPECT_EQ(std::memcmp(got.data(), data->data(), 1500 * sizeof(float)), 0);
}

TEST(SharedSpan, HostileBytesAreADecodeError) {
  auto expect_decode_error = [](std::vector<std::byte> b, const char* what) {
    auto owner = std::make_shared<std::vector<std::byte>>(std::move(b));
    try {
      (void)troupe::decode<std::tuple<std::uint8_t, shared_span<float>>>(*owner, owner);
      ADD_FAILURE() << what << ": decoded";
    } catch (const troupe::error& e) {
      EXPECT_EQ(e.code_value(), troupe::errc::decode_error) << what;
    }
  };
  auto good = troupe::encode(std::make_tuple(std::uint8_t{7}, shared_span<float>::copy_of(std::vector<float>(8, 1.5f))));
  ASSERT_EQ(good.size(), 1 + 1 + 2 + 32u);  // byte, count, padding to 4, floats
  auto truncated = good;
  truncated.pop_back();
  expect_decode_error(truncated, "truncated");
  auto padded = good;
  padded[2] = std::byte{1};
  expect_decode_error(padded, "non-zero padding");
  auto huge = troupe::encode(std::uint8_t{7});
  for (int i = 0; i < 9; ++i) huge.push_back(std::byte{0xff});
  huge.push_back(std::byte{0x01});
  expect_decode_error(huge, "a count of 2^64-1 floats");
}

TEST(SharedSpan, CopyOfOwnsItsValues) {
  std::vector<float> v{1.0f, 2.0f, 3.0f};
  auto s = shared_span<float>::copy_of(v);
  v[0] = 9.0f;
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_NE(s.data(), v.data());
  EXPECT_TRUE(shared_span<float>().empty());
}

}  // namespace
