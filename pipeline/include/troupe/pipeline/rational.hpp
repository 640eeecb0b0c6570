#pragma once
/// @file
/// Exact time and fractions for schedules: sums never drift, closed forms compare with ==.

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::pipeline {

/// An exact fraction of 64-bit integers, always normalized (den > 0, gcd 1).
class rational {
public:
  constexpr rational() noexcept = default;
  rational(std::int64_t num, std::int64_t den = 1);
  /// Parses "2", "1.25" or "3/4"; throws std::invalid_argument otherwise.
  static rational parse(std::string_view text);

  std::int64_t num() const noexcept { return num_; }
  std::int64_t den() const noexcept { return den_; }
  double to_double() const noexcept { return static_cast<double>(num_) / static_cast<double>(den_); }
  std::string str() const;

  // Exact in 128 bits, then reduced; a result whose reduced terms do not fit in 64 bits throws
  // std::overflow_error (never a wrapped, wrong value).
  friend rational operator+(rational a, rational b) {
    return reduce(wide{a.num_} * b.den_ + wide{b.num_} * a.den_, wide{a.den_} * b.den_);
  }
  friend rational operator-(rational a, rational b) {
    return reduce(wide{a.num_} * b.den_ - wide{b.num_} * a.den_, wide{a.den_} * b.den_);
  }
  friend rational operator*(rational a, rational b) { return reduce(wide{a.num_} * b.num_, wide{a.den_} * b.den_); }
  friend rational operator/(rational a, rational b) { return reduce(wide{a.num_} * b.den_, wide{a.den_} * b.num_); }
  rational& operator+=(rational b) { return *this = *this + b; }
  friend bool operator==(rational a, rational b) noexcept { return a.num_ == b.num_ && a.den_ == b.den_; }
  friend std::strong_ordering operator<=>(rational a, rational b) noexcept {
    return static_cast<wide>(a.num_) * b.den_ <=> static_cast<wide>(b.num_) * a.den_;
  }

private:
  __extension__ using wide = __int128;  // products of 64-bit terms need 128 bits
  static rational reduce(wide num, wide den);

  std::int64_t num_ = 0;
  std::int64_t den_ = 1;
};

}  // namespace troupe::pipeline
