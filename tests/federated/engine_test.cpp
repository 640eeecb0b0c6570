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

using test_support::expect_error;
using test_support::model_of;

void write_file(const std::string& file, const std::string& content) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << content;
}

const shared_data& fashion() { return test_data::fashion_subset(); }

simulation_options small(const std::string& strategy, unsigned threads) {
  simulation_options o;
  o.clients = 30;
  o.per_round = 6;
  o.rounds = 3;
  o.model = "mlp:784-24-10";
  o.partition = "dirichlet:0.5";
  o.strategy = strategy;
  o.threads = threads;
  o.test_limit = 500;
  o.seed = 42;
  o.window = 3;  // smaller than a round: replies queue behind the window
  return o;
}

std::vector<std::vector<float>> run_rounds(const simulation_options& o) {
  simulation sim(o, fashion());
  std::vector<std::vector<float>> models;
  for (int r = 0; r < o.rounds; ++r) {
    sim.run_round();
    models.emplace_back(sim.global_model().begin(), sim.global_model().end());
  }
  return models;
}

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

}  // namespace

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

}  // namespace

namespace {

std::string temp_file(const std::string& name) {
  return ::testing::TempDir() + "/troupe_engine_" + std::to_string(::getpid()) + "_" + name;
}


std::string file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(Checkpoint, ResumingInAFreshSimulationIsBitIdenticalToNeverStopping) {
  // Each case keeps a different kind of state between rounds: server moments, SCAFFOLD's
  // control variates, error-feedback residuals, the privacy accountant and adaptive bound.
  struct config {
    std::string strategy, compress;
    bool dp;
  };
  for (const config& c : {config{"fedadam", "", false}, config{"scaffold", "", false}, config{"fedavgm", "topk:0.1", false},
                          config{"fedavg", "", true}}) {
    auto o = small(c.strategy, 2);
    o.rounds = 4;
    o.compress = c.compress;
    if (c.dp) {
      o.dp_clip = 0.5;
      o.dp_noise = 0.3;
      o.dp_adaptive = true;
    }
    simulation straight(o, fashion());
    std::vector<std::pair<std::string, double>> straight_metrics;
    for (int r = 0; r < o.rounds; ++r) straight_metrics = straight.run_round().metrics;

    const std::string file = temp_file("resume.ckpt");
    {
      simulation first(o, fashion());
      first.run_round();
      first.run_round();
      first.save_checkpoint(file);
      first.run_round();  // progress after the checkpoint is lost with the process
    }
    auto resumed_options = o;
    resumed_options.threads = 1;  // the thread count may change
    simulation resumed(resumed_options, fashion());
    resumed.load_checkpoint(file);
    ASSERT_EQ(resumed.rounds_done(), 2);
    std::vector<std::pair<std::string, double>> resumed_metrics;
    while (resumed.rounds_done() < o.rounds) resumed_metrics = resumed.run_round().metrics;
    const auto a = model_of(straight), b = model_of(resumed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << c.strategy << " " << c.compress;
    EXPECT_EQ(straight_metrics, resumed_metrics) << c.strategy;
    EXPECT_EQ(straight.client_state_bytes(), resumed.client_state_bytes()) << c.strategy;
    std::remove(file.c_str());
  }
}

TEST(Checkpoint, RefusesOtherOptionsAndDamagedFilesWithoutChangingAnything) {
  auto o = small("fedavgm", 1);
  const std::string file = temp_file("refuse.ckpt");
  {
    simulation sim(o, fashion());
    sim.run_round();
    sim.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  ASSERT_GT(bytes.size(), 1000u);
  auto expect_refusal = [&](const simulation_options& options, const std::string& message) {
    simulation sim(options, fashion());
    const auto before = model_of(sim);
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 0);
    EXPECT_EQ(model_of(sim), before);
  };
  auto other = o;
  other.seed = 7;
  expect_refusal(other, "it was saved with seed=42 and this run has seed=7");
  other = o;
  other.partition = "iid";
  expect_refusal(other, "partition=dirichlet:0.5 and this run has partition=iid");
  auto write = [&](const std::string& content) { write_file(file, content); };
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 1);
  write(flipped);
  expect_refusal(o, "CRC-32 mismatch");
  write(bytes.substr(0, bytes.size() - 1));
  expect_refusal(o, "corrupted or truncated");
  write("");
  expect_refusal(o, "not a fedsim checkpoint");
  std::remove(file.c_str());
  expect_refusal(o, "cannot read the checkpoint");
}

// ---- FedBuff ------------------------------------------------------------------------------------

TEST(FedBuff, StalenessWeightIsOneOverSqrtOfOnePlusStaleness) {
  EXPECT_EQ(staleness_weight(0), 1.0);
  EXPECT_EQ(staleness_weight(3), 0.5);
  EXPECT_DOUBLE_EQ(staleness_weight(8), 1.0 / 3);
  EXPECT_THROW(staleness_weight(-1), std::invalid_argument);
}

/// Every update is +1 on every coordinate, whatever the model: the server's step then shows
/// the staleness weights alone.
class unit_step_trainer final : public local_trainer {
public:
  std::size_t dim() const override { return 2; }
  void initialize(std::span<float> m, std::uint64_t) override { std::fill(m.begin(), m.end(), 0.0f); }
  local_result train(const local_job& job, std::span<float> m, splitmix64&) override {
    for (float& v : m) v += 1.0f;
    return {0.0, 1, static_cast<std::int64_t>(job.shard.size())};
  }
  evaluation evaluate(std::span<const float>) override { return {}; }
};

TEST(FedBuff, WeighsEachUpdateByItsStaleness) {
  auto run = [](std::size_t in_flight) {
    simulation_options o;
    o.clients = 8;
    o.per_round = in_flight;
    o.partition = "iid";
    o.threads = 2;
    o.async = "fedbuff:1";
    simulation sim(o, fashion(), [](const shared_data&) { return std::make_unique<unit_step_trainer>(); });
    // With K = 1 each server update is one arrival: the model moves by 1 / sqrt(1 + s).
    std::vector<double> staleness;
    double x = 0, clock = 0;
    for (int r = 0; r < 12; ++r) {
      const auto report = sim.run_round();
      EXPECT_EQ(report.participants, 1u);
      EXPECT_EQ(report.metrics.size(), 1u);
      EXPECT_EQ(report.metrics.at(0).first, "mean_staleness");
      const double s = report.metrics.at(0).second;
      EXPECT_EQ(s, std::floor(s));
      const float step = sim.global_model()[0] - static_cast<float>(x);
      EXPECT_FLOAT_EQ(step, static_cast<float>(1 / std::sqrt(1 + s))) << "round " << r + 1;
      staleness.push_back(s);
      x = sim.global_model()[0];
      EXPECT_GE(report.simulated_seconds, 0.0);
      clock += report.simulated_seconds;
    }
    EXPECT_DOUBLE_EQ(sim.simulated_seconds(), clock);
    EXPECT_GT(clock, 0.0);
    return staleness;
  };
  // One client in flight: it always trains from the newest model, every step is 1.
  EXPECT_EQ(run(1), std::vector<double>(12, 0.0));
  // Three: the first arrival is fresh; the others started before some updates.
  const auto three = run(3);
  EXPECT_EQ(three.front(), 0.0);
  EXPECT_GT(*std::max_element(three.begin(), three.end()), 0.0);
}

TEST(FedBuff, IsBitIdenticalAtOneAndTwoThreads) {
  auto run = [](unsigned threads) {
    auto o = small("fedavg", threads);
    o.async = "fedbuff:3";
    o.rounds = 4;
    o.latency = "exponential:1";
    simulation sim(o, fashion());
    std::vector<std::vector<float>> models;
    std::vector<double> clocks;
    for (int r = 0; r < o.rounds; ++r) {
      sim.run_round();
      models.push_back(model_of(sim));
      clocks.push_back(sim.simulated_seconds());
    }
    return std::make_pair(models, clocks);
  };
  const auto one = run(1), two = run(2);
  EXPECT_EQ(one.second, two.second);
  for (std::size_t r = 0; r < one.first.size(); ++r)
    EXPECT_EQ(0, std::memcmp(one.first[r].data(), two.first[r].data(), one.first[r].size() * sizeof(float))) << "round " << r + 1;
  EXPECT_NE(one.first.front(), one.first.back());
}

TEST(FedBuff, LearnsFashionMnistOnIidData) {
  simulation_options o;
  o.clients = 10;
  o.per_round = 5;
  o.partition = "iid";
  o.model = "mlp:784-32-10";
  o.threads = 2;
  o.test_limit = 1000;
  o.async = "fedbuff:3";
  simulation sim(o, fashion());
  for (int r = 0; r < 8; ++r) sim.run_round();
  const auto after = sim.evaluate();
  EXPECT_GT(after.accuracy, 0.65);
  EXPECT_LT(after.loss, 1.2);
}

// SCAFFOLD's server c must stay the mean of the clients' c_i; a transform that changes the
// update on its way (clipping, noise, compression) broke that silently.
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

TEST(FedBuff, RefusesWhatItCannotDo) {
  auto o = small("fedavg", 1);
  auto refuse = [&](simulation_options bad, const std::string& message) {
    expect_error<std::invalid_argument>([&] { simulation sim(bad, fashion()); }, message);
  };
  auto b = o;
  b.async = "fedbuff:0";
  refuse(b, "K must be a whole number");
  b.async = "fedsync:2";
  refuse(b, "use fedbuff:K");
  b = o;
  b.async = "fedbuff:2";
  b.strategy = "scaffold";
  refuse(b, "scaffold is not supported");
  b = o;
  b.async = "fedbuff:2";
  b.secagg = true;
  refuse(b, "--async with --secagg");
  b = o;
  b.latency = "gamma:2";
  refuse(b, "use lognormal:SIGMA or exponential:MEAN");
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

namespace {

simulation_options small_async(const std::string& strategy, unsigned threads) {
  auto o = small(strategy, threads);
  o.async = "fedbuff:3";
  o.rounds = 6;
  o.latency = "exponential:1";
  return o;
}

std::vector<std::pair<std::string, double>> run_to(simulation& sim, int rounds) {
  std::vector<std::pair<std::string, double>> metrics;
  while (sim.rounds_done() < rounds) metrics = sim.run_round().metrics;
  return metrics;
}

}  // namespace

TEST(FedBuffCheckpoint, ResumingIsBitIdenticalToNeverStoppingAtOneAndTwoThreads) {
  // Each case carries other state across server steps: server moments and error-feedback
  // residuals; failed clients in flight; the privacy accountant; a robust rule's buffer.
  struct config {
    std::string strategy, compress;
    double dropout;
    bool dp;
  };
  for (const config& c : {config{"fedadam", "topk:0.2", 0, false}, config{"fedavg", "", 0.3, false},
                          config{"fedavg", "", 0.2, true}, config{"median", "", 0, false}}) {
    const std::string what = c.strategy + " " + c.compress + (c.dropout > 0 ? " dropout" : "") + (c.dp ? " dp" : "");
    auto o = small_async(c.strategy, 2);
    o.compress = c.compress;
    o.dropout = c.dropout;
    if (c.dp) {
      o.dp_clip = 0.5;
      o.dp_noise = 0.3;
    }
    simulation straight(o, fashion());
    const auto straight_metrics = run_to(straight, o.rounds);
    for (auto [saving, resuming] : {std::pair{1u, 2u}, std::pair{2u, 1u}}) {
      const std::string file = temp_file("async.ckpt");
      {
        auto first_options = o;
        first_options.threads = saving;
        simulation first(first_options, fashion());
        run_to(first, 3);
        first.save_checkpoint(file);
        run_to(first, o.rounds);  // saving changes nothing in the run that saved
        const auto a = model_of(straight), b = model_of(first);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << ": the saving run diverged";
      }
      auto resumed_options = o;
      resumed_options.threads = resuming;
      simulation resumed(resumed_options, fashion());
      resumed.load_checkpoint(file);
      ASSERT_EQ(resumed.rounds_done(), 3) << what;
      const auto resumed_metrics = run_to(resumed, o.rounds);
      const auto a = model_of(straight), b = model_of(resumed);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << what << ": saved at " << saving << " threads, resumed at " << resuming;
      EXPECT_EQ(straight_metrics, resumed_metrics) << what;
      EXPECT_EQ(straight.simulated_seconds(), resumed.simulated_seconds()) << what;
      // (client_state_bytes is not compared: the clients in flight allocate theirs whenever
      // their training starts in wall time.)
      std::remove(file.c_str());
    }
  }
}

TEST(FedBuffCheckpoint, ACheckpointBeforeTheFirstStepResumesToo) {
  auto o = small_async("fedavg", 2);
  o.rounds = 2;
  simulation straight(o, fashion());
  run_to(straight, o.rounds);
  const std::string file = temp_file("async0.ckpt");
  simulation(o, fashion()).save_checkpoint(file);
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 0);
  run_to(resumed, o.rounds);
  EXPECT_EQ(model_of(straight), model_of(resumed));
  std::remove(file.c_str());
}

TEST(FedBuffCheckpoint, RefusesOtherOptionsAndDamagedFilesWithoutChangingAnything) {
  auto o = small_async("fedavg", 1);
  o.dropout = 0.2;
  const std::string file = temp_file("async_refuse.ckpt");
  {
    simulation sim(o, fashion());
    run_to(sim, 2);
    sim.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  auto expect_refusal = [&](const simulation_options& options, const std::string& message) {
    simulation sim(options, fashion());
    run_to(sim, 1);  // clients in flight: a refused load keeps them
    const auto before = model_of(sim);
    const double clock = sim.simulated_seconds();
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 1);
    EXPECT_EQ(model_of(sim), before);
    EXPECT_EQ(sim.simulated_seconds(), clock);
    sim.run_round();  // and it goes on
  };
  auto other = o;
  other.async = "fedbuff:4";
  expect_refusal(other, "it was saved with async=fedbuff:3 and this run has async=fedbuff:4");
  other = o;
  other.async = "";
  expect_refusal(other, "it was saved with async=fedbuff:3 and this run has async=");
  other = o;
  other.dropout = 0.1;
  expect_refusal(other, "it was saved with dropout=0.20000000000000001 and this run has dropout=0.10000000000000001");
  auto write = [&](const std::string& content) { write_file(file, content); };
  std::string flipped = bytes;
  flipped[flipped.size() - 40] = static_cast<char>(flipped[flipped.size() - 40] ^ 1);  // in the updates in flight
  write(flipped);
  expect_refusal(o, "CRC-32 mismatch");
  write(bytes.substr(0, bytes.size() - 100));
  expect_refusal(o, "corrupted or truncated");
  std::remove(file.c_str());
}

TEST(FedBuff, FailedClientsTrainNothingAndTheirSlotsAreRefilled) {
  struct counting final : local_trainer {
    explicit counting(std::shared_ptr<std::atomic<int>> n) : n_(std::move(n)) {}
    std::size_t dim() const override { return 2; }
    void initialize(std::span<float> m, std::uint64_t) override { std::fill(m.begin(), m.end(), 0.0f); }
    local_result train(const local_job& job, std::span<float> m, splitmix64&) override {
      ++*n_;
      for (float& v : m) v += 1.0f;
      return {0.0, 1, static_cast<std::int64_t>(job.shard.size())};
    }
    evaluation evaluate(std::span<const float>) override { return {}; }
    std::shared_ptr<std::atomic<int>> n_;
  };
  auto run = [](unsigned threads, double dropout, int* trained, std::size_t* dropped) {
    simulation_options o;
    o.clients = 12;
    o.per_round = 4;
    o.partition = "iid";
    o.threads = threads;
    o.async = "fedbuff:3";
    o.dropout = dropout;
    auto n = std::make_shared<std::atomic<int>>(0);
    simulation sim(o, fashion(), [n](const shared_data&) { return std::make_unique<counting>(n); });
    *dropped = 0;
    std::vector<double> clocks;
    for (int r = 0; r < 20; ++r) {
      const auto rep = sim.run_round();
      EXPECT_EQ(rep.participants, 3u) << "every step takes K updates";
      EXPECT_EQ(rep.sampled, 3u + rep.dropped);
      *dropped += rep.dropped;
      clocks.push_back(sim.simulated_seconds());
    }
    *trained = n->load();
    return std::make_pair(model_of(sim), clocks);
  };
  int trained = 0, trained_two = 0;
  std::size_t dropped = 0, dropped_two = 0;
  const auto one = run(1, 0.4, &trained, &dropped);
  const auto two = run(2, 0.4, &trained_two, &dropped_two);
  EXPECT_EQ(one, two) << "failures are seeded: the same at any thread count";
  EXPECT_EQ(dropped, dropped_two);
  // 40% of the dispatches fail: about 40 over 20 steps of 3 updates.
  EXPECT_GT(dropped, 15u);
  EXPECT_LT(dropped, 80u);
  // 60 updates used, at most 4 more in flight; the failed dispatches trained nothing.
  EXPECT_GE(trained, 60);
  EXPECT_LE(trained, 64);
  // Without failures the run differs, and its clock runs slower than one that waits for failures.
  int plain_trained = 0;
  std::size_t none = 0;
  const auto plain = run(1, 0, &plain_trained, &none);
  EXPECT_EQ(none, 0u);
  EXPECT_LT(plain.second.back(), one.second.back()) << "failed slots still cost simulated time";
}

namespace {

/// Every client's update is (client + 1, 1, -(client + 1)), whatever the model: what a server
/// step receives shows the staleness weights and the clients.
class client_marker_trainer final : public local_trainer {
public:
  std::size_t dim() const override { return 3; }
  void initialize(std::span<float> m, std::uint64_t) override { std::fill(m.begin(), m.end(), 0.0f); }
  local_result train(const local_job& job, std::span<float> m, splitmix64&) override {
    const float c = static_cast<float>(job.client + 1);
    m[0] += c;
    m[1] += 1.0f;
    m[2] -= c;
    return {0.0, 1, static_cast<std::int64_t>(job.shard.size())};
  }
  evaluation evaluate(std::span<const float>) override { return {}; }
};

/// Hands every step's inputs to a test and returns their coordinate-wise median.
class recording_median final : public aggregator {
public:
  struct step {
    std::vector<std::uint64_t> participants, clients;
    std::vector<std::vector<float>> updates;
  };
  explicit recording_median(std::vector<step>* steps) : steps_(steps) {}
  std::string name() const override { return "recording-median"; }
  void begin(const round_info& r) override {
    steps_->push_back({{r.participants.begin(), r.participants.end()}, {}, {}});
  }
  void add(std::uint64_t c, double, std::span<const float> d) override {
    steps_->back().clients.push_back(c);
    steps_->back().updates.emplace_back(d.begin(), d.end());
  }
  std::vector<float> finish() override {
    const auto& u = steps_->back().updates;
    std::vector<std::span<const float>> views(u.begin(), u.end());
    return coordinate_median(views);
  }

private:
  std::vector<step>* steps_;
};

}  // namespace

TEST(FedBuff, AnAggregatorReceivesTheKStalenessWeightedUpdatesOfEachStep) {
  simulation_options o;
  o.clients = 10;
  o.per_round = 6;
  o.partition = "iid";
  o.threads = 2;
  o.async = "fedbuff:5";
  simulation sim(o, fashion(), [](const shared_data&) { return std::make_unique<client_marker_trainer>(); });
  std::vector<recording_median::step> steps;
  sim.set_aggregator(std::make_unique<recording_median>(&steps));
  std::vector<float> x(3, 0.0f);
  bool stale = false;
  for (int r = 1; r <= 8; ++r) {
    sim.run_round();
    ASSERT_EQ(steps.size(), static_cast<std::size_t>(r));
    const auto& s = steps.back();
    ASSERT_EQ(s.updates.size(), 5u);
    EXPECT_EQ(s.clients, s.participants) << "added in arrival order, as round_info names them";
    for (std::size_t k = 0; k < 5; ++k) {
      // (c + 1, 1, -(c + 1)) scaled by 1 / sqrt(1 + s) for a whole s >= 0.
      const float w = s.updates[k][1];
      const double staleness = 1 / (static_cast<double>(w) * w) - 1;
      EXPECT_NEAR(staleness, std::round(staleness), 1e-4);
      EXPECT_GE(std::round(staleness), 0.0);
      stale = stale || staleness > 0.5;
      EXPECT_FLOAT_EQ(s.updates[k][0], w * static_cast<float>(s.clients[k] + 1));
      EXPECT_FLOAT_EQ(s.updates[k][2], -s.updates[k][0]);
    }
    // The server moved by the rule's aggregate (FedAvg's server step, server_lr 1).
    std::vector<std::span<const float>> views(s.updates.begin(), s.updates.end());
    const auto median = coordinate_median(views);
    for (std::size_t i = 0; i < 3; ++i) x[i] += median[i];
    EXPECT_EQ(model_of(sim), x) << "step " << r;
  }
  EXPECT_TRUE(stale) << "six clients in flight for steps of five: some updates are stale";
}

TEST(FedBuff, ARobustRuleResistsScaledUpdatesWhereTheMeanDoesNot) {
  auto run = [](const std::string& strategy, unsigned threads) {
    simulation_options o;
    o.clients = 40;
    o.per_round = 8;
    o.partition = "iid";
    o.threads = threads;
    o.async = "fedbuff:7";
    o.strategy = strategy;
    o.attack = "scale:0.2:-20";  // a fifth of the clients send -20 times their update
    o.seed = 3;
    simulation sim(o, fashion(), [](const shared_data&) { return std::make_unique<unit_step_trainer>(); });
    for (int r = 0; r < 15; ++r) sim.run_round();
    return model_of(sim);
  };
  const auto mean = run("fedavg", 2);
  EXPECT_LT(mean[0], -1.0f) << "the attackers drag FedBuff's mean backwards";
  for (const std::string rule : {"median", "trimmed-mean:2", "krum:2", "multi-krum:2:3"}) {
    const auto robust = run(rule, 2);
    EXPECT_GT(robust[0], 2.0f) << rule << ": the honest +1 updates (staleness-weighted) win";
    EXPECT_LE(robust[0], 15.0f) << rule;
    EXPECT_EQ(robust, run(rule, 1)) << rule << ": the same at one thread";
  }
}

TEST(FedBuff, DifferentialPrivacyIsAGaussianMechanismPerStepWithoutAmplification) {
  simulation_options o;
  o.clients = 12;
  o.per_round = 6;
  o.partition = "iid";
  o.threads = 2;
  o.async = "fedbuff:4";
  o.dp_clip = 0.5;
  auto factory = [](const shared_data&) { return std::make_unique<unit_step_trainer>(); };
  for (const double z : {1e-6, 2.0}) {  // at 1e-6 the steps are the clipped, staleness-weighted mean
    auto noised = o;
    noised.dp_noise = z;
    simulation sim(noised, fashion(), factory);
    float before = 0;
    rdp_accountant reference;
    for (int r = 1; r <= 6; ++r) {
      const auto rep = sim.run_round();
      // Each update (1, 1) is clipped to norm 0.5; weights 1 / sqrt(1 + s) <= 1.
      const float step = sim.global_model()[0] - before;
      before = sim.global_model()[0];
      if (z < 1e-3) {
        EXPECT_GT(step, 0.0f);
        EXPECT_LE(step, static_cast<float>(0.5 / std::sqrt(2.0)) * (1 + 1e-4f)) << "step " << r;
      }
      // ε: r steps of the plain Gaussian mechanism (q = 1) with multiplier z.
      reference.compose(1.0, z, 1);
      double epsilon = -1;
      for (const auto& [name, value] : rep.metrics)
        if (name == "epsilon") epsilon = value;
      EXPECT_DOUBLE_EQ(epsilon, reference.epsilon(o.dp_delta).epsilon) << "z " << z << ", step " << r;
    }
  }
  o.dp_noise = 1;
  {
    // A client whose update waits in the buffer is not sent again before the step: every step
    // holds at most one update per client (the sensitivity is one clipped update).
    auto busy = o;
    busy.clients = 9;  // = in flight + K - 1: always exactly one idle client to send
    simulation sim(busy, fashion(), factory);
    std::vector<recording_median::step> steps;
    sim.set_aggregator(std::make_unique<recording_median>(&steps));
    for (int r = 0; r < 10; ++r) sim.run_round();
    for (const auto& s : steps) {
      std::set<std::uint64_t> distinct(s.clients.begin(), s.clients.end());
      EXPECT_EQ(distinct.size(), s.clients.size());
    }
  }
  auto refuse = [&](simulation_options bad, const std::string& message) {
    expect_error<std::invalid_argument>([&] { simulation sim(bad, fashion(), factory); }, message);
  };
  auto bad = o;
  bad.clients = 8;
  refuse(bad, "needs --clients >= 9");
  bad = o;
  bad.dp_adaptive = true;
  refuse(bad, "--dp-adaptive is not supported");
}

TEST(FedBuff, RefusesARobustRuleItsBufferCannotFeed) {
  auto o = small_async("trimmed-mean:2", 1);
  o.async = "fedbuff:4";
  expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, "needs at least 5; raise K");
  o.strategy = "krum:1";
  o.async = "fedbuff:5";
  EXPECT_NO_THROW(simulation(o, fashion()));
  o.async = "fedbuff:4";
  EXPECT_THROW(simulation(o, fashion()), std::invalid_argument);
  o.strategy = "fedavg";
  o.deadline = 1;
  EXPECT_THROW(simulation(o, fashion()), std::invalid_argument);
}

