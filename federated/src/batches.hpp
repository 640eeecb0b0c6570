#pragma once
// Rows of the shared images as a trainer's batch: u8 pixels normalized through a 256-entry
// table (the shared copy stays u8: 47 MB rather than 188 MB of floats), or f32 features as
// they are. Used by the built-in trainers (trainers.cpp, lora.cpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/classifier.hpp"
#include "troupe/kernels/data.hpp"

namespace troupe::federated::detail {

class image_batches {
public:
  explicit image_batches(std::shared_ptr<const labelled_data> data) : data_(std::move(data)) {
    if (!data_) throw std::invalid_argument("the trainer needs data");
    pixels_ = static_cast<int>(data_->train.images.numel() / std::max<std::int64_t>(1, data_->train.size()));
    float_features_ = data_->train.images.type() == dtype::f32;
    for (int v = 0; v < 256; ++v) lut_[v] = (static_cast<float>(v) / 255.0f - data_->mean) / data_->stddev;
  }
  const labelled_data& data() const noexcept { return *data_; }
  int pixels() const noexcept { return pixels_; }
  /// Room for `rows` rows in x() and y().
  void reserve(std::size_t rows) {
    x_.resize(rows * static_cast<std::size_t>(pixels_));
    y_.resize(rows);
  }
  float* x() noexcept { return x_.data(); }
  std::uint8_t* y() noexcept { return y_.data(); }

  /// Rows `rows` of `split` into x(), their labels into y().
  void gather(const dataset& split, const std::uint32_t* rows, std::size_t m) {
    const std::byte* images = split.images.bytes();
    const std::uint8_t* labels = split.labels.data<std::uint8_t>().data();
    const std::size_t d = static_cast<std::size_t>(pixels_);
    float* x = x_.data();
    if (float_features_) {
      for (std::size_t i = 0; i < m; ++i) {
        std::memcpy(x + i * d, images + static_cast<std::size_t>(rows[i]) * d * sizeof(float), d * sizeof(float));
        y_[i] = labels[rows[i]];
      }
      return;
    }
    const float* lut = lut_;  // locals: stores to x_ could otherwise alias the members
    const auto* pixels = reinterpret_cast<const std::uint8_t*>(images);
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint8_t* src = pixels + static_cast<std::size_t>(rows[i]) * d;
      float* dst = x + i * d;
      for (std::size_t k = 0; k < d; ++k) dst[k] = lut[src[k]];
      y_[i] = labels[rows[i]];
    }
  }
  /// Starts loading m rows of `split` (and their labels) into the cache. Always inlined: GCC
  /// counts a function whose only effect is __builtin_prefetch as free of side effects and
  /// drops calls to it that it does not inline.
  [[gnu::always_inline]] void prefetch(const dataset& split, const std::uint32_t* rows, std::size_t m) const {
    const std::byte* images = split.images.bytes();
    const std::uint8_t* labels = split.labels.data<std::uint8_t>().data();
    const std::size_t d = static_cast<std::size_t>(pixels_) * (float_features_ ? sizeof(float) : 1);
    for (std::size_t i = 0; i < m; ++i) {
      const std::byte* src = images + static_cast<std::size_t>(rows[i]) * d;
      for (std::size_t k = 0; k < d; k += 64) __builtin_prefetch(src + k, 0, 2);
      __builtin_prefetch(src + d - 1, 0, 2);
      __builtin_prefetch(labels + rows[i], 0, 2);
    }
  }

private:
  std::shared_ptr<const labelled_data> data_;
  int pixels_ = 0;
  bool float_features_ = false;
  float lut_[256];
  std::vector<float> x_;
  std::vector<std::uint8_t> y_;
};

/// Accuracy and mean loss of `net`'s parameters as they are on rows `rows` of `set`, in chunks of
/// 240 rows; NaN for both when there are none.
inline evaluation evaluate_rows(kernels::classifier& net, image_batches& batches, const dataset& set,
                                std::span<const std::uint32_t> rows) {
  const std::size_t n = rows.size(), chunk = 240;
  if (n == 0) return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN(), {}};
  batches.reserve(chunk);
  double loss = 0;
  std::int64_t correct = 0;
  for (std::size_t s = 0; s < n; s += chunk) {
    const std::size_t m = std::min(chunk, n - s);
    batches.gather(set, rows.data() + s, m);
    net.evaluate(batches.x(), batches.y(), static_cast<int>(m), loss, correct);
  }
  return {static_cast<double>(correct) / static_cast<double>(n), loss / static_cast<double>(n), {}};
}

/// The same on the first `limit` test examples (all when 0).
inline evaluation evaluate_test(kernels::classifier& net, image_batches& batches, std::size_t limit) {
  const std::size_t total = static_cast<std::size_t>(batches.data().test.size());
  std::vector<std::uint32_t> rows(limit ? std::min(limit, total) : total);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>(i);
  return evaluate_rows(net, batches, batches.data().test, rows);
}

}  // namespace troupe::federated::detail
