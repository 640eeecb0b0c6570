// Multi-scalar multiplication: Pippenger's bucket method with signed digits, and its plain
// reference. Variable time: for public scalars and points (a verifier's).

#include <stdexcept>
#include <string>
#include <vector>

#include "r255_point.hpp"

namespace troupe::federated::r255 {

using namespace detail;

namespace {

/// The window width that minimises the additions of Pippenger's method for n points: each of
/// ceil(253 / c) + 1 windows adds every point into one of 2^(c-1) buckets, then sums the buckets
/// (two additions each).
int window_for(std::size_t n) {
  int best = 2;
  double best_cost = 0;
  for (int c = 2; c <= 16; ++c) {
    const double windows = (253 + c - 1) / c + 1;
    const double cost = windows * (static_cast<double>(n) + 2.0 * static_cast<double>(std::size_t{1} << (c - 1)));
    if (c == 2 || cost < best_cost) {
      best = c;
      best_cost = cost;
    }
  }
  return best;
}

/// The signed radix-2^c digits of s, each in [-2^(c-1), 2^(c-1)), `windows` of them (2 <= c <= 16:
/// they fit 16 bits, 34 MB for a million scalars).
void signed_digits(const scalar& s, int c, int windows, std::int16_t* out) {
  const bytes32 b = to_bytes(s);
  std::uint64_t k[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 32; ++i) k[i / 8] |= static_cast<std::uint64_t>(b[i]) << (8 * (i % 8));
  const std::int64_t radix = std::int64_t{1} << c;
  std::int64_t carry = 0;
  for (int w = 0; w < windows; ++w) {
    const int bit = w * c;
    std::uint64_t v = 0;
    if (bit < 256) {
      const int word = bit / 64, shift = bit % 64;
      v = k[word] >> shift;
      if (shift + c > 64 && word + 1 < 5) v |= k[word + 1] << (64 - shift);
      v &= static_cast<std::uint64_t>(radix - 1);
    }
    std::int64_t d = static_cast<std::int64_t>(v) + carry;
    carry = (d + radix / 2) >> c;  // 1 when d >= 2^(c-1)
    d -= carry * radix;
    out[w] = static_cast<std::int16_t>(d);
  }
}

}  // namespace

point msm(std::span<const scalar> s, std::span<const point> p) {
  if (s.size() != p.size())
    throw std::invalid_argument("r255::msm: " + std::to_string(s.size()) + " scalars for " + std::to_string(p.size()) +
                                " points");
  return detail::msm_with_window(s, p, window_for(p.size()));
}

point detail::msm_with_window(std::span<const scalar> s, std::span<const point> p, int c) {
  // c = 1 would make every digit 1 a -1 with a carry, a chain no last window ends.
  if (c < 2 || c > 16) throw std::invalid_argument("r255::msm: window width " + std::to_string(c) + " outside [2, 16]");
  const std::size_t n = p.size();
  if (n == 0) return identity();
  const int windows = (253 + c - 1) / c + 1;  // s < 2^253; the last window holds the final carry
  std::vector<std::int16_t> digits(n * static_cast<std::size_t>(windows));
  std::vector<cached> addend(n);
  for (std::size_t i = 0; i < n; ++i) {
    signed_digits(s[i], c, windows, &digits[i * windows]);
    addend[i] = to_cached(p[i]);
  }
  const std::size_t buckets = std::size_t{1} << (c - 1);
  std::vector<point> bucket(buckets);
  std::vector<char> used(buckets);
  point result = identity();
  for (int w = windows - 1; w >= 0; --w) {
    for (int k = 0; k < c; ++k) result = dbl(result);
    std::fill(used.begin(), used.end(), 0);
    for (std::size_t i = 0; i < n; ++i) {
      const int d = digits[i * windows + w];
      if (d == 0) continue;
      const std::size_t b = static_cast<std::size_t>(d > 0 ? d : -d) - 1;
      if (!used[b]) {  // an empty bucket takes the point itself: no addition
        bucket[b] = d > 0 ? p[i] : -p[i];
        used[b] = 1;
        continue;
      }
      bucket[b] = to_point(d > 0 ? add_p1p1(bucket[b], addend[i]) : sub_p1p1(bucket[b], addend[i]));
    }
    // sum_b (b + 1) * bucket[b], as the running sums of the buckets from the top.
    point running = identity(), sum = identity();
    bool any = false;
    for (std::size_t b = buckets; b-- > 0;) {
      if (used[b]) {
        running = any ? running + bucket[b] : bucket[b];
        any = true;
      }
      if (any) sum = sum + running;
    }
    result = result + sum;
  }
  return result;
}

point msm_reference(std::span<const scalar> s, std::span<const point> p) {
  if (s.size() != p.size())
    throw std::invalid_argument("r255::msm_reference: " + std::to_string(s.size()) + " scalars for " +
                                std::to_string(p.size()) + " points");
  point sum = identity();
  for (std::size_t i = 0; i < p.size(); ++i) sum = sum + s[i] * p[i];
  return sum;
}

}  // namespace troupe::federated::r255
