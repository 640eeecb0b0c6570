#include "troupe/federated/robust.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace troupe::federated {

namespace {

/// The common length of the updates. Refuses an empty set, unequal lengths and values that are
/// not finite: a NaN has no place in an order (nth_element and sort would be undefined), and
/// Krum's distances to it are NaN, which its scores would then prefer.
std::size_t check_updates(std::span<const update_view> updates, const char* who) {
  if (updates.empty()) throw std::invalid_argument(std::string(who) + ": no updates");
  const std::size_t dim = updates[0].size();
  for (std::size_t i = 0; i < updates.size(); ++i) {
    const auto& u = updates[i];
    if (u.size() != dim)
      throw std::invalid_argument(std::string(who) + ": updates have different lengths (" + std::to_string(dim) +
                                  " and " + std::to_string(u.size()) + ")");
    for (std::size_t j = 0; j < dim; ++j)
      if (!std::isfinite(u[j]))
        throw std::invalid_argument(std::string(who) + ": update " + std::to_string(i) + " holds " +
                                    std::to_string(u[j]) + " at coordinate " + std::to_string(j) +
                                    " (updates must be finite)");
  }
  return dim;
}

}  // namespace

std::vector<float> coordinate_median(std::span<const update_view> updates) {
  const std::size_t dim = check_updates(updates, "coordinate_median"), n = updates.size();
  std::vector<float> out(dim), column(n);
  for (std::size_t j = 0; j < dim; ++j) {
    for (std::size_t i = 0; i < n; ++i) column[i] = updates[i][j];
    auto mid = column.begin() + n / 2;
    std::nth_element(column.begin(), mid, column.end());
    if (n % 2) {
      out[j] = *mid;
    } else {
      const float lower = *std::max_element(column.begin(), mid);
      out[j] = static_cast<float>((static_cast<double>(lower) + *mid) / 2);
    }
  }
  return out;
}

std::vector<float> trimmed_mean(std::span<const update_view> updates, std::size_t trim) {
  const std::size_t dim = check_updates(updates, "trimmed_mean"), n = updates.size();
  if (trim > (n - 1) / 2)  // 2 trim >= n, without the product (it wraps for trim >= 2^63)
    throw std::invalid_argument("trimmed_mean: trimming " + std::to_string(trim) + " from each end of " +
                                std::to_string(n) + " updates leaves none");
  std::vector<float> out(dim), column(n);
  for (std::size_t j = 0; j < dim; ++j) {
    for (std::size_t i = 0; i < n; ++i) column[i] = updates[i][j];
    std::sort(column.begin(), column.end());
    double sum = 0;
    for (std::size_t i = trim; i < n - trim; ++i) sum += column[i];
    out[j] = static_cast<float>(sum / static_cast<double>(n - 2 * trim));
  }
  return out;
}

krum_choice krum_select(std::span<const update_view> updates, std::size_t byzantine, std::size_t m) {
  check_updates(updates, "krum");
  const std::size_t n = updates.size();
  if (n < 3 || byzantine > (n - 3) / 2)  // n <= 2f + 2, without the product (it wraps)
    throw std::invalid_argument("krum: " + std::to_string(n) + " updates cannot tolerate " +
                                std::to_string(byzantine) + " Byzantine ones (needs n > 2f + 2)");
  if (m < 1 || m > n) throw std::invalid_argument("krum: m must be in [1, " + std::to_string(n) + "]");
  std::vector<double> distance(n * n, 0.0);
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = a + 1; b < n; ++b) {
      double d = 0;
      for (std::size_t j = 0; j < updates[a].size(); ++j) {
        const double diff = static_cast<double>(updates[a][j]) - updates[b][j];
        d += diff * diff;
      }
      distance[a * n + b] = distance[b * n + a] = d;
    }
  krum_choice choice;
  choice.scores.resize(n);
  const std::size_t neighbours = n - byzantine - 2;
  std::vector<double> row;
  for (std::size_t a = 0; a < n; ++a) {
    row.clear();
    for (std::size_t b = 0; b < n; ++b)
      if (b != a) row.push_back(distance[a * n + b]);
    std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(neighbours), row.end());
    choice.scores[a] = std::accumulate(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(neighbours), 0.0);
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return choice.scores[x] < choice.scores[y]; });
  choice.selected.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(m));
  return choice;
}

