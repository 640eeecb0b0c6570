#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/pipeline/partition.hpp>
#include <troupe/pipeline/partition_cli.hpp>

namespace tp = troupe::pipeline;

namespace {

// The message of the std::invalid_argument that `f` throws; fails the test when it throws
// nothing or something else.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (...) {
    ADD_FAILURE() << "threw something other than std::invalid_argument";
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

// Stage sums added from each stage's first layer forward, as the documentation promises.
template <class T>
std::vector<T> sums_of(const std::vector<T>& v, const std::vector<std::size_t>& b) {
  std::vector<T> out;
  for (std::size_t s = 0; s + 1 < b.size(); ++s) {
    T sum{};
    for (std::size_t l = b[s]; l < b[s + 1]; ++l) sum += v[l];
    out.push_back(sum);
  }
  return out;
}

// Every way to cut `layers` layers into `stages` non-empty contiguous stages.
void for_each_cut(std::size_t layers, std::size_t stages,
                  const std::function<void(const std::vector<std::size_t>&)>& f) {
  std::vector<std::size_t> b{0};
  std::function<void(std::size_t)> place = [&](std::size_t left) {
    if (left == 1) {
      b.push_back(layers);
      f(b);
      b.pop_back();
      return;
    }
    // Leave at least one layer for each of the `left - 1` later stages.
    for (std::size_t next = b.back() + 1; next + (left - 1) <= layers; ++next) {
      b.push_back(next);
      place(left - 1);
      b.pop_back();
    }
  };
  place(stages);
}

// The documented optimum by enumeration: smallest maximum, then largest minimum, then the
// lexicographically largest boundaries; nothing when no cut fits the memory limit.
template <class T>
std::optional<std::vector<std::size_t>> brute_force(const std::vector<T>& cost,
                                                    std::size_t stages,
                                                    const std::vector<double>* memory = nullptr,
                                                    double limit = 0) {
  std::optional<std::vector<std::size_t>> best;
  T best_max{}, best_min{};
  for_each_cut(cost.size(), stages, [&](const std::vector<std::size_t>& b) {
    if (memory) {
      for (double m : sums_of(*memory, b))
        if (m > limit) return;
    }
    const auto s = sums_of(cost, b);
    const T mx = *std::max_element(s.begin(), s.end());
    const T mn = *std::min_element(s.begin(), s.end());
    if (!best || mx < best_max || (mx == best_max && mn > best_min) ||
        (mx == best_max && mn == best_min && b > *best)) {
      best = b;
      best_max = mx;
      best_min = mn;
    }
  });
  return best;
}

void expect_well_formed(const tp::partition& p, std::size_t layers, std::size_t stages) {
  ASSERT_EQ(p.boundaries.size(), stages + 1);
  EXPECT_EQ(p.boundaries.front(), 0u);
  EXPECT_EQ(p.boundaries.back(), layers);
  for (std::size_t s = 0; s < stages; ++s) EXPECT_LT(p.boundaries[s], p.boundaries[s + 1]);
  ASSERT_EQ(p.stage_costs.size(), stages);
  EXPECT_EQ(p.max_cost, *std::max_element(p.stage_costs.begin(), p.stage_costs.end()));
}

// Random costs of three kinds: small integers (many ties), reals, and reals with zeros.
std::vector<double> random_costs(std::mt19937& rng, std::size_t n) {
  std::vector<double> c(n);
  const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
  for (auto& x : c) {
    if (kind == 0) {
      x = std::uniform_int_distribution<int>(1, 4)(rng);
    } else if (kind == 1) {
      x = std::uniform_real_distribution<double>(0.01, 10.0)(rng);
    } else {
      x = std::uniform_int_distribution<int>(0, 3)(rng) == 0
              ? 0.0
              : std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    }
  }
  return c;
}

// An independent oracle for the optimal maximum at sizes too large to enumerate: binary
// search over every contiguous range sum with a greedy probe (fewest stages under a cap).
double optimum_by_binary_search(const std::vector<double>& c, std::size_t stages) {
  std::vector<double> candidates;
  for (std::size_t i = 0; i < c.size(); ++i) {
    double s = 0;
    for (std::size_t j = i; j < c.size(); ++j) candidates.push_back(s += c[j]);
  }
  std::sort(candidates.begin(), candidates.end());
  auto fits = [&](double cap) {
    std::size_t used = 1;
    double s = 0;
    for (double x : c) {
      if (x > cap) return false;
      if (s + x > cap) {
        ++used;
        s = 0;
      }
      s += x;
    }
    return used <= stages;  // a cut into fewer stages can always be split further
  };
  std::size_t lo = 0, hi = candidates.size() - 1;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (fits(candidates[mid])) hi = mid; else lo = mid + 1;
  }
  return candidates[lo];
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// partition_uniform
// ----------------------------------------------------------------------------------------------

TEST(PartitionUniform, RefusesMoreStagesThanAnyPipelineHas) {
  EXPECT_THROW(tp::partition_uniform(SIZE_MAX, SIZE_MAX), std::invalid_argument);
  EXPECT_THROW(tp::partition_uniform(std::size_t{1} << 30, std::size_t{1} << 21), std::invalid_argument);
}

TEST(PartitionUniform, SpreadsTheRemainderOverTheFirstStages) {
  const auto p = tp::partition_uniform(10, 4);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 3, 6, 8, 10}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{3, 3, 2, 2}));
  EXPECT_EQ(p.max_cost, 3);
}

