// The data pipeline after loading: normalization, seeded shuffles, IID and Dirichlet shards, and
// batches of gathered rows.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "data_support.hpp"
#include "troupe/kernels/data.hpp"

namespace {

using namespace data_support;

// Sorted copy of all shards' indices.
std::vector<std::int64_t> all_indices(const std::vector<std::vector<std::int64_t>>& shards) {
  std::vector<std::int64_t> out;
  for (const auto& s : shards) out.insert(out.end(), s.begin(), s.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::int64_t> iota(std::int64_t n) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  return out;
}

// ---- normalization -----------------------------------------------------------------------------

TEST(Normalize, MapsEveryPixelValueAndFlattensEachImage) {
  bytes all(256);
  for (int v = 0; v < 256; ++v) all[static_cast<std::size_t>(v)] = static_cast<std::uint8_t>(255 - v);
  const tensor images = tensor::from<std::uint8_t>(all, {4, 8, 8});
  const tensor x = troupe::normalize(images, 0.25f, 0.5f);
  EXPECT_EQ(x.type(), dtype::f32);
  ASSERT_EQ(x.shape(), (tensor::shape_type{4, 64}));
  const auto data = x.data<float>();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double expected = (all[i] / 255.0 - 0.25) / 0.5;
    EXPECT_NEAR(data[i], expected, 1e-6 + 1e-6 * std::abs(expected)) << "pixel " << int(all[i]);
  }
}

TEST(Normalize, UsesFashionMnistConstantsByDefault) {
  const tensor x = troupe::normalize(tensor::from<std::uint8_t>({0, 255}, {2, 1}));
  EXPECT_NEAR(x.data<float>()[0], -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(x.data<float>()[1], (1.0 - 0.2860) / 0.3530, 1e-6);
}

TEST(Normalize, RejectsNonU8ImagesAndABadStd) {
  const tensor f = tensor::from<float>({1.0f, 2.0f}, {2, 1});
  EXPECT_THROW(troupe::normalize(f), std::invalid_argument);
  const tensor u = tensor::from<std::uint8_t>({1, 2}, {2, 1});
  EXPECT_THROW(troupe::normalize(u, 0.5f, 0.0f), std::invalid_argument);
  EXPECT_THROW(troupe::normalize(u, 0.5f, -1.0f), std::invalid_argument);
  EXPECT_THROW(troupe::normalize(u, NAN, 1.0f), std::invalid_argument);
}

// ---- shuffling ---------------------------------------------------------------------------------

TEST(ShuffledIndices, IsAPermutation) {
  for (std::int64_t n : {0, 1, 2, 7, 1000}) {
    auto p = troupe::shuffled_indices(n, 11);
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, iota(n)) << "n = " << n;
  }
}

TEST(ShuffledIndices, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  EXPECT_EQ(troupe::shuffled_indices(1000, 7), troupe::shuffled_indices(1000, 7));
  EXPECT_NE(troupe::shuffled_indices(1000, 7), troupe::shuffled_indices(1000, 8));
  EXPECT_NE(troupe::shuffled_indices(1000, 7), iota(1000));
}

TEST(ShuffledIndices, GivesTheDocumentedSequenceOnEveryStandardLibrary) {
  // std::mt19937_64(42), Fisher–Yates from the back, bounded draws by rejection.
  const std::vector<std::int64_t> pinned = {1, 7, 9, 0, 3, 8, 4, 2, 5, 6};
  EXPECT_EQ(troupe::shuffled_indices(10, 42), pinned);
}

TEST(ShuffledIndices, DrawsEveryPermutationOfFourAboutEquallyOften) {
  std::map<std::vector<std::int64_t>, int> counts;
  constexpr int draws = 24000;
  for (int seed = 0; seed < draws; ++seed) ++counts[troupe::shuffled_indices(4, static_cast<std::uint64_t>(seed))];
  ASSERT_EQ(counts.size(), 24u);
  // Each count is binomial(24000, 1/24): mean 1000, standard deviation 31.
  for (const auto& [perm, count] : counts) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

TEST(ShuffledIndices, RejectsANegativeCount) {
  EXPECT_THROW(troupe::shuffled_indices(-1, 0), std::invalid_argument);
}

// ---- IID shards --------------------------------------------------------------------------------

TEST(ShardIid, CoversEveryIndexExactlyOnceWithSizesWithinOne) {
  const auto shards = troupe::shard_iid(1003, 10, 5);
  ASSERT_EQ(shards.size(), 10u);
  EXPECT_EQ(all_indices(shards), iota(1003));
  for (std::size_t c = 0; c < shards.size(); ++c) EXPECT_EQ(shards[c].size(), c < 3 ? 101u : 100u) << c;
}

TEST(ShardIid, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  EXPECT_EQ(troupe::shard_iid(500, 7, 1), troupe::shard_iid(500, 7, 1));
  EXPECT_NE(troupe::shard_iid(500, 7, 1), troupe::shard_iid(500, 7, 2));
}

TEST(ShardIid, GivesEmptyShardsWhenClientsOutnumberExamples) {
  const auto shards = troupe::shard_iid(3, 5, 0);
  EXPECT_EQ(all_indices(shards), iota(3));
  EXPECT_TRUE(shards[3].empty() && shards[4].empty());
}

TEST(ShardIid, RejectsFewerThanOneClient) {
  const std::string what = error_of<std::invalid_argument>([] { troupe::shard_iid(10, 0, 0); });
  EXPECT_TRUE(contains(what, "clients must be at least 1")) << what;
  EXPECT_THROW(troupe::shard_iid(-1, 2, 0), std::invalid_argument);
}

// ---- Dirichlet shards --------------------------------------------------------------------------

// 10 classes of 600 examples each, in a shuffled order.
tensor ten_class_labels() {
  bytes labels(6000);
  const auto order = troupe::shuffled_indices(6000, 99);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(order[i] % 10);
  return tensor::from<std::uint8_t>(labels, {6000});
}

struct skew {
  double classes_per_client;  // classes holding at least one example of the client
  double total_variation;     // mean distance between a client's label mix and the global one
};

skew measure(const tensor& labels, const std::vector<std::vector<std::int64_t>>& shards) {
  const auto y = labels.data<std::uint8_t>();
  skew out{0.0, 0.0};
  for (const auto& shard : shards) {
    std::array<double, 10> counts{};
    for (std::int64_t i : shard) counts[y[static_cast<std::size_t>(i)]] += 1.0;
    double tv = 0.0;
    for (double c : counts) {
      out.classes_per_client += c > 0 ? 1.0 : 0.0;
      tv += std::abs(c / static_cast<double>(shard.size()) - 0.1);
    }
    out.total_variation += tv / 2.0;
  }
  out.classes_per_client /= static_cast<double>(shards.size());
  out.total_variation /= static_cast<double>(shards.size());
  return out;
}

TEST(ShardDirichlet, CoversEveryIndexExactlyOnce) {
  const tensor labels = ten_class_labels();
  for (double alpha : {0.05, 0.1, 0.5, 1.0, 100.0}) {
    const auto shards = troupe::shard_dirichlet(labels, 20, alpha, 3);
    ASSERT_EQ(shards.size(), 20u);
    EXPECT_EQ(all_indices(shards), iota(6000)) << "alpha " << alpha;
    for (const auto& s : shards) EXPECT_GE(s.size(), 1u) << "alpha " << alpha;
  }
}

TEST(ShardDirichlet, IsDeterministicPerSeedAndDiffersAcrossSeeds) {
  const tensor labels = ten_class_labels();
  EXPECT_EQ(troupe::shard_dirichlet(labels, 20, 0.5, 1), troupe::shard_dirichlet(labels, 20, 0.5, 1));
  EXPECT_NE(troupe::shard_dirichlet(labels, 20, 0.5, 1), troupe::shard_dirichlet(labels, 20, 0.5, 2));
}

TEST(ShardDirichlet, SmallAlphaIsMoreSkewedThanLargeAlpha) {
  const tensor labels = ten_class_labels();
  const skew small = measure(labels, troupe::shard_dirichlet(labels, 20, 0.1, 4));
  const skew large = measure(labels, troupe::shard_dirichlet(labels, 20, 100.0, 4));
  EXPECT_LT(small.classes_per_client, 6.0);
  EXPECT_GT(small.total_variation, 0.5);
  EXPECT_EQ(large.classes_per_client, 10.0);
  EXPECT_LT(large.total_variation, 0.1);
}

TEST(ShardDirichlet, GivesEveryClientAtLeastMinSize) {
  const tensor labels = ten_class_labels();
  const auto shards = troupe::shard_dirichlet(labels, 30, 0.1, 6, 50);
  EXPECT_EQ(all_indices(shards), iota(6000));
  for (const auto& s : shards) EXPECT_GE(s.size(), 50u);
}

TEST(ShardDirichlet, AcceptsI32AndI64Labels) {
  const std::vector<std::int32_t> y32 = {0, 3, 3, 1, 0, 2, 1, 3};
  const std::vector<std::int64_t> y64(y32.begin(), y32.end());
  const auto a = troupe::shard_dirichlet(tensor::from<std::int32_t>(y32, {8}), 2, 1.0, 9);
  const auto b = troupe::shard_dirichlet(tensor::from<std::int64_t>(y64, {8}), 2, 1.0, 9);
  EXPECT_EQ(a, b);
  EXPECT_EQ(all_indices(a), iota(8));
}

TEST(ShardDirichlet, RejectsBadArgumentsSayingWhatToChange) {
  const tensor labels = ten_class_labels();
  for (double alpha : {0.0, -1.0, static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    const std::string what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 4, alpha, 0); });
    EXPECT_TRUE(contains(what, "alpha must be positive")) << what;
  }
  std::string what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 0, 1.0, 0); });
  EXPECT_TRUE(contains(what, "clients must be at least 1")) << what;
  what = error_of<std::invalid_argument>([&] { troupe::shard_dirichlet(labels, 100, 1.0, 0, 61); });
  EXPECT_TRUE(contains(what, "lower min_size or use fewer clients")) << what;
  EXPECT_THROW(troupe::shard_dirichlet(labels, 4, 1.0, 0, -1), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<std::uint8_t>({1, 2}, {1, 2}), 1, 1.0, 0), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<std::int32_t>({1, -2}, {2}), 1, 1.0, 0), std::invalid_argument);
  EXPECT_THROW(troupe::shard_dirichlet(tensor::from<float>({1.0f}, {1}), 1, 1.0, 0), std::invalid_argument);
}

