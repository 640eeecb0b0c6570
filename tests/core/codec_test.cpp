#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <troupe/core/codec.hpp>
#include <troupe/core/error.hpp>
#include <troupe/core/tensor.hpp>

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

using troupe::byte_reader;
using troupe::byte_writer;
using troupe::errc;

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

constexpr std::uint32_t kSeed = 0x7c0dec5u;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

std::vector<std::byte> bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

std::vector<std::byte> concat(std::vector<std::byte> a, const std::vector<std::byte>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::byte> varint(std::uint64_t v) {
  byte_writer w;
  w.write_varint(v);
  return w.take();
}

std::string hex(std::span<const std::byte> data) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%02X", static_cast<unsigned>(data[i]));
    if (i != 0) out += ' ';
    out += buf;
    if (i == 64 && data.size() > 66) {
      out += " ...";
      break;
    }
  }
  return out;
}

/// Success when `f` throws troupe::error with code decode_error; failure for any other outcome.
template <class F>
::testing::AssertionResult throws_decode_error(F&& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    if (e.code_value() == errc::decode_error) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "threw troupe::error with code " << static_cast<int>(e.code_value()) << ": "
           << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "threw " << typeid(e).name() << " instead of troupe::error: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is not a std::exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

template <class T>
::testing::AssertionResult round_trips(const T& value) {
  auto encoded = troupe::encode(value);
  try {
    T back = troupe::decode<T>(encoded);
    if (back == value) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << typeid(T).name() << " decoded to another value; encoding: " << hex(encoded);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << typeid(T).name() << " failed to decode its own "
                                         << "encoding (" << hex(encoded) << "): " << e.what();
  }
}

/// Every strict prefix of the encoding of `value` must be refused with decode_error.
template <class T>
void expect_every_truncation_rejected(const T& value) {
  const auto encoded = troupe::encode(value);
  ASSERT_FALSE(encoded.empty()) << typeid(T).name();
  for (std::size_t n = 0; n < encoded.size(); ++n) {
    // A copy of exactly n bytes, so that a sanitizer would see any read past the prefix.
    const std::vector<std::byte> prefix(encoded.begin(),
                                        encoded.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_TRUE(throws_decode_error([&] { (void)troupe::decode<T>(prefix); }))
        << typeid(T).name() << ": prefix of " << n << " of " << encoded.size()
        << " bytes: " << hex(prefix);
  }
}

// ---------------------------------------------------------------------------------------------
// Random values from a seeded generator
// ---------------------------------------------------------------------------------------------

std::uint64_t draw64(std::mt19937& rng) {
  return (static_cast<std::uint64_t>(rng()) << 32) | static_cast<std::uint64_t>(rng());
}

std::size_t draw_size(std::mt19937& rng, std::size_t max) {
  return std::uniform_int_distribution<std::size_t>(0, max)(rng);
}

template <class T>
struct random_of {
  static T make(std::mt19937& rng) {
    if constexpr (std::is_same_v<T, bool>) {
      return (rng() & 1u) != 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      std::uniform_real_distribution<double> d(-1e9, 1e9);
      return static_cast<T>(d(rng));
    } else if constexpr (std::is_enum_v<T>) {
      return static_cast<T>(random_of<std::underlying_type_t<T>>::make(rng));
    } else {
      static_assert(std::is_integral_v<T>);
      return static_cast<T>(draw64(rng));  // every bit pattern, sign included
    }
  }
};

template <>
struct random_of<std::string> {
  static std::string make(std::mt19937& rng) {
    std::string s(draw_size(rng, 40), '\0');
    for (auto& c : s) c = static_cast<char>(rng());  // NUL bytes and high bytes included
    return s;
  }
};

template <class T>
struct random_of<std::vector<T>> {
  static std::vector<T> make(std::mt19937& rng) {
    std::vector<T> v;
    const auto n = draw_size(rng, 8);
    for (std::size_t i = 0; i < n; ++i) v.push_back(random_of<T>::make(rng));
    return v;
  }
};

template <class T, std::size_t N>
struct random_of<std::array<T, N>> {
  static std::array<T, N> make(std::mt19937& rng) {
    std::array<T, N> a{};
    for (auto& x : a) x = random_of<T>::make(rng);
    return a;
  }
};

template <class T>
struct random_of<std::optional<T>> {
  static std::optional<T> make(std::mt19937& rng) {
    if (rng() % 4 == 0) return std::nullopt;
    return random_of<T>::make(rng);
  }
};

template <class A, class B>
struct random_of<std::pair<A, B>> {
  static std::pair<A, B> make(std::mt19937& rng) {
    A a = random_of<A>::make(rng);
    B b = random_of<B>::make(rng);
    return {std::move(a), std::move(b)};
  }
};

template <class... Ts>
struct random_of<std::tuple<Ts...>> {
  static std::tuple<Ts...> make(std::mt19937& rng) {
    return std::tuple<Ts...>{random_of<Ts>::make(rng)...};  // braced: left to right
  }
};

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

enum class color : std::uint8_t { red = 1, green = 2, blue = 200 };
enum class wide : std::int64_t { low = std::numeric_limits<std::int64_t>::min(), high = 1 };
enum small_signed : short { minus = -5, plus = 5 };
enum legacy { first, second, third };
enum class two_bytes : std::uint16_t { value = 0x0102 };
enum class bounded : std::int16_t { a, b, c };

struct no_codec {};
struct decode_returns_other {};
struct encode_only {};

struct point {
  std::int32_t x = 0;
  std::int32_t y = 0;
  std::string label;
  bool operator==(const point&) const = default;
};

}  // namespace

namespace troupe {

template <>
struct enum_bounds<bounded> {
  static constexpr bounded last = bounded::c;
};

template <>
struct codec<decode_returns_other> {
  static void encode(byte_writer&, const decode_returns_other&) {}
  static int decode(byte_reader&) { return 0; }
};

template <>
struct codec<encode_only> {
  static void encode(byte_writer&, const encode_only&) {}
};

template <>
struct codec<point> {
  static void encode(byte_writer& w, const point& p) {
    codec<std::int32_t>::encode(w, p.x);
    codec<std::int32_t>::encode(w, p.y);
    codec<std::string>::encode(w, p.label);
  }
  static point decode(byte_reader& r) {
    point p;
    p.x = codec<std::int32_t>::decode(r);
    p.y = codec<std::int32_t>::decode(r);
    p.label = codec<std::string>::decode(r);
    return p;
  }
};

}  // namespace troupe

namespace {

template <>
struct random_of<point> {
  static point make(std::mt19937& rng) {
    point p;
    p.x = random_of<std::int32_t>::make(rng);
    p.y = random_of<std::int32_t>::make(rng);
    p.label = random_of<std::string>::make(rng);
    return p;
  }
};

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

// ---------------------------------------------------------------------------------------------
// Byte layout
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Decoding failures
// ---------------------------------------------------------------------------------------------

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
