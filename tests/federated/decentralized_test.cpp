// Decentralized training: the graphs, the Metropolis weights, gossip's sum, the consensus error's
// decay at the rate of the ring's second eigenvalue, the peers' messages against the plain
// averaging step, and short runs of the three modes.

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fashion_subset.hpp"
#include "troupe/federated/decentralized.hpp"

namespace {

using namespace troupe::federated;
using models_t = std::vector<std::vector<float>>;

models_t random_models(std::size_t n, std::size_t dim, std::uint32_t seed, bool integers) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> di(-100, 100);
  std::normal_distribution<float> df(0.0f, 1.0f);
  models_t m(n, std::vector<float>(dim));
  for (auto& v : m)
    for (auto& x : v) x = integers ? static_cast<float>(di(rng)) : df(rng);
  return m;
}

void expect_well_formed(const topology& g, std::size_t degree) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto& n = g.neighbours[i];
    EXPECT_EQ(n.size(), degree) << g.name << " client " << i;
    std::set<std::uint32_t> distinct(n.begin(), n.end());
    EXPECT_EQ(distinct.size(), n.size()) << "a repeated edge at " << i;
    EXPECT_EQ(distinct.count(static_cast<std::uint32_t>(i)), 0u) << "a self-loop at " << i;
    for (auto j : n) {
      const auto& back = g.neighbours[j];
      EXPECT_TRUE(std::find(back.begin(), back.end(), i) != back.end()) << i << "-" << j << " is not symmetric";
    }
  }
  EXPECT_TRUE(is_connected(g)) << g.name;
}

TEST(Topology, RingTorusCompleteAndRandomRegularAreWellFormed) {
  expect_well_formed(make_topology("ring", 10, 0), 2);
  expect_well_formed(make_topology("torus", 100, 0), 4);
  expect_well_formed(make_topology("torus", 12, 0), 4);
  expect_well_formed(make_topology("complete", 7, 0), 6);
  for (std::size_t d : {2u, 3u, 4u, 10u}) expect_well_formed(make_topology("random-regular:" + std::to_string(d), 100, 5), d);
  EXPECT_EQ(make_topology("torus", 100, 0).name, "torus 10x10");
}

TEST(Topology, RandomRegularIsSeeded) {
  const auto a = make_topology("random-regular:4", 60, 11), b = make_topology("random-regular:4", 60, 11),
             c = make_topology("random-regular:4", 60, 12);
  EXPECT_EQ(a.neighbours, b.neighbours);
  EXPECT_NE(a.neighbours, c.neighbours);
}

TEST(Topology, RefusesGraphsThatCannotExist) {
  EXPECT_THROW(make_topology("ring", 2, 0), std::invalid_argument);
  EXPECT_THROW(make_topology("torus", 13, 0), std::invalid_argument);  // prime
  EXPECT_THROW(make_topology("torus", 8, 0), std::invalid_argument);   // 2x4
  EXPECT_THROW(make_topology("random-regular:3", 11, 0), std::invalid_argument);  // n*D odd
  EXPECT_THROW(make_topology("random-regular:10", 10, 0), std::invalid_argument);
  EXPECT_THROW(make_topology("random-regular:x", 10, 0), std::invalid_argument);
  EXPECT_THROW(make_topology("random-regular:", 10, 0), std::invalid_argument);
  EXPECT_THROW(make_topology("star", 10, 0), std::invalid_argument);
  EXPECT_THROW(make_topology("complete", 1, 0), std::invalid_argument);
  try {
    make_topology("torus", 13, 0);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("R*C with R, C >= 3"), std::string::npos) << e.what();
  }
}

