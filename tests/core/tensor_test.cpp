#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include <troupe/core/device.hpp>
#include <troupe/core/tensor.hpp>

namespace {

using troupe::device;
using troupe::dtype;
using troupe::tensor;

TEST(Tensor, HasItsShapeDtypeAndSize) {
  auto t = tensor::empty({4, 3, 2}, dtype::f32);
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_THROW(t.dim(3), std::out_of_range);
  EXPECT_EQ(t.str(), "f32[4, 3, 2] on cpu");
  EXPECT_EQ(troupe::size_of(dtype::bf16), 2u);
  EXPECT_EQ(troupe::size_of(dtype::i64), 8u);
  EXPECT_EQ(troupe::size_of(dtype::u32), 4u);
  EXPECT_EQ(tensor::from<std::uint32_t>({7, 4294967295u}, {2}).str(), "u32[2] on cpu");
  EXPECT_THROW(tensor::empty({2, -1}), std::invalid_argument);
}

TEST(Tensor, HostBuffersAre64ByteAligned) {
  for (std::int64_t n : {1, 3, 17, 1000}) {
    auto t = tensor::empty({n}, dtype::u8);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.bytes()) % 64, 0u) << n;
  }
}

TEST(Tensor, ZerosAreZeroAndFromCopiesValues) {
  auto z = tensor::zeros({3, 5});
  for (float v : z.data<float>()) EXPECT_EQ(v, 0.0f);
  auto t = tensor::from<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.type(), dtype::i32);
  EXPECT_EQ(t.data<std::int32_t>()[4], 5);
  EXPECT_THROW((tensor::from<float>({1.0f, 2.0f}, {3})), std::invalid_argument);
}

TEST(Tensor, TypedAccessChecksTheElementType) {
  auto t = tensor::empty({2}, dtype::f32);
  EXPECT_THROW(t.data<std::int32_t>(), std::invalid_argument);
  auto h = tensor::empty({2}, dtype::bf16);
  EXPECT_NO_THROW(h.data<std::uint16_t>());
}

TEST(Tensor, CopiesShareTheBufferAndCloneDoesNot) {
  auto a = tensor::from<float>({1, 2, 3}, {3});
  auto b = a;
  b.data<float>()[0] = 9;
  EXPECT_EQ(a.data<float>()[0], 9);
  EXPECT_EQ(a.use_count(), 2);
  auto c = a.clone();
  c.data<float>()[1] = 7;
  EXPECT_EQ(a.data<float>()[1], 2);
}

TEST(Tensor, SlicesAreViewsOfConsecutiveRows) {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i);
  auto t = tensor::from<float>(v, {6, 2});
  auto s = t.slice(2, 4);
  EXPECT_EQ(s.shape(), (tensor::shape_type{2, 2}));
  EXPECT_EQ(s.data<float>()[0], 4.0f);
  s.data<float>()[0] = -1;
  EXPECT_EQ(t.data<float>()[4], -1.0f);
  EXPECT_THROW(t.slice(5, 7), std::invalid_argument);
  EXPECT_THROW(t.slice(3, 2), std::invalid_argument);
}

TEST(Tensor, SplitsIntoMicrobatchesOrSaysWhyNot) {
  auto t = tensor::zeros({12, 4});
  auto parts = t.split(3);
  ASSERT_EQ(parts.size(), 3u);
  for (auto& p : parts) EXPECT_EQ(p.dim(0), 4);
  EXPECT_EQ(parts[2].bytes(), t.bytes() + 8 * 4 * sizeof(float));
  try {
    tensor::zeros({10, 4}).split(3);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a batch of 10 rows does not split into 3"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("1, 2, 5, 10"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ReshapeKeepsElementsAndInfersOneDimension) {
  auto t = tensor::zeros({4, 6});
  EXPECT_EQ(t.reshape({-1, 3}).shape(), (tensor::shape_type{8, 3}));
  EXPECT_EQ(t.reshape({24}).bytes(), t.bytes());
  EXPECT_THROW(t.reshape({5, 5}), std::invalid_argument);
  EXPECT_THROW(t.reshape({-1, -1}), std::invalid_argument);
  EXPECT_THROW(t.reshape({-1, 5}), std::invalid_argument);
  // Products that wrap around 2^64 to the element count are refused, not accepted.
  EXPECT_THROW(tensor::zeros({16}).reshape({4, (std::int64_t{1} << 62) + 4}), std::invalid_argument);
  EXPECT_THROW(tensor::zeros({0}).reshape({std::int64_t{1} << 32, std::int64_t{1} << 32}), std::invalid_argument);
}

TEST(Tensor, CodecRoundTripsEveryDtypeOnFreshData) {
  std::mt19937 rng(7);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::i32, dtype::i64, dtype::u8, dtype::u32}) {
    auto x = tensor::empty({3, 5, 2}, t);
    for (std::size_t i = 0; i < x.nbytes(); ++i) x.bytes()[i] = static_cast<std::byte>(rng());
    auto y = troupe::decode<tensor>(troupe::encode(x));
    EXPECT_EQ(y.type(), t);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(std::memcmp(x.bytes(), y.bytes(), x.nbytes()), 0);
  }
  auto view = tensor::from<float>({1, 2, 3, 4}, {4}).slice(1, 3);
  auto back = troupe::decode<tensor>(troupe::encode(view));
  EXPECT_EQ(back.data<float>()[0], 2.0f);
  EXPECT_EQ(back.numel(), 2);
}

