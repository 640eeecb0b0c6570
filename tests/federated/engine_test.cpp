// The simulation engine: determinism at any thread count, FedAvg against a sequential
// computation, the hook points, idle-client memory, and option checks.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <unistd.h>

#include "troupe/federated/dp.hpp"
#include "troupe/federated/robust.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

#include "fashion_subset.hpp"
#include "support.hpp"

namespace {

using namespace troupe::federated;
using namespace test_support;

}  // namespace

namespace {

std::vector<std::vector<float>> run_rounds(const simulation_options& o) {
  simulation sim(o, fashion());
  std::vector<std::vector<float>> models;
  for (int r = 0; r < o.rounds; ++r) {
    sim.run_round();
    models.emplace_back(sim.global_model().begin(), sim.global_model().end());
  }
  return models;
}

}  // namespace

TEST(Simulation, IsBitIdenticalEveryRoundAtOneTwoAndFourThreads) {
  for (const std::string strategy : {"fedavg", "fedprox:0.1", "scaffold", "fedadam"}) {
    const auto one = run_rounds(small(strategy, 1));
    for (unsigned threads : {2u, 4u}) {
      const auto many = run_rounds(small(strategy, threads));
      ASSERT_EQ(one.size(), many.size());
      for (std::size_t r = 0; r < one.size(); ++r)
        EXPECT_EQ(0, std::memcmp(one[r].data(), many[r].data(), one[r].size() * sizeof(float)))
            << strategy << ": round " << r + 1 << " differs with " << threads << " threads";
    }
    // And the model moved.
    EXPECT_NE(one.front(), one.back()) << strategy;
  }
}

TEST(Simulation, DifferentSeedsGiveDifferentModels) {
  auto o = small("fedavg", 2);
  o.rounds = 1;
  const auto a = run_rounds(o);
  o.seed = 43;
  EXPECT_NE(a, run_rounds(o));
}

/// A trainer whose update is a known function of the client and its shard; it records the
/// shard sizes it saw.
struct shard_log {
  std::mutex m;
  std::map<std::uint64_t, std::size_t> size;
};

class marker_trainer final : public local_trainer {
public:
  explicit marker_trainer(std::shared_ptr<shard_log> log) : log_(std::move(log)) {}
  std::size_t dim() const override { return 3; }
  void initialize(std::span<float> m, std::uint64_t) override { std::fill(m.begin(), m.end(), 1.0f); }
  local_result train(const local_job& job, std::span<float> m, splitmix64&) override {
    {
      std::lock_guard lock(log_->m);
      log_->size[job.client] = job.shard.size();
    }
    m[0] += static_cast<float>(job.client);
    m[1] += static_cast<float>(job.shard.size());
    m[2] *= 2;
    return {0.5, 1, static_cast<std::int64_t>(job.shard.size())};
  }
  evaluation evaluate(std::span<const float>) override { return {}; }

private:
  std::shared_ptr<shard_log> log_;
};

TEST(Simulation, FedAvgIsTheSampleWeightedMeanOfTheSampledClients) {
  simulation_options o;
  o.clients = 9;
  o.per_round = 4;
  o.partition = "powerlaw:1.5";  // unequal sizes, so the weights matter
  o.threads = 2;
  o.seed = 5;
  auto log = std::make_shared<shard_log>();
  simulation sim(o, fashion(), [log](const shared_data&) { return std::make_unique<marker_trainer>(log); });
  std::vector<double> x{1, 1, 1};
  std::set<std::uint64_t> everybody;
  for (int r = 1; r <= 4; ++r) {
    const auto who = sim.sample(r);
    ASSERT_EQ(who.size(), 4u);
    EXPECT_TRUE(std::is_sorted(who.begin(), who.end()));
    const auto rep = sim.run_round();
    EXPECT_EQ(rep.participants, 4u);
    EXPECT_DOUBLE_EQ(rep.train_loss, 0.5);
    double total = 0;
    std::vector<double> mean(3, 0.0);
    for (auto c : who) {
      const double n = static_cast<double>(log->size.at(c));
      total += n;
      mean[0] += n * static_cast<double>(c);
      mean[1] += n * n;
      mean[2] += n * x[2];
      everybody.insert(c);
    }
    for (int i = 0; i < 3; ++i) x[static_cast<std::size_t>(i)] += mean[static_cast<std::size_t>(i)] / total;
    const auto g = sim.global_model();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(g[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)], 1e-4 * std::abs(x[static_cast<std::size_t>(i)])) << "round " << r;
  }
  EXPECT_GT(everybody.size(), 4u) << "the sample changes from round to round";
  EXPECT_NE(sim.sample(1), sim.sample(2));
}