TEST(ShardDirichlet, GivesUpWhenMinSizeCannotBeMet) {
  // One class of ten split by Dirichlet(0.001) between two clients almost never lands 5 and 5.
  const tensor labels = tensor::from<std::uint8_t>(bytes(10, 0), {10});
  const std::string what = error_of<std::runtime_error>([&] { troupe::shard_dirichlet(labels, 2, 0.001, 0, 5); });
  EXPECT_TRUE(contains(what, "lower min_size, raise alpha or use fewer clients")) << what;
}

// ---- batching ----------------------------------------------------------------------------------

TEST(GatherRows, CopiesTheSelectedRows) {
  std::mt19937 g(12);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(10 * 7);
  for (float& v : values) v = u(g);
  const tensor source = tensor::from<float>(values, {10, 7});
  const std::vector<std::int64_t> rows = {3, 0, 9, 3};
  tensor out = tensor::empty({4, 7});
  troupe::gather_rows(source, rows, out);
  const auto got = out.data<float>();
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < 7; ++j)
      EXPECT_EQ(got[i * 7 + j], values[static_cast<std::size_t>(rows[i]) * 7 + j]) << i << ", " << j;
}

TEST(GatherRows, FlattensU8ImagesIntoRows) {
  const bytes pixels = random_bytes(5 * 28 * 28, 13);
  const tensor images = tensor::from<std::uint8_t>(pixels, {5, 28, 28});
  const std::vector<std::int64_t> rows = {4, 1};
  tensor out = tensor::empty({2, 784}, dtype::u8);
  troupe::gather_rows(images, rows, out);
  const auto got = out.data<std::uint8_t>();
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 784, pixels.begin() + 4 * 784));
  EXPECT_TRUE(std::equal(got.begin() + 784, got.end(), pixels.begin() + 784, pixels.begin() + 2 * 784));

  const tensor fresh = troupe::gather_rows(images, rows);
  EXPECT_EQ(fresh.shape(), (tensor::shape_type{2, 28, 28}));
  const auto again = fresh.data<std::uint8_t>();
  EXPECT_TRUE(std::equal(again.begin(), again.end(), got.begin(), got.end()));
}

