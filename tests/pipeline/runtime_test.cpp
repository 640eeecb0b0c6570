#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/core/device.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>
#include <troupe/pipeline/simulator.hpp>

namespace {

using troupe::tensor;
namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;

/// An MLP of `stages` linear layers (ReLU between them), 10 outputs, initialized from `seed`.
std::vector<std::int64_t> sizes_for(int stages, std::int64_t in = 12, std::int64_t hidden = 16) {
  std::vector<std::int64_t> sizes{in};
  for (int i = 1; i < stages; ++i) sizes.push_back(hidden);
  sizes.push_back(10);
  return sizes;
}

std::string spec_of(const std::vector<std::int64_t>& sizes) {
  std::string s = "mlp:";
  for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? "-" : "") + std::to_string(sizes[i]);
  return s;
}

std::unique_ptr<kernels::sequential> initialized(const std::vector<std::int64_t>& sizes, std::uint64_t seed) {
  auto m = kernels::make_mlp(spec_of(sizes));
  m->initialize(seed);
  return m;
}

/// The same model as stages of one linear layer each (with its ReLU), holding copies of its values.
std::vector<std::unique_ptr<kernels::sequential>> cut(kernels::sequential& whole, const std::vector<std::int64_t>& sizes) {
  return pipeline::cut_mlp(whole, sizes, static_cast<int>(sizes.size()) - 1);
}

tensor random_batch(std::int64_t n, std::int64_t features, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n * features));
  for (auto& x : v) x = d(rng);
  return tensor::from<float>(v, {n, features});
}

tensor random_labels(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& y : v) y = static_cast<std::int64_t>(rng() % 10);
  return tensor::from<std::int64_t>(v, {n});
}

kernels::hyperparameters adamw_hp() {
  kernels::hyperparameters hp;
  hp.lr = 0.01;
  hp.weight_decay = 0.01;
  return hp;
}

/// How many of the schedule's actions are of `kind`.
int count_actions(const pipeline::schedule& s, pipeline::op kind) {
  int n = 0;
  for (const auto& row : s.ranks)
    for (const auto& a : row) n += a && a->kind == kind;
  return n;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

struct RuntimeSchedules : ::testing::TestWithParam<std::string> {};

// Every schedule the generators make trains exactly as the whole model does, to the bit: the
// same operations per microbatch, and each stage adds its weight gradients in microbatch order.
TEST_P(RuntimeSchedules, TrainLikeTheWholeModelToTheBit) {
  const std::string name = GetParam();
  const int ranks = 4, microbatches = 8;
  const auto s = pipeline::generate(name, ranks, microbatches);
  const auto sizes = sizes_for(s.stages());
  auto whole = initialized(sizes, 7);

  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  kernels::optimizer opt(kernels::optimizer_kind::adamw, {{whole->parameters(), adamw_hp()}},
                         kernels::optimizer_options{.threads = 1});
  for (int step = 0; step < 3; ++step) {
    const tensor x = random_batch(32, sizes.front(), 100 + static_cast<std::uint64_t>(step));
    const tensor y = random_labels(32, 200 + static_cast<std::uint64_t>(step));
    const double expected_loss = pipeline::whole_model_step(*whole, opt, x, y, microbatches);
    const auto r = t.step(x, y);
    EXPECT_TRUE(r.applied);
    EXPECT_NEAR(r.loss, expected_loss, 1e-6 * std::abs(expected_loss)) << name << " step " << step;
    ASSERT_EQ(r.busy_seconds.size(), static_cast<std::size_t>(ranks));
    for (std::size_t k = 0; k < r.peak_activation_bytes.size(); ++k) EXPECT_GT(r.peak_activation_bytes[k], 0u) << k;
  }
  const auto got = t.parameters();
  const auto want = whole->parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i]->value)) << name << " parameter " << i;
  // predict() runs the stages in order without training.
  const tensor x = random_batch(5, sizes.front(), 9);
  kernels::saved_activations keep;
  EXPECT_TRUE(same_bits(t.predict(x), whole->forward(x, keep, false))) << name;
  EXPECT_EQ(t.steps(), 3);
}

