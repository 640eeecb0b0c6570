// The codec's round trips: every arithmetic type, enum, string and standard container, and a user
// type with its own codec, on fixed and seeded random values; and which types are serializable.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/error.hpp>

#include "codec_support.hpp"

namespace {

using namespace codec_support;

template <class T>
void expect_random_round_trips(std::mt19937& rng, int count = 100) {
  for (int i = 0; i < count; ++i) {
    const T value = random_of<T>::make(rng);
    EXPECT_TRUE(round_trips(value)) << "value #" << i << " (seed " << kSeed << ")";
  }
}

template <class... Ts>
struct type_list {};

template <class... Ts, class F>
void for_each_type(type_list<Ts...>, F&& f) {
  (f(std::type_identity<Ts>{}), ...);
}

using arithmetic_types =
    type_list<bool, char, signed char, unsigned char, wchar_t, char8_t, char16_t, char32_t, short,
              unsigned short, int, unsigned, long, unsigned long, long long, unsigned long long,
              float, double, long double>;

// ---------------------------------------------------------------------------------------------
// Types used by the tests
// ---------------------------------------------------------------------------------------------

enum class wide : std::int64_t { low = std::numeric_limits<std::int64_t>::min(), high = 1 };
enum small_signed : short { minus = -5, plus = 5 };
enum legacy { first, second, third };

struct no_codec {};
struct decode_returns_other {};
struct encode_only {};

}  // namespace

namespace troupe {

template <>
struct codec<decode_returns_other> {
  static void encode(byte_writer&, const decode_returns_other&) {}
  static int decode(byte_reader&) { return 0; }
};

template <>
struct codec<encode_only> {
  static void encode(byte_writer&, const encode_only&) {}
};

}  // namespace troupe