TEST(PartitionUniform, NeverPutsTheWholeRemainderOnTheLastStage) {
  // The naive floor-then-rest cut gives 2,2,2,5 for 11 layers on 4 stages.
  const auto p = tp::partition_uniform(11, 4);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 3, 6, 9, 11}));
  EXPECT_EQ(p.max_cost, 3);
}

TEST(PartitionUniform, GivesStagesThatDifferByAtMostOneLayerAndAreNeverEmpty) {
  for (std::size_t layers = 1; layers <= 40; ++layers) {
    for (std::size_t stages = 1; stages <= layers; ++stages) {
      const auto p = tp::partition_uniform(layers, stages);
      expect_well_formed(p, layers, stages);
      for (std::size_t s = 0; s < stages; ++s) {
        const std::size_t want = layers / stages + (s < layers % stages ? 1 : 0);
        EXPECT_EQ(p.stage_size(s), want) << layers << " layers, " << stages << " stages";
      }
    }
  }
}

TEST(PartitionUniform, AgreesWithTheBalancedPartitionOfEqualCosts) {
  for (std::size_t layers = 1; layers <= 30; ++layers) {
    const std::vector<double> ones(layers, 1.0);
    for (std::size_t stages = 1; stages <= layers; ++stages) {
      EXPECT_EQ(tp::partition_uniform(layers, stages).boundaries,
                tp::partition_balanced(ones, stages).boundaries)
          << layers << " layers, " << stages << " stages";
    }
  }
}

TEST(PartitionUniform, RejectsZeroStagesAndMoreStagesThanLayers) {
  EXPECT_EQ(error_of([] { tp::partition_uniform(5, 0); }),
            "the number of stages is 0; use at least 1 stage");
  EXPECT_EQ(error_of([] { tp::partition_uniform(3, 4); }),
            "cannot cut 3 layers into 4 stages without an empty stage; use at most 3 stages");
  EXPECT_THROW(tp::partition_uniform(0, 1), std::invalid_argument);
}

// ----------------------------------------------------------------------------------------------
// partition_balanced
// ----------------------------------------------------------------------------------------------

TEST(PartitionBalanced, CutsFiveEqualLayersIntoFourStagesWithMaximumTwo) {
  const std::vector<double> c(5, 1.0);
  const auto p = tp::partition_balanced(c, 4);
  EXPECT_EQ(p.max_cost, 2);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 2, 3, 4, 5}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{2, 1, 1, 1}));
  EXPECT_TRUE(p.stage_memory.empty());
}

TEST(PartitionBalanced, FindsTheKnownOptimumOfASmallExample) {
  const std::vector<double> c{1, 2, 3, 4, 5};
  const auto p = tp::partition_balanced(c, 2);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 3, 5}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{6, 9}));
  EXPECT_EQ(p.max_cost, 9);
  const auto q = tp::partition_balanced(c, 3);  // 1+2+3 | 4 | 5
  EXPECT_EQ(q.boundaries, (std::vector<std::size_t>{0, 3, 4, 5}));
  EXPECT_EQ(q.max_cost, 6);
}

