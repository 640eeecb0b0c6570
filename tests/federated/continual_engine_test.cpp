// Continual learning in the simulation: the options' refusals, an empty basis as FedAvg bit for
// bit, GPM's projected steps against the stored inputs and against the reference projection, the
// clients' Fisher diagonal against per-example gradients, and a run's ACC and BWT.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <memory>
#include <stdexcept>
#include <vector>

#include "continual_trainer.hpp"
#include "engine.hpp"
#include "support.hpp"
#include "troupe/federated/continual.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"
#include "troupe/kernels/layers.hpp"

namespace {

using namespace troupe::federated;
using test_support::expect_error;
using test_support::fashion;
using test_support::model_of;

simulation_options small(const std::string& continual = "", const std::string& cl = "") {
  simulation_options o;
  o.clients = 10;
  o.per_round = 5;
  o.rounds = 10;
  o.model = "mlp:784-32-10";
  o.partition = "iid";
  o.lr = 0.05;
  o.seed = 5;
  o.threads = 2;
  o.continual = continual;
  o.cl = cl;
  return o;
}

TEST(ContinualEngine, RefusesWhatCannotRun) {
  auto refused = [](simulation_options o, const std::string& words) {
    expect_error<std::invalid_argument>([&] { simulation sim(o, fashion()); }, words);
  };
  refused(small("", "gpm:0.9"), "give the tasks with --continual");
  auto o = small();
  o.task_rounds = 3;
  refused(o, "--task-rounds is read with --continual");
  o = small("permuted:3");
  refused(o, "does not split into 3 tasks");
  o = small("permuted:5");
  o.task_rounds = 3;
  refused(o, "needs 15 rounds");
  o = small("permuted:5", "gpm:0.9");
  o.client_optimizer = "adam";
  refused(o, "use --client-optimizer sgd");
  o = small("permuted:5", "gpm:0.9");
  o.strategy = "fedavgm";
  refused(o, "use fedavg or fedprox");
  o = small("permuted:5", "gpm:0.9");
  o.dp_clip = 1;
  o.dp_noise = 1;
  refused(o, "is not projected");
  o = small("permuted:5", "ewc:10");
  o.model = "sequential(linear(784->10))";
  refused(o, "trains an MLP");
  o = small("permuted:5", "ewc:10");
  o.async = "fedbuff:4";
  refused(o, "with --async is not supported");
  o = small("split:5");
  o.drift = "swap:3:0.3:1-7";
  refused(o, "run them apart");
  o = small("split:11");
  o.rounds = 22;
  refused(o, "only 10 classes");
  refused(small("permuted:5", "lwf:1"), "use none, ewc:LAMBDA or gpm:THRESHOLD");
}

TEST(ContinualEngine, AnEmptyBasisIsFedAvgBitForBit) {
  // Task 1 of permuted:5 is the data as it is, and no basis exists before its end: GPM's clients
  // train exactly as FedAvg's. EWC's before its first consolidation, and none, likewise.
  simulation plain(small(), fashion());
  plain.run_round();
  plain.run_round();
  for (const char* cl : {"gpm:0.9", "ewc:5", "none"}) {
    simulation continual(small("permuted:5", cl), fashion());
    continual.run_round();
    continual.run_round();
    EXPECT_EQ(model_of(continual), model_of(plain)) << cl;
  }
}

/// A trainer of `o`'s factory and the state it shares.
std::unique_ptr<detail::continual_trainer> trainer_of(const simulation_options& o) {
  auto t = detail::make_continual_trainer_factory(o)(fashion());
  return std::unique_ptr<detail::continual_trainer>(static_cast<detail::continual_trainer*>(t.release()));
}

/// The rows 0..n-1 of the training set.
std::vector<std::uint32_t> first_rows(std::size_t n) {
  std::vector<std::uint32_t> rows(n);
  for (std::size_t i = 0; i < n; ++i) rows[i] = static_cast<std::uint32_t>(i);
  return rows;
}

/// [W | b] M of layer `l` of the flat model: out x k.
std::vector<double> outputs_on_basis(const std::vector<float>& model, std::size_t offset, std::size_t in, std::size_t out,
                                     const gpm_basis& b) {
  std::vector<double> y(out * b.k, 0.0);
  const std::size_t d = in + 1;
  for (std::size_t o = 0; o < out; ++o)
    for (std::size_t c = 0; c < b.k; ++c) {
      double s = model[offset + in * out + o] * b.m[c * d + in];
      for (std::size_t i = 0; i < in; ++i) s += model[offset + o * in + i] * b.m[c * d + i];
      y[o * b.k + c] = s;
    }
  return y;
}

TEST(ContinualEngine, AfterGpmProjectedStepsTheLayersOutputsOnTheStoredBasisAreUnchanged) {
  auto o = small("permuted:2", "gpm:0.97");
  o.rounds = 4;
  auto t = trainer_of(o);
  auto& s = *t->state();
  std::vector<float> model(t->dim());
  t->initialize(model, 1);
  // Task 1's bases from 200 examples at the initial model.
  const auto rows = first_rows(200);
  splitmix64 g{2};
  std::size_t n = 0;
  const auto inputs = t->layer_inputs(rows, 0, model, 200, g, n);
  ASSERT_EQ(n, 200u);
  const auto& sizes = t->layer_sizes();
  s.bases.resize(sizes.size());
  s.bases_f.resize(sizes.size());
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    s.bases[l].rows = sizes[l].first + 1;
    gpm_merge(s.bases[l], std::vector<gpm_summary>{gpm_summarize(inputs[l], n, s.bases[l])}, 0.97);
    s.bases_f[l].assign(s.bases[l].m.begin(), s.bases[l].m.end());
    EXPECT_GT(s.bases[l].k, 0u);
  }
  // A round of task 2 (permuted pixels): 30 steps of 10 examples.
  local_job job;
  job.global = model;
  const auto shard = first_rows(300);
  job.shard = shard;
  job.batch = 10;
  job.lr = 0.05;
  job.round = 3;
  std::vector<float> trained = model;
  splitmix64 rng{3};
  const auto r = t->train(job, trained, rng);
  EXPECT_EQ(r.steps, 30);
  std::size_t offset = 0;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto [in, out] = sizes[l];
    const auto before = outputs_on_basis(model, offset, in, out, s.bases[l]);
    const auto after = outputs_on_basis(trained, offset, in, out, s.bases[l]);
    double diff = 0, norm = 0, moved = 0;
    for (std::size_t i = 0; i < before.size(); ++i) {
      diff += (after[i] - before[i]) * (after[i] - before[i]);
      norm += before[i] * before[i];
    }
    for (std::size_t i = offset; i < offset + out * (in + 1); ++i) moved += std::abs(trained[i] - model[i]);
    EXPECT_LE(std::sqrt(diff), 1e-6 * std::sqrt(norm)) << "layer " << l;
    EXPECT_GT(moved, 1e-3) << "layer " << l << " did not train";
    offset += out * (in + 1);
  }
}