// Activation checkpointing changes what a rank holds between F and the backward, never the
// result: every generator's schedule with RECOMPUTE inserted trains to the same bits, and each
// rank holds at most what it held without.
TEST_P(RuntimeSchedules, RecomputeActivationsToTheSameBitsHoldingLess) {
  const std::string name = GetParam();
  const int ranks = 4, microbatches = 8;
  const auto plain = pipeline::generate(name, ranks, microbatches);
  // Every stage counted as two layers (linear + ReLU), of which every:2 keeps one input.
  const auto s = pipeline::with_checkpointing(plain, pipeline::checkpoint_policy::parse("every:2"), 2);
  ASSERT_EQ(count_actions(s, pipeline::op::recompute), s.stages() * microbatches);
  const auto sizes = sizes_for(s.stages());
  auto whole = initialized(sizes, 11);

  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  pipeline::trainer base(sys, plain, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  kernels::optimizer opt(kernels::optimizer_kind::adamw, {{whole->parameters(), adamw_hp()}},
                         kernels::optimizer_options{.threads = 1});
  std::size_t held = 0, held_plain = 0;
  for (int step = 0; step < 2; ++step) {
    const tensor x = random_batch(32, sizes.front(), 300 + static_cast<std::uint64_t>(step));
    const tensor y = random_labels(32, 400 + static_cast<std::uint64_t>(step));
    const double expected_loss = pipeline::whole_model_step(*whole, opt, x, y, microbatches);
    const auto r = t.step(x, y);
    const auto b = base.step(x, y);
    EXPECT_NEAR(r.loss, expected_loss, 1e-6 * std::abs(expected_loss)) << name;
    for (std::size_t k = 0; k < r.peak_activation_bytes.size(); ++k) {
      EXPECT_LE(r.peak_activation_bytes[k], b.peak_activation_bytes[k]) << name << " rank " << k;
      held += r.peak_activation_bytes[k];
      held_plain += b.peak_activation_bytes[k];
    }
  }
  EXPECT_LT(held, held_plain) << name;
  const auto got = t.parameters();
  const auto want = whole->parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i]->value)) << name << " parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(AllGenerators, RuntimeSchedules, ::testing::ValuesIn(pipeline::schedule_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// Stochastic rounding of bf16 and 8-bit state draws per tensor of the whole model: ranks round
// as one optimizer of the whole model with the same seed does, whichever stages they hold.
TEST(Runtime, StochasticRoundingDrawsAsTheWholeModelsOptimizer) {
  for (const auto& name : {std::string("1f1b"), std::string("interleaved-1f1b"), std::string("zb-v")}) {
    for (auto storage : {kernels::state_storage::bf16, kernels::state_storage::int8}) {
      const auto s = pipeline::generate(name, 2, 4);
      const auto sizes = sizes_for(s.stages());
      auto whole = initialized(sizes, 11);
      kernels::state_options state{.storage = storage, .block_size = 64, .min_8bit_elements = 1, .stochastic_rounding = true};
      troupe::actor_system sys{{.threads = 2}};
      pipeline::trainer t(sys, s, cut(*whole, sizes),
                          {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp(), .state = state, .seed = 5});
      kernels::optimizer opt(kernels::optimizer_kind::adamw, {{whole->parameters(), adamw_hp(), state}},
                             kernels::optimizer_options{.threads = 1, .seed = 5});
      for (int step = 0; step < 3; ++step) {
        const tensor x = random_batch(16, sizes.front(), 300 + static_cast<std::uint64_t>(step));
        const tensor y = random_labels(16, 400 + static_cast<std::uint64_t>(step));
        pipeline::whole_model_step(*whole, opt, x, y, 4);
        ASSERT_TRUE(t.step(x, y).applied);
      }
      const auto got = t.parameters();
      const auto want = whole->parameters();
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(same_bits(got[i], want[i]->value)) << name << " " << kernels::name_of(storage) << " parameter " << i;
    }
  }
}

TEST(Runtime, OneStepEqualsOneStepOnTheWholeBatchWithOneMicrobatch) {
  const auto s = pipeline::generate("gpipe", 2, 1);
  const auto sizes = sizes_for(2);
  auto whole = initialized(sizes, 3);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::sgd, .hp = {.lr = 0.1}});
  kernels::optimizer opt(kernels::optimizer_kind::sgd, {{whole->parameters(), {.lr = 0.1}}});
  const tensor x = random_batch(6, sizes.front(), 1);
  const tensor y = random_labels(6, 2);
  pipeline::whole_model_step(*whole, opt, x, y, 1);
  t.step(x, y);
  const auto got = t.parameters();
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], whole->parameters()[i]->value)) << i;
}