TEST(PartitionBalanced, NeverLeavesAStageEmptyEvenWhenOneLayerDominates) {
  // A greedy probe alone would put everything before the big layer in one stage and leave
  // the last stages empty.
  const std::vector<double> c{1, 1, 1, 100, 1, 1};
  for (std::size_t stages = 1; stages <= c.size(); ++stages) {
    const auto p = tp::partition_balanced(c, stages);
    expect_well_formed(p, c.size(), stages);
    EXPECT_EQ(p.max_cost, stages == 1 ? 105 : stages == 2 ? 102 : 100);
  }
}

TEST(PartitionBalanced, MatchesBruteForceOnRandomCostsUpToTwelveLayers) {
  std::mt19937 rng(20240611);
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t layers = std::uniform_int_distribution<std::size_t>(1, 12)(rng);
    const std::size_t stages = std::uniform_int_distribution<std::size_t>(1, layers)(rng);
    const auto c = random_costs(rng, layers);
    const auto want = brute_force(c, stages);
    ASSERT_TRUE(want.has_value());
    const auto p = tp::partition_balanced(c, stages);
    expect_well_formed(p, layers, stages);
    ASSERT_EQ(p.boundaries, *want) << "trial " << trial;
    EXPECT_EQ(p.stage_costs, sums_of(c, *want));
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(PartitionBalanced, MatchesBruteForceForEveryStageCountOnTwelveLayers) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const auto c = random_costs(rng, 12);
    for (std::size_t stages = 1; stages <= 12; ++stages) {
      ASSERT_EQ(tp::partition_balanced(c, stages).boundaries, *brute_force(c, stages))
          << "trial " << trial << ", " << stages << " stages";
    }
  }
}

TEST(PartitionBalanced, MatchesABinarySearchOracleOnHundredsOfLayers) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 6; ++trial) {
    const std::size_t layers = std::uniform_int_distribution<std::size_t>(100, 300)(rng);
    const std::size_t stages = std::uniform_int_distribution<std::size_t>(2, 32)(rng);
    const auto c = random_costs(rng, layers);
    const auto p = tp::partition_balanced(c, stages);
    expect_well_formed(p, layers, stages);
    EXPECT_EQ(p.max_cost, optimum_by_binary_search(c, stages)) << "trial " << trial;
  }
}

TEST(PartitionBalanced, RespectsAMemoryLimitLikeBruteForce) {
  std::mt19937 rng(4242);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t layers = std::uniform_int_distribution<std::size_t>(1, 12)(rng);
    const std::size_t stages = std::uniform_int_distribution<std::size_t>(1, layers)(rng);
    const auto c = random_costs(rng, layers);
    std::vector<double> mem(layers);
    for (auto& m : mem) m = std::uniform_int_distribution<int>(1, 8)(rng);
    double total = 0;
    for (double m : mem) total += m;
    const double limit = std::uniform_int_distribution<int>(1, static_cast<int>(total))(rng);
    const auto want = brute_force(c, stages, &mem, limit);
    const tp::memory_limit ml{mem, limit};
    if (!want) {
      EXPECT_THROW(tp::partition_balanced(c, stages, ml), std::invalid_argument);
      ++infeasible;
      continue;
    }
    const auto p = tp::partition_balanced(c, stages, ml);
    expect_well_formed(p, layers, stages);
    ASSERT_EQ(p.boundaries, *want) << "trial " << trial;
    EXPECT_EQ(p.stage_memory, sums_of(mem, *want));
    for (double m : p.stage_memory) EXPECT_LE(m, limit);
    ++feasible;
  }
  // Both outcomes were exercised, many times.
  EXPECT_GT(feasible, 500);
  EXPECT_GT(infeasible, 500);
}