TEST(Metropolis, WeightsAreSymmetricDoublyStochasticAndAThirdOnARing) {
  const auto ring = make_topology("ring", 8, 0);
  for (const auto& row : metropolis_weights(ring)) {
    EXPECT_DOUBLE_EQ(row.self, 1.0 / 3.0);
    for (double w : row.neighbour) EXPECT_DOUBLE_EQ(w, 1.0 / 3.0);
  }
  const auto g = make_topology("random-regular:3", 20, 1);
  // Make the degrees differ: a ring plus chords of one client.
  auto h = make_topology("ring", 9, 0);
  h.neighbours[0] = {1, 3, 5, 8};
  h.neighbours[3] = {0, 2, 4};
  h.neighbours[5] = {0, 4, 6};
  for (const topology* t : {&g, static_cast<const topology*>(&h)}) {
    const auto w = metropolis_weights(*t);
    for (std::size_t i = 0; i < t->size(); ++i) {
      double row = w[i].self;
      for (std::size_t e = 0; e < t->neighbours[i].size(); ++e) {
        const auto j = t->neighbours[i][e];
        row += w[i].neighbour[e];
        const auto& nj = t->neighbours[j];
        const auto at = std::find(nj.begin(), nj.end(), i) - nj.begin();
        EXPECT_DOUBLE_EQ(w[i].neighbour[e], w[j].neighbour[static_cast<std::size_t>(at)]);
        EXPECT_DOUBLE_EQ(w[i].neighbour[e], 1.0 / (1.0 + static_cast<double>(std::max(t->neighbours[i].size(), nj.size()))));
      }
      EXPECT_NEAR(row, 1.0, 1e-15);
      EXPECT_GT(w[i].self, 0.0);
    }
  }
}

TEST(ConsensusError, IsTheRootMeanSquareDistanceToTheMean) {
  EXPECT_DOUBLE_EQ(consensus_error({{1, 2}, {1, 2}, {1, 2}}), 0.0);
  // Mean (0, 0); squared distances 1 + 1 + 4 + 0 over 4 models: sqrt(6 / 4).
  EXPECT_DOUBLE_EQ(consensus_error({{1, 0}, {-1, 0}, {0, 2}, {0, -2}}), std::sqrt(10.0 / 4.0));
}

TEST(Gossip, PreservesTheSumExactlyForIntegersAndToRoundingForFloats) {
  const auto g = make_topology("random-regular:4", 20, 3);
  {
    auto x = random_models(20, 64, 1, true);
    auto steps = run_averaging(g, "gossip", x, 2, 9, 2);
    for (std::size_t k = 0; k < 64; ++k) {
      double before = 0;
      for (auto& m : x) before += m[k];
      for (std::size_t t = 1; t < steps.size(); ++t) {
        double after = 0;
        for (auto& m : steps[t]) after += m[k];
        EXPECT_EQ(after, before) << "coordinate " << k << " after round " << t;
      }
    }
    EXPECT_LT(consensus_error(steps.back()), consensus_error(x));
  }
  {
    auto x = random_models(20, 64, 2, false);
    auto steps = run_averaging(g, "gossip", x, 3, 9, 2);
    for (std::size_t k = 0; k < 64; ++k) {
      double before = 0, scale = 0;
      for (auto& m : x) {
        before += m[k];
        scale += std::fabs(m[k]);
      }
      double after = 0;
      for (auto& m : steps.back()) after += m[k];
      // Each pair average rounds once per end: 20 edges a round, half an ulp each.
      EXPECT_NEAR(after, before, 3 * 20 * 2 * 0x1p-24 * scale) << "coordinate " << k;
    }
  }
}

TEST(Gossip, PeersAverageEachEdgeAsTheSequentialPlainRuleDoes) {
  const auto g = make_topology("torus", 12, 0);
  auto x = random_models(12, 16, 4, false);
  auto steps = run_averaging(g, "gossip", x, 1, 21, 2);
  auto ref = x;
  // The seed stream of round 1, as run_averaging draws it.
  const auto edges = gossip_edges(g, 12, derive_seed(21, (10ull << 32) + 1));
  for (auto [i, j] : edges)
    for (std::size_t k = 0; k < 16; ++k) ref[i][k] = ref[j][k] = 0.5f * ref[i][k] + 0.5f * ref[j][k];
  EXPECT_EQ(steps[1], ref);
}

TEST(Metropolis, PeersMessagesEqualThePlainAveragingStepBitForBit) {
  const auto g = make_topology("random-regular:3", 16, 8);
  auto x = random_models(16, 33, 5, false);
  auto steps = run_averaging(g, "dpsgd", x, 3, 0, 2);
  const auto w = metropolis_weights(g);
  auto ref = x;
  for (int t = 1; t <= 3; ++t) {
    ref = metropolis_step(g, w, ref);
    EXPECT_EQ(steps[static_cast<std::size_t>(t)], ref) << "step " << t;
  }
}

