// Continual learning's rules (continual.hpp): the specs, the tasks' permutations and splits, ACC
// and BWT, EWC's penalty and its gradient, GPM's threshold criterion, its federated merge and its
// projection.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include "support.hpp"
#include "troupe/federated/continual.hpp"
#include "troupe/federated/rng.hpp"

namespace {

using namespace troupe::federated;
using test_support::expect_error;
using test_support::random_values;

TEST(ContinualSpec, ReadsTheTasksAndTheMethods) {
  const auto p = parse_continual("permuted:5");
  EXPECT_EQ(p.type, continual_tasks::kind::permuted);
  EXPECT_EQ(p.tasks, 5);
  EXPECT_EQ(parse_continual("split:2").type, continual_tasks::kind::split);
  EXPECT_EQ(parse_cl("none").type, continual_method::kind::none);
  EXPECT_EQ(parse_cl("").type, continual_method::kind::none);
  EXPECT_DOUBLE_EQ(parse_cl("ewc:1000").lambda, 1000);
  EXPECT_DOUBLE_EQ(parse_cl("gpm:0.97").threshold, 0.97);
  expect_error<std::invalid_argument>([] { parse_continual("permuted"); }, "use permuted:T or split:T");
  expect_error<std::invalid_argument>([] { parse_continual("rotated:3"); }, "use permuted:T or split:T");
  expect_error<std::invalid_argument>([] { parse_continual("permuted:1"); }, "from 2 to 1000");
  expect_error<std::invalid_argument>([] { parse_continual("split:2.5"); }, "whole number");
  expect_error<std::invalid_argument>([] { parse_continual("split:x"); }, "is not a number");
  expect_error<std::invalid_argument>([] { parse_cl("ewc:0"); }, "lambda must be above 0");
  expect_error<std::invalid_argument>([] { parse_cl("gpm:1"); }, "in (0, 1)");
  expect_error<std::invalid_argument>([] { parse_cl("si:1"); }, "use none, ewc:LAMBDA or gpm:THRESHOLD");
}

TEST(ContinualTasks, PermutationsAreFixedPerTaskAndTheFirstIsTheIdentity) {
  const auto first = task_permutation(7, 0, 784);
  for (std::uint32_t j = 0; j < 784; ++j) EXPECT_EQ(first[j], j);
  const auto a = task_permutation(7, 1, 784), b = task_permutation(7, 2, 784);
  EXPECT_EQ(a, task_permutation(7, 1, 784));  // the same seed and task: the same permutation
  EXPECT_NE(a, b);
  EXPECT_NE(a, task_permutation(8, 1, 784));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, first);  // a permutation: every pixel once
  std::size_t fixed = 0;
  for (std::uint32_t j = 0; j < 784; ++j) fixed += a[j] == j;
  EXPECT_LT(fixed, 10u);  // a shuffle keeps about one pixel in place
}

TEST(ContinualTasks, SplitsCoverEveryClassOnce) {
  for (int tasks : {2, 3, 5, 10}) {
    std::vector<int> seen(10, 0);
    int previous = 0;
    for (int t = 0; t < tasks; ++t) {
      const auto [first, last] = split_classes(t, tasks, 10);
      EXPECT_EQ(first, previous);
      EXPECT_GT(last, first);
      for (int c = first; c < last; ++c) ++seen[c];
      previous = last;
    }
    EXPECT_EQ(previous, 10);
    for (int c = 0; c < 10; ++c) EXPECT_EQ(seen[c], 1);
  }
  EXPECT_EQ(split_classes(1, 5, 10), std::make_pair(2, 4));
  EXPECT_THROW(split_classes(5, 5, 10), std::invalid_argument);
}

TEST(ContinualScores, AccIsTheFinalMeanAndBwtTheMeanChangeOfTheEarlierTasks) {
  // a[j][j] = 0.9, 0.8, 0.7; at the end 0.5, 0.6, 0.7.
  const std::vector<double> after = {0.9, 0.8, 0.7}, final = {0.5, 0.6, 0.7};
  const auto s = score_tasks(after, final);
  EXPECT_NEAR(s.acc, 0.6, 1e-12);
  EXPECT_NEAR(s.bwt, ((0.5 - 0.9) + (0.6 - 0.8)) / 2, 1e-12);  // the last task is not in BWT
  EXPECT_THROW(score_tasks(after, std::vector<double>{0.5}), std::invalid_argument);
}

