// Sharded checkpoints of a GPT's training (kernels::train_lm with --checkpoint and --resume):
// each rank's shard and the manifest; a run stopped and resumed ends with the checkpoint of a run
// that never stopped, byte for byte (weights, random state, optimizer state and step count,
// data generator); what cannot be resumed, and damaged shards, are refused with the reason.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/core/file.hpp>
#include <troupe/kernels/lm.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/runtime.hpp>

namespace {

namespace fs = std::filesystem;
namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;

/// A fresh directory for one test's files, removed after it.
class scratch {
public:
  explicit scratch(const std::string& name)
      : root_(fs::temp_directory_path() / ("troupe_ckpt_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~scratch() { fs::remove_all(root_); }
  std::string operator/(const std::string& name) const { return (root_ / name).string(); }

private:
  fs::path root_;
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const std::string& path, const std::string& body) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << body;
}

/// A text with some structure: a few words in a random order.
std::string corpus_text() {
  std::string s;
  std::mt19937 rng(4);
  const char* words[] = {"the lord ", "said unto ", "moses ", "and ", "it was good. ", "in the beginning "};
  while (s.size() < 6000) s += words[rng() % 6];
  return s;
}

/// A small GPT with dropout (random state in every shard), clipping, 6 steps; evaluations at
/// steps 4 and 6, so a stop at step 3 falls between them.
kernels::lm_options options(const std::string& text, const std::string& state = "fp32") {
  kernels::lm_options o;
  o.model = "gpt:layers=2,heads=2,embd=32,ctx=8,dropout=0.1";  // (its 32 x 128 matrices: 8-bit state)
  o.dataset.clear();
  o.text = text;
  o.steps = 6;
  o.batch = 4;
  o.microbatches = 2;
  o.lr = 1e-2;
  o.warmup = 2;
  o.clip = 0.5;
  o.state = state;
  o.eval_every = 4;
  o.eval_batches = 1;
  o.seed = 3;
  return o;
}

/// Trains with the whole model in this thread (`schedule` empty) or with a pipeline.
kernels::lm_result train(const kernels::lm_options& o, const std::string& schedule = "", int ranks = 2,
                         std::vector<kernels::lm_progress>* seen = nullptr) {
  troupe::actor_system sys{{.threads = 2}};
  kernels::lm_engine_factory engine;
  if (!schedule.empty())
    engine = pipeline::lm_pipeline_engine(sys, pipeline::generate(schedule, ranks, static_cast<int>(o.microbatches)));
  return kernels::train_lm(o, [&](const kernels::lm_progress& p) { if (seen) seen->push_back(p); }, {}, engine);
}

/// The value of `key=` in a manifest.
std::string field(const std::string& manifest, const std::string& key) {
  std::istringstream lines(manifest);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return "(none)";
}

/// The shard files a manifest names, in rank order.
std::vector<std::string> shards(const std::string& dir) {
  std::vector<std::string> out;
  std::istringstream lines(read(dir + "/manifest"));
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("shard=", 0) == 0) out.push_back(dir + "/" + line.substr(6, line.find(' ') - 6));
  return out;
}

/// The checkpoints in `a` and `b` are of the same step and hold the same bytes: every shard
/// (weights, random state, optimizer state with its step count), the data generator, the losses
/// since the last evaluation, the options.
void expect_same_checkpoint(const std::string& a, const std::string& b, const std::string& what) {
  const std::string ma = read(a + "/manifest"), mb = read(b + "/manifest");
  ASSERT_FALSE(ma.empty()) << what;
  for (const char* key : {"step", "skipped-steps", "train-loss-sum", "train-losses", "data-rng", "ranks", "place", "cut"})
    EXPECT_EQ(field(ma, key), field(mb, key)) << what << ": " << key;
  const auto options = [](const std::string& m) {  // (the crc= line after them differs with the slot)
    const auto from = m.find("option ");
    return m.substr(from, m.rfind("crc=") - from);
  };
  EXPECT_EQ(options(ma), options(mb)) << what;
  const auto sa = shards(a), sb = shards(b);
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (std::size_t r = 0; r < sa.size(); ++r) {
    const std::string x = read(sa[r]), y = read(sb[r]);
    EXPECT_FALSE(x.empty()) << sa[r];
    EXPECT_TRUE(x == y) << what << ": the shards of rank " << r << " differ (" << sa[r] << ", " << sb[r] << ")";
  }
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

struct layout_case {
  std::string schedule;  // empty: the whole model in this thread
  int ranks;
  std::string state;
};

void PrintTo(const layout_case& c, std::ostream* os) {
  *os << (c.schedule.empty() ? std::string("in this thread") : c.schedule) << " on " << c.ranks << " ranks, " << c.state;
}

class ResumedTraining : public testing::TestWithParam<layout_case> {};

TEST_P(ResumedTraining, EndsWithTheCheckpointOfARunThatNeverStopped) {
  const auto& c = GetParam();
  scratch dir("resume_" + (c.schedule.empty() ? std::string("thread") : c.schedule) + "_" + c.state);
  write(dir / "text", corpus_text());
  auto o = options(dir / "text", c.state);

  std::vector<kernels::lm_progress> straight_seen, resumed_seen;
  o.checkpoint = dir / "straight";
  const auto straight = train(o, c.schedule, c.ranks, &straight_seen);

  o.checkpoint = dir / "stopped";
  o.stop_after = 3;
  const auto stopped = train(o, c.schedule, c.ranks);
  EXPECT_EQ(stopped.last_step, 3);
  EXPECT_EQ(field(read(dir / "stopped/manifest"), "step"), "3");
  o.stop_after = 0;
  o.resume = o.checkpoint;
  const auto resumed = train(o, c.schedule, c.ranks, &resumed_seen);
  EXPECT_EQ(resumed.resumed_from, 3);
  EXPECT_EQ(resumed.last_step, 6);

  expect_same_checkpoint(dir / "straight", dir / "stopped", c.schedule + " " + c.state);
  // The evaluations after the stop: the losses of steps 1 to 3 came with the checkpoint.
  ASSERT_EQ(straight_seen.size(), 2u);
  ASSERT_EQ(resumed_seen.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed_seen[i].step, straight_seen[i].step);
    EXPECT_EQ(resumed_seen[i].train_loss, straight_seen[i].train_loss) << "evaluation " << i;
    EXPECT_EQ(resumed_seen[i].val_loss, straight_seen[i].val_loss) << "evaluation " << i;
  }
  EXPECT_EQ(resumed.val_loss, straight.val_loss);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ResumedTraining,
    testing::Values(layout_case{"", 1, "fp32"}, layout_case{"1f1b", 2, "fp32"}, layout_case{"1f1b", 2, "int8"},
                    layout_case{"zb-v", 2, "fp32"}, layout_case{"zb-v", 2, "int8"},
                    layout_case{"interleaved-1f1b", 2, "bf16"}, layout_case{"gpipe", 3, "int8"}),
    [](const testing::TestParamInfo<layout_case>& i) {
      std::string name = (i.param.schedule.empty() ? std::string("in_thread") : i.param.schedule) + "_" +
                         std::to_string(i.param.ranks) + "_" + i.param.state;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

TEST(Checkpoint, EachRankWritesItsOwnShardAndTheManifestNamesThem) {
  scratch dir("layout");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text");
  o.checkpoint = dir / "ck";
  o.checkpoint_every = 2;
  train(o, "zb-v", 2);
  const std::string m = read(dir / "ck/manifest");
  EXPECT_EQ(m.rfind("troupe checkpoint 1\n", 0), 0u);
  EXPECT_EQ(field(m, "step"), "6");
  EXPECT_EQ(field(m, "ranks"), "2");
  EXPECT_EQ(field(m, "place"), "0,1,1,0") << "zb-v's V: rank 0 holds the first and last stages";
  // Checkpoints at steps 2, 4 and 6 went to slots a, b, a: the one before the last stays whole.
  EXPECT_EQ(field(m, "slot"), "a");
  for (const char* f : {"rank0-a.shard", "rank1-a.shard", "rank0-b.shard", "rank1-b.shard"})
    EXPECT_TRUE(fs::is_regular_file(dir / ("ck/" + std::string(f)))) << f;
  EXPECT_EQ(read(dir / "ck/rank1-a.shard").substr(0, 4), "TRPS");
  // The moments in their storage: bf16, and 8-bit codes (of the tensors of 4096 elements and
  // more; the smaller ones stay fp32), take less room than fp32.
  std::vector<std::size_t> sizes;
  for (const char* state : {"fp32", "bf16", "int8"}) {
    auto s = options(dir / "text", state);
    s.checkpoint = dir / ("ck-" + std::string(state));
    train(s, "1f1b", 2);
    sizes.push_back(fs::file_size(dir / ("ck-" + std::string(state) + "/rank0-a.shard")));
  }
  EXPECT_GT(sizes[0], sizes[1]);
  EXPECT_GT(sizes[0], sizes[2]);
}

TEST(Checkpoint, AScheduleWithTheSameStagesPerRankGoesOnFromAnothersCheckpoint) {
  scratch dir("other_schedule");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text");
  o.checkpoint = dir / "straight";
  train(o, "1f1b", 2);
  o.checkpoint = dir / "stopped";
  o.stop_after = 2;
  train(o, "1f1b", 2);
  o.stop_after = 0;
  o.resume = o.checkpoint;
  train(o, "gpipe", 2);
  expect_same_checkpoint(dir / "straight", dir / "stopped", "1f1b then gpipe");
  // One rank holds the whole model as the in-thread engine does: their shards are the same.
  auto whole = options(dir / "text");
  whole.checkpoint = dir / "whole";
  train(whole);
  whole.checkpoint = dir / "whole-stopped";
  whole.stop_after = 2;
  train(whole);
  whole.stop_after = 0;
  whole.resume = whole.checkpoint;
  train(whole, "gpipe", 1);
  expect_same_checkpoint(dir / "whole", dir / "whole-stopped", "in this thread, then a pipeline of one rank");
}

TEST(Checkpoint, ACheckpointThatFailsHalfWayLeavesTheLastOneToResume) {
  scratch dir("half_way");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text", "int8");
  o.checkpoint = dir / "straight";
  train(o, "1f1b", 2);
  // The second checkpoint (step 4, slot b): rank 0 writes its shard, rank 1 cannot.
  o.checkpoint = dir / "broken";
  o.checkpoint_every = 2;
  fs::create_directories(dir / "broken/rank1-b.shard");
  expect_message([&] { train(o, "1f1b", 2); }, "the checkpoint was not written: rank 1: checkpoint shard");
  EXPECT_EQ(field(read(dir / "broken/manifest"), "step"), "2");
  fs::remove_all(dir / "broken/rank1-b.shard");
  o.resume = o.checkpoint;
  const auto resumed = train(o, "1f1b", 2);
  EXPECT_EQ(resumed.resumed_from, 2);
  expect_same_checkpoint(dir / "straight", dir / "broken", "after a failed checkpoint");
}

TEST(Checkpoint, ARunThatCannotGoOnFromItIsRefusedSayingWhy) {
  scratch dir("refused");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text");
  o.checkpoint = dir / "ck";
  o.stop_after = 3;
  train(o, "1f1b", 2);
  auto again = options(dir / "text");
  again.resume = dir / "ck";
  {
    auto other = again;
    other.model = "gpt:layers=2,heads=2,embd=16,ctx=8,dropout=0.1";
    expect_message([&] { train(other, "1f1b", 2); },
                   "it was saved with model=gpt:layers=2,heads=2,embd=32,ctx=8,dropout=0.1 and this run has "
                   "model=gpt:layers=2,heads=2,embd=16,ctx=8,dropout=0.1");
  }
  expect_message([&] { train(again, "1f1b", 3); }, "it was written by 2 ranks and this run has 3 (resume with --ranks 2)");
  expect_message([&] { train(again); }, "it was written by 2 ranks and this run has 1");
  expect_message([&] { train(again, "zb-v", 2); },
                 "its 2 stages were on ranks 0,1, this run puts its 4 on ranks 0,1,1,0");
  {
    // A manifest whose cut is not this run's (as another partitioner would cut the model), with
    // a checksum that matches it.
    fs::create_directories(dir / "recut");
    for (const std::string f : {"rank0-a.shard", "rank1-a.shard"}) fs::copy_file(dir / ("ck/" + f), dir / ("recut/" + f));
    std::string m = read(dir / "ck/manifest");
    const auto cut = m.find("\ncut=") + 5, end = m.find('\n', cut);
    const std::string was = m.substr(cut, end - cut);
    m.replace(cut, end - cut, "3,18");
    m.erase(m.rfind("crc="));
    char crc[16];
    std::snprintf(crc, sizeof crc, "crc=%08x\n", troupe::crc32(std::as_bytes(std::span(m.data(), m.size()))));
    write(dir / "recut/manifest", m + crc);
    auto other = again;
    other.resume = dir / "recut";
    expect_message([&] { train(other, "1f1b", 2); },
                   "the model was cut into stages of 3,18 parameter tensors, this run cuts it into " + was);
  }
  {
    auto other = again;
    other.steps = 8;
    expect_message([&] { train(other, "1f1b", 2); }, "it was saved with steps=6 and this run has steps=8");
  }
  {
    auto other = again;
    other.state = "int8";
    expect_message([&] { train(other, "1f1b", 2); }, "it was saved with state=fp32 and this run has state=int8");
  }
  {
    auto other = again;
    write(dir / "text2", corpus_text() + "more");
    other.text = dir / "text2";
    expect_message([&] { train(other, "1f1b", 2); }, "it was saved with corpus-characters=");
  }
  {
    auto other = options(dir / "text");
    other.checkpoint = dir / "ck";
    expect_message([&] { train(other, "1f1b", 2); },
                   "--checkpoint " + (dir / "ck") + " holds a checkpoint already: go on from it with --resume");
  }
  {
    auto other = options(dir / "text");
    other.resume = dir / "nothing";
    expect_message([&] { train(other, "1f1b", 2); }, "--resume " + (dir / "nothing") + ": no such directory");
    fs::create_directories(dir / "empty");
    other.resume = dir / "empty";
    expect_message([&] { train(other, "1f1b", 2); }, "holds no checkpoint (no manifest)");
  }
  {
    auto other = again;
    other.stop_after = 2;
    other.checkpoint = dir / "ck2";
    expect_message([&] { train(other, "1f1b", 2); }, "the checkpoint is at step 3, past --stop-after 2");
  }
  {
    auto other = options(dir / "text");
    other.stop_after = 3;
    expect_message([&] { train(other); }, "--stop-after requires --checkpoint");
    other.checkpoint = dir / "ck3";
    other.stop_after = 6;
    expect_message([&] { train(other); }, "--stop-after must be a step below --steps 6");
  }
}

TEST(Checkpoint, AFinishedRunHasNothingLeftToResume) {
  scratch dir("finished");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text");
  o.checkpoint = dir / "ck";
  train(o);
  o.resume = o.checkpoint;
  expect_message([&] { train(o); }, "the checkpoint is at step 6, the last of --steps 6: nothing is left to train");
}

TEST(Checkpoint, ADamagedShardOrManifestIsRefusedNamingTheFile) {
  scratch dir("damaged");
  write(dir / "text", corpus_text());
  auto o = options(dir / "text");
  o.checkpoint = dir / "ck";
  o.stop_after = 2;
  train(o, "1f1b", 2);
  o.stop_after = 0;
  o.checkpoint.clear();
  o.resume = dir / "ck";
  const std::string shard = dir / "ck/rank1-a.shard", good = read(shard);
  const std::string manifest = dir / "ck/manifest", good_manifest = read(manifest);

  std::string flipped = good;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
  write(shard, flipped);
  expect_message([&] { train(o, "1f1b", 2); }, "rank 1: checkpoint shard " + shard + " is corrupted: its CRC-32 is");

  write(shard, good.substr(0, good.size() - 100));
  expect_message([&] { train(o, "1f1b", 2); },
                 "checkpoint shard " + shard + " is truncated or was replaced: " + std::to_string(good.size() - 100) +
                     " bytes, the manifest says " + std::to_string(good.size()));

  fs::remove(shard);
  expect_message([&] { train(o, "1f1b", 2); }, "checkpoint shard " + shard + " is missing");

  write(shard, good);
  std::string bad_manifest = good_manifest;
  bad_manifest[bad_manifest.find("step=") + 5] = '7';
  write(manifest, bad_manifest);
  expect_message([&] { train(o, "1f1b", 2); }, "the checkpoint manifest " + manifest + " is corrupted");
  write(manifest, good_manifest.substr(0, good_manifest.size() / 2));
  expect_message([&] { train(o, "1f1b", 2); }, "the checkpoint manifest " + manifest + " is truncated");

  write(manifest, good_manifest);
  EXPECT_EQ(train(o, "1f1b", 2).resumed_from, 2) << "put back whole, it resumes";
}

}  // namespace
