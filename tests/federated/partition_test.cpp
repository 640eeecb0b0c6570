#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "troupe/federated/partition.hpp"
#include "troupe/kernels/data.hpp"

namespace {

using namespace troupe::federated;
using troupe::tensor;

tensor labels_cycling(std::int64_t n, int classes) {
  tensor t = tensor::empty({n}, troupe::dtype::u8);
  auto d = t.data<std::uint8_t>();
  for (std::int64_t i = 0; i < n; ++i) d[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % classes);
  return t;
}

void expect_each_index_at_most_once(const partition& p, std::size_t n, bool all) {
  std::vector<int> seen(n, 0);
  for (auto i : p.indices) {
    ASSERT_LT(i, n);
    ++seen[i];
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], all ? 1 : std::min(seen[i], 1)) << i;
  EXPECT_EQ(p.offsets.back(), p.indices.size());
}

TEST(Partition, IidMatchesTheKernelsShards) {
  const auto p = partition_iid(1003, 10, 7);
  const auto want = troupe::shard_iid(1003, 10, 7);
  ASSERT_EQ(p.clients(), 10u);
  for (std::size_t c = 0; c < 10; ++c) {
    const auto s = p.shard(c);
    ASSERT_EQ(s.size(), want[c].size());
    for (std::size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], want[c][i]);
  }
  expect_each_index_at_most_once(p, 1003, true);
}

TEST(Partition, DirichletMatchesTheKernelsShards) {
  const tensor y = labels_cycling(2000, 10);
  const auto p = make_partition("dirichlet:0.5", y, 20, 3);
  const auto want = troupe::shard_dirichlet(y, 20, 0.5, 3);
  for (std::size_t c = 0; c < 20; ++c) {
    const auto s = p.shard(c);
    ASSERT_EQ(s.size(), want[c].size());
    EXPECT_TRUE(std::equal(s.begin(), s.end(), want[c].begin()));
  }
  expect_each_index_at_most_once(p, 2000, true);
}

TEST(Partition, ShardsGiveEachClientAtMostKClasses) {
  const tensor y = labels_cycling(200, 10);  // 20 of each class: shards of 10 hold one class
  const auto p = make_partition("shards:2", y, 10, 5);
  expect_each_index_at_most_once(p, 200, true);
  auto d = y.data<std::uint8_t>();
  std::set<int> classes_of_first;
  for (std::size_t c = 0; c < 10; ++c) {
    const auto s = p.shard(c);
    EXPECT_EQ(s.size(), 20u);
    std::set<int> classes;
    for (auto i : s) classes.insert(d[i]);
    EXPECT_LE(classes.size(), 2u);
  }
  // Another seed deals the shards differently.
  const auto q = make_partition("shards:2", y, 10, 6);
  EXPECT_NE(p.indices, q.indices);
}

TEST(Partition, PowerLawSizesAreSkewedAndCoverTheData) {
  const auto p = partition_power_law(10000, 100, 1.2, 9);
  expect_each_index_at_most_once(p, 10000, true);
  std::vector<std::size_t> sizes;
  for (std::size_t c = 0; c < 100; ++c) sizes.push_back(p.shard(c).size());
  EXPECT_GE(*std::min_element(sizes.begin(), sizes.end()), 1u);
  std::sort(sizes.begin(), sizes.end());
  EXPECT_GT(sizes.back(), 4 * sizes[50]) << "the largest client should dwarf the median one";
  EXPECT_EQ(partition_power_law(10000, 100, 1.2, 9).offsets, p.offsets);
}

TEST(Partition, APowerLawOfTinyExponentGivesNearlyEverythingToOneClient) {
  // (1 - u)^(-1/A) overflows for a tiny A; in logs the weights stay finite and the heaviest client
  // takes all but the one example each of the others (it came out as an even split).
  for (double a : {1e-300, 1e-5, 0.0014}) {
    const auto p = partition_power_law(10000, 100, a, 9);
    expect_each_index_at_most_once(p, 10000, true);
    std::size_t largest = 0;
    for (std::size_t c = 0; c < 100; ++c) {
      EXPECT_GE(p.shard(c).size(), 1u);
      largest = std::max(largest, p.shard(c).size());
    }
    EXPECT_GE(largest, 9000u) << "exponent " << a;
  }
}

TEST(Partition, RejectsMalformedSpecsAndImpossibleSplits) {
  const tensor y = labels_cycling(100, 10);
  for (const char* bad : {"dirichlet", "dirichlet:", "dirichlet:x", "dirichlet:-1", "shards:0", "shards:1.5",
                          "powerlaw:0", "iid:3", "pathological"})
    EXPECT_THROW(make_partition(bad, y, 10, 0), std::invalid_argument) << bad;
  EXPECT_THROW(make_partition("shards:2", y, 60, 0), std::invalid_argument);
  EXPECT_THROW(make_partition("iid", y, 0, 0), std::invalid_argument);
}

}  // namespace