namespace {

/// CRC-32 (IEEE, reflected), bit by bit: the checksum a checkpoint ends with.
std::uint32_t plain_crc32(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

/// `body` with its version field (after the 8-byte magic) set to `version` and a fresh CRC-32.
std::string reversioned(std::string body, std::uint32_t version) {
  std::memcpy(body.data() + 8, &version, sizeof version);
  const std::uint32_t crc = plain_crc32(body);
  body.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return body;
}

}  // namespace

TEST(Checkpoint, ReadsVersionOneAndTwoFilesOfSynchronousRunsAndRefusesUnknownVersions) {
  auto o = small("fedavgm", 2);
  const std::string file = temp_file("v1.ckpt");
  simulation straight(o, fashion());
  run_to(straight, 3);
  {
    simulation first(o, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  ASSERT_EQ(plain_crc32(bytes.substr(0, bytes.size() - 4)),
            *reinterpret_cast<const std::uint32_t*>(bytes.data() + bytes.size() - 4));
  // Version 1 had no FedBuff section: 24 bytes (server version, dispatches, clients in flight,
  // all zero in a synchronous run) before the CRC.
  const std::string v3 = bytes.substr(0, bytes.size() - 4);
  ASSERT_EQ(v3.substr(v3.size() - 24), std::string(24, '\0'));
  // Version 2 had no optimizer state after each client's: 30 clients of 24 bytes (generator,
  // an empty state, an empty optimizer state) before the FedBuff section become 16 bytes each.
  const std::size_t clients_at = v3.size() - 24 - 30 * 24;
  std::string body = v3.substr(0, clients_at);
  for (std::size_t c = 0; c < 30; ++c) {
    ASSERT_EQ(v3.substr(clients_at + 24 * c + 8, 16), std::string(16, '\0'));
    body += v3.substr(clients_at + 24 * c, 16);
  }
  body += v3.substr(v3.size() - 24);
  auto write = [&](const std::string& content) { write_file(file, content); };
  write(reversioned(body, 2));
  {
    simulation resumed(o, fashion());
    resumed.load_checkpoint(file);
    EXPECT_EQ(resumed.rounds_done(), 1);
    run_to(resumed, 3);
    EXPECT_EQ(model_of(straight), model_of(resumed));
  }
  write(reversioned(body.substr(0, body.size() - 24), 1));
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 1);
  run_to(resumed, 3);
  EXPECT_EQ(model_of(straight), model_of(resumed));

  write(reversioned(v3, 4));
  simulation other(o, fashion());
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "has version 4; this build reads 1 to 3");
  // A version 2 file of a synchronous run that claims clients in flight is malformed.
  std::string forged = body;
  forged[forged.size() - 8] = 1;
  write(reversioned(forged, 2));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: FedBuff state in a synchronous run");
  EXPECT_EQ(other.rounds_done(), 0);
  std::remove(file.c_str());
}

TEST(Checkpoint, RefusesValuesNoRunWritesEvenWithAValidChecksum) {
  // A crafted file: a NaN or negative clock, a NaN in the model. Each is refused on load (it was
  // found rounds later as a NaN accuracy or an infinite clock), and nothing changes.
  auto o = small("fedadam", 2);
  const std::string file = temp_file("forged.ckpt");
  {
    simulation first(o, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  const std::string body = bytes.substr(0, bytes.size() - 4);
  // Layout: magic (8), version (4), the options' fingerprint (u64 length, chars), rounds (i64),
  // clock (f64), the model (u64 length, floats), ...
  std::uint64_t fingerprint = 0;
  std::memcpy(&fingerprint, body.data() + 12, 8);
  const std::size_t clock_at = 12 + 8 + fingerprint + 8, model_at = clock_at + 8 + 8;
  auto forged = [&](std::size_t at, auto value) {
    std::string b = body;
    std::memcpy(b.data() + at, &value, sizeof value);
    write_file(file, reversioned(b, 3));
  };
  simulation other(o, fashion());
  forged(clock_at, std::nan(""));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the simulated clock is nan");
  forged(clock_at, -1e300);
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the simulated clock is");
  forged(model_at + 4 * 10, std::nanf(""));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the model holds a value that is not finite");
  EXPECT_EQ(other.rounds_done(), 0);
  // The untouched file still loads.
  write_file(file, bytes);
  other.load_checkpoint(file);
  EXPECT_EQ(other.rounds_done(), 1);
  std::remove(file.c_str());
}

namespace {

/// Where a checkpoint's parts start: the strategy's state (its u64 count, then doubles) and the
/// transforms' (their u64 count, then each one's u64 count and doubles).
struct checkpoint_layout {
  std::size_t strategy_at = 0, strategy_values = 0, transforms_at = 0;
};

checkpoint_layout layout_of(const std::string& body, std::size_t dim) {
  checkpoint_layout l;
  std::uint64_t fingerprint = 0;
  std::memcpy(&fingerprint, body.data() + 12, 8);
  l.strategy_at = 12 + 8 + fingerprint + 8 + 8 + 8 + 4 * dim;
  std::memcpy(&l.strategy_values, body.data() + l.strategy_at, 8);
  l.transforms_at = l.strategy_at + 8 + 8 * l.strategy_values;
  return l;
}

}  // namespace

TEST(Checkpoint, RefusesStrategyAndTransformStateThatDoesNotFitWithoutChangingAnything) {
  // A FedBuff run with momentum and DP clipping, refused with clients in flight: the refusal
  // used to come after the clients in flight were dropped and the strategy's state replaced
  // (the next round then crashed), and a momentum of the wrong length loaded and failed every
  // round after.
  auto o = small_async("fedavgm", 1);
  o.dp_clip = 0.5;
  o.dp_noise = 0.3;
  const std::string file = temp_file("state.ckpt");
  std::size_t dim = 0;
  {
    simulation first(o, fashion());
    run_to(first, 2);
    dim = first.global_model().size();
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  const std::string body = bytes.substr(0, bytes.size() - 4);
  const auto l = layout_of(body, dim);
  ASSERT_EQ(l.strategy_values, dim);
  std::uint64_t transforms = 0;
  double bound = 0;
  std::memcpy(&transforms, body.data() + l.transforms_at, 8);
  std::memcpy(&bound, body.data() + l.transforms_at + 16, 8);
  ASSERT_EQ(transforms, 1u);
  ASSERT_EQ(bound, 0.5);
  auto with_strategy = [&](const std::vector<double>& s) {
    std::string b = body.substr(0, l.strategy_at);
    const std::uint64_t n = s.size();
    b.append(reinterpret_cast<const char*>(&n), 8);
    b.append(reinterpret_cast<const char*>(s.data()), 8 * s.size());
    b += body.substr(l.transforms_at);
    return reversioned(b, 3);
  };
  auto expect_refusal = [&](const std::string& content, const std::string& message) {
    write_file(file, content);
    simulation sim(o, fashion()), twin(o, fashion());
    run_to(sim, 1);
    run_to(twin, 1);
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 1);
    run_to(sim, 3);  // the state, the clients in flight and the DP bound as they were
    run_to(twin, 3);
    EXPECT_EQ(model_of(sim), model_of(twin)) << message;
  };
  expect_refusal(with_strategy({1, 2, 3}),
                 "malformed: strategy 'fedavgm': the checkpoint's state has 3 values for a model of " + std::to_string(dim));
  std::vector<double> huge(dim, 0.0);
  huge[7] = 1e300;  // finite, but not as a float
  expect_refusal(with_strategy(huge), "state value 7 (");
  std::string b = body;
  const double minus = -1;
  std::memcpy(b.data() + l.transforms_at + 16, &minus, 8);
  expect_refusal(reversioned(b, 3), "dp-clip: the saved state has no valid clipping bound");
  expect_refusal(reversioned(body, 1), "has version 1, which holds only synchronous runs; this run is FedBuff");
  write_file(file, bytes);
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 2);

  // FedAdam's step count at the largest int would overflow at the next step.
  auto adam = small("fedadam", 1);
  {
    simulation first(adam, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  std::string a = file_bytes(file);
  a.resize(a.size() - 4);
  const auto la = layout_of(a, dim);
  ASSERT_EQ(la.strategy_values, 1 + 2 * dim);
  const double last = 2147483647.0;
  std::memcpy(a.data() + la.strategy_at + 8, &last, 8);
  write_file(file, reversioned(a, 3));
  simulation other(adam, fashion());
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "fedadam': the checkpoint's step count is malformed");
  EXPECT_EQ(other.rounds_done(), 0);
  std::remove(file.c_str());
}
