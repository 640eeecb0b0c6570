// Concept drift in the simulation: the clients' error streams, the injected label swap, the
// alarms, and the responses (reset, cluster).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "support.hpp"
#include "troupe/federated/drift.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

namespace {

using namespace troupe::federated;
using test_support::expect_error;

/// The first 12,000 Fashion-MNIST training images and the first 2,000 test images: ten clients
/// of 1,200 examples, so that a round gives each detector 1,200 errors.
const shared_data& fashion12k() {
  static const shared_data data = [] {
    auto all = troupe::load_fashion_mnist();
    all.train.images = all.train.images.slice(0, 12000).clone();
    all.train.labels = all.train.labels.slice(0, 12000).clone();
    all.test.images = all.test.images.slice(0, 2000).clone();
    all.test.labels = all.test.labels.slice(0, 2000).clone();
    return std::make_shared<const troupe::fashion_mnist>(std::move(all));
  }();
  return data;
}

/// Ten clients, all in every round; from round 5 three of them swap trousers (1) and sneakers
/// (7), classes the model learns well in four rounds, so that the swap raises their error rate
/// by about 0.18.
simulation_options drifting(const std::string& detect, const std::string& response = "") {
  simulation_options o;
  o.clients = 10;
  o.per_round = 10;
  o.rounds = 8;
  o.model = "mlp:784-32-10";
  o.partition = "iid";
  o.lr = 0.05;
  o.seed = 3;
  o.drift = "swap:5:0.3:1-7";
  o.drift_detect = detect;
  o.drift_response = response;
  return o;
}

struct run_result {
  std::vector<std::pair<int, std::vector<std::uint64_t>>> alarms;
  std::vector<char> drifted, cluster;
  std::vector<std::vector<float>> models;  // the global model after each round
  evaluation last;
};

run_result run(const simulation_options& o) {
  simulation sim(o, fashion12k());
  run_result r;
  for (int round = 1; round <= o.rounds; ++round) {
    const round_report rr = sim.run_round();
    if (!rr.drift_alarms.empty()) r.alarms.emplace_back(round, rr.drift_alarms);
    r.models.emplace_back(sim.global_model().begin(), sim.global_model().end());
  }
  r.drifted = sim.drifted();
  r.cluster = sim.drift_cluster();
  r.last = sim.evaluate();
  return r;
}

double metric(const evaluation& e, const std::string& name) {
  for (const auto& [n, v] : e.metrics)
    if (n == name) return v;
  ADD_FAILURE() << "no metric " << name;
  return std::nan("");
}

TEST(DriftEngine, ErrorsAreTheModelsMistakesOnTheShardInShardOrder) {
  // A data set whose test split is the first 500 training examples: the trainer's errors on
  // that shard must average to one minus its test accuracy, example by example in any chunking.
  auto d = std::make_shared<troupe::labelled_data>(*fashion12k());
  d->test.images = d->train.images.slice(0, 500).clone();
  d->test.labels = d->train.labels.slice(0, 500).clone();
  simulation_options o;
  o.model = "mlp:784-32-10";
  auto trainer = make_trainer_factory(o)(d);
  std::vector<float> model(trainer->dim());
  trainer->initialize(model, 11);
  // Train a little so that the errors are neither all 0 nor all 1.
  std::vector<std::uint32_t> shard(500);
  for (std::uint32_t i = 0; i < 500; ++i) shard[i] = i;
  local_job job;
  job.shard = shard;
  job.global = model;
  splitmix64 rng{1};
  std::vector<float> trained = model;
  (void)trainer->train(job, trained, rng);
  job.global = trained;
  std::vector<std::uint8_t> errors;
  trainer->errors(job, trained, errors);
  ASSERT_EQ(errors.size(), 500u);
  double wrong = 0;
  for (auto e : errors) wrong += e;
  const double accuracy = trainer->evaluate(trained).accuracy;
  EXPECT_NEAR(wrong / 500.0, 1.0 - accuracy, 1e-12);
  EXPECT_GT(wrong, 10);
  EXPECT_LT(wrong, 400);
  // One example at a time gives the same bits.
  for (std::uint32_t i = 0; i < 500; i += 37) {
    local_job one = job;
    one.shard = std::span<const std::uint32_t>(&shard[i], 1);
    std::vector<std::uint8_t> e;
    trainer->errors(one, trained, e);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e[0], errors[i]) << "example " << i;
  }
}

TEST(DriftEngine, AlarmsComeOnlyFromDriftedClientsFromTheDriftsRoundOn) {
  const run_result r = run(drifting("adwin"));
  ASSERT_FALSE(r.alarms.empty()) << "no alarm";
  EXPECT_LE(r.alarms.front().first, 6) << "detected later than a round after the drift";
  std::set<std::uint64_t> alarmed;
  for (const auto& [round, clients] : r.alarms) {
    EXPECT_GE(round, 5) << "an alarm before the drift";
    for (auto c : clients) {
      EXPECT_TRUE(r.drifted[c]) << "client " << c << " did not drift, round " << round;
      alarmed.insert(c);
    }
  }
  EXPECT_EQ(alarmed.size(), 3u) << "every drifted client alarms";
  // Without the drift, the same run raises no alarm.
  auto calm = drifting("adwin");
  calm.drift.clear();
  const run_result quiet = run(calm);
  for (const auto& [round, clients] : quiet.alarms) ADD_FAILURE() << "round " << round << ": " << clients.size() << " alarms without drift";
}

