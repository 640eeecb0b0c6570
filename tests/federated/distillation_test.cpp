// Heterogeneous models by knowledge distillation: the pieces against their definitions (the
// model list, the KL and L1 losses with their gradients, the consensus), the distiller, and
// FedAvg-within-architecture, FedDF and FedMD runs.

#include "troupe/federated/distillation.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;
using test_support::fashion;
using test_support::random_values;

TEST(Distillation, ModelListSplitsOutsideParentheses) {
  const auto m = split_model_list("mlp:784-100-10, sequential(linear(784->10), relu, linear(10->10))");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], "mlp:784-100-10");
  EXPECT_EQ(m[1], "sequential(linear(784->10), relu, linear(10->10))");
  EXPECT_EQ(split_model_list("mlp:784-10").size(), 1u);
  expect_error<std::invalid_argument>([] { (void)split_model_list(""); }, "empty model");
  expect_error<std::invalid_argument>([] { (void)split_model_list("a,,b"); }, "empty model");
  expect_error<std::invalid_argument>([] { (void)split_model_list("sequential(relu"); }, "without its ')'");
  expect_error<std::invalid_argument>([] { (void)split_model_list("relu)"); }, "without its '('");
}

TEST(Distillation, KlIsZeroAtTheTeacherAndItsGradientIsExact) {
  const int rows = 3, classes = 5;
  const auto t = random_values(rows * classes, 1, 3), s0 = random_values(rows * classes, 2, 3);
  std::vector<float> d(t.size());
  EXPECT_NEAR(kl_distillation(t.data(), t.data(), rows, classes, 1.0, d.data()), 0.0, 1e-12);
  for (float g : d) EXPECT_NEAR(g, 0.0f, 1e-9f);
  for (double temperature : {1.0, 2.5}) {
    auto s = s0;
    (void)kl_distillation(s.data(), t.data(), rows, classes, temperature, d.data());
    for (std::size_t i = 0; i < s.size(); ++i) {
      const float keep = s[i], h = 1e-2f;
      s[i] = keep + h;
      const double up = kl_distillation(s.data(), t.data(), rows, classes, temperature, nullptr);
      s[i] = keep - h;
      const double down = kl_distillation(s.data(), t.data(), rows, classes, temperature, nullptr);
      s[i] = keep;
      EXPECT_NEAR(d[i], (up - down) / (2 * h), 2e-4) << "T " << temperature << " [" << i << "]";
    }
    EXPECT_GT(kl_distillation(s.data(), t.data(), rows, classes, temperature, nullptr), 0);
  }
  expect_error<std::invalid_argument>([&] { (void)kl_distillation(t.data(), t.data(), rows, classes, 0, nullptr); },
                                      "temperature");
}

TEST(Distillation, L1IsTheMeanAbsoluteDifference) {
  const float s[4] = {1, -2, 3, 0.5f}, t[4] = {0, -2, 5, 1};
  float d[4];
  EXPECT_DOUBLE_EQ(l1_distillation(s, t, 2, 2, d), (1 + 0 + 2 + 0.5) / 4);
  EXPECT_EQ(d[0], 0.25f);
  EXPECT_EQ(d[1], 0.0f);
  EXPECT_EQ(d[2], -0.25f);
  EXPECT_EQ(d[3], -0.25f);
}

// FedMD's consensus of identical models is each model's logits, bit for bit.
TEST(Distillation, ConsensusOfIdenticalLogitsIsEach) {
  const auto l = random_values(40, 3, 5);
  std::vector<float> out;
  mean_logits(std::vector<std::vector<float>>(7, l), out);
  EXPECT_EQ(out, l);
  mean_logits(std::vector<std::vector<float>>{{1, 2}, {3, 6}}, out);
  EXPECT_EQ(out, (std::vector<float>{2, 4}));
  expect_error<std::invalid_argument>([&] { mean_logits(std::vector<std::vector<float>>{{1}, {1, 2}}, out); }, "sizes");
}