TEST(Runtime, LearnsASeparableProblem) {
  const auto s = pipeline::generate("1f1b", 2, 4);
  const auto sizes = sizes_for(2, 4, 32);
  auto whole = initialized(sizes, 11);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::adam, .hp = {.lr = 0.02}});
  // The label is the sign pattern of the first two features (4 classes of 10).
  const tensor x = random_batch(64, 4, 5);
  std::vector<std::int64_t> labels;
  for (std::int64_t i = 0; i < 64; ++i) {
    const auto row = x.data<float>().subspan(static_cast<std::size_t>(i * 4), 4);
    labels.push_back((row[0] > 0 ? 1 : 0) + (row[1] > 0 ? 2 : 0));
  }
  const tensor y = tensor::from<std::int64_t>(labels, {64});
  const double first = t.step(x, y).loss;
  double last = first;
  for (int i = 0; i < 150; ++i) last = t.step(x, y).loss;
  EXPECT_LT(last, 0.1 * first) << first << " -> " << last;
  const tensor logits = t.predict(x);
  EXPECT_GE(kernels::count_correct(logits, y), 60);
}

TEST(Runtime, ARankThatFailsAbortsTheStepOnEveryRankAndNothingChanges) {
  const auto s = pipeline::generate("1f1b", 4, 8);
  const auto sizes = sizes_for(4);
  auto whole = initialized(sizes, 5);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  const auto before = t.parameters();
  const tensor x = random_batch(16, sizes.front(), 1);
  // A label outside the model's 10 classes: the last stage fails in the middle of the step,
  // while the other ranks wait for its gradients.
  auto bad = random_labels(16, 2);
  bad.data<std::int64_t>()[13] = 10;
  try {
    t.step(x, bad);
    ADD_FAILURE() << "a bad label was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("label"), std::string::npos) << e.what();
  }
  auto after = t.parameters();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(same_bits(before[i], after[i])) << i;
  // The next step starts clean and trains.
  const auto r = t.step(x, random_labels(16, 2));
  EXPECT_TRUE(r.applied);
  after = t.parameters();
  EXPECT_FALSE(same_bits(before[0], after[0]));
}

TEST(Runtime, StagesThatDoNotFitFailWithTheLayersError) {
  const auto s = pipeline::generate("gpipe", 2, 2);
  std::vector<std::unique_ptr<kernels::sequential>> stages;
  stages.push_back(kernels::make_mlp("mlp:8-16"));
  stages.push_back(kernels::make_mlp("mlp:15-10"));  // 15 inputs where 16 come
  for (auto& st : stages) st->initialize(1);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, std::move(stages));
  EXPECT_THROW(t.step(random_batch(4, 8, 1), random_labels(4, 1)), std::invalid_argument);
  EXPECT_THROW(t.step(random_batch(4, 8, 1), random_labels(4, 1)), std::invalid_argument);
}

TEST(Runtime, ANonFiniteGradientSkipsTheStepEverywhere) {
  const auto s = pipeline::generate("zb-h1", 2, 4);
  const auto sizes = sizes_for(2);
  auto whole = initialized(sizes, 5);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes));
  const auto before = t.parameters();
  tensor x = random_batch(8, sizes.front(), 1);
  x.data<float>()[0] = std::nanf("");
  const auto r = t.step(x, random_labels(8, 1));
  EXPECT_FALSE(r.applied);  // (the ReLU hides the NaN from the loss, not from the first layer's gradient)
  const auto after = t.parameters();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(same_bits(before[i], after[i])) << i;
}

/// A layer defined outside troupe's kernels: it runs in this process, and cannot travel.
struct custom_layer : kernels::layer {
  std::string describe() const override { return "custom"; }
  tensor forward(const tensor& x, kernels::saved_activations&, bool) override { return x; }
  tensor backward_input(const tensor& dy, kernels::saved_activations&) override { return dy; }
};

