// A GPT through the pipeline runtime: cut into stages of its top-level layers, each rank's AdamW
// over its stages, the gradients clipped by the norm over every rank. Compared, to the bit, with
// the whole model trained in this thread (kernels::lm_in_thread) on the same batches.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/lm.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>

namespace {

using troupe::tensor;
namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;

constexpr std::int64_t vocab = 11, ctx = 8, windows = 8;
const std::string spec = "gpt:layers=2,heads=2,embd=16,ctx=8,dropout=0.1";

std::unique_ptr<kernels::sequential> gpt(std::uint64_t seed) {
  auto m = kernels::make_gpt(spec, vocab);
  m->initialize(seed);
  return m;
}

/// Random windows of token ids (x) and next tokens (y), as kernels::sample_windows lays them out.
void batch(std::uint64_t seed, tensor& x, tensor& y) {
  std::mt19937_64 g(seed);
  std::vector<std::int32_t> tokens(200);
  for (auto& t : tokens) t = static_cast<std::int32_t>(g() % vocab);
  kernels::sample_windows(tokens, windows, ctx, g, x, y);
}

kernels::lm_engine_setup setup_of(kernels::sequential& model, std::int64_t microbatches, double clip,
                                  kernels::state_options state = {}) {
  kernels::lm_engine_setup s{.model = model, .microbatches = microbatches, .hp = {}, .state = state, .warmup = 2,
                             .decay_steps = 4, .min_lr = 1e-3, .clip = clip};
  s.hp.lr = 1e-2;
  s.hp.beta1 = 0.9;
  s.hp.beta2 = 0.99;
  s.hp.weight_decay = 0.1;
  return s;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

/// Trains one model in this thread and a copy through `s`, `steps` steps on the same batches;
/// expects the same losses and, after, the same weights and predictions, to the bit.
void expect_same_training(const pipeline::schedule& s, double clip, kernels::state_options state = {}, int steps = 3) {
  auto here = gpt(5), there = gpt(5);
  auto reference = kernels::lm_in_thread(setup_of(*here, s.microbatches, clip, state));
  troupe::actor_system sys{{.threads = 2}};
  auto piped = pipeline::lm_pipeline_engine(sys, s)(setup_of(*there, s.microbatches, clip, state));
  for (int step = 0; step < steps; ++step) {
    tensor x, y;
    batch(100 + static_cast<std::uint64_t>(step), x, y);
    const auto want = reference->step(x, y);
    const auto got = piped->step(x, y);
    EXPECT_EQ(got.loss, want.loss) << s.name << " step " << step;
    EXPECT_TRUE(got.applied && want.applied) << s.name << " step " << step;
  }
  piped->sync(*there);
  const auto a = here->parameters(), b = there->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same_bits(a[i]->value, b[i]->value)) << s.name << ": parameter " << a[i]->name;
  tensor x, y;
  batch(7, x, y);
  EXPECT_TRUE(same_bits(piped->predict(x), reference->predict(x))) << s.name;
}

struct GptSchedules : ::testing::TestWithParam<std::string> {};

// Every generator's schedule trains the GPT to the bits of the one-rank run: the same
// microbatches in the same order on each stage, the norm for clipping added in model order
// from every rank's gradients (clip 0.05 clips every step here), the same warmup + cosine.
TEST_P(GptSchedules, TrainToTheBitsOfTheOneRankRun) {
  expect_same_training(pipeline::generate(GetParam(), 2, 4), 0.05);
}

// Activation checkpointing (every stage's forward recomputed before its backward, dropout's
// masks drawn again) changes no bit either.
TEST_P(GptSchedules, RecomputingActivationsTrainsToTheSameBits) {
  const auto plain = pipeline::generate(GetParam(), 2, 4);
  expect_same_training(pipeline::with_checkpointing(plain, pipeline::checkpoint_policy::parse("every:2"), 2), 0.05);
}

INSTANTIATE_TEST_SUITE_P(EveryGenerator, GptSchedules, ::testing::ValuesIn(pipeline::schedule_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(GptPipeline, EveryOptimizerStateStorageTrainsToTheBitsOfTheOneRankRun) {
  const auto s = pipeline::generate("1f1b", 2, 4);
  expect_same_training(s, 0, {.storage = kernels::state_storage::bf16});
  expect_same_training(s, 1.0, {.storage = kernels::state_storage::int8, .block_size = 64, .min_8bit_elements = 1});
  expect_same_training(s, 0.05, {.storage = kernels::state_storage::bf16, .stochastic_rounding = true});
}

TEST(GptPipeline, FourRanksOfOneStageEachTrainToTheSameBits) {
  expect_same_training(pipeline::generate("zb-h1", 4, 4), 0.05, {}, 2);
}

// The ranks rebuild their stages from the portable form (as on another node): a GPT's layers,
// values and dropout state travel.
TEST(GptPipeline, RanksSpawnedThroughTheirPortableFormTrainTheSame) {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = "lm-runtime-test-token";
  troupe::actor_system head(cfg);
  const auto s = pipeline::generate("zb-v", 2, 4);
  auto here = gpt(3), there = gpt(3);
  auto reference = kernels::lm_in_thread(setup_of(*here, 4, 0.05));
  {
    auto piped = pipeline::lm_pipeline_engine(head, s, {1, 1})(setup_of(*there, 4, 0.05));
    for (int step = 0; step < 2; ++step) {
      tensor x, y;
      batch(40 + static_cast<std::uint64_t>(step), x, y);
      EXPECT_EQ(piped->step(x, y).loss, reference->step(x, y).loss);
    }
    piped->sync(*there);
  }
  const auto a = here->parameters(), b = there->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i]->value, b[i]->value)) << a[i]->name;
}

