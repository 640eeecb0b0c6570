// SplitFed: one client is plain SGD on the whole model, bit for bit; several clients train;
// bad options are refused.

#include <gtest/gtest.h>

#include <cstring>

#include "support.hpp"
#include "troupe/federated/splitfed.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;

splitfed_options small_splitfed(std::size_t clients) {
  splitfed_options o;
  o.model = "mlp:784-32-16-10";
  o.clients = clients;
  o.rounds = 2;
  o.batch = 16;
  o.lr = 0.05;
  o.seed = 9;
  o.test_limit = 1000;
  return o;
}

TEST(SplitFed, OneClientIsPlainSgdOnTheWholeModelBitForBit) {
  // The bottom and the top are the whole MLP's layers with the same shapes, stepped by the same
  // SGD on the same batches: the same float operations. The top's step comes before the
  // bottom's backward, which reads only the cut gradient the top computed before it stepped;
  // FedAvg over one client weighs it by exactly 1.
  const auto o = small_splitfed(1);
  const auto split = run_splitfed(o, test_support::fashion());
  const auto plain = splitfed_reference(o, test_support::fashion());
  ASSERT_EQ(split.model.size(), plain.size());
  EXPECT_EQ(std::memcmp(split.model.data(), plain.data(), plain.size() * sizeof(float)), 0);
  EXPECT_GT(split.final_accuracy, 0.6);
}

TEST(SplitFed, SeveralClientsTrainAndCountTheirBytes) {
  const auto s = run_splitfed(small_splitfed(5), test_support::fashion());
  EXPECT_GT(s.final_accuracy, 0.6);
  // Per step up to 16 rows: 32 activations and a label up, 32 gradients down per row.
  EXPECT_GT(s.bytes_per_step, 0);
  EXPECT_LE(s.bytes_per_step, 16.0 * (32 * 4 + 1 + 32 * 4));
  EXPECT_GE(s.steps, 3000 / 16 * 2);
}

TEST(SplitFed, RefusesOptionsThatCannotRun) {
  auto o = small_splitfed(2);
  o.model = "relu";
  expect_error<std::invalid_argument>([&] { run_splitfed(o, test_support::fashion()); }, "needs an MLP");
  o = small_splitfed(2);
  o.partition = "shards:2";
  expect_error<std::invalid_argument>([&] { run_splitfed(o, test_support::fashion()); }, "iid or dirichlet");
  o = small_splitfed(5000);
  expect_error<std::invalid_argument>([&] { run_splitfed(o, test_support::fashion()); }, "more than the 3000");
  o = small_splitfed(2);
  expect_error<std::invalid_argument>([&] { splitfed_reference(o, test_support::fashion()); }, "one client");
}

}  // namespace
}  // namespace troupe::federated