TEST(Runtime, RefusesWhatCannotRun) {
  troupe::actor_system sys{{.threads = 2}};
  const auto sizes = sizes_for(2);
  auto stages = [&] {
    auto whole = initialized(sizes, 1);
    return cut(*whole, sizes);
  };
  const auto s = pipeline::generate("1f1b", 2, 4);
  EXPECT_THROW(pipeline::trainer(sys, pipeline::generate("1f1b", 4, 4), stages()), std::invalid_argument);
  auto with_null = stages();
  with_null[1].reset();
  EXPECT_THROW(pipeline::trainer(sys, s, std::move(with_null)), std::invalid_argument);
  auto broken = s;
  broken.ranks[1].pop_back();  // a backward never runs
  EXPECT_THROW(pipeline::trainer(sys, broken, stages()), pipeline::schedule_error);
  EXPECT_THROW(pipeline::trainer(sys, s, stages(), {.hp = {.lr = -1}}), std::invalid_argument);
  // A cosine schedule over no steps, or over a negative or NaN number of them, changed nothing or
  // drew a meaningless rate.
  for (double steps : {std::nan(""), -5.0, 0.5, 1e-300})
    EXPECT_THROW(pipeline::trainer(sys, s, stages(), {.cosine_steps = steps}), std::invalid_argument) << steps;
  // Inputs in another dtype than the layers' f32.
  {
    pipeline::trainer t(sys, s, stages());
    EXPECT_THROW(t.step(tensor::zeros({8, sizes.front()}, troupe::dtype::bf16), random_labels(8, 1)),
                 std::invalid_argument);
  }

  // Ranks on other nodes: one node per rank, a system that is a node, stages that can travel.
  EXPECT_THROW(pipeline::trainer(sys, s, stages(), {}, {2}), std::invalid_argument);
  EXPECT_THROW(pipeline::trainer(sys, s, stages(), {}, {2, 3}), std::invalid_argument);  // sys is no node
  auto with_custom = stages();
  with_custom[1]->add(std::make_unique<custom_layer>());
  try {
    pipeline::trainer(sys, s, std::move(with_custom), {}, {2, 3});
    ADD_FAILURE() << "a layer defined outside troupe was sent to another node";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1 cannot go to another node: layer description"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("'custom' is not a layer troupe knows"), std::string::npos) << e.what();
  }

  pipeline::trainer t(sys, s, stages());
  EXPECT_THROW(t.step(random_batch(6, sizes.front(), 1), random_labels(6, 1)), std::invalid_argument);  // 6 % 4
  EXPECT_THROW(t.step(random_batch(8, sizes.front(), 1), random_labels(4, 1)), std::invalid_argument);
  EXPECT_THROW(t.step(random_batch(8, sizes.front(), 1).reshape({8, 3, 4}), random_labels(8, 1)), std::invalid_argument);
  EXPECT_NO_THROW(t.step(random_batch(8, sizes.front(), 1), random_labels(8, 1)));
}

// A recomputed forward draws the same dropout masks as the first: checkpointed stages with
// dropout train exactly as the same stages without checkpointing.
TEST(Runtime, RecomputedDropoutDrawsTheSameMasks) {
  auto stages = [] {
    std::vector<std::unique_ptr<kernels::sequential>> out(2);
    out[0] = std::make_unique<kernels::sequential>();
    out[0]->add(kernels::make_linear(12, 16));
    out[0]->add(kernels::make_gelu());
    out[0]->add(kernels::make_dropout(0.3f));
    out[0]->add(kernels::make_residual(kernels::make_dropout(0.2f)));
    out[1] = std::make_unique<kernels::sequential>();
    out[1]->add(kernels::make_linear(16, 10));
    out[1]->add(kernels::make_dropout(0.1f));
    for (std::size_t i = 0; i < out.size(); ++i) out[i]->initialize(20 + i);
    return out;
  };
  const auto plain = pipeline::generate("1f1b", 2, 4);
  const auto s = pipeline::with_checkpointing(plain, pipeline::checkpoint_policy::parse("sqrt"), 4);
  ASSERT_EQ(count_actions(s, pipeline::op::recompute), s.stages() * s.microbatches);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, stages(), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  pipeline::trainer base(sys, plain, stages(), {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()});
  for (int step = 0; step < 3; ++step) {
    const tensor x = random_batch(16, 12, 500 + static_cast<std::uint64_t>(step));
    const tensor y = random_labels(16, 600 + static_cast<std::uint64_t>(step));
    EXPECT_EQ(t.step(x, y).loss, base.step(x, y).loss) << step;
  }
  const auto got = t.parameters(), want = base.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << i;
}