TEST(Metropolis, ConsensusErrorOnARingDecaysAtTheSecondEigenvalue) {
  for (std::size_t p : {8u, 16u}) {
    const auto g = make_topology("ring", p, 0);
    const double lambda2 = 1.0 / 3.0 + 2.0 / 3.0 * std::cos(2 * std::numbers::pi / static_cast<double>(p));
    // Past the faster modes, the error shrinks by lambda2 per step; measured from step b/2 to
    // step b, where it is still a thousandth of the start (well above float32's rounding).
    const int b = static_cast<int>(std::log(1e-3) / std::log(lambda2)), a = b / 2;
    auto steps = run_averaging(g, "dpsgd", random_models(p, 8, 7, false), b, 0, 2);
    const double measured = std::pow(consensus_error(steps[b]) / consensus_error(steps[a]), 1.0 / (b - a));
    EXPECT_NEAR(measured, lambda2, 2e-3) << "p=" << p;
    EXPECT_GT(consensus_error(steps[b]), 0.0);
  }
}

decentralized_options small(const std::string& mode, const std::string& topo) {
  decentralized_options d;
  d.mode = mode;
  d.topology = topo;
  d.base.clients = 9;
  d.base.rounds = 3;
  d.base.eval_every = 3;
  d.base.partition = "iid";
  d.base.batch = 20;
  d.base.lr = 0.05;
  d.base.local_steps = 10;
  d.base.threads = 2;
  d.base.test_limit = 2000;
  return d;
}

TEST(Decentralized, AllreduceLeavesEveryPeerWithTheSameModel) {
  auto s = run_decentralized(small("allreduce", "ring"), test_data::fashion_subset());
  EXPECT_EQ(s.consensus_error, 0.0);
  EXPECT_GT(s.final_accuracy, 0.5);
  // Each peer sends 2(p-1)/p of the model per round (p = 9 does not divide the model: the formula's
  // chunks), three rounds.
  EXPECT_GT(s.bytes, 0u);
}

TEST(Decentralized, DpsgdAndGossipLearnAndKeepPeersClose) {
  for (const char* mode : {"dpsgd", "gossip"}) {
    int reports = 0;
    auto s = run_decentralized(small(mode, "torus"), test_data::fashion_subset(), nullptr,
                               [&](const decentralized_report& r) { reports += r.evaluated; });
    EXPECT_EQ(reports, 1) << mode;
    EXPECT_GT(s.final_accuracy, 0.5) << mode;
    EXPECT_GT(s.consensus_error, 0.0) << mode;
    EXPECT_TRUE(std::isfinite(s.consensus_error)) << mode;
  }
  // D-PSGD: 3 rounds of 10 iterations, each peer sending its model to its 4 neighbours.
  auto s = run_decentralized(small("dpsgd", "torus"), test_data::fashion_subset());
  EXPECT_EQ(s.bytes, 3ull * 10 * 9 * 4 * 4 * (784 * 100 + 100 + 100 * 10 + 10));
}

TEST(Decentralized, TheSameSeedGivesTheSameModelsAtAnyThreadCount) {
  for (const char* mode : {"dpsgd", "gossip"}) {
    auto d = small(mode, "ring");
    d.base.rounds = 1;
    d.base.eval_every = 1;
    d.base.threads = 1;
    const auto one = run_decentralized(d, test_data::fashion_subset());
    d.base.threads = 2;
    const auto two = run_decentralized(d, test_data::fashion_subset());
    EXPECT_EQ(one.mean_model, two.mean_model) << mode;
    EXPECT_EQ(one.consensus_error, two.consensus_error) << mode;
    d.base.seed = 1;
    EXPECT_NE(run_decentralized(d, test_data::fashion_subset()).mean_model, one.mean_model) << mode;
  }
}

TEST(Decentralized, RefusesWhatItCannotRun) {
  auto d = small("push-sum", "ring");
  EXPECT_THROW(run_decentralized(d, test_data::fashion_subset()), std::invalid_argument);
  d = small("dpsgd", "torus");
  d.base.clients = 7;
  EXPECT_THROW(run_decentralized(d, test_data::fashion_subset()), std::invalid_argument);
  d = small("gossip", "ring");
  d.base.clients = 1;
  EXPECT_THROW(run_decentralized(d, test_data::fashion_subset()), std::invalid_argument);
  d = small("gossip", "ring");
  d.base.device = "cuda";
  EXPECT_THROW(run_decentralized(d, test_data::fashion_subset()), std::invalid_argument);
  d = small("dpsgd", "ring");
  d.base.eval_every = 0;
  EXPECT_THROW(run_decentralized(d, test_data::fashion_subset()), std::invalid_argument);
}

}  // namespace