TEST(PartitionBalanced, GivesUpSomeBalanceToFitTheMemoryLimit) {
  const std::vector<double> c{1, 2, 3, 4, 5};
  const std::vector<double> mem{1, 1, 1, 1, 10};
  // Unconstrained the best cut is 1+2+3 | 4+5 (memory 3 | 11); with a limit of 10 the last
  // layer must be alone.
  const auto p = tp::partition_balanced(c, 2, tp::memory_limit{mem, 10});
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 4, 5}));
  EXPECT_EQ(p.max_cost, 10);
  EXPECT_EQ(p.stage_memory, (std::vector<double>{4, 10}));
}

TEST(PartitionBalanced, SaysTheSmallestMemoryLimitThatWouldWork) {
  const std::vector<double> c{1, 1, 1, 1};
  const std::vector<double> mem{3, 3, 3, 3};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(c, 2, tp::memory_limit{mem, 5}); }),
            "no split of 4 layers into 2 stages keeps every stage's memory within 5; raise the "
            "limit to at least 6 or use more stages");
  // And that limit works.
  EXPECT_NO_THROW(tp::partition_balanced(c, 2, tp::memory_limit{mem, 6}));
}

TEST(PartitionBalanced, SaysWhenOneLayerAloneExceedsTheMemoryLimit) {
  const std::vector<double> c{1, 1, 1};
  const std::vector<double> mem{1, 9, 1};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(c, 3, tp::memory_limit{mem, 8}); }),
            "layer 1 alone needs memory 9, more than the limit 8, so no number of stages fits; "
            "raise the limit to at least 9");
}

TEST(PartitionBalanced, RejectsBadCostsMemoryAndStageCounts) {
  const std::vector<double> ok{1, 2, 3};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(ok, 0); }),
            "the number of stages is 0; use at least 1 stage");
  EXPECT_EQ(error_of([&] { tp::partition_balanced(ok, 4); }),
            "cannot cut 3 layers into 4 stages without an empty stage; use at most 3 stages");
  EXPECT_EQ(error_of([] { tp::partition_balanced(std::vector<double>{}, 1); }),
            "cannot cut 0 layers into 1 stages without an empty stage; use at most 0 stages");
  const std::vector<double> negative{1, -2, 3};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(negative, 2); }),
            "the cost of layer 1 is -2; every cost must be a finite, non-negative number");
  const std::vector<double> nan{1, 2, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(nan, 2); }),
            "the cost of layer 2 is nan; every cost must be a finite, non-negative number");
  const std::vector<double> inf{std::numeric_limits<double>::infinity(), 1};
  EXPECT_THROW(tp::partition_balanced(inf, 1), std::invalid_argument);
  const std::vector<double> huge{1e308, 1e308};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(huge, 1); }),
            "the layers' cost values add up to more than a double holds; scale them down");

  const std::vector<double> short_mem{1, 1};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(ok, 2, tp::memory_limit{short_mem, 5}); }),
            "got 2 memory values for 3 layers; give one memory value per layer");
  const std::vector<double> bad_mem{1, -1, 1};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(ok, 2, tp::memory_limit{bad_mem, 5}); }),
            "the memory of layer 1 is -1; every memory must be a finite, non-negative number");
  const std::vector<double> mem{1, 1, 1};
  EXPECT_EQ(error_of([&] { tp::partition_balanced(ok, 2, tp::memory_limit{mem, -1}); }),
            "the memory limit is -1; it must be a finite, non-negative number");
}

TEST(PartitionBalanced, HandlesAllZeroCostsWithoutEmptyStages) {
  const std::vector<double> c(6, 0.0);
  const auto p = tp::partition_balanced(c, 4);
  expect_well_formed(p, 6, 4);
  EXPECT_EQ(p.max_cost, 0);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 3, 4, 5, 6}));  // ties: earliest takes most
}

// ----------------------------------------------------------------------------------------------
// partition_by_parameters
// ----------------------------------------------------------------------------------------------

TEST(PartitionByParameters, BalancesParameterCounts) {
  // An embedding, six equal blocks and a large head.
  const std::vector<std::uint64_t> params{50, 10, 10, 10, 10, 10, 10, 40};
  const auto p = tp::partition_by_parameters(params, 3);
  EXPECT_EQ(p.boundaries, (std::vector<std::size_t>{0, 1, 6, 8}));
  EXPECT_EQ(p.stage_costs, (std::vector<double>{50, 50, 50}));
  EXPECT_EQ(p.max_cost, 50);
}

