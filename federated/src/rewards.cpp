// Budgeted rewards: a round's budget paid out from its participants' Shapley values in integer
// micro-units, by largest remainders, so that the payout is exact.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "spec.hpp"
#include "troupe/federated/contribution.hpp"

namespace troupe::federated {

namespace {
__extension__ typedef unsigned __int128 u128;  // GCC's 128-bit integers (quotas of up to 2^100)
}  // namespace

reward_budget parse_reward_budget(const std::string& spec) {
  const auto parts = detail::split_spec(spec);
  const std::string context = "--reward-budget '" + spec + "'";
  if (parts.size() > 2) throw std::invalid_argument(context + ": use B or B:FLOOR_FRACTION");
  reward_budget b;
  b.budget = detail::spec_number(parts[0], context);
  if (!(b.budget > 0 && b.budget <= max_reward_budget))
    throw std::invalid_argument(context + ": the budget B must be in (0, 1e12]");
  if (std::llround(b.budget * static_cast<double>(micro_units)) < 1)
    throw std::invalid_argument(context + ": the budget is below one micro-unit (1e-6)");
  if (parts.size() == 2) {
    b.floor_fraction = detail::spec_number(parts[1], context);
    if (!(b.floor_fraction >= 0 && b.floor_fraction <= 1))
      throw std::invalid_argument(context + ": FLOOR_FRACTION must be in [0, 1]");
  }
  return b;
}

// The proportional part: quota_i = rest * w_i / W with integer weights w_i (the positive parts
// scaled so that the largest is 2^40), so that quotas and remainders are exact in 128 bits:
// every participant gets floor(quota_i), and the units left over (fewer than n) go one each to
// the largest remainders. A larger value has a weight at least as large (rounding is monotone),
// hence a quota at least as large, and wins ties of the remainder: it never gets less.
std::vector<std::int64_t> budget_rewards(std::span<const double> values, const reward_budget& b) {
  const std::size_t n = values.size();
  if (n == 0) throw std::invalid_argument("budget_rewards: no participants to pay");
  for (double v : values)
    if (!std::isfinite(v)) throw std::invalid_argument("budget_rewards: a Shapley value is not finite");
  if (!(b.budget > 0 && b.budget <= max_reward_budget) || !(b.floor_fraction >= 0 && b.floor_fraction <= 1))
    throw std::invalid_argument("budget_rewards: the budget must be in (0, 1e12] and the floor fraction in [0, 1]");
  const auto total = static_cast<std::int64_t>(std::llround(b.budget * static_cast<double>(micro_units)));
  const auto un = static_cast<std::int64_t>(n);
  const auto by_fraction = static_cast<std::int64_t>(std::floor(b.floor_fraction * static_cast<double>(total)));
  const std::int64_t floor_each = std::clamp<std::int64_t>(by_fraction, 0, total / un);
  const std::int64_t rest = total - floor_each * un;

  std::vector<u128> weight(n, 1);  // equal shares when no value is positive
  double largest = 0;
  for (double v : values) largest = std::max(largest, v);
  if (largest > 0)
    for (std::size_t i = 0; i < n; ++i)
      weight[i] = static_cast<u128>(std::llround(std::max(0.0, values[i]) / largest * 0x1p40));
  u128 sum = 0;
  for (auto w : weight) sum += w;

  std::vector<std::int64_t> out(n, floor_each);
  std::vector<u128> remainder(n, 0);
  std::int64_t given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const u128 share = static_cast<u128>(rest) * weight[i];
    out[i] += static_cast<std::int64_t>(share / sum);
    given += static_cast<std::int64_t>(share / sum);
    remainder[i] = share % sum;
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  const std::int64_t left = rest - given;  // < n: each floor lost less than one unit
  std::partial_sort(order.begin(), order.begin() + left, order.end(), [&](std::size_t i, std::size_t j) {
    if (remainder[i] != remainder[j]) return remainder[i] > remainder[j];
    if (values[i] != values[j]) return values[i] > values[j];
    return i < j;
  });
  for (std::int64_t k = 0; k < left; ++k) ++out[order[static_cast<std::size_t>(k)]];
  return out;
}

}  // namespace troupe::federated