// A node's own ranks go the way ranks on other nodes go: spawned from their portable form (layer
// descriptions, parameter names and values, the schedule as CSV), and still bit-identical to the
// whole model. The state is 8-bit but for one parameter named as in the whole model: the rank
// that holds it must know it by that name.
TEST(Runtime, RanksSpawnedThroughTheirPortableFormTrainTheSame) {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = "runtime-test-token";
  troupe::actor_system head(cfg);
  ASSERT_EQ(head.node(), 1u);
  const auto s = pipeline::generate("zb-v", 2, 4);
  const auto sizes = sizes_for(s.stages());
  auto whole = initialized(sizes, 9);
  const kernels::state_options state{
      .storage = kernels::state_storage::int8, .block_size = 64, .min_8bit_elements = 1, .fp32_params = {"4.weight"}};
  {
    pipeline::trainer t(head, s, cut(*whole, sizes),
                        {.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp(), .state = state}, {1, 1});
    kernels::optimizer opt(kernels::optimizer_kind::adamw, {{whole->parameters(), adamw_hp(), state}},
                           kernels::optimizer_options{.threads = 1});
    for (int step = 0; step < 2; ++step) {
      const tensor x = random_batch(8, sizes.front(), 40 + static_cast<std::uint64_t>(step));
      const tensor y = random_labels(8, 50 + static_cast<std::uint64_t>(step));
      pipeline::whole_model_step(*whole, opt, x, y, 4);
      t.step(x, y);
    }
    const auto got = t.parameters();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], whole->parameters()[i]->value)) << i;
    EXPECT_EQ(head.live_actors(), 3u);  // two ranks and the driver they watch
  }
  // The trainer stopped its ranks (a monitor hears of a stop a moment before the actor leaves
  // the count).
  EXPECT_TRUE(head.await_all_actors_done(std::chrono::seconds(5))) << head.live_actors();
  // A rank that cannot be placed fails the constructor, and the ranks made before it go.
  EXPECT_THROW(pipeline::trainer(head, s, cut(*whole, sizes), {}, {1, 9}), troupe::error);
  EXPECT_TRUE(head.await_all_actors_done(std::chrono::seconds(5))) << head.live_actors();
  // A name in fp32_params that no stage has would change nothing: refused before any rank is made.
  try {
    pipeline::trainer(head, s, cut(*whole, sizes), {.state = {.fp32_params = {"1.weight"}}}, {1, 1});
    ADD_FAILURE() << "an unknown parameter name was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fp32_params names '1.weight', which is no parameter of any stage"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(head.await_all_actors_done(std::chrono::seconds(5))) << head.live_actors();
}

// Any of troupe's layers travel, with their random state, and a checkpointed schedule with them:
// ranks spawned through the portable form train as the same stages do in this process.
TEST(Runtime, StagesOfEveryLayerKindTravelWithTheirRandomStateAndRecompute) {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = "runtime-test-token";
  troupe::actor_system head(cfg);
  auto stages = [] {
    std::vector<std::unique_ptr<kernels::sequential>> out;
    for (int i = 0; i < 4; ++i) {
      auto st = std::make_unique<kernels::sequential>();
      st->add(kernels::make_linear(i == 0 ? 12 : 16, i == 3 ? 10 : 16));
      if (i < 3) {
        st->add(kernels::make_layer_norm(16, i == 1 ? 1e-3f : 1e-5f));
        st->add(kernels::make_gelu());
        st->add(kernels::make_residual(kernels::make_dropout(0.25f)));
      }
      st->initialize(70 + static_cast<std::uint64_t>(i));
      out.push_back(std::move(st));
    }
    return out;
  };
  const auto s = pipeline::with_checkpointing(pipeline::generate("zb-v", 2, 4), pipeline::checkpoint_policy::parse("sqrt"), 4);
  const pipeline::training_options o{.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()};
  pipeline::trainer here(head, s, stages(), o);
  pipeline::trainer there(head, s, stages(), o, {1, 1});
  for (int step = 0; step < 2; ++step) {
    const tensor x = random_batch(8, 12, 80 + static_cast<std::uint64_t>(step));
    const tensor y = random_labels(8, 90 + static_cast<std::uint64_t>(step));
    EXPECT_EQ(here.step(x, y).loss, there.step(x, y).loss) << step;
  }
  const auto a = here.parameters(), b = there.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << i;
}