TEST(PartitionByParameters, MatchesBruteForceOnRandomCountsUpToTwelveLayers) {
  std::mt19937_64 rng(31337);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t layers = std::uniform_int_distribution<std::size_t>(1, 12)(rng);
    const std::size_t stages = std::uniform_int_distribution<std::size_t>(1, layers)(rng);
    std::vector<std::uint64_t> params(layers);
    const bool small = trial % 2 == 0;  // small counts make ties; large ones exceed 2^53 in sum
    for (auto& x : params) {
      x = small ? std::uniform_int_distribution<std::uint64_t>(0, 5)(rng)
                : std::uniform_int_distribution<std::uint64_t>(1, std::uint64_t{1} << 58)(rng);
    }
    const auto want = brute_force(params, stages);
    const auto p = tp::partition_by_parameters(params, stages);
    expect_well_formed(p, layers, stages);
    ASSERT_EQ(p.boundaries, *want) << "trial " << trial;
  }
}

TEST(PartitionByParameters, RejectsCountsThatOverflowAndBadStageCounts) {
  const std::vector<std::uint64_t> big{std::numeric_limits<std::uint64_t>::max(), 1};
  EXPECT_EQ(error_of([&] { tp::partition_by_parameters(big, 1); }),
            "the parameter counts add up to more than 2^64 - 1; pass them in a larger unit");
  const std::vector<std::uint64_t> two{1, 2};
  EXPECT_THROW(tp::partition_by_parameters(two, 0), std::invalid_argument);
  EXPECT_THROW(tp::partition_by_parameters(two, 3), std::invalid_argument);
}

// ----------------------------------------------------------------------------------------------
// parse_number_list and run_partition_command
// ----------------------------------------------------------------------------------------------

TEST(ParseNumberList, ReadsCommaSeparatedNumbersWithOptionalSpaces) {
  EXPECT_EQ(tp::parse_number_list("1,2.5, 3e2 ,0", "--costs"),
            (std::vector<double>{1, 2.5, 300, 0}));
  EXPECT_EQ(tp::parse_number_list("7", "--costs"), (std::vector<double>{7}));
}

TEST(ParseNumberList, RejectsEmptyItemsNonNumbersAndNegativeNumbers) {
  EXPECT_EQ(error_of([] { tp::parse_number_list("", "--costs"); }),
            "--costs is empty; give comma-separated numbers such as 1,2.5,3");
  EXPECT_EQ(error_of([] { tp::parse_number_list("1,,2", "--costs"); }),
            "--costs item 2 is empty; remove the extra comma or put a number there");
  EXPECT_EQ(error_of([] { tp::parse_number_list("1,2,", "--costs"); }),
            "--costs item 3 is empty; remove the extra comma or put a number there");
  EXPECT_EQ(error_of([] { tp::parse_number_list("1,two", "--memory"); }),
            "--memory item 2 \"two\" is not a number; write a decimal number such as 2 or 0.5");
  EXPECT_EQ(error_of([] { tp::parse_number_list("1,2x", "--costs"); }),
            "--costs item 2 \"2x\" is not a number; write a decimal number such as 2 or 0.5");
  EXPECT_EQ(error_of([] { tp::parse_number_list("3,-1", "--costs"); }),
            "--costs item 2 is negative (-1); write a number of 0 or more");
  EXPECT_EQ(error_of([] { tp::parse_number_list("nan", "--costs"); }),
            "--costs item 1 \"nan\" is not finite; write a finite number");
  EXPECT_THROW(tp::parse_number_list("1e999", "--costs"), std::invalid_argument);
  EXPECT_THROW(tp::parse_number_list("1 2", "--costs"), std::invalid_argument);
}