TEST(GatherRows, RejectsOutOfRangeIndices) {
  const tensor source = tensor::from<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  tensor out = tensor::empty({1, 2});
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{3}, std::int64_t{1} << 40}) {
    const std::vector<std::int64_t> rows = {bad};
    const std::string what = error_of<std::out_of_range>([&] { troupe::gather_rows(source, rows, out); });
    EXPECT_TRUE(contains(what, "row index " + std::to_string(bad))) << what;
  }
}

TEST(GatherRows, RejectsMismatchedShapesDtypesAndOverlap) {
  const tensor source = tensor::from<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const std::vector<std::int64_t> rows = {0, 2};
  tensor wrong_rows = tensor::empty({3, 2});
  tensor wrong_width = tensor::empty({2, 3});
  tensor wrong_type = tensor::empty({2, 2}, dtype::u8);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_rows), std::invalid_argument);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_width), std::invalid_argument);
  EXPECT_THROW(troupe::gather_rows(source, rows, wrong_type), std::invalid_argument);
  tensor inside = source.slice(1, 3);
  const std::string what = error_of<std::invalid_argument>([&] { troupe::gather_rows(source, rows, inside); });
  EXPECT_TRUE(contains(what, "overlaps")) << what;
}

TEST(BatchIterator, WalksTheListInBatchesWithASmallerLastOne) {
  const auto indices = troupe::shuffled_indices(10, 1);
  troupe::batch_iterator batches(indices, 4);
  EXPECT_EQ(batches.count(), 3);
  std::vector<std::size_t> sizes;
  std::vector<std::int64_t> seen;
  while (auto batch = batches.next()) {
    sizes.push_back(batch->size());
    seen.insert(seen.end(), batch->begin(), batch->end());
  }
  EXPECT_EQ(sizes, (std::vector<std::size_t>{4, 4, 2}));
  EXPECT_EQ(seen, indices);
  EXPECT_FALSE(batches.next().has_value());
  // A batch larger than the list: one batch (the count must not overflow).
  EXPECT_EQ(troupe::batch_iterator(indices, std::numeric_limits<std::int64_t>::max()).count(), 1);
}

TEST(BatchIterator, DropsThePartialLastBatchWhenAsked) {
  const auto indices = iota(10);
  troupe::batch_iterator batches(indices, 4, /*drop_last=*/true);
  EXPECT_EQ(batches.count(), 2);
  int n = 0;
  while (auto batch = batches.next()) {
    EXPECT_EQ(batch->size(), 4u);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

TEST(BatchIterator, StartsAgainAfterReset) {
  const auto indices = iota(5);
  troupe::batch_iterator batches(indices, 5);
  ASSERT_TRUE(batches.next().has_value());
  EXPECT_FALSE(batches.next().has_value());
  batches.reset();
  const auto batch = batches.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->front(), 0);
}

TEST(BatchIterator, RejectsABatchSizeBelowOne) {
  const auto indices = iota(5);
  EXPECT_THROW(troupe::batch_iterator(indices, 0), std::invalid_argument);
}

}  // namespace