TEST(Distillation, DistillerMovesTowardsItsTeacherAndStaysAtItsOwnLogits) {
  distiller d("mlp:20-16-4", 20, 1e-2);
  std::vector<float> w(d.parameter_count());
  const auto start = random_values(w.size(), 4, 0.3);
  d.load(start);
  const auto x = random_values(8 * 20, 5);
  std::vector<float> own;
  d.logits(x.data(), 8, own);
  (void)d.step(x.data(), own.data(), 8, distiller::loss::kl);  // zero gradient: Adam does not move
  d.store(w);
  EXPECT_EQ(w, start);

  const auto teacher = random_values(8 * 4, 6, 4);
  const double first = d.step(x.data(), teacher.data(), 8, distiller::loss::kl);
  double last = first;
  for (int s = 0; s < 200; ++s) last = d.step(x.data(), teacher.data(), 8, distiller::loss::kl);
  EXPECT_LT(last, 0.2 * first) << first << " -> " << last;
}

simulation_options kd_run(const std::string& strategy) {
  simulation_options o;
  o.clients = 6;
  o.per_round = 4;
  o.rounds = 2;
  o.partition = "dirichlet:0.5";
  o.strategy = strategy;
  o.client_models = "mlp:784-16-10,mlp:784-8-10";
  o.public_examples = 400;
  o.distill_steps = 5;
  o.test_limit = 500;
  o.threads = 2;
  o.seed = 9;
  return o;
}

TEST(Distillation, FedDfWithoutStepsIsFedAvgWithinEachArchitecture) {
  auto a = kd_run("fedavg"), b = kd_run("feddf");
  b.distill_steps = 0;
  const auto models = split_model_list(a.client_models);
  const auto x = run_heterogeneous(a, models, {}, fashion());
  const auto y = run_heterogeneous(b, models, {}, fashion());
  ASSERT_EQ(x.accuracies.size(), 2u);
  EXPECT_EQ(x.accuracies, y.accuracies);
  for (double v : x.accuracies) EXPECT_GT(v, 0.3);
}

TEST(Distillation, FedDfAndFedMdTrainEveryArchitecture) {
  for (const char* strategy : {"feddf", "fedmd"}) {
    auto o = kd_run(strategy);
    std::vector<heterogeneous_progress> seen;
    const auto s = run_heterogeneous(o, split_model_list(o.client_models), [&](const heterogeneous_progress& p) { seen.push_back(p); },
                                     fashion());
    ASSERT_EQ(seen.size(), 2u) << strategy;
    ASSERT_EQ(s.accuracies.size(), 2u) << strategy;
    for (double v : s.accuracies) EXPECT_GT(v, 0.3) << strategy;
    if (std::string(strategy) == "feddf") {
      EXPECT_GT(seen.back().distill_loss, 0) << strategy;
    }
  }
}

TEST(Distillation, RefusesWhatItCannotRun) {
  const auto models = split_model_list("mlp:784-16-10,mlp:784-8-10");
  auto o = kd_run("feddf");
  o.secagg = true;
  expect_error<std::invalid_argument>([&] { (void)run_heterogeneous(o, models, {}, fashion()); }, "--secagg");
  o = kd_run("scaffold");
  expect_error<std::invalid_argument>([&] { (void)run_heterogeneous(o, models, {}, fashion()); }, "fedavg (within");
  o = kd_run("feddf");
  o.public_examples = 3000;
  expect_error<std::invalid_argument>([&] { (void)run_heterogeneous(o, models, {}, fashion()); }, "leaves no training");
  o = kd_run("feddf");
  expect_error<std::invalid_argument>([&] { (void)run_heterogeneous(o, split_model_list("mlp:784-16-3"), {}, fashion()); },
                                      "classes");
  o = kd_run("feddf");
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "run_heterogeneous");
}

}  // namespace
}  // namespace troupe::federated
