// FedGEN: the losses against their definitions, the generator's training, and the strategy in a
// simulation (alpha = 0 is FedAvg bit for bit; checkpoints carry the generator).

#include "troupe/federated/fedgen.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "support.hpp"

namespace troupe::federated {
namespace {

using test_support::expect_error;
using test_support::fashion;
using test_support::random_values;
using test_support::model_of;
using test_support::run_to;
using test_support::small;

TEST(FedGen, ParsesItsSpelling) {
  EXPECT_TRUE(is_fedgen("fedgen"));
  EXPECT_TRUE(is_fedgen("fedgen:2"));
  EXPECT_FALSE(is_fedgen("fedgenx"));
  EXPECT_EQ(parse_fedgen("fedgen").alpha, 10);
  EXPECT_EQ(parse_fedgen("fedgen:0.5").alpha, 0.5);
  EXPECT_EQ(parse_fedgen("fedgen:0").alpha, 0);
  for (const char* bad : {"fedgen:", "fedgen:x", "fedgen:-1", "fedgen:nan", "fedgen:1:2"})
    expect_error<std::invalid_argument>([&] { (void)parse_fedgen(bad); }, "ALPHA");
  expect_error<std::invalid_argument>([] { (void)make_strategy("fedgen"); }, "needs the model and the data");
}

TEST(FedGen, TermWeightDecaysFromTheSecondRound) {
  const fedgen_options o;
  EXPECT_EQ(o.weight(1), 0);  // the generator is untrained in round 1
  EXPECT_DOUBLE_EQ(o.weight(2), 10 * 0.98);
  EXPECT_DOUBLE_EQ(o.weight(11), 10 * std::pow(0.98, 10));
  EXPECT_EQ(o.weight(100000), 1e-4);
  fedgen_options off;
  off.alpha = 0;
  EXPECT_EQ(off.weight(5), 0);
}

// d/dW, d/db and d/dz of mean_i s(y_i) CE(z_i W^T + b, y_i) against central differences.
TEST(FedGen, HeadCrossEntropyGradientsMatchFiniteDifferences) {
  const int classes = 4, latent = 5, rows = 3;
  auto w = random_values(classes * latent, 1), b = random_values(classes, 2), z = random_values(rows * latent, 3);
  const std::uint8_t y[rows] = {2, 0, 3};
  const double scale_of[classes] = {0.5, 1.0, 2.0, 0.25};
  const float scale = 1.5f;
  std::vector<float> gw(w.size(), 0), gb(b.size(), 0), dz(z.size(), 0);
  (void)head_cross_entropy({w.data(), b.data()}, classes, latent, z.data(), y, rows, scale_of, scale, gw.data(), gb.data(),
                           dz.data());
  auto loss = [&] {
    return scale * head_cross_entropy({w.data(), b.data()}, classes, latent, z.data(), y, rows, scale_of, 1, nullptr,
                                      nullptr, nullptr);
  };
  auto check = [&](std::vector<float>& v, const std::vector<float>& grad, const char* what) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float keep = v[i], h = 1e-2f;
      v[i] = keep + h;
      const double up = loss();
      v[i] = keep - h;
      const double down = loss();
      v[i] = keep;
      EXPECT_NEAR(grad[i], (up - down) / (2 * h), 2e-4) << what << "[" << i << "]";
    }
  };
  check(w, gw, "W");
  check(b, gb, "b");
  check(z, dz, "z");
}

TEST(FedGen, DiversityLossIsThePapersDefinition) {
  // Two rows, one noise coordinate and one feature: |eps|^2 distance 4, |g|_1 distance 3, so
  // the mean over the four ordered pairs (two of them with i = j) is 6.
  const float noise[2] = {0, 2}, g[2] = {1, 4};
  EXPECT_NEAR(diversity_loss(noise, 1, g, 1, 2, 1, nullptr), std::exp(-6.0), 1e-12);

  const int rows = 4, d_eps = 3, latent = 5;
  auto eps = random_values(rows * d_eps, 4), f = random_values(rows * latent, 5);
  std::vector<float> df(f.size(), 0);
  (void)diversity_loss(eps.data(), d_eps, f.data(), latent, rows, 2.0f, df.data());
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float keep = f[i], h = 1e-3f;
    f[i] = keep + h;
    const double up = diversity_loss(eps.data(), d_eps, f.data(), latent, rows, 1, nullptr);
    f[i] = keep - h;
    const double down = diversity_loss(eps.data(), d_eps, f.data(), latent, rows, 1, nullptr);
    f[i] = keep;
    EXPECT_NEAR(df[i], 2.0 * (up - down) / (2 * h), 1e-4) << i;
  }
}