namespace {

// ---------------------------------------------------------------------------------------------
// The serializable concept
// ---------------------------------------------------------------------------------------------

using troupe::serializable;

static_assert(serializable<bool>);
static_assert(serializable<char>);
static_assert(serializable<std::uint8_t>);
static_assert(serializable<std::int64_t>);
static_assert(serializable<double>);
static_assert(serializable<long double>);
static_assert(serializable<color>);
static_assert(serializable<legacy>);
static_assert(serializable<troupe::errc>);
static_assert(serializable<std::string>);
static_assert(serializable<std::vector<int>>);
static_assert(serializable<std::vector<bool>>);
static_assert(serializable<std::vector<std::string>>);
static_assert(serializable<std::vector<std::vector<int>>>);
static_assert(serializable<std::array<int, 3>>);
static_assert(serializable<std::array<std::string, 0>>);
static_assert(serializable<std::optional<std::string>>);
static_assert(serializable<std::pair<int, std::string>>);
static_assert(serializable<std::tuple<int, std::string, double>>);
static_assert(serializable<std::tuple<>>);
static_assert(serializable<std::vector<std::optional<std::pair<int, std::tuple<bool>>>>>);

static_assert(!serializable<no_codec>);
static_assert(!serializable<decode_returns_other>);
static_assert(!serializable<encode_only>);
static_assert(!serializable<int*>);
static_assert(!serializable<const char*>);
static_assert(!serializable<std::vector<no_codec>>);
static_assert(!serializable<std::vector<std::vector<no_codec>>>);
static_assert(!serializable<std::array<no_codec, 2>>);
static_assert(!serializable<std::optional<no_codec>>);
static_assert(!serializable<std::pair<int, no_codec>>);
static_assert(!serializable<std::pair<no_codec, int>>);
static_assert(!serializable<std::tuple<int, no_codec>>);
static_assert(!serializable<std::tuple<encode_only>>);

// A user specialization makes the type and the standard containers of it serializable.
static_assert(serializable<point>);
static_assert(serializable<std::vector<point>>);
static_assert(serializable<std::optional<point>>);
static_assert(serializable<std::tuple<point, std::array<point, 2>>>);

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

TEST(Codec, RoundTripsEveryArithmeticTypeOnRandomValues) {
  std::mt19937 rng(kSeed);
  for_each_type(arithmetic_types{}, [&]<class T>(std::type_identity<T>) {
    SCOPED_TRACE(typeid(T).name());
    bool saw_nonzero = false;
    for (int i = 0; i < 200; ++i) {
      const T value = random_of<T>::make(rng);
      saw_nonzero = saw_nonzero || value != T{};
      const auto encoded = troupe::encode(value);
      EXPECT_EQ(encoded.size(), (std::is_same_v<T, bool> ? std::size_t{1} : sizeof(T)));
      EXPECT_TRUE(round_trips(value)) << "value #" << i;
    }
    EXPECT_TRUE(saw_nonzero);
  });
}

TEST(Codec, RoundTripsArithmeticExtremes) {
  for_each_type(arithmetic_types{}, [&]<class T>(std::type_identity<T>) {
    SCOPED_TRACE(typeid(T).name());
    using limits = std::numeric_limits<T>;
    for (T v : {limits::min(), limits::max(), limits::lowest(), T{}, T(1)})
      EXPECT_TRUE(round_trips(v));
  });
}

TEST(Codec, RoundTripsFloatingPointSpecialValues) {
  for_each_type(type_list<float, double, long double>{}, [&]<class T>(std::type_identity<T>) {
    SCOPED_TRACE(typeid(T).name());
    using limits = std::numeric_limits<T>;
    for (T v : {limits::infinity(), -limits::infinity(), limits::denorm_min(), -limits::min(),
                limits::epsilon(), T(-0.0)}) {
      const T back = troupe::decode<T>(troupe::encode(v));
      EXPECT_EQ(back, v);
      EXPECT_EQ(std::signbit(back), std::signbit(v));
    }
    const T nan = troupe::decode<T>(troupe::encode(limits::quiet_NaN()));
    EXPECT_TRUE(std::isnan(nan));
  });
}

TEST(Codec, EncodesIntegersLittleEndian) {
  std::mt19937 rng(kSeed);
  for_each_type(type_list<std::int16_t, std::uint16_t, std::int32_t, std::uint32_t, std::int64_t,
                          std::uint64_t>{},
                [&]<class T>(std::type_identity<T>) {
                  SCOPED_TRACE(typeid(T).name());
                  for (int i = 0; i < 100; ++i) {
                    const T value = random_of<T>::make(rng);
                    const auto encoded = troupe::encode(value);
                    ASSERT_EQ(encoded.size(), sizeof(T));
                    const auto bits = static_cast<std::make_unsigned_t<T>>(value);
                    for (std::size_t b = 0; b < sizeof(T); ++b)
                      EXPECT_EQ(static_cast<unsigned>(encoded[b]),
                                static_cast<unsigned>((bits >> (8 * b)) & 0xffu))
                          << "byte " << b << " of " << hex(encoded);
                  }
                });
}

TEST(Codec, RoundTripsEnums) {
  std::mt19937 rng(kSeed);
  for (auto c : {color::red, color::green, color::blue}) EXPECT_TRUE(round_trips(c));
  for (auto w : {wide::low, wide::high}) EXPECT_TRUE(round_trips(w));
  for (auto s : {minus, plus}) EXPECT_TRUE(round_trips(s));
  for (auto l : {first, second, third}) EXPECT_TRUE(round_trips(l));
  for (auto e : {troupe::errc::ok, troupe::errc::decode_error, troupe::errc::name_taken})
    EXPECT_TRUE(round_trips(e));
  expect_random_round_trips<color>(rng);
  expect_random_round_trips<wide>(rng);
  expect_random_round_trips<small_signed>(rng);
  EXPECT_EQ(troupe::encode(wide::high).size(), 8u);
  EXPECT_EQ(troupe::encode(color::blue).size(), 1u);
}

TEST(Codec, RoundTripsStringsIncludingEmptyAndEmbeddedNul) {
  using namespace std::string_literals;
  EXPECT_TRUE(round_trips(std::string()));
  EXPECT_TRUE(round_trips("\0"s));
  EXPECT_TRUE(round_trips("a\0b\0\0c"s));
  EXPECT_TRUE(round_trips(std::string(300, '\0')));
  EXPECT_TRUE(round_trips(std::string(20000, 'x')));
  const auto nul = troupe::decode<std::string>(troupe::encode("a\0b"s));
  EXPECT_EQ(nul.size(), 3u);
  EXPECT_EQ(nul, "a\0b"s);
  std::mt19937 rng(kSeed);
  expect_random_round_trips<std::string>(rng, 300);
}

TEST(Codec, RoundTripsVectorsOfScalars) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::vector<int>{}));
  EXPECT_TRUE(round_trips(std::vector<bool>{}));
  EXPECT_TRUE(round_trips(std::vector<bool>{true, false, false, true, true}));
  std::vector<std::uint32_t> big(1000);
  for (auto& x : big) x = rng();
  EXPECT_TRUE(round_trips(big));
  expect_random_round_trips<std::vector<bool>>(rng);
  expect_random_round_trips<std::vector<char>>(rng);
  expect_random_round_trips<std::vector<std::uint8_t>>(rng);
  expect_random_round_trips<std::vector<std::int16_t>>(rng);
  expect_random_round_trips<std::vector<std::int32_t>>(rng);
  expect_random_round_trips<std::vector<std::uint64_t>>(rng);
  expect_random_round_trips<std::vector<float>>(rng);
  expect_random_round_trips<std::vector<double>>(rng);
  expect_random_round_trips<std::vector<long double>>(rng);
  expect_random_round_trips<std::vector<color>>(rng);
  expect_random_round_trips<std::vector<wide>>(rng);
}

TEST(Codec, RoundTripsVectorsOfStrings) {
  using namespace std::string_literals;
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::vector<std::string>{}));
  EXPECT_TRUE(round_trips(std::vector<std::string>{"", "", ""}));
  EXPECT_TRUE(round_trips(std::vector<std::string>{"x\0y"s, "", std::string(200, 'z')}));
  expect_random_round_trips<std::vector<std::string>>(rng);
}

