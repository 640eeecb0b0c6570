// --verify-norm as the engine's hooks: the aggregate of honest updates is bit-identical to the
// one without the check; updates above the bound (the scale attack) and updates changed after
// their proof are dropped and reported; what cannot combine is refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support.hpp"
#include "troupe/federated/mechanisms.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/federated/zkproof.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;
using test_support::fashion;

/// Adds to each of 8 coordinates ±(0.15 to 0.25), drawn from the client's generator: a norm
/// between 0.42 and 0.71, and 1.7 to 2.9 once scaled by -4.
class random_step_trainer final : public local_trainer {
public:
  std::size_t dim() const override { return 8; }
  void initialize(std::span<float> m, std::uint64_t) override { std::fill(m.begin(), m.end(), 0.0f); }
  local_result train(const local_job& job, std::span<float> m, splitmix64& g) override {
    for (float& v : m) {
      const double size = 0.15 + 0.1 * g.uniform01();
      v += static_cast<float>(g.uniform01() < 0.5 ? -size : size);
    }
    return {0, 1, static_cast<std::int64_t>(job.shard.size())};
  }
  evaluation evaluate(std::span<const float>) override { return {}; }
};

trainer_factory random_steps() {
  return [](const shared_data&) -> std::unique_ptr<local_trainer> { return std::make_unique<random_step_trainer>(); };
}

simulation_options tiny() {
  simulation_options o;
  o.clients = 12;
  o.per_round = 6;
  o.partition = "iid";
  o.threads = 2;
  o.seed = 5;
  return o;
}

TEST(VerifyNorm, HonestRunsAreBitIdenticalWithAndWithoutTheCheck) {
  auto o = tiny();
  simulation plain(o, fashion(), random_steps());
  o.verify_norm = 1.0;
  simulation checked(o, fashion(), random_steps());
  for (int r = 0; r < 3; ++r) {
    plain.run_round();
    const auto report = checked.run_round();
    EXPECT_EQ(report.aborted, "");
    EXPECT_TRUE(report.rejected.empty());
    EXPECT_EQ(report.participants, 6u);
    auto has = [&](const std::string& name) {
      return std::any_of(report.metrics.begin(), report.metrics.end(), [&](const auto& m) { return m.first == name; });
    };
    EXPECT_TRUE(has("prove_ms") && has("verify_ms") && has("proof_bytes") && has("rejected"));
  }
  const auto a = plain.global_model(), b = checked.global_model();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(VerifyNorm, TheScaleAttackersAreDroppedAndReported) {
  auto o = tiny();
  o.per_round = o.clients;  // everybody, every round: the malicious set is each round's
  o.attack = "scale:0.3:-4";
  o.verify_norm = 1.0;
  std::vector<std::uint64_t> malicious;
  for (std::uint64_t c = 0; c < o.clients; ++c)
    if (is_malicious(c, 0.3, o.seed)) malicious.push_back(c);
  ASSERT_FALSE(malicious.empty());
  ASSERT_LT(malicious.size(), o.clients);
  simulation sim(o, fashion(), random_steps());
  for (int r = 0; r < 3; ++r) {
    const auto report = sim.run_round();
    auto rejected = report.rejected;
    std::sort(rejected.begin(), rejected.end());
    EXPECT_EQ(rejected, malicious) << "round " << r + 1;
    EXPECT_EQ(report.participants, o.clients - malicious.size());
  }
  // Without the check the attackers move the model: it differs from the checked run's.
  auto open = o;
  open.verify_norm = 0;
  simulation unchecked(open, fashion(), random_steps());
  for (int r = 0; r < 3; ++r) unchecked.run_round();
  const auto a = sim.global_model(), b = unchecked.global_model();
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

/// One update through the mechanism's transform, then the words as the server receives them.
std::vector<std::uint32_t> proved(const mechanism& m, std::vector<float> delta, const round_info& info) {
  client_update u;
  u.client = 1;
  u.delta = std::move(delta);
  splitmix64 g{1};
  m.transform->apply(u, {}, info, g);
  EXPECT_TRUE(u.delta.empty());
  return u.words;
}

TEST(VerifyNorm, AnUpdateChangedAfterItsProofOrCutShortIsDropped) {
  auto m = make_norm_verification({.bound = 1.0, .bits = 16}, make_weighted_mean());
  const std::vector<std::uint64_t> who = {1, 2, 3, 4};
  round_info info{.round = 1, .dim = 4, .population = 4, .participants = who, .seed = 1, .global = {}};
  const std::vector<float> d1 = {0.1f, -0.2f, 0.3f, 0.05f}, d2 = {0.4f, 0.1f, -0.1f, 0.2f};
  auto w1 = proved(m, d1, info), w2 = proved(m, d2, info), w3 = proved(m, d2, info), w4 = proved(m, d1, info);
  // Client 2 doubles one coordinate after proving: the opening no longer holds.
  float changed = 0.8f;
  std::memcpy(&w2[0], &changed, 4);
  // Client 3's words lose their last word; client 4's proof loses a byte inside.
  w3.pop_back();
  w4[w4.size() - 3] ^= 0x10;
  m.aggregator->begin(info);
  m.aggregator->add_encoded(1, 1.0, w1);
  m.aggregator->add_encoded(2, 1.0, w2);
  m.aggregator->add_encoded(3, 1.0, w3);
  m.aggregator->add_encoded(4, 1.0, w4);
  const auto sum = m.aggregator->finish();
  EXPECT_EQ(m.aggregator->rejected(), (std::vector<std::uint64_t>{2, 3, 4}));
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(sum[i], d1[i]);  // the mean of client 1's alone
  // A round where every update fails is given up.
  m.aggregator->begin(info);
  m.aggregator->add_encoded(2, 1.0, w2);
  EXPECT_THROW((void)m.aggregator->finish(), round_aborted);
  expect_error<std::logic_error>([&] { m.aggregator->add(1, 1.0, d1); }, "came without its proof");
}

TEST(VerifyNorm, WhatCannotCombineIsRefused) {
  auto with = [](auto change) {
    auto o = tiny();
    o.verify_norm = 1.0;
    change(o);
    return o;
  };
  expect_error<std::invalid_argument>([&] { check_norm_verification(with([](auto& o) { o.secagg = true; })); }, "--secagg");
  expect_error<std::invalid_argument>([&] { check_norm_verification(with([](auto& o) { o.compress = "topk:0.1"; })); },
                                      "--compress");
  expect_error<std::invalid_argument>([&] { check_norm_verification(with([](auto& o) { o.async = "fedbuff:2"; })); },
                                      "--async");
  expect_error<std::invalid_argument>([&] { check_norm_verification(with([](auto& o) { o.strategy = "qfedavg:1"; })); },
                                      "qfedavg");
  expect_error<std::invalid_argument>([&] { check_norm_verification(with([](auto& o) { o.verify_norm = -1; })); },
                                      "positive");
  auto o = tiny();
  o.verify_bits = 8;
  expect_error<std::invalid_argument>([&] { check_norm_verification(o); }, "--verify-bits is read with --verify-norm");
  expect_error<std::invalid_argument>([] { (void)make_norm_verification({.bound = 1.0, .bits = 12}, make_weighted_mean()); },
                                      "8, 16 or 32");
  // Through the simulation's constructor too.
  auto s = tiny();
  s.verify_norm = 1.0;
  s.secagg = true;
  expect_error<std::invalid_argument>([&] { simulation sim(s, fashion(), random_steps()); }, "--secagg");
}

}  // namespace
}  // namespace troupe::federated