// Stages on CUDA devices: a rank moves what arrives to its device and steps its optimizer there;
// the training follows the same stages on the host within float rounding (cuBLAS sums in another
// order), here and through the portable form (values cross as host copies and go back to the
// device on the other side).
TEST(Runtime, StagesOnCudaDevicesTrainAsOnTheHost) {
  if (troupe::cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = "runtime-test-token";
  troupe::actor_system head(cfg);
  const auto s = pipeline::with_checkpointing(pipeline::generate("zb-v", 2, 4), pipeline::checkpoint_policy::parse("every:2"), 2);
  const auto sizes = sizes_for(s.stages(), 12, 64);
  auto whole = initialized(sizes, 13);
  auto on_devices = [&] {
    auto stages = cut(*whole, sizes);
    for (int st = 0; st < s.stages(); ++st)  // rank r on device r (or 0 when there is one)
      kernels::move_to(*stages[static_cast<std::size_t>(st)],
                       troupe::device::cuda(s.place.rank_of(st) % troupe::cuda_device_count()));
    return stages;
  };
  const pipeline::training_options o{.optimizer = kernels::optimizer_kind::adamw, .hp = adamw_hp()};
  pipeline::trainer host(head, s, cut(*whole, sizes), o);
  pipeline::trainer here(head, s, on_devices(), o);
  pipeline::trainer there(head, s, on_devices(), o, {1, 1});
  for (int step = 0; step < 3; ++step) {
    const tensor x = random_batch(16, sizes.front(), 700 + static_cast<std::uint64_t>(step));
    const tensor y = random_labels(16, 800 + static_cast<std::uint64_t>(step));
    const double want = host.step(x, y).loss;
    EXPECT_NEAR(here.step(x, y).loss, want, 1e-4 * std::abs(want)) << step;
    EXPECT_NEAR(there.step(x, y).loss, want, 1e-4 * std::abs(want)) << step;
  }
  const auto want = host.parameters();
  for (auto* t : {&here, &there}) {
    const auto got = t->parameters();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].where().is_cpu());
      const auto a = got[i].data<float>(), b = want[i].data<float>();
      for (std::size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-4 + 1e-3 * std::abs(b[j])) << i << " " << j;
    }
    EXPECT_TRUE(t->predict(random_batch(3, sizes.front(), 1)).where().is_cpu());
  }
  // A rank's stages share its optimizer, so they must share a device.
  auto split = cut(*whole, sizes);
  kernels::move_to(*split[0], troupe::device::cuda(0));  // rank 0 holds stages 0 and 3 under zb-v
  try {
    pipeline::trainer(head, s, std::move(split), o);
    ADD_FAILURE() << "a rank's stages on two devices were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a rank's stages must live on one device"), std::string::npos) << e.what();
  }
}

// On a test_system, step() drives the system while it waits; inside an actor it refuses to block.
struct stepper {
  pipeline::trainer* t;
  int step(tensor x, tensor y) {
    t->step(x, y);
    return 0;
  }
};

TEST(Runtime, StepsOnATestSystemAndRefusesToBlockAnActor) {
  troupe::test_system sys;
  const auto s = pipeline::generate("1f1b", 2, 2);
  const auto sizes = sizes_for(2);
  auto whole = initialized(sizes, 2);
  pipeline::trainer t(sys, s, cut(*whole, sizes));
  const tensor x = random_batch(4, sizes.front(), 1);
  const tensor y = random_labels(4, 1);
  EXPECT_TRUE(t.step(x, y).applied);
  EXPECT_EQ(t.steps(), 1);
  auto a = sys.spawn<stepper>(&t);
  try {
    a.ask(&stepper::step, x, y).get();
    ADD_FAILURE() << "step() blocked an actor";
  } catch (const troupe::error& e) {
    EXPECT_EQ(e.code_value(), troupe::errc::would_deadlock) << e.what();
  }
  EXPECT_TRUE(t.step(x, y).applied);
}

/// Passes its input through; its first forward takes a second.
class slow_once final : public kernels::layer {
public:
  std::string describe() const override { return "slow_once"; }
  tensor forward(const tensor& x, kernels::saved_activations&, bool) override {
    if (first_) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    first_ = false;
    return x;
  }
  tensor backward_input(const tensor& dy, kernels::saved_activations&) override { return dy; }

private:
  bool first_ = true;
};