TEST(Codec, RoundTripsNestedVectors) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::vector<std::vector<int>>{}));
  EXPECT_TRUE(round_trips(std::vector<std::vector<int>>{{}, {}, {}}));
  EXPECT_TRUE(round_trips(std::vector<std::vector<int>>{{1}, {}, {2, 3}}));
  expect_random_round_trips<std::vector<std::vector<std::int32_t>>>(rng);
  expect_random_round_trips<std::vector<std::vector<bool>>>(rng);
  expect_random_round_trips<std::vector<std::vector<std::string>>>(rng);
  expect_random_round_trips<std::vector<std::vector<std::vector<std::uint16_t>>>>(rng, 30);
}

TEST(Codec, RoundTripsArrays) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::array<int, 0>{}));
  EXPECT_TRUE(troupe::encode(std::array<int, 0>{}).empty());
  EXPECT_EQ(troupe::encode(std::array<std::int32_t, 3>{}).size(), 12u);  // no length prefix
  expect_random_round_trips<std::array<std::int32_t, 4>>(rng);
  expect_random_round_trips<std::array<double, 7>>(rng);
  expect_random_round_trips<std::array<bool, 5>>(rng);
  expect_random_round_trips<std::array<std::string, 3>>(rng);
  expect_random_round_trips<std::array<std::vector<std::int8_t>, 2>>(rng);
  expect_random_round_trips<std::array<std::array<std::uint16_t, 2>, 3>>(rng);
}

TEST(Codec, RoundTripsOptionals) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::optional<int>{}));
  EXPECT_TRUE(round_trips(std::optional<int>{0}));
  EXPECT_TRUE(round_trips(std::optional<std::string>{""}));
  EXPECT_TRUE(round_trips(std::optional<std::string>{}));
  EXPECT_TRUE(round_trips(std::optional<bool>{false}));
  EXPECT_TRUE(round_trips(std::optional<std::optional<int>>{std::optional<int>{}}));
  EXPECT_TRUE(round_trips(std::optional<std::optional<int>>{}));
  expect_random_round_trips<std::optional<std::int64_t>>(rng);
  expect_random_round_trips<std::optional<std::string>>(rng);
  expect_random_round_trips<std::optional<std::vector<double>>>(rng);
  expect_random_round_trips<std::vector<std::optional<std::string>>>(rng);
}

TEST(Codec, RoundTripsPairs) {
  std::mt19937 rng(kSeed);
  expect_random_round_trips<std::pair<int, std::string>>(rng);
  expect_random_round_trips<std::pair<std::string, std::vector<double>>>(rng);
  expect_random_round_trips<std::pair<bool, color>>(rng);
  expect_random_round_trips<std::vector<std::pair<std::uint16_t, std::string>>>(rng);
  expect_random_round_trips<std::pair<std::pair<int, int>, std::optional<std::int8_t>>>(rng);
}

TEST(Codec, RoundTripsTuples) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(std::tuple<>{}));
  EXPECT_TRUE(troupe::encode(std::tuple<>{}).empty());
  expect_random_round_trips<std::tuple<std::int32_t>>(rng);
  expect_random_round_trips<std::tuple<std::int32_t, std::string, double, bool>>(rng);
  expect_random_round_trips<std::tuple<std::vector<std::string>, std::optional<std::int16_t>,
                                       std::array<std::uint8_t, 3>, std::pair<color, float>>>(rng);
  expect_random_round_trips<std::vector<std::tuple<bool, std::string, std::int64_t>>>(rng);
  expect_random_round_trips<std::tuple<std::tuple<int, std::tuple<std::string>>, char>>(rng);
}

TEST(Codec, ReadsSeveralValuesInSequenceFromOneBuffer) {
  using namespace std::string_literals;
  byte_writer w;
  troupe::codec<std::int16_t>::encode(w, -7);
  troupe::codec<std::string>::encode(w, "mid\0dle"s);
  troupe::codec<std::vector<double>>::encode(w, {1.5, -2.25});
  troupe::codec<bool>::encode(w, true);
  const auto buf = w.take();
  byte_reader r(buf);
  EXPECT_EQ(troupe::codec<std::int16_t>::decode(r), -7);
  EXPECT_EQ(troupe::codec<std::string>::decode(r), "mid\0dle"s);
  EXPECT_EQ(troupe::codec<std::vector<double>>::decode(r), (std::vector<double>{1.5, -2.25}));
  EXPECT_TRUE(troupe::codec<bool>::decode(r));
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(Codec, RoundTripsAUserTypeWithItsOwnCodec) {
  std::mt19937 rng(kSeed);
  EXPECT_TRUE(round_trips(point{-3, 4, std::string("origin\0ish", 10)}));
  EXPECT_EQ(troupe::encode(point{1, 2, "a"}), bytes({1, 0, 0, 0, 2, 0, 0, 0, 1, 'a'}));
  expect_random_round_trips<point>(rng);
  expect_random_round_trips<std::vector<point>>(rng);
  expect_random_round_trips<std::optional<point>>(rng);
  expect_random_round_trips<std::tuple<point, std::array<point, 2>>>(rng);
  expect_every_truncation_rejected(point{7, -8, "label"});
}

}  // namespace