/// A transform that halves the update, counts its rounds in the client's state, and reports a
/// metric: exercises the client chain, persistent state and per-round metadata.
class halve final : public update_transform {
public:
  std::string name() const override { return "halve"; }
  std::size_t client_state_floats(std::size_t) const override { return 1; }
  void apply(client_update& u, std::span<float> state, const round_info&, splitmix64&) const override {
    for (float& v : u.delta) v *= 0.5f;
    state[0] += 1;
    u.delta[1] = state[0];  // the round count, visible in the aggregate
  }
  void end_round(const round_info& r, std::vector<std::pair<std::string, double>>& out) override {
    out.emplace_back("halved_round", r.round);
  }
};

/// Records the order of add() and otherwise averages plainly.
class recording_mean final : public aggregator {
public:
  explicit recording_mean(std::vector<std::uint64_t>* order) : order_(order) {}
  std::string name() const override { return "recording"; }
  void begin(const round_info& r) override {
    sum_.assign(r.dim, 0.0f);
    n_ = 0;
    order_->clear();
  }
  void add(std::uint64_t c, double, std::span<const float> d) override {
    order_->push_back(c);
    for (std::size_t i = 0; i < d.size(); ++i) sum_[i] += d[i];
    ++n_;
  }
  std::vector<float> finish() override {
    for (float& v : sum_) v /= static_cast<float>(n_);
    return sum_;
  }

private:
  std::vector<std::uint64_t>* order_;
  std::vector<float> sum_;
  int n_ = 0;
};

TEST(Simulation, TransformsAndAggregatorsPlugIn) {
  simulation_options o;
  o.clients = 2;
  o.per_round = 2;
  o.partition = "iid";
  o.threads = 2;
  auto log = std::make_shared<shard_log>();
  simulation sim(o, fashion(), [log](const shared_data&) { return std::make_unique<marker_trainer>(log); });
  sim.add_transform(std::make_unique<halve>());
  std::vector<std::uint64_t> order;
  sim.set_aggregator(std::make_unique<recording_mean>(&order));
  const auto r1 = sim.run_round();
  EXPECT_EQ(order, (std::vector<std::uint64_t>{0, 1}));
  ASSERT_EQ(r1.metrics.size(), 1u);
  EXPECT_EQ(r1.metrics[0].first, "halved_round");
  // m[0]: deltas 0 and 1, halved and averaged: 1 + 0.25; m[1]: the clients' round count, 1.
  EXPECT_FLOAT_EQ(sim.global_model()[0], 1.25f);
  EXPECT_FLOAT_EQ(sim.global_model()[1], 2.0f);
  sim.run_round();
  EXPECT_FLOAT_EQ(sim.global_model()[1], 4.0f) << "the transform's state persists per client";
  EXPECT_EQ(sim.client_state_bytes(), 2 * sizeof(float));
  EXPECT_THROW(sim.add_transform(std::make_unique<halve>()), std::logic_error);
}

TEST(Simulation, ScaffoldKeepsStateOnlyForClientsThatTookPart) {
  auto o = small("scaffold", 2);
  simulation sim(o, fashion());
  EXPECT_EQ(sim.client_state_bytes(), 0u);
  sim.run_round();
  const std::size_t dim = sim.global_model().size();
  EXPECT_EQ(sim.client_state_bytes(), 6 * dim * sizeof(float));
  simulation plain(small("fedavg", 2), fashion());
  plain.run_round();
  EXPECT_EQ(plain.client_state_bytes(), 0u);
}