TEST(ContinualEngine, TheFastProjectionMatchesTheReference) {
  auto o = small("permuted:2", "gpm:0.97");
  auto t = trainer_of(o);
  auto& s = *t->state();
  const auto& sizes = t->layer_sizes();
  s.bases.resize(sizes.size());
  s.bases_f.resize(sizes.size());
  splitmix64 g{4};
  for (std::size_t l = 0; l < sizes.size(); ++l) {  // random orthonormal bases of 40 and 7 columns
    auto& b = s.bases[l];
    b.rows = sizes[l].first + 1;
    std::vector<double> a((l == 0 ? 40 : 7) * b.rows);
    for (auto& x : a) x = g.uniform01() - 0.5;
    gpm_merge(b, std::vector<gpm_summary>{gpm_summarize(a, a.size() / b.rows, b)}, 0.999999);
    s.bases_f[l].assign(b.m.begin(), b.m.end());
  }
  const auto before = test_support::random_values(t->dim(), 5);
  const auto change = test_support::random_values(t->dim(), 6, 0.01);
  auto theta = t->working_model();
  for (std::size_t i = 0; i < theta.size(); ++i) theta[i] = before[i] + change[i];
  t->project_step(before.data());
  std::size_t offset = 0;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const auto [in, out] = sizes[l];
    std::vector<float> dw(change.begin() + offset, change.begin() + offset + in * out);
    std::vector<float> db(change.begin() + offset + in * out, change.begin() + offset + out * (in + 1));
    gpm_project_reference(dw, db, out, s.bases[l]);
    for (std::size_t i = 0; i < in * out; ++i)
      ASSERT_NEAR(theta[offset + i] - before[offset + i], dw[i], 1e-7 + 1e-4 * std::abs(dw[i])) << "layer " << l;
    for (std::size_t o2 = 0; o2 < out; ++o2)
      ASSERT_NEAR(theta[offset + in * out + o2] - before[offset + in * out + o2], db[o2], 1e-7 + 1e-4 * std::abs(db[o2]));
    offset += out * (in + 1);
  }
}

