#include <troupe/pipeline/partition.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "number_text.hpp"

namespace troupe::pipeline {
namespace {


void check_stage_count(std::size_t layers, std::size_t stages) {
  if (stages == 0) throw std::invalid_argument("the number of stages is 0; use at least 1 stage");
  // A partition lists every stage: far more than any pipeline has is a mistake, not a request
  // for gigabytes of boundaries.
  constexpr std::size_t most_stages = std::size_t{1} << 20;
  if (stages > most_stages)
    throw std::invalid_argument("cannot cut into " + std::to_string(stages) + " stages; at most " +
                                std::to_string(most_stages));
  if (stages > layers) {
    throw std::invalid_argument("cannot cut " + std::to_string(layers) + " layers into " +
                                std::to_string(stages) +
                                " stages without an empty stage; use at most " +
                                std::to_string(layers) + " stages");
  }
}

// The exact partitioners keep two tables of (stages + 1) x (layers + 1) entries: refuse shapes
// that would take gigabytes (and minutes) instead of allocating them.
void check_table_size(std::size_t layers, std::size_t stages) {
  constexpr std::size_t most = std::size_t{1} << 25;
  if ((stages + 1) > most / (layers + 1))
    throw std::invalid_argument("cutting " + std::to_string(layers) + " layers into " + std::to_string(stages) +
                                " stages exactly needs tables of (stages + 1) x (layers + 1) entries, more than " +
                                std::to_string(most) + ": use fewer layers (merge neighbours) or fewer stages");
}

void check_values(std::span<const double> values, const char* what) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) {
      throw std::invalid_argument(std::string("the ") + what + " of layer " + std::to_string(i) +
                                  " is " + format_number(values[i]) + "; every " + what +
                                  " must be a finite, non-negative number");
    }
  }
  // Every stage sum is at most the total (sums of non-negative numbers round monotonically),
  // so a finite total keeps every stage sum finite.
  double total = 0;
  for (double v : values) total += v;
  if (!std::isfinite(total)) {
    throw std::invalid_argument(std::string("the layers' ") + what +
                                " values add up to more than a double holds; scale them down");
  }
}

// The exact cutter behind partition_by_parameters and partition_balanced.
//
// Two dynamic programs over suffixes of the layer list, each O(S·L²) at worst:
//  1. best[k][i] = the smallest possible largest stage cost when layers [i, L) form k non-empty
//     stages whose memory fits; its value at (S, 0) is the optimum C*.
//  2. with every stage's cost capped at C*, high[k][i] = the largest possible smallest stage
//     cost; its value at (S, 0) is m*, the tie-break.
// The boundaries are then chosen first stage to last, each as far right as still leaves the
// rest able to meet C* and m*: the lexicographically largest boundaries among the tied optima.
//
// Every stage sum is accumulated from its first layer forward and nothing but comparisons,
// min and max is applied to them, so with doubles the answer is exact for those sums and
// matches any other code that adds a stage's costs in the same order.
template <class T>
struct cutter {
  std::span<const T> cost;
  std::span<const double> memory;  // empty: no memory limit
  double limit = std::numeric_limits<double>::infinity();

  std::size_t layers() const { return cost.size(); }

  // Fills `value`/`ok` for k = 1..stages; `ok` false means no such split exists.
  // mode_min_max: the first program; otherwise the second, with stage costs capped at `cap`.
  void solve(std::size_t stages, bool mode_min_max, T cap, std::vector<T>& value,
             std::vector<char>& ok) const {
    const std::size_t L = layers();
    const std::size_t width = L + 1;
    value.assign((stages + 1) * width, T{});
    ok.assign((stages + 1) * width, 0);
    const bool with_memory = !memory.empty();
    for (std::size_t k = 1; k <= stages; ++k) {
      for (std::size_t i = 0; i + k <= L; ++i) {
        T s{};
        double m = 0;
        bool found = false;
        T found_value{};
        // The first stage is [i, j); the remaining k-1 stages need at least k-1 layers.
        const std::size_t last_j = (k == 1) ? L : L - (k - 1);
        for (std::size_t j = i + 1; j <= last_j; ++j) {
          s += cost[j - 1];
          if (with_memory) {
            m += memory[j - 1];
            if (m > limit) break;  // memory only grows with j
          }
          if (mode_min_max) {
            if (found && !(s < found_value)) break;  // a longer first stage only costs more
          } else if (cap < s) {
            break;
          }
          if (k == 1) {
            if (j == L) {
              found = true;
              found_value = s;
            }
            continue;
          }
          const std::size_t rest = (k - 1) * width + j;
          if (!ok[rest]) continue;
          if (mode_min_max) {
            T v = std::max(s, value[rest]);
            if (!found || v < found_value) {
              found = true;
              found_value = v;
            }
          } else {
            T v = std::min(s, value[rest]);
            if (!found || found_value < v) {
              found = true;
              found_value = v;
            }
          }
        }
        value[k * width + i] = found_value;
        ok[k * width + i] = found ? 1 : 0;
      }
    }
  }

