// FedBuff's asynchronous steps: staleness weights, determinism, failures, and the mechanisms
// through its buffer.

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

TEST(FedBuff, EachStepReportsTheClientsItTookById) {
  auto o = small("fedavg", 1);
  o.async = "fedbuff:3";
  o.dropout = 0.3;
  simulation sim(o, fashion());
  std::size_t failed = 0;
  for (int r = 1; r <= 6; ++r) {
    const auto rep = sim.run_round();
    EXPECT_EQ(rep.sampled_clients.size(), rep.sampled) << "step " << r;
    EXPECT_EQ(rep.sampled, rep.participants + rep.dropped);
    for (auto c : rep.sampled_clients) EXPECT_LT(c, sim.population());
    failed += rep.dropped;
  }
  EXPECT_GT(failed, 0u);  // the failed clients are among them too
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

