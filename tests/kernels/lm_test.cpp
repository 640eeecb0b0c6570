// Language modelling: the corpus, batches, the schedule and clipping, training a GPT on a tiny
// text, and sampling from a saved model.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/lm.hpp>

namespace {

using namespace troupe;
using namespace troupe::kernels;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("troupe_lm_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write(const std::string& path, const std::string& body) {
  std::ofstream out(path, std::ios::binary);
  out << body;
}

template <class F>
void expect_message(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << part;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

/// A small text with structure enough to learn: a few words in a rhythm.
std::string tiny_corpus() {
  std::string s;
  std::mt19937 rng(1);
  const char* words[] = {"the lord ", "said unto ", "moses ", "and ", "it was good. ", "in the beginning "};
  while (s.size() < 20000) s += words[rng() % 6];
  return s;
}

TEST(Corpus, Utf8IsDecodedAndBinaryOrBrokenTextRefused) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
  const auto points = decode_utf8(text, "t");
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[1], U'\u00E9');
  EXPECT_EQ(points[2], U'\u20AC');
  EXPECT_EQ(points[3], U'\U0001F600');
  EXPECT_EQ(encode_utf8(points), text);
  expect_message([] { decode_utf8(std::string("ab\0c", 4), "f"); }, "f is not UTF-8 text (binary?): a NUL byte at byte 2");
  expect_message([] { decode_utf8("a\xC3", "f"); }, "truncated");
  expect_message([] { decode_utf8("\xFF", "f"); }, "invalid leading byte");
  expect_message([] { decode_utf8("\xC0\xAF", "f"); }, "invalid code point");  // overlong '/'
  expect_message([] { decode_utf8("\xED\xA0\x80", "f"); }, "invalid code point");  // a surrogate
}

TEST(Corpus, TheVocabularyIsTheSortedCharactersAndTheSplitNinetyTen) {
  const auto c = make_corpus("banana bread", "t");
  EXPECT_EQ(encode_utf8(c.vocab), " abdenr");
  ASSERT_EQ(c.train.size() + c.validation.size(), 12u);
  EXPECT_EQ(c.train.size(), 10u);
  EXPECT_EQ(c.train[0], 2);  // 'b'
  EXPECT_EQ(c.validation.back(), 3);  // 'd'
}

TEST(Corpus, MissingEmptyAndBinaryFilesAreRefusedClearly) {
  expect_message([] { load_text_file("/nonexistent/file.txt"); }, "--text /nonexistent/file.txt: cannot be read");
  const std::string empty = temp_path("empty.txt"), binary = temp_path("binary.bin");
  write(empty, "");
  write(binary, std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  expect_message([&] { load_text_file(empty); }, "is empty");
  expect_message([&] { load_text_file(binary); }, "is not UTF-8 text (binary?)");
  expect_message([] { load_text_file("/tmp"); }, "is a directory");
  std::remove(empty.c_str());
  std::remove(binary.c_str());
}

TEST(Corpus, TheKingJamesBibleHasNoVerseReferences) {
  std::string text;
  try {
    text = kjv_text();
  } catch (const std::runtime_error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_GT(text.size(), 4000000u);
  EXPECT_LT(text.size(), 4300000u);
  EXPECT_EQ(text.rfind("In the beginning God created the heaven and the earth.\n", 0), 0u);
  EXPECT_EQ(text.find("Ge1:"), std::string::npos);
  EXPECT_EQ(text.find("Rev22:"), std::string::npos);
  EXPECT_NE(text.find("The grace of our Lord Jesus Christ be with you all. Amen.\n"), std::string::npos);
}

TEST(Corpus, WindowsAreSeededAndTheirTargetsAreTheNextTokens) {
  std::vector<std::int32_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = i;
  std::mt19937_64 a(5), b(5);
  tensor x1, y1, x2, y2;
  sample_windows(tokens, 4, 8, a, x1, y1);
  sample_windows(tokens, 4, 8, b, x2, y2);
  EXPECT_EQ(x1.shape(), (tensor::shape_type{32, 1}));
  EXPECT_EQ(y1.type(), dtype::i32);
  for (int r = 0; r < 32; ++r) {
    EXPECT_EQ(x1.data<float>()[r], x2.data<float>()[r]);
    EXPECT_EQ(y1.data<std::int32_t>()[r], static_cast<std::int32_t>(x1.data<float>()[r]) + 1);
    if (r % 8 != 0) {
      EXPECT_EQ(x1.data<float>()[r], x1.data<float>()[r - 1] + 1);
    }
  }
  std::mt19937_64 c(6);
  EXPECT_THROW(sample_windows(std::vector<std::int32_t>(8), 1, 8, c, x1, y1), std::invalid_argument);
}

TEST(LmTraining, TheScheduleWarmsUpThenFollowsACosineToTheFloor) {
  // nanoGPT's get_lr at iterations 0, 99, 100, 1050, 2000 (steps 1, 100, 101, 1051, 2001).
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1, 1e-3, 1e-4, 100, 2000), 1e-3 / 101);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(100, 1e-3, 1e-4, 100, 2000), 1e-3 * 100 / 101);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(101, 1e-3, 1e-4, 100, 2000), 1e-3);
  EXPECT_NEAR(warmup_cosine_lr(1051, 1e-3, 1e-4, 100, 2000), 5.5e-4, 1e-12);
  EXPECT_NEAR(warmup_cosine_lr(2001, 1e-3, 1e-4, 100, 2000), 1e-4, 1e-12);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(5000, 1e-3, 1e-4, 100, 2000), 1e-4);
}