// A shape whose element count is 0 but whose dimensions no tensor may have is a decode error
// like any other hostile header (not the tensor constructor's std::invalid_argument).
TEST(Tensor, CodecRejectsAnImpossibleShapeWithAZeroDimension) {
  troupe::byte_writer w;
  w.write_raw<std::uint8_t>(0);
  w.write_varint(2);
  w.write_varint(std::uint64_t{1} << 62);
  w.write_varint(0);
  try {
    (void)troupe::decode<tensor>(w.buffer());
    ADD_FAILURE() << "decoded";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::decode_error);
  }
}

TEST(Tensor, CodecRejectsHostileOrTruncatedInput) {
  auto bytes = troupe::encode(tensor::from<float>({1, 2, 3}, {3}));
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(troupe::decode<tensor>(std::span(bytes.data(), n)), troupe::error) << n;
  auto bad_type = bytes;
  bad_type[0] = std::byte{9};
  EXPECT_THROW(troupe::decode<tensor>(bad_type), troupe::error);
  // A shape announcing 2^40 elements with 12 bytes behind it.
  troupe::byte_writer w;
  w.write_raw<std::uint8_t>(0);
  w.write_varint(1);
  w.write_varint(std::uint64_t{1} << 40);
  w.write_bytes("abcdefghijkl", 12);
  EXPECT_THROW(troupe::decode<tensor>(w.buffer()), troupe::error);
  troupe::byte_writer deep;
  deep.write_raw<std::uint8_t>(0);
  deep.write_varint(9);
  EXPECT_THROW(troupe::decode<tensor>(deep.buffer()), troupe::error);
}

TEST(Tensor, DeviceTensorsNeedADevice) {
  if (troupe::cuda_device_count() == 0) {
    EXPECT_ANY_THROW(tensor::empty({4}, dtype::f32, device::cuda(0)));
    GTEST_SKIP() << "no CUDA device here: the round trip through device memory needs one";
  }
  auto x = tensor::from<float>({1, 2, 3, 4}, {4});
  auto d = x.to(device::cuda(0));
  EXPECT_EQ(d.where(), device::cuda(0));
  EXPECT_THROW(d.data<float>(), std::invalid_argument);
  auto back = d.to(device::cpu());
  EXPECT_EQ(back.data<float>()[3], 4.0f);
  auto z = tensor::zeros({1000}, dtype::f32, device::cuda(0)).to(device::cpu());
  for (float v : z.data<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Tensor, DeviceViewsCopyBothWaysAndFreedDeviceBlocksAreReused) {
  if (troupe::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  const device gpu = device::cuda(0);
  tensor x = tensor::empty({4, 3});
  for (int i = 0; i < 12; ++i) x.data<float>()[i] = static_cast<float>(i);
  // Rows [1, 3): a view 12 bytes into its buffer, to the device and back.
  const tensor back = x.slice(1, 3).to(gpu).to(device::cpu());
  ASSERT_EQ(back.shape(), (tensor::shape_type{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(3 + i));
  // Into a view of a device tensor: only its rows change.
  tensor whole = tensor::zeros({4, 3}, dtype::f32, gpu);
  tensor rows = whole.slice(2, 4);
  troupe::copy(x.slice(0, 2), rows);
  const tensor w = whole.to(device::cpu());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w.data<float>()[i], i < 6 ? 0.0f : static_cast<float>(i - 6)) << i;
  // A freed block comes back for the next request of its size; after the cache is released,
  // allocations still work (on the device that was current).
  const std::byte* freed = nullptr;
  {
    const tensor a = tensor::empty({1 << 18}, dtype::f32, gpu);
    freed = a.bytes();
  }
  {
    const tensor b = tensor::empty({1 << 18}, dtype::f32, gpu);
    EXPECT_EQ(b.bytes(), freed);
  }
  troupe::release_cached_device_memory();
  const tensor c = tensor::zeros({1 << 18}, dtype::f32, gpu).to(device::cpu());
  for (float v : c.data<float>()) ASSERT_EQ(v, 0.0f);
}

TEST(Tensor, AllFiniteFindsEveryNanAndInfinityAnywhere) {
  std::vector<float> f(37, 1.5f);
  std::vector<double> g(37, -2.0);
  EXPECT_TRUE(troupe::all_finite(f));
  EXPECT_TRUE(troupe::all_finite(g));
  EXPECT_TRUE(troupe::all_finite(std::span<const float>()));
  for (const std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{36}})
    for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity()}) {
      auto f2 = f;
      auto g2 = g;
      f2[at] = static_cast<float>(bad);
      g2[at] = bad;
      EXPECT_FALSE(troupe::all_finite(f2)) << at << " " << bad;
      EXPECT_FALSE(troupe::all_finite(g2)) << at << " " << bad;
    }
  EXPECT_TRUE(troupe::all_finite(std::vector<float>{std::numeric_limits<float>::max(), -0.0f,
                                                    std::numeric_limits<float>::denorm_min()}));
}

}  // namespace