TEST(Ewc, PenaltyAndGradientAreZeroAtTheOptimumAndLambdaFTimesTheDistanceElsewhere) {
  const std::size_t n = 257;
  auto fisher = random_values(n, 1, 1.0);
  for (auto& f : fisher) f = std::abs(f);
  const auto optimum = random_values(n, 2, 0.5);
  ewc_penalty p;
  p.add_task(fisher, optimum);
  const double lambda = 40;
  std::vector<float> g(n, 7.0f);
  EXPECT_EQ(p.value(optimum, lambda), 0.0);
  p.gradient(optimum, static_cast<float>(lambda), g);
  for (float v : g) EXPECT_EQ(v, 0.0f);

  const auto theta = random_values(n, 3, 0.5);
  p.gradient(theta, static_cast<float>(lambda), g);
  double expected_value = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(theta[i]) - optimum[i];
    EXPECT_NEAR(g[i], lambda * fisher[i] * d, 1e-5 * (1 + std::abs(lambda * fisher[i] * d)));
    expected_value += 0.5 * lambda * fisher[i] * d * d;
  }
  EXPECT_NEAR(p.value(theta, lambda), expected_value, 1e-9 * expected_value);
  // The gradient is the penalty's: central differences of value() in double.
  for (std::size_t i : {std::size_t{0}, std::size_t{100}, n - 1}) {
    auto plus = theta, minus = theta;
    const float h = 1e-2f;
    plus[i] += h;
    minus[i] -= h;
    const double fd = (p.value(plus, lambda) - p.value(minus, lambda)) / (static_cast<double>(plus[i]) - minus[i]);
    EXPECT_NEAR(g[i], fd, 1e-4 * (1 + std::abs(fd)));
  }
}

TEST(Ewc, TheProximalStepMinimisesTheDistanceToTheSgdStepPlusThePenalty) {
  // prox(theta) = argmin_x ||x - theta||^2 / (2 lr) + (lambda / 2) sum_i F_i (x_i - theta*_i)^2:
  // its optimality condition (x - theta) / lr + lambda F (x - theta*) = 0, elementwise; theta* a
  // fixed point; and a small lr lambda F gives the explicit step.
  const std::size_t n = 300;
  auto f1 = random_values(n, 11, 3.0), f2 = random_values(n, 12, 3.0);
  for (auto& f : f1) f = std::abs(f);
  for (auto& f : f2) f = std::abs(f);
  const auto o1 = random_values(n, 13, 0.5), o2 = random_values(n, 14, 0.5), theta = random_values(n, 15, 0.5);
  ewc_penalty both;
  both.add_task(f1, o1);
  both.add_task(f2, o2);
  const double lr = 0.05;
  for (const double lambda : {0.1, 100.0, 1e6}) {  // 1e6: lr lambda F far past the explicit step's bound of 2
    std::vector<float> x = theta;
    both.proximal(x, lr, lambda);
    for (std::size_t i = 0; i < n; ++i) {
      const double f = static_cast<double>(f1[i]) + f2[i];
      const double closed = (theta[i] + lr * lambda * f * o2[i]) / (1 + lr * lambda * f);
      ASSERT_NEAR(x[i], closed, 1e-6 * (1 + std::abs(closed))) << "lambda " << lambda << " i " << i;
      const double condition = (static_cast<double>(x[i]) - theta[i]) / lr + lambda * f * (static_cast<double>(x[i]) - o2[i]);
      ASSERT_NEAR(condition, 0.0, 1e-4 * (1 + lambda * f)) << "lambda " << lambda << " i " << i;
      // Between theta and the anchor: never past it, at any lambda.
      ASSERT_GE(x[i], std::min(theta[i], o2[i]) - 1e-6f);
      ASSERT_LE(x[i], std::max(theta[i], o2[i]) + 1e-6f);
    }
  }
  std::vector<float> at = o2;
  both.proximal(at, lr, 1e6);
  EXPECT_EQ(at, o2);
  // lr lambda F of order 1e-5: the explicit step theta - lr lambda F (theta - theta*), to second order.
  std::vector<float> x = theta, g(n);
  both.proximal(x, lr, 1e-4);
  both.gradient(theta, 1e-4f, g);
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(x[i], theta[i] - lr * g[i], 1e-7);
  ewc_penalty none;
  x = theta;
  none.proximal(x, lr, 10);
  EXPECT_EQ(x, theta);
}