TEST(LmTraining, ClippingScalesEveryGradientByTheGlobalNorm) {
  auto m = make_gpt("gpt:layers=1,heads=1,embd=2,ctx=2", 3);
  auto params = m->parameters();
  double sq = 0;
  for (auto* p : params)
    for (float& g : p->grad.data<float>()) g = 0.5f, sq += 0.25;
  const double norm = std::sqrt(sq);
  EXPECT_NEAR(clip_grad_norm(*m, 1.0), norm, 1e-9);
  double after = 0;
  for (auto* p : params)
    for (float g : p->grad.data<float>()) {
      EXPECT_NEAR(g, 0.5 / (norm + 1e-6), 1e-7);
      after += static_cast<double>(g) * g;
    }
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-5);
  const float before = params[0]->grad.data<float>()[0];
  clip_grad_norm(*m, 100.0);  // under the limit: unchanged
  EXPECT_EQ(params[0]->grad.data<float>()[0], before);
}

// The norm that clipping uses is the sum of per-tensor sums, added in model order: what pipeline
// ranks report of their parts adds up to it exactly.
TEST(LmTraining, TheGlobalNormIsThePerTensorSumsAddedInOrder) {
  auto m = make_gpt("gpt:layers=1,heads=2,embd=4,ctx=2", 5);
  std::mt19937_64 g(3);
  std::vector<double> sums;
  for (auto* p : m->parameters()) {
    for (float& v : p->grad.data<float>()) v = static_cast<float>(static_cast<double>(g() % 2001) / 1000.0 - 1.0);
    double s = 0;
    for (float v : p->grad.data<float>()) s += static_cast<double>(v) * v;
    EXPECT_EQ(grad_square_sum(p->grad), s) << p->name;
    sums.push_back(s);
  }
  double total = 0;
  for (double s : sums) total += s;
  EXPECT_EQ(global_norm(sums), std::sqrt(total));
  EXPECT_EQ(clip_grad_norm(*m, 0.5), std::sqrt(total));
  EXPECT_EQ(clip_coefficient(std::sqrt(total), 1e9), 1.0) << "under the limit: no change";
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.0) << "not finite: no change (the step is skipped)";
}

// nanoGPT's groups: weight decay on matrices and embeddings, none on biases and norms.
TEST(LmTraining, OnlyMatricesAreDecayed) {
  auto m = make_gpt("gpt:layers=1,heads=2,embd=4,ctx=2", 5);
  const auto params = m->parameters();
  std::vector<std::uint64_t> keys, ordered;
  for (std::size_t i = 0; i < params.size(); ++i) keys.push_back(100 + i);
  hyperparameters hp;
  hp.weight_decay = 0.1;
  const auto groups = decay_matrices_only(params, keys, hp, {}, ordered);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].hp.weight_decay, 0.1);
  EXPECT_EQ(groups[1].hp.weight_decay, 0.0);
  for (const auto* p : groups[0].params) EXPECT_GT(p->value.dim(0), 1) << p->name;
  for (const auto* p : groups[1].params) EXPECT_EQ(p->value.dim(0), 1) << p->name;
  EXPECT_EQ(groups[0].params.size() + groups[1].params.size(), params.size());
  ASSERT_EQ(ordered.size(), params.size());
  EXPECT_EQ(ordered[0], 100u) << "wte, the first matrix, keeps its key";
  const auto lr = warmup_cosine(1e-3, 1e-4, 10, 100);
  for (std::int64_t step : {1, 10, 11, 50, 100, 200})
    EXPECT_EQ(lr(step, 1e-3), warmup_cosine_lr(step, 1e-3, 1e-4, 10, 100)) << step;
}