std::vector<float> multi_krum(std::span<const update_view> updates, std::size_t byzantine, std::size_t m) {
  const auto choice = krum_select(updates, byzantine, m);
  std::vector<double> sum(updates[0].size(), 0.0);
  for (std::size_t i : choice.selected)
    for (std::size_t j = 0; j < sum.size(); ++j) sum[j] += updates[i][j];
  std::vector<float> out(sum.size());
  for (std::size_t j = 0; j < sum.size(); ++j) out[j] = static_cast<float>(sum[j] / static_cast<double>(m));
  return out;
}

std::vector<float> geometric_median(std::span<const update_view> updates, int iterations, double nu, double tolerance) {
  const std::size_t dim = check_updates(updates, "geometric_median"), n = updates.size();
  if (!(nu > 0) || !std::isfinite(nu)) throw std::invalid_argument("geometric_median: nu must be > 0 and finite");
  if (iterations < 1) throw std::invalid_argument("geometric_median: iterations must be >= 1");
  if (!(tolerance >= 0)) throw std::invalid_argument("geometric_median: the tolerance must be >= 0");
  std::vector<double> z(dim, 0.0), next(dim);
  for (const auto& u : updates)
    for (std::size_t j = 0; j < dim; ++j) z[j] += u[j];
  for (double& x : z) x /= static_cast<double>(n);
  std::vector<double> distance(n);
  auto distances = [&](const std::vector<double>& at) {  // fills `distance`, returns their sum
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double d = 0;
      for (std::size_t j = 0; j < dim; ++j) {
        const double diff = at[j] - updates[i][j];
        d += diff * diff;
      }
      distance[i] = std::sqrt(d);
      total += distance[i];
    }
    return total;
  };
  double objective = distances(z);
  for (int it = 0; it < iterations; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    double weights = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double beta = 1 / std::max(nu, distance[i]);
      weights += beta;
      for (std::size_t j = 0; j < dim; ++j) next[j] += beta * updates[i][j];
    }
    for (double& x : next) x /= weights;
    const double improved = distances(next);
    z.swap(next);
    const bool settled = objective - improved <= tolerance * objective;
    objective = improved;
    if (settled) break;
  }
  return std::vector<float>(z.begin(), z.end());
}

std::vector<float> norm_bounded_mean(std::span<const update_view> updates, double bound) {
  const std::size_t dim = check_updates(updates, "norm_bounded_mean"), n = updates.size();
  if (!(bound > 0) || !std::isfinite(bound))
    throw std::invalid_argument("norm_bounded_mean: the bound must be > 0 and finite");
  std::vector<double> sum(dim, 0.0);
  for (const auto& u : updates) {
    double squares = 0;
    for (float x : u) squares += static_cast<double>(x) * x;
    const double norm = std::sqrt(squares), scale = norm > bound ? bound / norm : 1.0;
    for (std::size_t j = 0; j < dim; ++j) sum[j] += scale * u[j];
  }
  std::vector<float> out(dim);
  for (std::size_t j = 0; j < dim; ++j) out[j] = static_cast<float>(sum[j] / static_cast<double>(n));
  return out;
}

void apply_update_attack(update_attack attack, std::span<float> update, double factor) {
  switch (attack) {
    case update_attack::none: return;
    case update_attack::sign_flip: factor = -factor; [[fallthrough]];
    case update_attack::scale:
      for (float& x : update) x = static_cast<float>(x * factor);
      return;
  }
}

void stamp_backdoor(std::span<std::uint8_t> image, int side, int size, int margin) {
  if (side <= 0 || size <= 0 || margin < 0 || size + margin > side ||
      image.size() != static_cast<std::size_t>(side) * static_cast<std::size_t>(side))
    throw std::invalid_argument("stamp_backdoor: the trigger does not fit the image");
  for (int r = side - margin - size; r < side - margin; ++r)
    for (int c = side - margin - size; c < side - margin; ++c)
      image[static_cast<std::size_t>(r) * static_cast<std::size_t>(side) + static_cast<std::size_t>(c)] = 255;
}

}  // namespace troupe::federated
