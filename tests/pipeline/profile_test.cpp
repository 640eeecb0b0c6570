#include <gtest/gtest.h>

#include <troupe/pipeline/partition.hpp>
#include <troupe/pipeline/profile.hpp>

namespace {

using namespace troupe;

TEST(Profile, MeasuresEveryLayerOfARealModel) {
  auto model = kernels::make_mlp("mlp:64-32-8");
  auto p = pipeline::profile_layers(*model, 16, 3);
  ASSERT_EQ(p.names.size(), 3u);
  EXPECT_EQ(p.names[0], "linear(64->32)");
  EXPECT_EQ(p.names[1], "relu");
  for (double c : p.cost_us) EXPECT_GT(c, 0.0);
  // A linear layer keeps its input for the weight gradient; ReLU keeps its output.
  EXPECT_EQ(p.activation_bytes[0], 16.0 * 64 * 4);
  EXPECT_EQ(p.activation_bytes[1], 16.0 * 32 * 4);
  // The costs feed the partitioner like given ones.
  auto part = pipeline::partition_balanced(p.cost_us, 2);
  EXPECT_EQ(part.boundaries.front(), 0u);
  EXPECT_EQ(part.boundaries.back(), 3u);
  EXPECT_THROW(pipeline::profile_layers(*model, 0, 3), std::invalid_argument);
}

}  // namespace