TEST(Runtime, AStepPastItsDeadlineIsAbortedEverywhereAndTheNextOneRuns) {
  const auto s = pipeline::generate("1f1b", 2, 2);
  const auto sizes = sizes_for(2);
  auto whole = initialized(sizes, 4);
  auto stages = cut(*whole, sizes);
  stages[1]->add(std::make_unique<slow_once>());
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, std::move(stages), {.step_timeout = 0.3});
  const auto before = t.parameters();
  const tensor x = random_batch(4, sizes.front(), 1);
  const tensor y = random_labels(4, 1);
  try {
    t.step(x, y);
    ADD_FAILURE() << "a step past its deadline returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within"), std::string::npos) << e.what();
  }
  const auto after = t.parameters();  // (waits behind the slow rank's step)
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(same_bits(before[i], after[i])) << i;
  EXPECT_TRUE(t.step(x, y).applied);
  EXPECT_THROW(pipeline::trainer(sys, s, cut(*whole, sizes), {.step_timeout = -1}), std::invalid_argument);
}

TEST(CutMlp, BalancesParametersAndCopiesTheValues) {
  const std::vector<std::int64_t> sizes{784, 256, 128, 64, 10};
  auto whole = initialized(sizes, 3);
  const auto stages = pipeline::cut_mlp(*whole, sizes, 2);
  ASSERT_EQ(stages.size(), 2u);
  // 784x256 is most of the model: it stands alone.
  EXPECT_EQ(stages[0]->describe().find("linear(256->128)"), std::string::npos) << stages[0]->describe();
  EXPECT_NE(stages[1]->describe().find("linear(256->128)"), std::string::npos) << stages[1]->describe();
  std::vector<kernels::parameter*> cut_params;
  for (const auto& s : stages)
    for (auto* p : s->parameters()) cut_params.push_back(p);
  const auto params = whole->parameters();
  ASSERT_EQ(cut_params.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(same_bits(cut_params[i]->value, params[i]->value)) << i;
    EXPECT_EQ(cut_params[i]->name, params[i]->name) << "the whole model's names, not the stage's";
    EXPECT_NE(cut_params[i]->value.bytes(), params[i]->value.bytes()) << "a copy, not a view";
  }
  // The cut model computes what the whole one does.
  const tensor x = random_batch(3, 784, 4);
  kernels::saved_activations k0, k1, kw;
  const tensor y = stages[1]->forward(stages[0]->forward(x, k0, false), k1, false);
  EXPECT_TRUE(same_bits(y, whole->forward(x, kw, false)));
}

TEST(CutMlp, RefusesMoreStagesThanLayersAndAModelThatIsNotItsSizes) {
  auto whole = kernels::make_mlp("mlp:8-4-2");
  EXPECT_THROW(pipeline::cut_mlp(*whole, {8, 4, 2}, 3), std::invalid_argument);
  EXPECT_THROW(pipeline::cut_mlp(*whole, {8, 4, 2}, 0), std::invalid_argument);
  EXPECT_THROW(pipeline::cut_mlp(*whole, {8, 5, 2}, 2), std::invalid_argument);
  EXPECT_THROW(pipeline::cut_mlp(*whole, {8, 4, 2, 2}, 2), std::invalid_argument);
  EXPECT_EQ(pipeline::cut_mlp(*whole, {8, 4, 2}, 2).size(), 2u);
  // The same parameters with another activation between them: not an MLP that cuts as one.
  auto gelu = kernels::make_layer("sequential(linear(8->4), gelu, linear(4->2))");
  EXPECT_THROW(pipeline::cut_mlp(static_cast<kernels::sequential&>(*gelu), {8, 4, 2}, 2), std::invalid_argument);
}

TEST(Runtime, AStepTimeoutTooLongForTheClockIsNoLimit) {
  const auto s = pipeline::generate("1f1b", 2, 2);
  const auto sizes = sizes_for(2);
  auto whole = initialized(sizes, 4);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, cut(*whole, sizes), {.step_timeout = 1e10});
  EXPECT_TRUE(t.step(random_batch(4, sizes.front(), 1), random_labels(4, 1)).applied);
}

}  // namespace
