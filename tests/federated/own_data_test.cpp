// A simulation on data that is not Fashion-MNIST: f32 features, its own number of classes, and
// the clients' own partition (client_train).

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "troupe/federated/partition.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

#include "support.hpp"

namespace {

using namespace troupe::federated;
using test_support::expect_error;

/// Three well separated clusters of 8 features; training example i belongs to client i % 4.
shared_data clusters() {
  auto d = std::make_shared<troupe::labelled_data>();
  std::mt19937 g(3);
  std::normal_distribution<float> noise(0, 0.3f);
  auto make = [&](int n, troupe::dataset& out) {
    out.images = troupe::tensor::empty({n, 8}, troupe::dtype::f32);
    out.labels = troupe::tensor::empty({n}, troupe::dtype::u8);
    auto x = out.images.data<float>();
    auto y = out.labels.data<std::uint8_t>();
    for (int i = 0; i < n; ++i) {
      y[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % 3);
      for (int k = 0; k < 8; ++k) x[static_cast<std::size_t>(i) * 8 + k] = (k == 2 * (i % 3) ? 2.0f : 0.0f) + noise(g);
    }
  };
  make(240, d->train);
  make(60, d->test);
  d->classes = 3;
  std::vector<std::uint32_t> owner(240);
  for (std::uint32_t i = 0; i < 240; ++i) owner[i] = i % 4;
  d->client_train = troupe::tensor::from<std::uint32_t>(owner, {240});
  return d;
}

simulation_options on_clusters() {
  simulation_options o;
  o.clients = 4;
  o.per_round = 2;
  o.rounds = 10;
  o.model = "mlp:8-6-3";
  o.lr = 0.1;
  return o;
}

TEST(OwnData, LearnsFloatFeaturesWithTheirOwnClassesAndPartition) {
  simulation sim(on_clusters(), clusters());
  for (int r = 0; r < 10; ++r) sim.run_round();
  EXPECT_GT(sim.evaluate().accuracy, 0.95);
}

TEST(OwnData, RefusesAPopulationThatDoesNotMatchTheDatasPartition) {
  auto o = on_clusters();
  o.clients = 5;
  expect_error<std::invalid_argument>([&] { simulation sim(o, clusters()); }, "run with --clients 4");
  o = on_clusters();
  o.model = "mlp:8-6-10";
  expect_error<std::invalid_argument>([&] { simulation sim(o, clusters()); }, "has 10 outputs; the data has 3 classes");
  o = on_clusters();
  o.data = "csv:file";
  expect_error<std::invalid_argument>([&] { simulation sim(o, clusters()); }, "use npz:FILE or idx:DIR");
}

TEST(OwnData, TheAssignedPartitionKeepsEachClientsExamplesInOrder) {
  const std::vector<std::uint32_t> owner{2, 0, 2, 1, 0, 2};
  const partition p = partition_assigned(troupe::tensor::from<std::uint32_t>(owner, {6}), 4);
  ASSERT_EQ(p.clients(), 4u);
  EXPECT_EQ(std::vector<std::uint32_t>(p.shard(0).begin(), p.shard(0).end()), (std::vector<std::uint32_t>{1, 4}));
  EXPECT_EQ(std::vector<std::uint32_t>(p.shard(1).begin(), p.shard(1).end()), (std::vector<std::uint32_t>{3}));
  EXPECT_EQ(std::vector<std::uint32_t>(p.shard(2).begin(), p.shard(2).end()), (std::vector<std::uint32_t>{0, 2, 5}));
  EXPECT_TRUE(p.shard(3).empty());
  EXPECT_THROW(partition_assigned(troupe::tensor::from<std::uint32_t>(owner, {6}), 2), std::invalid_argument);
}

}  // namespace