TEST(GptPipeline, RefusesAScheduleOfOtherMicrobatches) {
  auto model = gpt(1);
  troupe::actor_system sys{{.threads = 1}};
  try {
    pipeline::lm_pipeline_engine(sys, pipeline::generate("1f1b", 2, 4))(setup_of(*model, 2, 0));
    ADD_FAILURE() << "a schedule of 4 microbatches took batches split in 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("has 4 microbatches; the training splits its batches into 2"), std::string::npos)
        << e.what();
  }
}

// A GPT's pieces: the embedding (with the dropout after it), each attention and MLP block, the
// final norm, the head; balanced by parameter count, names and values kept, random state too.
TEST(CutSequential, CutsAGptIntoItsEmbeddingBlocksNormAndHead) {
  auto whole = gpt(9);
  EXPECT_EQ(pipeline::pieces_of(*whole), 7);
  const auto stages = pipeline::cut_sequential(*whole, 3);
  ASSERT_EQ(stages.size(), 3u);
  std::string joined;
  std::size_t layers = 0;
  std::vector<kernels::parameter*> params;
  for (const auto& st : stages) {
    layers += st->size();
    for (auto* p : st->parameters()) params.push_back(p);
    EXPECT_GT(st->parameters().size(), 0u);
  }
  EXPECT_EQ(layers, whole->size());
  EXPECT_EQ(stages.front()->at(1).describe(), "dropout(0.1)");  // with the embedding
  const auto want = whole->parameters();
  ASSERT_EQ(params.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(params[i]->name, want[i]->name);
    EXPECT_TRUE(same_bits(params[i]->value, want[i]->value)) << want[i]->name;
    EXPECT_NE(params[i]->value.bytes(), want[i]->value.bytes()) << "a copy, not the model's own";
  }
  // The stages in order compute what the model computes, dropout's draws included.
  tensor x, y;
  batch(3, x, y);
  kernels::saved_activations k, kw;
  tensor h = x;
  for (const auto& st : stages) h = st->forward(h, k, true);
  EXPECT_TRUE(same_bits(h, whole->forward(x, kw, true)));
}

TEST(CutSequential, RefusesMoreStagesThanPieces) {
  auto whole = gpt(1);
  try {
    pipeline::cut_sequential(*whole, 8);
    ADD_FAILURE() << "7 pieces filled 8 stages";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("7 layers with parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot fill 8 stages"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pipeline::cut_sequential(*whole, 0), std::invalid_argument);
  kernels::sequential empty;
  EXPECT_THROW(pipeline::cut_sequential(empty, 1), std::invalid_argument);
}

}  // namespace