TEST(PartitionCli, PrintsTheJsonOfASmallExampleExactly) {
  tp::partition_cli_options o;
  o.costs = "1,2,3,4,5";
  o.stages = 2;
  o.json = true;
  std::ostringstream out, err;
  EXPECT_EQ(tp::run_partition_command(o, out, err), 0);
  EXPECT_EQ(out.str(), "{\"stages\":2,\"boundaries\":[0,3,5],\"stage_costs\":[6,9],\"max_cost\":9}\n");
  EXPECT_EQ(err.str(), "");
}

TEST(PartitionCli, AddsStageMemoryToTheJsonWhenMemoryIsGiven) {
  tp::partition_cli_options o;
  o.costs = "1,2,3,4,5";
  o.stages = 2;
  o.memory = "1,1,1,1,10";
  o.memory_limit = "10";
  o.json = true;
  std::ostringstream out, err;
  EXPECT_EQ(tp::run_partition_command(o, out, err), 0);
  EXPECT_EQ(out.str(),
            "{\"stages\":2,\"boundaries\":[0,4,5],\"stage_costs\":[10,5],\"max_cost\":10,"
            "\"stage_memory\":[4,10]}\n");
  // Without a limit the memory is reported but does not constrain the cut.
  o.memory_limit.clear();
  std::ostringstream out2;
  EXPECT_EQ(tp::run_partition_command(o, out2, err), 0);
  EXPECT_EQ(out2.str(),
            "{\"stages\":2,\"boundaries\":[0,3,5],\"stage_costs\":[6,9],\"max_cost\":9,"
            "\"stage_memory\":[3,11]}\n");
}

TEST(PartitionCli, WritesNumbersThatReadBackExactly) {
  tp::partition_cli_options o;
  o.costs = "0.1,0.2,0.5";
  o.stages = 2;
  o.json = true;
  std::ostringstream out, err;
  EXPECT_EQ(tp::run_partition_command(o, out, err), 0);
  EXPECT_EQ(out.str(),
            "{\"stages\":2,\"boundaries\":[0,2,3],\"stage_costs\":[0.30000000000000004,0.5],"
            "\"max_cost\":0.5}\n");
}

TEST(PartitionCli, PrintsAReadableTableWithoutJson) {
  tp::partition_cli_options o;
  o.costs = "1,2,3,4,5";
  o.stages = 2;
  std::ostringstream out, err;
  EXPECT_EQ(tp::run_partition_command(o, out, err), 0);
  EXPECT_EQ(out.str(),
            "stage  layers      count   cost\n"
            "0      0-2         3       6\n"
            "1      3-4         2       9\n"
            "max stage cost: 9\n");
}

TEST(PartitionCli, ReportsBadInputOnTheErrorStreamAndFails) {
  const auto run = [](tp::partition_cli_options o) {
    std::ostringstream out, err;
    const int rc = tp::run_partition_command(o, out, err);
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.str(), "");
    return err.str();
  };
  tp::partition_cli_options o;
  o.costs = "1,2,3";
  o.stages = 4;
  EXPECT_EQ(run(o),
            "troupe partition: --stages 4 is more than the 3 layers in --costs, which would leave "
            "a stage empty; use at most 3 stages\n");
  o.stages = 0;
  EXPECT_EQ(run(o),
            "troupe partition: --stages is missing or 0; give a number of stages from 1 to 3\n");
  o.stages = 2;
  o.costs = "1,,3";
  EXPECT_EQ(run(o),
            "troupe partition: --costs item 2 is empty; remove the extra comma or put a number "
            "there\n");
  o.costs = "1,2,3";
  o.memory_limit = "4";
  EXPECT_EQ(run(o),
            "troupe partition: --memory-limit needs --memory m1,m2,... with the memory of every "
            "layer\n");
  o.memory = "1,2";
  EXPECT_EQ(run(o),
            "troupe partition: --memory has 2 values but --costs has 3; give one memory value per "
            "layer\n");
  o.memory = "3,3,3";
  o.memory_limit = "-4";
  EXPECT_EQ(run(o), "troupe partition: --memory-limit is negative (-4); write a number of 0 or more\n");
  o.memory_limit = "5";
  EXPECT_EQ(run(o),
            "troupe partition: no split of 3 layers into 2 stages keeps every stage's memory "
            "within 5; raise the limit to at least 6 or use more stages\n");
}