  // The boundaries of the optimum (see above), or nothing when no split fits the memory limit.
  std::optional<std::vector<std::size_t>> cut(std::size_t stages) const {
    const std::size_t L = layers();
    const std::size_t width = L + 1;
    std::vector<T> value;
    std::vector<char> ok;
    solve(stages, true, T{}, value, ok);
    if (!ok[stages * width]) return std::nullopt;
    const T top = value[stages * width];
    solve(stages, false, top, value, ok);
    const T bottom = value[stages * width];

    std::vector<std::size_t> b{0};
    std::size_t i = 0;
    for (std::size_t k = stages; k >= 2; --k) {
      T s{};
      double m = 0;
      std::size_t chosen = 0;
      for (std::size_t j = i + 1; j + (k - 1) <= L; ++j) {
        s += cost[j - 1];
        if (!memory.empty()) {
          m += memory[j - 1];
          if (m > limit) break;
        }
        if (top < s) break;
        const std::size_t rest = (k - 1) * width + j;
        if (!(s < bottom) && ok[rest] && !(value[rest] < bottom)) chosen = j;
      }
      // The second program proved that (k, i) can meet both bounds, so a choice exists.
      if (chosen == 0) throw std::logic_error("partition: internal error in the exact cutter");
      b.push_back(chosen);
      i = chosen;
    }
    b.push_back(L);
    return b;
  }
};

template <class T>
std::vector<double> stage_sums(std::span<const T> values, const std::vector<std::size_t>& b) {
  std::vector<double> out;
  out.reserve(b.size() - 1);
  for (std::size_t s = 0; s + 1 < b.size(); ++s) {
    T sum{};
    for (std::size_t l = b[s]; l < b[s + 1]; ++l) sum += values[l];
    out.push_back(static_cast<double>(sum));
  }
  return out;
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

partition partition_uniform(std::size_t layers, std::size_t stages) {
  check_stage_count(layers, stages);
  const std::size_t base = layers / stages;
  const std::size_t extra = layers % stages;
  partition p;
  p.boundaries.reserve(stages + 1);
  p.boundaries.push_back(0);
  for (std::size_t s = 0; s < stages; ++s) {
    const std::size_t size = base + (s < extra ? 1 : 0);
    p.boundaries.push_back(p.boundaries.back() + size);
    p.stage_costs.push_back(static_cast<double>(size));
  }
  p.max_cost = max_of(p.stage_costs);
  return p;
}

partition partition_by_parameters(std::span<const std::uint64_t> params, std::size_t stages) {
  check_stage_count(params.size(), stages);
  check_table_size(params.size(), stages);
  std::uint64_t total = 0;
  for (std::uint64_t v : params) {
    if (v > std::numeric_limits<std::uint64_t>::max() - total) {
      throw std::invalid_argument(
          "the parameter counts add up to more than 2^64 - 1; pass them in a larger unit");
    }
    total += v;
  }
  cutter<std::uint64_t> c{params, {}, std::numeric_limits<double>::infinity()};
  partition p;
  p.boundaries = *c.cut(stages);  // without a memory limit a split always exists
  p.stage_costs = stage_sums(params, p.boundaries);
  p.max_cost = max_of(p.stage_costs);
  return p;
}

partition partition_balanced(std::span<const double> costs, std::size_t stages,
                             std::optional<memory_limit> limit) {
  check_stage_count(costs.size(), stages);
  check_table_size(costs.size(), stages);
  check_values(costs, "cost");
  cutter<double> c{costs, {}, std::numeric_limits<double>::infinity()};
  if (limit) {
    if (limit->memory.size() != costs.size()) {
      throw std::invalid_argument("got " + std::to_string(limit->memory.size()) +
                                  " memory values for " + std::to_string(costs.size()) +
                                  " layers; give one memory value per layer");
    }
    check_values(limit->memory, "memory");
    if (!std::isfinite(limit->limit) || limit->limit < 0) {
      throw std::invalid_argument("the memory limit is " + format_number(limit->limit) +
                                  "; it must be a finite, non-negative number");
    }
    c.memory = limit->memory;
    c.limit = limit->limit;
  }
  auto b = c.cut(stages);
  if (!b) {
    const auto& mem = limit->memory;
    const auto worst = std::max_element(mem.begin(), mem.end());
    if (*worst > limit->limit) {
      throw std::invalid_argument(
          "layer " + std::to_string(worst - mem.begin()) + " alone needs memory " +
          format_number(*worst) + ", more than the limit " + format_number(limit->limit) +
          ", so no number of stages fits; raise the limit to at least " + format_number(*worst));
    }
    // The smallest limit that works is the min-max split of the memory values themselves.
    cutter<double> by_memory{mem, {}, std::numeric_limits<double>::infinity()};
    const auto mb = *by_memory.cut(stages);
    const double needed = max_of(stage_sums(mem, mb));
    throw std::invalid_argument("no split of " + std::to_string(costs.size()) + " layers into " +
                                std::to_string(stages) +
                                " stages keeps every stage's memory within " +
                                format_number(limit->limit) + "; raise the limit to at least " +
                                format_number(needed) + " or use more stages");
  }
  partition p;
  p.boundaries = std::move(*b);
  p.stage_costs = stage_sums(costs, p.boundaries);
  p.max_cost = max_of(p.stage_costs);
  if (limit) p.stage_memory = stage_sums(limit->memory, p.boundaries);
  return p;
}

}  // namespace troupe::pipeline