TEST(FedGen, GeneratorLossDecreasesAgainstFixedHeads) {
  const int classes = 10, latent = 24;
  fedgen_options o;
  o.steps = 1;
  feature_generator gen(classes, latent, o, 7);
  auto w1 = random_values(classes * latent, 11), b1 = random_values(classes, 12, 0.1);
  auto w2 = random_values(classes * latent, 13), b2 = random_values(classes, 14, 0.1);
  const head_view heads[2] = {{w1.data(), b1.data()}, {w2.data(), b2.data()}};
  std::vector<double> shares(2 * classes);
  for (int y = 0; y < classes; ++y) shares[y] = y < 5 ? 0.8 : 0.3, shares[classes + y] = 1 - shares[y];
  std::vector<std::uint8_t> labels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const splitmix64 probe{99};
  const auto before = gen.evaluate(heads, shares, labels, probe);
  splitmix64 rng{5};
  for (int s = 0; s < 300; ++s) (void)gen.train_step(heads, shares, labels, rng);
  const auto after = gen.evaluate(heads, shares, labels, probe);
  EXPECT_LT(after.teacher, 0.5 * before.teacher) << before.teacher << " -> " << after.teacher;
  EXPECT_TRUE(std::isfinite(after.diversity));
}

// A head whose shares are all zero teaches nothing: training against (h1, h2 with shares 0) is
// training against h1 alone.
TEST(FedGen, HeadsCountByTheirLabelShares) {
  const int classes = 3, latent = 4;
  auto w1 = random_values(classes * latent, 21), b1 = random_values(classes, 22);
  auto w2 = random_values(classes * latent, 23), b2 = random_values(classes, 24);
  const head_view both[2] = {{w1.data(), b1.data()}, {w2.data(), b2.data()}};
  const head_view one[1] = {{w1.data(), b1.data()}};
  const std::vector<double> shares_both{1, 1, 1, 0, 0, 0}, shares_one{1, 1, 1};
  const std::vector<std::uint8_t> labels{0, 1, 2};
  feature_generator a(classes, latent, {}, 3), b(classes, latent, {}, 3);
  splitmix64 ra{1}, rb{1};
  for (int s = 0; s < 5; ++s) {
    const auto la = a.train_step(both, shares_both, labels, ra);
    const auto lb = b.train_step(one, shares_one, labels, rb);
    EXPECT_EQ(la.teacher, lb.teacher);
  }
  EXPECT_EQ(a.parameters(), b.parameters());
  expect_error<std::invalid_argument>([&] { (void)a.train_step(both, shares_one, labels, ra); }, "one share per head");
}

simulation_options fedgen_run(const std::string& strategy) {
  auto o = small(strategy, 2);
  o.rounds = 3;
  o.partition = "dirichlet:0.1";
  o.batch = 32;
  o.lr = 0.01;
  return o;
}

TEST(FedGen, AlphaZeroIsFedAvgBitForBit) {
  simulation avg(fedgen_run("fedavg"), fashion());
  simulation gen(fedgen_run("fedgen:0"), fashion());
  (void)run_to(avg, 3);
  (void)run_to(gen, 3);
  EXPECT_EQ(model_of(avg), model_of(gen));
}

TEST(FedGen, GeneratorTermChangesTheClientsAndResumesBitForBit) {
  simulation avg(fedgen_run("fedavg"), fashion());
  simulation gen(fedgen_run("fedgen:1"), fashion());
  (void)run_to(avg, 3);
  (void)run_to(gen, 3);
  EXPECT_NE(model_of(avg), model_of(gen));
  for (float v : gen.global_model()) ASSERT_TRUE(std::isfinite(v));

  const std::string file = test_support::temp_file("fedgen.ckpt");
  simulation first(fedgen_run("fedgen:1"), fashion());
  (void)run_to(first, 2);
  first.save_checkpoint(file);
  simulation resumed(fedgen_run("fedgen:1"), fashion());
  resumed.load_checkpoint(file);
  (void)run_to(first, 3);
  (void)run_to(resumed, 3);
  EXPECT_EQ(model_of(first), model_of(gen));
  EXPECT_EQ(model_of(resumed), model_of(gen));
  std::remove(file.c_str());
}

TEST(FedGen, RefusesWhatItCannotRun) {
  auto o = fedgen_run("fedgen");
  o.secagg = true;
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "secure aggregation shows it only the sum");
  o = fedgen_run("fedgen");
  o.compress = "topk:0.1";
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "--compress");
  o = fedgen_run("fedgen");
  o.async = "fedbuff:3";
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "--async");
  o = fedgen_run("fedgen");
  o.trainer = "noop";
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "--trainer mlp");
  o = fedgen_run("fedgen");
  o.model = "sequential(linear(784->10), relu)";
  expect_error<std::invalid_argument>([&] { simulation s(o, fashion()); }, "does not end in a linear layer");
}

}  // namespace
}  // namespace troupe::federated