TEST(Ewc, SeveralTasksSumTheirFishersAroundTheLatestOptimum) {
  // Online EWC: after tasks 1 and 2 the penalty is (lambda / 2) sum_i (F_1,i + F_2,i)
  // (theta_i - theta*_2,i)^2, the penalty of one task whose Fisher is the sum, at task 2's optimum.
  const std::size_t n = 64;
  auto f1 = random_values(n, 4), f2 = random_values(n, 5);
  for (auto& f : f1) f = std::abs(f);
  for (auto& f : f2) f = std::abs(f);
  const auto o1 = random_values(n, 6), o2 = random_values(n, 7), theta = random_values(n, 8);
  ewc_penalty both, summed;
  both.add_task(f1, o1);
  both.add_task(f2, o2);
  EXPECT_EQ(both.tasks(), 2u);
  std::vector<float> f12(n);
  for (std::size_t i = 0; i < n; ++i) f12[i] = f1[i] + f2[i];
  summed.add_task(f12, o2);
  double expected = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(theta[i]) - o2[i];
    expected += 0.5 * 3 * (static_cast<double>(f1[i]) + f2[i]) * d * d;
  }
  EXPECT_NEAR(both.value(theta, 3), expected, 1e-6 * expected);
  EXPECT_EQ(both.value(o2, 3), 0.0);
  EXPECT_GT(both.value(o1, 3), 0.0);
  std::vector<float> g(n), h(n);
  both.gradient(theta, 3, g);
  summed.gradient(theta, 3, h);
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(g[i], h[i], 1e-5 * (1 + std::abs(h[i])));
  double most = 0;
  for (std::size_t i = 0; i < n; ++i) most = std::max(most, static_cast<double>(f1[i]) + f2[i]);
  EXPECT_NEAR(both.largest_diagonal(), most, 1e-6);
  EXPECT_THROW(both.add_task(std::vector<float>(3), std::vector<float>(3)), std::invalid_argument);
}

/// `count` orthonormal vectors of `d` numbers (Gram-Schmidt on seeded random ones), one after another.
std::vector<double> orthonormal(std::size_t count, std::size_t d, std::uint64_t seed) {
  splitmix64 g{seed};
  std::vector<double> q;
  for (std::size_t c = 0; c < count; ++c) {
    std::vector<double> v(d);
    for (auto& x : v) x = g.uniform01() * 2 - 1;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t p = 0; p < c; ++p) {
        double dot = 0;
        for (std::size_t i = 0; i < d; ++i) dot += v[i] * q[p * d + i];
        for (std::size_t i = 0; i < d; ++i) v[i] -= dot * q[p * d + i];
      }
    double norm = 0;
    for (double x : v) norm += x * x;
    for (auto& x : v) x /= std::sqrt(norm);
    q.insert(q.end(), v.begin(), v.end());
  }
  return q;
}

/// Rows s_i v_i: a matrix whose singular values are s (the v_i orthonormal).
std::vector<double> with_singular_values(const std::vector<double>& s, const std::vector<double>& v, std::size_t d) {
  std::vector<double> a;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < d; ++j) a.push_back(s[i] * v[i * d + j]);
  return a;
}

/// The projector M M^T of a basis, d x d.
std::vector<double> projector(const gpm_basis& b) {
  const std::size_t d = b.rows;
  std::vector<double> p(d * d, 0.0);
  for (std::size_t c = 0; c < b.k; ++c)
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < d; ++j) p[i * d + j] += b.m[c * d + i] * b.m[c * d + j];
  return p;
}

TEST(Gpm, EnergyRankIsTheSmallestKReachingTheThreshold) {
  const std::vector<double> sigma = {4, 2, 1, 1};  // energies 16, 4, 1, 1: 22 in all
  EXPECT_EQ(energy_rank(sigma, 22, 0, 0.5), 1u);    // 16 >= 11
  EXPECT_EQ(energy_rank(sigma, 22, 0, 0.9), 2u);    // 20 >= 19.8
  EXPECT_EQ(energy_rank(sigma, 22, 0, 0.95), 3u);   // 21 >= 20.9
  EXPECT_EQ(energy_rank(sigma, 22, 0, 0.999), 4u);
  EXPECT_EQ(energy_rank(sigma, 40, 18, 0.5), 1u);   // 18 projected + 16 >= 20
  EXPECT_EQ(energy_rank(sigma, 40, 30, 0.5), 0u);   // the basis holds enough already
}