TEST(DriftEngine, ClassOrderedShardsRaiseNoAlarmWithoutDrift) {
  // Under --partition dirichlet a shard lies class after class. Read in that order, one round's
  // errors rise from a class the model knows to one it confuses, a change within the round that
  // ADWIN cuts on with no drift at all. The clients read them in a seeded order instead: with
  // Dirichlet(0.5) shards, every client in every round (the model moves smoothly) and no drift,
  // no alarm.
  for (const std::uint64_t seed : {3u, 4u}) {
    auto o = drifting("adwin");
    o.drift.clear();
    o.partition = "dirichlet:0.5";
    o.seed = seed;
    const run_result r = run(o);
    for (const auto& [round, clients] : r.alarms)
      ADD_FAILURE() << "seed " << seed << " round " << round << ": " << clients.size() << " alarms without drift";
  }
}

TEST(DriftEngine, ClusterServesTheAlarmedClientsASecondModelThatLearnsTheirTask) {
  const run_result none = run(drifting("adwin"));
  const run_result cluster = run(drifting("adwin", "cluster"));
  std::size_t members = 0;
  for (std::size_t c = 0; c < cluster.cluster.size(); ++c) {
    members += cluster.cluster[c];
    if (cluster.cluster[c]) {
      EXPECT_TRUE(cluster.drifted[c]) << "client " << c << " moved without drifting";
    }
  }
  EXPECT_EQ(members, 3u);
  EXPECT_EQ(metric(cluster.last, "second_model_clients"), 3.0);
  // The drifted clients' accuracy on their swapped task: recovered by their own model.
  const double before = metric(none.last, "drifted_accuracy"), after = metric(cluster.last, "drifted_accuracy");
  EXPECT_GT(after, before + 0.08) << "without a response " << before << ", with cluster " << after;
  // The others lose nothing: their model no longer averages the swapped labels in.
  EXPECT_GE(metric(cluster.last, "stable_accuracy"), metric(none.last, "stable_accuracy") - 0.01);
}

TEST(DriftEngine, ResetChangesOnlyTheRoundsFromTheFirstAlarmOn) {
  auto o = drifting("adwin", "reset");
  o.client_optimizer = "adam";
  o.lr = 1e-3;
  auto plain = o;
  plain.drift_response.clear();
  const run_result reset = run(o), kept = run(plain);
  ASSERT_FALSE(reset.alarms.empty());
  ASSERT_EQ(kept.alarms.front().first, reset.alarms.front().first);
  const int first = reset.alarms.front().first;
  for (int r = 1; r < first; ++r) EXPECT_EQ(reset.models[r - 1], kept.models[r - 1]) << "round " << r;
  // The alarmed clients trained from fresh Adam moments in the alarm's round.
  EXPECT_NE(reset.models[first - 1], kept.models[first - 1]);
}

TEST(DriftEngine, RefusesWhatCannotWork) {
  auto bad = [](simulation_options o, const std::string& words) {
    expect_error<std::invalid_argument>([&] { simulation sim(o, fashion12k()); }, words);
  };
  auto o = drifting("adwin");
  o.drift_detect.clear();
  o.drift_response = "reset";
  bad(o, "--drift-response reset acts on alarms: give --drift-detect ddm or adwin");
  bad(drifting("cusum"), "--drift-detect 'cusum': use ddm or adwin");
  bad(drifting("adwin", "retrain"), "--drift-response 'retrain': use reset or cluster");
  o = drifting("adwin", "cluster");
  o.secagg = true;
  bad(o, "with --secagg the server sees only one sum");
  o = drifting("adwin", "cluster");
  o.strategy = "fedprox:0.01";
  bad(o, "use --strategy fedavg");
  o = drifting("adwin");
  o.async = "fedbuff:5";
  bad(o, "--drift with --async is not supported");
  o = drifting("adwin");
  o.trainer = "noop";
  bad(o, "--drift needs --trainer mlp");
  o = drifting("adwin");
  o.rounds = 3;
  bad(o, "round 5 is after the last round (--rounds 3)");
  o = drifting("adwin");
  o.drift = "swap:5:0.3:1-12";
  bad(o, "labels 1 and 12 must both be among the data's 10 classes");
  o = drifting("adwin");
  o.attack = "label-flip:0.2";
  bad(o, "both change the clients' labels");
  o = drifting("adwin", "reset");
  o.strategy = "scaffold";
  bad(o, "resetting a client's control variate");
}

}  // namespace