TEST(Simulation, LearnsFashionMnistInAFewRounds) {
  simulation_options o;
  o.clients = 10;
  o.per_round = 5;
  o.partition = "iid";
  o.model = "mlp:784-32-10";
  o.threads = 2;
  o.test_limit = 1000;
  simulation sim(o, fashion());
  const double before = sim.evaluate().accuracy;
  for (int r = 0; r < 5; ++r) sim.run_round();
  const auto after = sim.evaluate();
  EXPECT_LT(before, 0.3);
  EXPECT_GT(after.accuracy, 0.65);
  EXPECT_LT(after.loss, 1.2);
}

std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

TEST(Simulation, AMillionIdleClientsCostUnderOneKilobyteEach) {
  simulation_options o;
  o.clients = 1'000'000;
  o.per_round = 1000;
  o.partition = "iid";
  o.trainer = "noop";
  o.threads = 2;
  const std::size_t before = resident_bytes();
  simulation sim(o);
  const std::size_t grown = resident_bytes() - before;
  const double per_client = static_cast<double>(grown) / 1e6;
  std::printf("resident growth with 1,000,000 idle clients: %.0f bytes per client\n", per_client);
  EXPECT_LE(per_client, 1024.0);
  sim.run_round();  // and they work
  EXPECT_EQ(sim.rounds_done(), 1);
}

TEST(Simulation, RefusesBadOptionsWithAClearMessage) {
  auto expect_refused = [](simulation_options o, const std::string& words) {
    expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, words);
  };
  simulation_options o;
  o.clients = 10;
  o.per_round = 11;
  expect_refused(o, "more than the 10 clients");
  o.per_round = 0;
  expect_refused(o, "--per-round");
  o = {};
  o.clients = 0;
  expect_refused(o, "--clients");
  o = {};
  o.model = "mlp:784-x-10";
  expect_refused(o, "mlp");
  o.model = "mlp:100-10";
  expect_refused(o, "784 pixels");
  o = {};
  o.strategy = "fedsgd";
  expect_refused(o, "unknown strategy");
  o = {};
  o.partition = "dirichlet:";
  expect_refused(o, "dirichlet");
  o = {};
  o.lr = -1;
  expect_refused(o, "--lr");
}

namespace {

TEST(Simulation, DropoutsDeadlinesAndOverSelectionAreSeededAndDeterministic) {
  auto o = small("fedavg", 1);
  o.dropout = 0.3;
  o.deadline = 0.4;
  o.over_select = 0.5;  // 6 per round: sample 9, keep the first 6 to finish
  const auto one = run_rounds(o);
  o.threads = 4;
  EXPECT_EQ(one, run_rounds(o));

  simulation sim(o, fashion());
  std::size_t dropped = 0, late = 0, short_rounds = 0;
  for (int r = 1; r <= 20; ++r) {
    round_report rep;
    const auto kept = sim.participants(r, &rep);
    EXPECT_EQ(rep.sampled, 9u);
    EXPECT_LE(kept.size(), 6u);
    EXPECT_EQ(kept, sim.participants(r)) << "the same round, the same participants";
    dropped += rep.dropped;
    late += rep.late;
    if (kept.size() < 6) {
      ++short_rounds;
      EXPECT_DOUBLE_EQ(rep.simulated_seconds, 0.4) << "short of updates, the server waits out the deadline";
    }
    // Every kept client finished in time, and no unkept survivor finished earlier.
    double slowest = 0;
    for (auto c : kept) {
      const double t = sim.simulated_latency(c, r);
      EXPECT_GE(t, 0.0);
      EXPECT_LE(t, 0.4);
      slowest = std::max(slowest, t);
    }
    for (auto c : sim.sample(r)) {
      const double t = sim.simulated_latency(c, r);
      if (t >= 0 && t <= 0.4 && !std::binary_search(kept.begin(), kept.end(), c)) {
        EXPECT_GE(t, slowest);
      }
    }
  }
  EXPECT_GT(dropped, 20u);  // 30% of 180 sampled: about 54
  EXPECT_LT(dropped, 100u);
  EXPECT_GT(late, 0u);
  const auto rep = sim.run_round();
  EXPECT_EQ(rep.participants, sim.participants(1).size());

  simulation_options bad = o;
  bad.dropout = 1.0;
  EXPECT_THROW(simulation(bad, fashion()), std::invalid_argument);
}

TEST(Simulation, EachRoundReportsItsSampledClientsById) {
  auto o = small("fedavg", 1);
  o.dropout = 0.3;
  o.over_select = 0.5;  // 9 sampled, 6 kept at most
  simulation sim(o, fashion());
  std::set<std::vector<std::uint64_t>> samples;
  for (int r = 1; r <= 4; ++r) {
    const auto rep = sim.run_round();
    EXPECT_EQ(rep.sampled_clients, sim.sample(r)) << "round " << r;
    EXPECT_EQ(rep.sampled_clients.size(), rep.sampled);
    EXPECT_LT(rep.participants, rep.sampled);
    samples.insert(rep.sampled_clients);
  }
  EXPECT_GT(samples.size(), 1u);
}

}  // namespace