TEST(Gpm, TheThresholdCriterionKeepsTheKnownDirectionsOfAHandBuiltMatrix) {
  const std::size_t d = 12;
  const auto v = orthonormal(5, d, 9);
  // Singular values 5, 3, 2, 1, 0.5: energies 25, 9, 4, 1, 0.25 (39.25).
  const std::vector<double> s = {5, 3, 2, 1, 0.5};
  const auto a = with_singular_values(s, v, d);
  gpm_basis b;
  b.rows = d;
  const auto first = gpm_summarize(a, s.size(), b);
  EXPECT_NEAR(first.total, 39.25, 1e-9);
  EXPECT_EQ(first.projected, 0.0);
  EXPECT_EQ(first.count, 5u);
  // 0.9 * 39.25 = 35.3: 25 + 9 + 4 = 38 is the first to reach it.
  EXPECT_EQ(gpm_merge(b, std::vector<gpm_summary>{first}, 0.9), 3u);
  ASSERT_EQ(b.k, 3u);
  gpm_basis expected;
  expected.rows = d;
  expected.k = 3;
  expected.m.assign(v.begin(), v.begin() + 3 * d);
  const auto p = projector(b), q = projector(expected);
  for (std::size_t i = 0; i < d * d; ++i) EXPECT_NEAR(p[i], q[i], 1e-10);

  // A later task: the same inputs plus a new direction of value 4 (energy 16, total 55.25). The
  // basis already captures 38; the residual's values are 4, 1, 0.5, so at 0.95 (52.49) it adds
  // 4 (54) and, at 0.99 (54.7), also 1 (55).
  const auto w = orthonormal(6, d, 9);  // the same first five, and a sixth
  std::vector<double> later = a;
  for (std::size_t j = 0; j < d; ++j) later.push_back(4 * w[5 * d + j]);
  const auto second = gpm_summarize(later, 6, b);
  EXPECT_NEAR(second.projected, 38, 1e-9);
  EXPECT_NEAR(second.total, 55.25, 1e-9);
  gpm_basis b95 = b, b99 = b;
  EXPECT_EQ(gpm_merge(b95, std::vector<gpm_summary>{second}, 0.95), 1u);
  EXPECT_EQ(gpm_merge(b99, std::vector<gpm_summary>{second}, 0.99), 2u);
  // The direction added first is the new one.
  double along = 0;
  for (std::size_t j = 0; j < d; ++j) along += b95.m[3 * d + j] * w[5 * d + j];
  EXPECT_NEAR(std::abs(along), 1.0, 1e-10);
  // Orthonormal columns.
  for (std::size_t x = 0; x < b99.k; ++x)
    for (std::size_t y = 0; y < b99.k; ++y) {
      double dot = 0;
      for (std::size_t j = 0; j < d; ++j) dot += b99.m[x * d + j] * b99.m[y * d + j];
      EXPECT_NEAR(dot, x == y ? 1.0 : 0.0, 1e-10);
    }
}

TEST(Gpm, TheServersBasisFromTheClientsSummariesIsTheBasisOfAllTheirInputs) {
  const std::size_t d = 30;
  std::vector<std::vector<double>> inputs;
  std::vector<double> all;
  std::size_t rows = 0;
  splitmix64 g{11};
  for (std::size_t k = 0; k < 4; ++k) {
    const std::size_t n = 5 + k * 3;  // clients of different sizes, fewer rows than d
    std::vector<double> a(n * d);
    // Low-rank inputs with a shared part, as a layer's activations are.
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t j = 0; j < d; ++j) a[r * d + j] = std::sin(0.3 * static_cast<double>(j) * (1 + r % 3)) + 0.1 * (g.uniform01() - 0.5);
    inputs.push_back(a);
    all.insert(all.end(), a.begin(), a.end());
    rows += n;
  }
  for (const std::size_t existing : {std::size_t{0}, std::size_t{4}}) {
    gpm_basis start;
    start.rows = d;
    start.k = existing;
    start.m = orthonormal(existing, d, 12);
    std::vector<gpm_summary> mine;
    for (const auto& a : inputs) mine.push_back(gpm_summarize(a, a.size() / d, start));
    gpm_basis federated = start, central = start;
    const std::size_t added = gpm_merge(federated, mine, 0.97);
    const std::size_t added_central = gpm_merge(central, std::vector<gpm_summary>{gpm_summarize(all, rows, start)}, 0.97);
    EXPECT_EQ(added, added_central);
    EXPECT_GT(added, 0u);
    const auto p = projector(federated), q = projector(central);
    for (std::size_t i = 0; i < d * d; ++i) EXPECT_NEAR(p[i], q[i], 1e-8);
  }
}

TEST(Gpm, TheReferenceProjectionLeavesTheLayersOutputsOnTheBasisUnchanged) {
  const std::size_t in = 9, out = 4, d = in + 1;
  gpm_basis b;
  b.rows = d;
  b.k = 3;
  b.m = orthonormal(3, d, 13);
  auto dw = random_values(out * in, 14), db = random_values(out, 15);
  gpm_project_reference(dw, db, out, b);
  for (std::size_t c = 0; c < b.k; ++c)
    for (std::size_t o = 0; o < out; ++o) {
      double y = db[o] * b.m[c * d + in];
      for (std::size_t i = 0; i < in; ++i) y += dw[o * in + i] * b.m[c * d + i];
      EXPECT_NEAR(y, 0.0, 1e-6);
    }
  // An empty basis changes nothing.
  gpm_basis none;
  none.rows = d;
  auto w2 = random_values(out * in, 16), b2 = random_values(out, 17);
  const auto w2_before = w2, b2_before = b2;
  gpm_project_reference(w2, b2, out, none);
  EXPECT_EQ(w2, w2_before);
  EXPECT_EQ(b2, b2_before);
}

}  // namespace
