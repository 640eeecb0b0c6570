#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <troupe/federated/simulation.hpp>
#include <troupe/federated/unlearn.hpp>

namespace {

using namespace troupe::federated;

simulation_options small_run() {
  simulation_options o;
  o.clients = 10;
  o.per_round = 4;
  o.rounds = 4;
  o.eval_every = 4;
  o.train_limit = 3000;
  o.test_limit = 500;
  o.partition = "iid";
  o.threads = 2;
  o.seed = 3;
  return o;
}

double figure(const summary& s, const std::string& name) {
  for (const auto& [n, v] : s.final_metrics)
    if (n == name) return v;
  ADD_FAILURE() << "no figure " << name;
  return std::nan("");
}

TEST(Unlearning, ExcludedClientsAreDroppedFromTheSameDraws) {
  auto o = small_run();
  simulation plain(o);
  o.excluded = {1, 3};
  simulation without(o);
  bool met = false;
  for (int r = 1; r <= 8; ++r) {
    auto expected = plain.sample(r);
    met |= std::erase_if(expected, [](std::uint64_t c) { return c == 1 || c == 3; }) > 0;
    EXPECT_EQ(without.sample(r), expected) << "round " << r;
  }
  EXPECT_TRUE(met) << "the draws never picked client 1 or 3: the test shows nothing";
  EXPECT_THROW(without.exclude_clients(std::vector<std::uint64_t>{10}), std::invalid_argument);
}

TEST(Unlearning, RetrainIsBitIdenticalToARunThatNeverHadThem) {
  auto o = small_run();
  o.unlearn = "1,3";
  o.unlearn_at = 2;
  o.unlearn_method = "retrain";
  const summary unlearned = run_simulation(o);
  auto never = small_run();
  never.excluded = {1, 3};
  const summary clean = run_simulation(never);
  EXPECT_EQ(unlearned.model_crc32, clean.model_crc32);
  EXPECT_EQ(unlearned.final_accuracy, clean.final_accuracy);
  EXPECT_EQ(unlearned.rounds, 4);
  EXPECT_EQ(figure(unlearned, "unlearn_rounds"), 2);
  // With them the model differs: the exclusion removed something.
  const summary with = run_simulation(small_run());
  EXPECT_NE(with.model_crc32, clean.model_crc32);
}

TEST(Unlearning, MembershipAdvantageIsTheLargestGapOverThresholds) {
  // tau = 0.2: 2/3 of the members, none of the others; tau = 0.9: all of both.
  EXPECT_NEAR(membership_advantage(std::vector<double>{0.1, 0.2, 0.9}, std::vector<double>{0.3, 0.5, 0.8}), 2.0 / 3, 1e-12);
  EXPECT_EQ(membership_advantage(std::vector<double>{1, 2}, std::vector<double>{1, 2}), 0);
  // Members with higher losses than everyone else: no threshold separates them that way.
  EXPECT_EQ(membership_advantage(std::vector<double>{5, 6}, std::vector<double>{1, 2}), 0);
  EXPECT_EQ(membership_advantage(std::vector<double>{1}, std::vector<double>{2}), 1);
  EXPECT_THROW(membership_advantage(std::vector<double>{}, std::vector<double>{1}), std::invalid_argument);
}

TEST(Unlearning, ParsesItsSpecsAndRefusesWhatCannotRun) {
  EXPECT_EQ(parse_unlearn_method("retrain").type, unlearn_method::kind::retrain);
  EXPECT_EQ(parse_unlearn_method("pga").rounds, 5);
  EXPECT_EQ(parse_unlearn_method("pga:3").rounds, 3);
  EXPECT_THROW(parse_unlearn_method("pga:x"), std::invalid_argument);
  EXPECT_THROW(parse_unlearn_method("sisa"), std::invalid_argument);
  EXPECT_EQ(parse_unlearn_method("calibrate").interval, 5);
  EXPECT_EQ(parse_unlearn_method("calibrate:2").type, unlearn_method::kind::calibrate);
  EXPECT_EQ(parse_unlearn_method("calibrate:2").interval, 2);
  EXPECT_THROW(parse_unlearn_method("calibrate:0"), std::invalid_argument);
  auto o = small_run();
  o.unlearn = "3,0,3";
  o.unlearn_at = 2;
  EXPECT_EQ(unlearn_clients(o), (std::vector<std::uint64_t>{0, 3}));
  EXPECT_NO_THROW(check_unlearn_options(o));
  auto bad = o;
  bad.unlearn = "10";
  EXPECT_THROW(unlearn_clients(bad), std::invalid_argument);
  bad.unlearn = "1,,2";
  EXPECT_THROW(unlearn_clients(bad), std::invalid_argument);
  bad.unlearn = "0,1,2,3,4,5,6,7,8,9";
  EXPECT_THROW(unlearn_clients(bad), std::invalid_argument);
  bad.unlearn = "attackers";
  EXPECT_THROW(unlearn_clients(bad), std::invalid_argument);  // no --attack
  bad = o;
  bad.unlearn_at = 5;  // past --rounds 4
  EXPECT_THROW(check_unlearn_options(bad), std::invalid_argument);
  bad = o;
  bad.checkpoint = "/tmp/x";
  EXPECT_THROW(check_unlearn_options(bad), std::invalid_argument);
  bad = o;
  bad.unlearn_method = "pga";
  bad.trainer = "noop";
  EXPECT_THROW(check_unlearn_options(bad), std::invalid_argument);
  bad = o;
  bad.unlearn_method = "calibrate";
  bad.strategy = "fedadam";
  EXPECT_THROW(check_unlearn_options(bad), std::invalid_argument);
  bad.strategy = "fedavg";
  bad.secagg = true;
  EXPECT_THROW(check_unlearn_options(bad), std::invalid_argument);
  auto none = small_run();
  none.unlearn_at = 2;
  EXPECT_THROW(check_unlearn_options(none), std::invalid_argument);
  none.unlearn_at = 0;
  none.unlearn_method = "pga";
  EXPECT_THROW(check_unlearn_options(none), std::invalid_argument);
  // A simulation refuses them too.
  EXPECT_THROW(simulation{none}, std::invalid_argument);
}

TEST(Unlearning, PgaRadiusIsASqrtThirdOfTheSquaredDistanceToTheInitialModel) {
  // Halimi et al.'s code bounds the squared distance to the reference by a third of the squared
  // distance from the reference to a random model (here the run's initial model).
  const std::vector<float> ref{3, 4, 0}, init{0, 0, 0};
  EXPECT_DOUBLE_EQ(pga_radius(ref, init), 5 / std::sqrt(3.0));
  EXPECT_EQ(pga_radius(ref, ref), 0);
  EXPECT_THROW(pga_radius(ref, std::vector<float>{1, 2}), std::invalid_argument);
}

TEST(Unlearning, ProjectedGradientAscentTakesTheBackdoorOut) {
  auto o = small_run();
  o.per_round = 10;
  o.rounds = 10;
  o.eval_every = 10;
  o.attack = "backdoor:0.3:0";
  o.unlearn = "attackers";
  o.unlearn_at = 8;
  o.unlearn_method = "pga:1";
  const summary s = run_simulation(o);
  EXPECT_EQ(figure(s, "unlearn_rounds"), 3);
  EXPECT_GT(figure(s, "pga_ascent_steps"), 0);
  // Every step is projected back onto the ball around the reference: the ascent ends inside it
  // (on its surface here, the loss still rising at the last step).
  EXPECT_GT(figure(s, "pga_radius"), 0);
  EXPECT_LE(figure(s, "pga_distance"), figure(s, "pga_radius") * (1 + 1e-6));
  EXPECT_GT(figure(s, "pga_distance"), 0.99 * figure(s, "pga_radius"));
  const double before = figure(s, "backdoor_success_before_unlearning"), after = figure(s, "unlearned_backdoor_success");
  EXPECT_GT(before, 0.5) << "the backdoor did not take: the test shows nothing";
  EXPECT_LT(after, 0.5 * before);
  EXPECT_GT(figure(s, "unlearned_accuracy"), 0.6);
  EXPECT_GE(figure(s, "mia_advantage_removed"), 0);
  EXPECT_LE(figure(s, "mia_advantage_unseen"), 1);
}

TEST(Unlearning, FedEraserReplaysTheStoredRoundsAndReportsTheirStorage) {
  auto o = small_run();
  o.per_round = 10;
  o.rounds = 10;
  o.eval_every = 10;
  o.attack = "backdoor:0.3:0";
  o.unlearn = "attackers";
  o.unlearn_at = 8;
  o.unlearn_method = "calibrate:3";
  const summary s = run_simulation(o);
  // Rounds 1, 4 and 7 stored, every client of each (10 per round), 79,510 floats each.
  EXPECT_EQ(figure(s, "unlearn_rounds"), 3);
  EXPECT_EQ(figure(s, "unlearn_storage_bytes"), 3 * 10 * 79510 * 4.0);
  const double before = figure(s, "backdoor_success_before_unlearning"), after = figure(s, "unlearned_backdoor_success");
  EXPECT_GT(before, 0.5) << "the backdoor did not take: the test shows nothing";
  EXPECT_LT(after, 0.5 * before);
  EXPECT_GT(figure(s, "unlearned_accuracy"), 0.5);
  EXPECT_EQ(s.rounds, 10);
}

}  // namespace