TEST(Simulation, RefusesScaffoldWithATransformThatChangesTheUpdate) {
  auto o = small("scaffold", 1);
  auto refused = [&](auto change) {
    auto b = o;
    change(b);
    expect_error<std::invalid_argument>([&] { simulation sim(b, fashion()); }, "scaffold with --dp-* or --compress");
  };
  refused([](simulation_options& b) { b.dp_clip = 1, b.dp_noise = 1; });
  refused([](simulation_options& b) { b.compress = "topk:0.1"; });
  refused([](simulation_options& b) { b.compress = "qsgd:4"; });
  EXPECT_NO_THROW(simulation(o, fashion()));
}

TEST(Simulation, ASynchronousRoundLastsAsLongAsItsSlowestClient) {
  auto o = small("fedavg", 2);
  simulation sim(o, fashion());
  const auto r = sim.run_round();
  double slowest = 0;
  for (auto c : sim.sample(1)) slowest = std::max(slowest, sim.simulated_latency(c, 1));
  EXPECT_GT(slowest, 0.0);
  EXPECT_EQ(r.simulated_seconds, slowest);
  EXPECT_EQ(sim.simulated_seconds(), slowest);
}

// ---- FedBuff: checkpoints and mechanisms ---------------------------------------------------------

namespace troupe::federated {
namespace {

// --local-steps: exactly that many steps, through a shard smaller than one pass needs (it is
// reshuffled and passed again) and larger; the default remains whole passes.
TEST(LocalSteps, TakeExactlyThatManyStepsWhateverTheShard) {
  simulation_options o;
  o.model = "mlp:784-16-10";
  o.batch = 8;
  auto trainer = make_trainer_factory(o)(test_support::fashion());
  std::vector<float> global(trainer->dim());
  trainer->initialize(global, 1);
  std::vector<std::uint32_t> shard(20);
  for (std::uint32_t i = 0; i < shard.size(); ++i) shard[i] = i * 7;
  for (int steps : {1, 2, 3, 7}) {
    std::vector<float> model = global;
    local_job job;
    job.global = global;
    job.shard = shard;
    job.batch = 8;
    job.lr = 0.01;
    job.steps = steps;
    splitmix64 rng{3};
    const local_result r = trainer->train(job, model, rng);
    EXPECT_EQ(r.steps, steps);
    EXPECT_LE(r.samples, 8 * steps);
  }
  std::vector<float> model = global;
  local_job job;
  job.global = global;
  job.shard = shard;
  job.batch = 8;
  job.epochs = 2;
  splitmix64 rng{3};
  EXPECT_EQ(trainer->train(job, model, rng).steps, 6);  // 2 passes of batches 8, 8, 4
  job.shard = {};
  job.steps = 5;
  model = global;
  EXPECT_EQ(trainer->train(job, model, rng).steps, 0);  // an empty shard has nothing to step on
}

}  // namespace
}  // namespace troupe::federated