TEST(ContinualEngine, TheClientsFisherIsTheSumOfSquaredPerExampleGradients) {
  for (const char* tasks : {"permuted:3", "split:5"}) {
    auto o = small(tasks, "ewc:1");
    o.rounds = 30;
    auto t = trainer_of(o);
    std::vector<float> model(t->dim());
    t->initialize(model, 7);
    const auto shard = first_rows(60);
    const int task = 1;
    std::vector<double> fast;
    const std::size_t n = t->fisher_sum(shard, task, model, fast);
    // The reference: each example alone through the layers' full backward, its gradients squared.
    auto net = detail::make_model(o.model);
    std::size_t at = 0;
    for (auto* p : net->parameters())
      for (float& v : p->value.data<float>()) v = model[at++];
    const auto& data = *fashion();
    const auto perm = task_permutation(t->state()->seed, task, 784);
    const auto [first, last] = split_classes(task, 5, 10);
    const bool split = std::string(tasks) == "split:5";
    std::vector<double> slow(t->dim(), 0.0);
    std::size_t m = 0;
    const auto images = data.train.images.data<std::uint8_t>();
    const auto labels = data.train.labels.data<std::uint8_t>();
    for (auto row : shard) {
      if (split && (labels[row] < first || labels[row] >= last)) continue;
      ++m;
      std::vector<float> x(784);
      for (std::size_t j = 0; j < 784; ++j) {
        const std::size_t src = split ? j : perm[j];
        x[j] = (static_cast<float>(images[row * 784 + src]) / 255.0f - data.mean) / data.stddev;
      }
      for (auto* p : net->parameters()) std::fill(p->grad.data<float>().begin(), p->grad.data<float>().end(), 0.0f);
      troupe::kernels::saved_activations keep;
      const troupe::tensor xt = troupe::tensor::from<float>(std::span<const float>(x), {1, 784});
      const troupe::tensor yt = troupe::tensor::from<std::uint8_t>(std::span<const std::uint8_t>(&labels[row], 1), {1});
      troupe::tensor dlogits;
      (void)troupe::kernels::softmax_cross_entropy(net->forward(xt, keep, true), yt, dlogits);
      (void)net->backward(dlogits, keep);
      std::size_t k = 0;
      for (auto* p : net->parameters())
        for (float v : std::as_const(p->grad).data<float>()) slow[k++] += static_cast<double>(v) * v;
    }
    EXPECT_EQ(n, m) << tasks;
    EXPECT_GT(m, 0u) << tasks;
    ASSERT_EQ(fast.size(), slow.size());
    double largest = 0;
    for (double v : slow) largest = std::max(largest, v);
    EXPECT_GT(largest, 0.0);
    for (std::size_t i = 0; i < slow.size(); ++i)
      ASSERT_NEAR(fast[i], slow[i], 1e-6 * largest + 1e-4 * slow[i]) << tasks << " parameter " << i;
  }
}

TEST(ContinualEngine, ARunReportsEachTaskAndItsAccAndBwt) {
  for (const char* cl : {"none", "ewc:5", "gpm:0.95"}) {
    auto o = small("permuted:2", cl);
    o.rounds = 4;
    o.eval_every = 100;  // only the tasks' ends and the last round
    o.train_limit = 3000;
    o.test_limit = 500;
    const summary s = run_simulation(o);
    ASSERT_EQ(s.task_accuracy_after.size(), 2u) << cl;
    ASSERT_EQ(s.task_accuracy_final.size(), 2u) << cl;
    EXPECT_NEAR(s.acc, (s.task_accuracy_final[0] + s.task_accuracy_final[1]) / 2, 1e-12);
    EXPECT_NEAR(s.bwt, s.task_accuracy_final[0] - s.task_accuracy_after[0], 1e-12);
    EXPECT_NEAR(s.task_accuracy_after[1], s.task_accuracy_final[1], 1e-12);  // the last task ends the run
    EXPECT_NEAR(s.final_accuracy, s.acc, 1e-12);
    EXPECT_GT(s.task_accuracy_after[0], 0.5) << cl;  // two rounds of 5 clients learn task 1
    if (std::string(cl) == "none")
      EXPECT_EQ(s.consolidation_bytes, 0u);
    else
      EXPECT_GT(s.consolidation_bytes, 0u) << cl;
  }
}

TEST(ContinualEngine, EwcsProximalStepIsStableAtLambdaPastTheExplicitStepsBound) {
  // With lambda = 1e6 and lr 0.05, lr lambda F is in the thousands for the output layer's bias,
  // where an explicit step of the penalty's gradient diverges (it multiplies theta - theta* by
  // 1 - lr lambda F); the proximal step holds those parameters at theta*_1 instead: the model
  // stays finite, and task 1 (classes 0-4 of split:2, which plain FedAvg forgets as it learns
  // classes 5-9 through the same head) keeps more than without the penalty.
  auto run = [](const char* cl) {
    auto o = small("split:2", cl);
    o.rounds = 6;
    o.eval_every = 100;
    o.train_limit = 3000;
    o.test_limit = 500;
    o.lr = 0.1;
    o.local_epochs = 3;
    return run_simulation(o);
  };
  const summary plain = run("none"), held = run("ewc:1e6");
  ASSERT_EQ(held.task_accuracy_final.size(), 2u);
  EXPECT_TRUE(std::isfinite(held.acc));
  std::printf("split:2, 3 rounds a task: BWT %.4f without a method, %.4f with ewc:1e6; task 2 after its rounds %.4f, %.4f\n",
              plain.bwt, held.bwt, plain.task_accuracy_after[1], held.task_accuracy_after[1]);
  // The penalty must not buy its BWT by never learning task 2 (chance on its five classes: 0.2).
  EXPECT_GT(held.task_accuracy_after[1], 0.5);
  EXPECT_LT(plain.bwt, -0.3);
  EXPECT_GT(held.bwt, plain.bwt + 0.2);
}

}  // namespace
