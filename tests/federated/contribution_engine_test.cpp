// --contribution in the simulation: a round's values against the validation accuracies measured
// here, the estimators' efficiency on real rounds, the CSV and the rewards of a run, refusals.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "troupe/federated/contribution.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

#include "support.hpp"

namespace {

using namespace troupe::federated;
using namespace test_support;

simulation_options valued(const std::string& method) {
  auto o = small("fedavg", 2);
  o.per_round = 4;
  o.rounds = 2;
  o.contribution = method;
  o.validation = 300;
  return o;
}

/// Validation accuracy measured here: a trainer of the options' model whose test set is the last
/// `validation` training rows.
double validation_accuracy(const simulation_options& o, std::span<const float> model) {
  auto held = std::make_shared<troupe::labelled_data>(*fashion());
  const auto n = fashion()->train.size(), first = n - static_cast<std::int64_t>(o.validation);
  held->test.images = fashion()->train.images.slice(first, n).clone();
  held->test.labels = fashion()->train.labels.slice(first, n).clone();
  auto plain = o;
  plain.test_limit = 0;
  return make_trainer_factory(plain)(held)->evaluate(model).accuracy;
}

TEST(Contribution, ExactValuesOfARoundSumToTheValidationGainOfFedAvgsStep) {
  const auto o = valued("exact");
  simulation sim(o, fashion());
  for (int r = 0; r < 2; ++r) {
    const auto before = model_of(sim);
    (void)sim.run_round();
    const auto* t = sim.contributions();
    ASSERT_NE(t, nullptr);
    const double gain = validation_accuracy(o, sim.global_model()) - validation_accuracy(o, before);
    EXPECT_DOUBLE_EQ(t->last_gain(), gain) << "the grand coalition's model is FedAvg's next model";
    const auto& v = t->last_estimate().values;
    ASSERT_EQ(v.size(), 4u);
    EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0), gain, 1e-12) << "efficiency";
    EXPECT_EQ(t->last_estimate().evaluations, 15u);
    EXPECT_EQ(t->last_participants(), sim.participants(r + 1));
  }
  EXPECT_EQ(sim.contributions()->rounds_valued(), 2u);
}

TEST(Contribution, PermutationEstimatorsAreEfficientOnARealRound) {
  for (const char* method : {"mc:3", "gtg:0"}) {
    simulation sim(valued(method), fashion());
    (void)sim.run_round();
    const auto* t = sim.contributions();
    const auto& v = t->last_estimate().values;
    EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0), t->last_gain(), 1e-12) << method;
  }
}

TEST(Contribution, AFreeRiderIsANullPlayerUnderTheShareModel) {
  // scale:P:0: the malicious clients return the model they were given (an update of zeros).
  auto o = valued("exact");
  o.attack = "scale:0.5:0";
  o.coalition_model = "share";
  simulation sim(o, fashion());
  std::size_t free_riders = 0;
  for (int r = 0; r < 2; ++r) {
    const auto before = model_of(sim);
    (void)sim.run_round();
    const auto* t = sim.contributions();
    const auto& v = t->last_estimate().values;
    const double gain = validation_accuracy(o, sim.global_model()) - validation_accuracy(o, before);
    EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0), gain, 1e-12) << "all together are still FedAvg's step";
    for (std::size_t i = 0; i < v.size(); ++i)
      if (is_malicious(t->last_participants()[i], 0.5, o.seed)) {
        EXPECT_EQ(v[i], 0.0) << "client " << t->last_participants()[i];
        ++free_riders;
      }
  }
  ASSERT_GT(free_riders, 0u) << "no free rider took part: the test would prove nothing";
}

TEST(Contribution, RunWritesTheCsvAndPaysTheBudgetExactly) {
  auto o = valued("mc:4");
  o.data_dir.clear();
  o.train_limit = 3000;
  o.rounds = 3;
  o.window = 0;
  o.contributions_file = temp_file("contributions.csv");
  o.reward_budget = "2.5:0.1";
  const auto s = run_simulation(o);
  EXPECT_EQ(s.contribution_rounds, 3u);
  EXPECT_DOUBLE_EQ(s.rewards_total, 7.5);
  std::set<std::uint64_t> took_part;
  simulation sim(o, fashion());
  for (int r = 1; r <= 3; ++r)
    for (auto c : sim.participants(r)) took_part.insert(c);
  std::ifstream in(o.contributions_file);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "client,rounds,shapley,reward,malicious");
  std::set<std::uint64_t> rows;
  double paid = 0;
  std::size_t rounds = 0;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string client, count, value, reward, bad;
    std::getline(fields, client, ',');
    std::getline(fields, count, ',');
    std::getline(fields, value, ',');
    std::getline(fields, reward, ',');
    std::getline(fields, bad, ',');
    rows.insert(std::stoull(client));
    rounds += std::stoul(count);
    paid += std::stod(reward);
    EXPECT_GE(std::stod(reward), 0.25 - 1e-9) << "each round's floor, 0.1 B, at least once";
    EXPECT_EQ(bad, "0");
  }
  EXPECT_EQ(rows, took_part);
  EXPECT_EQ(rounds, 12u);
  EXPECT_NEAR(paid, 7.5, 1e-6);
  std::remove(o.contributions_file.c_str());
}

TEST(Contribution, RefusesWhatCannotWork) {
  auto refused = [](simulation_options o, const std::string& words) {
    expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, words);
  };
  auto o = valued("exact");
  o.per_round = 13;
  refused(o, "more than 12");
  o = valued("exact");
  o.secagg = true;
  refused(o, "only the sum");
  o = valued("gtg:0.01");
  o.async = "fedbuff:2";
  refused(o, "no rounds");
  o = valued("mc:5");
  o.dp_clip = 1;
  o.dp_noise = 1;
  refused(o, "privacy");
  o = valued("mc:5");
  o.checkpoint = temp_file("ckpt");
  refused(o, "checkpoints");
  o = valued("mc:5");
  o.trainer = "noop";
  refused(o, "--trainer mlp");
  o = valued("mc:5");
  o.validation = 3000;
  refused(o, "leaves no training examples");
  o = valued("mc:5");
  o.coalition_model = "median";
  refused(o, "--coalition-model 'median'");
  o = valued("mc:0");
  refused(o, "P (permutations)");
  o = valued("");
  o.contributions_file = temp_file("never.csv");
  refused(o, "give --contribution too");
  o = valued("");
  o.reward_budget = "10";
  refused(o, "give --contribution too");
  o = valued("exact");
  o.reward_budget = "10:2";
  refused(o, "FLOOR_FRACTION");
  o = valued("exact");
  o.data_dir.clear();
  o.train_limit = 3000;
  o.contributions_file = "/nonexistent-dir/values.csv";
  expect_error<std::runtime_error>([&] { (void)run_simulation(o); }, "cannot write the --contributions file");
}

}  // namespace
