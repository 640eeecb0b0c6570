#pragma once
// What the codec tests share: byte helpers, the decode_error and round-trip checks, seeded random
// values of every codec type, and two user types (an enum, a struct with its own codec).

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
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

namespace codec_support {

using troupe::byte_reader;
using troupe::byte_writer;
using troupe::errc;

inline constexpr std::uint32_t kSeed = 0x7c0dec5u;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

inline std::vector<std::byte> bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

inline std::vector<std::byte> varint(std::uint64_t v) {
  byte_writer w;
  w.write_varint(v);
  return w.take();
}

inline std::string hex(std::span<const std::byte> data) {
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

inline std::uint64_t draw64(std::mt19937& rng) {
  return (static_cast<std::uint64_t>(rng()) << 32) | static_cast<std::uint64_t>(rng());
}

inline std::size_t draw_size(std::mt19937& rng, std::size_t max) {
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

// ---------------------------------------------------------------------------------------------
// User types: an enum, and a struct with its own codec
// ---------------------------------------------------------------------------------------------

enum class color : std::uint8_t { red = 1, green = 2, blue = 200 };

struct point {
  std::int32_t x = 0;
  std::int32_t y = 0;
  std::string label;
  bool operator==(const point&) const = default;
};

}  // namespace codec_support

namespace troupe {

template <>
struct codec<codec_support::point> {
  static void encode(byte_writer& w, const codec_support::point& p) {
    codec<std::int32_t>::encode(w, p.x);
    codec<std::int32_t>::encode(w, p.y);
    codec<std::string>::encode(w, p.label);
  }
  static codec_support::point decode(byte_reader& r) {
    codec_support::point p;
    p.x = codec<std::int32_t>::decode(r);
    p.y = codec<std::int32_t>::decode(r);
    p.label = codec<std::string>::decode(r);
    return p;
  }
};

}  // namespace troupe

namespace codec_support {

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

}  // namespace codec_support
