#include "troupe/federated/compress.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "random.hpp"

namespace troupe::federated {

void sparse_update::densify(std::span<float> out) const {
  if (out.size() != dim) throw std::invalid_argument("sparse_update: output has the wrong length");
  if (index.size() != value.size())
    throw std::invalid_argument("sparse_update::densify: " + std::to_string(index.size()) + " positions for " +
                                std::to_string(value.size()) + " values");
  // Checked before anything is written: a position past the end would write out of bounds.
  for (std::uint32_t i : index)
    if (i >= dim)
      throw std::invalid_argument("sparse_update::densify: position " + std::to_string(i) + " is outside the " +
                                  std::to_string(dim) + " coordinates");
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t i = 0; i < index.size(); ++i) out[index[i]] = value[i];
}

sparse_update top_k(std::span<const float> update, double fraction, std::span<float> residual) {
  if (!(fraction > 0 && fraction <= 1))
    throw std::invalid_argument("top_k: the fraction must be in (0, 1], got " + std::to_string(fraction));
  const std::size_t dim = update.size();
  if (residual.size() != dim)
    throw std::invalid_argument("top_k: the residual has " + std::to_string(residual.size()) +
                                " coordinates, the update " + std::to_string(dim));
  for (std::size_t i = 0; i < dim; ++i) residual[i] += update[i];  // residual now holds v = update + r
  const std::size_t k = dim == 0 ? 0 : std::clamp<std::size_t>(
      static_cast<std::size_t>(std::llround(fraction * static_cast<double>(dim))), 1, dim);
  std::vector<std::uint32_t> order(dim);
  std::iota(order.begin(), order.end(), 0u);
  auto larger = [&](std::uint32_t a, std::uint32_t b) {
    const float ma = std::fabs(residual[a]), mb = std::fabs(residual[b]);
    return ma != mb ? ma > mb : a < b;
  };
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), larger);
  order.resize(k);
  std::sort(order.begin(), order.end());
  sparse_update out;
  out.dim = dim;
  out.index = std::move(order);
  out.value.reserve(k);
  for (std::uint32_t i : out.index) {
    out.value.push_back(residual[i]);
    residual[i] = 0;  // sent: nothing of it stays behind
  }
  return out;
}

std::size_t quantized_update::wire_bytes() const noexcept {
  const auto bits = static_cast<std::size_t>(std::bit_width(static_cast<unsigned>(2 * levels)));
  return sizeof(float) + (level.size() * bits + 7) / 8;
}

void quantized_update::dequantize(std::span<float> out) const {
  if (out.size() != level.size()) throw std::invalid_argument("qsgd: output has the wrong length");
  for (std::size_t i = 0; i < level.size(); ++i)
    out[i] = static_cast<float>(static_cast<double>(norm) * level[i] / levels);
}

quantized_update qsgd(std::span<const float> update, int levels, std::uint64_t seed) {
  if (levels < 1 || levels > 127) throw std::invalid_argument("qsgd: levels must be in [1, 127]");
  double squares = 0;
  for (float x : update) squares += static_cast<double>(x) * x;
  if (!std::isfinite(squares)) throw std::invalid_argument("qsgd: the update is not finite");
  quantized_update q;
  q.levels = levels;
  // The norm in double (a float sum of squares overflows from 1.8e19 on), sent as a float: an
  // update whose norm is beyond the largest float cannot be sent (its dequantization was NaN).
  const double norm = std::sqrt(squares);
  if (norm > std::numeric_limits<float>::max())
    throw std::invalid_argument("qsgd: the update's L2 norm " + std::to_string(norm) +
                                " is beyond the largest float, which carries it on the wire");
  q.norm = static_cast<float>(norm);
  q.level.resize(update.size());
  if (q.norm == 0) return q;
  splitmix64 rng{seed};
  const double scale = levels / norm;
  for (std::size_t i = 0; i < update.size(); ++i) {
    const double x = std::min(std::fabs(update[i]) * scale, static_cast<double>(levels));
    const double lower = std::floor(x);
    const int l = static_cast<int>(lower) + (rng.uniform01() < x - lower ? 1 : 0);
    q.level[i] = static_cast<std::int8_t>(update[i] < 0 ? -l : l);
  }
  return q;
}

}  // namespace troupe::federated