// Microbatches in one thread: each loss counted 1/M, the gradients summed before the step; with
// one microbatch the step is the whole batch's.
TEST(LmTraining, MicrobatchesInOneThreadSumTheirGradients) {
  auto one = make_gpt("gpt:layers=1,heads=2,embd=8,ctx=4", 7), two = make_gpt("gpt:layers=1,heads=2,embd=8,ctx=4", 7);
  one->initialize(1);
  two->initialize(1);
  std::vector<std::int32_t> tokens(64);
  std::mt19937_64 g(2);
  for (auto& t : tokens) t = static_cast<std::int32_t>(g() % 7);
  tensor x, y;
  sample_windows(tokens, 4, 4, g, x, y);
  // eps 1: the step is about lr * gradient, so a gradient of the wrong scale shows.
  hyperparameters hp;
  hp.lr = 0.1;
  hp.eps = 1.0;
  lm_engine_setup s1{.model = *one, .microbatches = 1, .hp = hp, .state = {}, .warmup = 0, .decay_steps = 10,
                     .min_lr = 0, .clip = 0};
  lm_engine_setup s2{.model = *two, .microbatches = 2, .hp = hp, .state = {}, .warmup = 0, .decay_steps = 10,
                     .min_lr = 0, .clip = 0};
  auto e1 = lm_in_thread(s1), e2 = lm_in_thread(s2);
  const auto r1 = e1->step(x, y), r2 = e2->step(x, y);
  EXPECT_NEAR(r2.loss, r1.loss, 1e-6);
  const auto a = one->parameters(), b = two->parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < a[i]->value.numel(); ++k)
      EXPECT_NEAR(a[i]->value.data<float>()[k], b[i]->value.data<float>()[k], 1e-5) << a[i]->name;
  EXPECT_THROW(lm_in_thread(lm_engine_setup{.model = *one, .microbatches = 0}), std::invalid_argument);
}

TEST(LmTraining, AGptLearnsATinyCorpusAndItsSavedModelSamples) {
  const std::string text = temp_path("corpus.txt"), dir = temp_path("model");
  write(text, tiny_corpus());
  lm_options o;
  o.model = "gpt:layers=2,heads=2,embd=32,ctx=16";
  o.dataset.clear();
  o.text = text;
  o.steps = 150;
  o.batch = 8;
  o.lr = 3e-3;
  o.warmup = 10;
  o.eval_every = 50;
  o.eval_batches = 4;
  o.save = dir;
  std::vector<lm_progress> seen;
  const auto r = train_lm(o, [&](const lm_progress& p) { seen.push_back(p); });
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.back().step, 150);
  // Chance is log(vocab) ~ 2.9; the words repeat, so a model that learned them is far below it.
  const auto vocab = make_corpus(tiny_corpus(), "t").vocab.size();
  EXPECT_LT(seen.front().val_loss, std::log(static_cast<double>(vocab)));
  EXPECT_LT(r.val_loss, 1.2);
  EXPECT_LT(seen.back().val_loss, seen.front().val_loss);
  EXPECT_GT(r.tokens_per_s, 0);
  EXPECT_GT(r.peak_rss_mb, 0);
  EXPECT_EQ(r.skipped_steps, 0);

  auto lm = load_lm(dir);
  EXPECT_EQ(lm.spec, o.model);
  EXPECT_EQ(lm.vocab.size(), vocab);
  const std::string greedy = generate_text(lm, "in the ", 20, 0, 1);
  EXPECT_EQ(greedy.rfind("in the ", 0), 0u);
  EXPECT_EQ(decode_utf8(greedy, "out").size(), 27u);
  EXPECT_EQ(generate_text(lm, "in the ", 20, 0, 2), greedy) << "temperature 0 takes the most likely";
  EXPECT_EQ(generate_text(lm, "the", 30, 1.0, 7), generate_text(lm, "the", 30, 1.0, 7)) << "seeded";
  // Longer than the context: it slides.
  EXPECT_EQ(decode_utf8(generate_text(lm, "", 40, 0.8, 3), "out").size(), 40u);
  expect_message([&] { generate_text(lm, "XYZ", 5, 1.0, 1); }, "the character 'X' is not in the model's vocabulary");
  expect_message([&] { load_lm("/nonexistent/model"); }, "model: cannot be read");
  std::filesystem::remove_all(dir);
  std::remove(text.c_str());
}

TEST(LmTraining, BadOptionsAreRefusedBeforeTraining) {
  lm_options o;
  o.dataset.clear();
  o.text = "/nonexistent/x.txt";
  expect_message([&] { train_lm(o); }, "--text /nonexistent/x.txt: cannot be read");
  o.text = "";
  o.dataset = "fashion-mnist";
  expect_message([&] { train_lm(o); }, "is not a text corpus");
  o.dataset = "kjv";
  o.text = "/tmp/a.txt";
  expect_message([&] { train_lm(o); }, "cannot combine");
  o.text.clear();
  o.steps = 0;
  expect_message([&] { train_lm(o); }, "--steps must be at least 1");
  const std::string small = temp_path("small.txt");
  write(small, "just a few characters of text, fewer than a window.");
  lm_options s;
  s.dataset.clear();
  s.text = small;
  expect_message([&] { train_lm(s); }, "a window of ctx + 1 = 65 needs more");
  std::remove(small.c_str());
}

}  // namespace
