// Checkpoint shards (checkpoint.hpp): what is written reads back the same (weights, random state,
// optimizer state in its storage); damaged bytes, even with a checksum that matches them, are
// refused naming the file and leave the model and optimizer as they were.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <troupe/core/file.hpp>
#include <troupe/kernels/checkpoint.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/kernels/optim.hpp>

namespace {

using namespace troupe;
using namespace troupe::kernels;

const std::string spec = "gpt:layers=1,heads=2,embd=16,ctx=8,dropout=0.1";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("troupe_shard_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const std::string& path, const std::string& body) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << body;
}

shard_info info_of(const std::string& path, const std::string& bytes) {
  return {std::filesystem::path(path).filename().string(), crc32(std::as_bytes(std::span(bytes.data(), bytes.size()))),
          bytes.size()};
}

/// A small GPT with its AdamW (8-bit moments for every tensor), after `steps` steps on random
/// gradients and a training forward (which moves its dropout generators).
struct trained {
  std::unique_ptr<sequential> model = make_gpt(spec, 11);
  std::optional<optimizer> opt;
  explicit trained(std::uint64_t seed, int steps) {
    model->initialize(seed);
    state_options state;
    state.storage = state_storage::int8;
    state.min_8bit_elements = 1;
    state.block_size = 64;
    opt.emplace(optimizer_kind::adamw, std::vector<param_group>{{model->parameters(), hyperparameters{}, state}});
    std::mt19937 g(static_cast<std::uint32_t>(seed));
    std::normal_distribution<float> n;
    for (int s = 0; s < steps; ++s) {
      for (auto* p : model->parameters())
        for (float& v : p->grad.data<float>()) v = n(g);
      opt->step();
    }
    tensor x = tensor::zeros({8, 1});
    saved_activations keep;
    (void)model->forward(x, keep, true);
  }
  std::vector<shard_stage> stages() { return {{0, model.get()}}; }
  std::string values() const {
    std::string out;
    for (auto* p : model->parameters()) out.append(reinterpret_cast<const char*>(p->value.bytes()), p->value.nbytes());
    std::vector<std::string> random;
    model->save_random_state(random);
    for (const auto& r : random) out += r;
    return out;
  }
  std::vector<std::byte> state() const { return opt->save_state(); }
};

TEST(Shard, ReadsBackTheWeightsRandomStateAndOptimizerStateItWrote) {
  const std::string path = temp_path("a.shard");
  trained a(1, 3), b(2, 0);
  const auto info = write_shard(path, a.stages(), *a.opt);
  EXPECT_EQ(info.file, std::filesystem::path(path).filename().string());
  EXPECT_EQ(info.bytes, std::filesystem::file_size(path));
  EXPECT_EQ(info, info_of(path, read(path)));
  ASSERT_NE(a.values(), b.values());
  read_shard(path, info, b.stages(), *b.opt);
  EXPECT_EQ(b.values(), a.values());
  EXPECT_EQ(b.opt->steps(), 3);
  EXPECT_TRUE(b.state() == a.state()) << "the 8-bit moments, their scales and the step counts";
  std::filesystem::remove(path);
}

TEST(Shard, AShardOfAnotherModelIsRefusedAndChangesNothing) {
  const std::string path = temp_path("other.shard");
  trained a(1, 1);
  write_shard(path, a.stages(), *a.opt);
  auto other = make_gpt("gpt:layers=1,heads=2,embd=32,ctx=8,dropout=0.1", 11);
  optimizer opt(optimizer_kind::adamw, {{other->parameters(), hyperparameters{}, state_options{}}});
  try {
    read_shard(path, info_of(path, read(path)), {{0, other.get()}}, opt);
    ADD_FAILURE() << "a shard of another model was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint shard " + path + " holds stage 0 as sequential(embedding(vocab=11, ctx=8, "
                                         "embd=16)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(opt.steps(), 0);
  std::filesystem::remove(path);
}

// Hostile bytes that carry a checksum of their own (so that the decoder, not the checksum,
// meets them): every cut and every byte flipped, at a stride, is refused with a message that
// names the file, or (a flipped bit inside a weight or a moment) read as the data it now is;
// a refusal leaves the model and the optimizer as they were.
TEST(Shard, DamagedBytesWithAMatchingChecksumAreRefusedOrReadWholeNeverHalf) {
  const std::string path = temp_path("good.shard"), bad = temp_path("bad.shard");
  trained a(1, 2), b(2, 1);
  write_shard(path, a.stages(), *a.opt);
  const std::string good = read(path);
  const std::string before = b.values();
  const auto state_before = b.state();
  int refused = 0, read_whole = 0;
  auto attempt = [&](const std::string& bytes) {
    write(bad, bytes);
    try {
      read_shard(bad, info_of(bad, bytes), b.stages(), *b.opt);
      ++read_whole;
      // Read whole: back to the start for the next attempt.
      trained fresh(2, 1);
      std::swap(b.model, fresh.model);
      b.opt.swap(fresh.opt);
    } catch (const std::runtime_error& e) {
      ++refused;
      ASSERT_EQ(std::string(e.what()).rfind("checkpoint shard " + bad + " ", 0), 0u) << e.what();
      ASSERT_EQ(b.values(), before) << "a refused shard changed the model: " << e.what();
      ASSERT_TRUE(b.state() == state_before) << "a refused shard changed the optimizer: " << e.what();
    }
  };
  for (std::size_t cut = 0; cut < good.size(); cut += 97) attempt(good.substr(0, cut));
  for (std::size_t at = 0; at < good.size(); at += 89) {
    std::string flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x5a);
    attempt(flipped);
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(read_whole, 0);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// A parameter kept in bf16 or f16 (the loader compares types, so the model here has one too)
// whose shard holds a NaN or an infinity is refused as an f32 one is, and nothing changes;
// the same shard with finite values reads.
TEST(Shard, ANonFiniteBf16OrF16ParameterIsRefusedAndChangesNothing) {
  const std::string path = temp_path("half.shard");
  struct half_model {
    std::unique_ptr<sequential> model = make_gpt(spec, 11);
    std::optional<optimizer> opt;
    half_model(std::uint64_t seed, dtype type, std::uint16_t fill) {
      model->initialize(seed);
      auto params = model->parameters();
      auto& v = params.back()->value;
      v = tensor::empty(v.shape(), type);
      for (auto& bits : v.data<std::uint16_t>()) bits = fill;
      params.pop_back();  // the optimizer takes f32 parameters only
      opt.emplace(optimizer_kind::adamw, std::vector<param_group>{{params, hyperparameters{}, state_options{}}});
    }
    std::vector<shard_stage> stages() { return {{0, model.get()}}; }
    std::string values() const {
      std::string out;
      for (auto* p : model->parameters()) out.append(reinterpret_cast<const char*>(p->value.bytes()), p->value.nbytes());
      return out;
    }
  };
  // (bf16 0x3f80 and f16 0x3c00 are 1.0.)
  const std::vector<std::tuple<dtype, std::uint16_t, std::uint16_t, const char*>> cases = {
      {dtype::bf16, 0x3f80, 0x7fc0, "bf16 NaN"},  {dtype::bf16, 0x3f80, 0x7f80, "bf16 +inf"},
      {dtype::bf16, 0x3f80, 0xff80, "bf16 -inf"}, {dtype::f16, 0x3c00, 0x7e00, "f16 NaN"},
      {dtype::f16, 0x3c00, 0xfc00, "f16 -inf"}};
  for (const auto& [type, one, bad, what] : cases) {
    half_model finite(1, type, one), broken(1, type, bad), target(2, type, 0);
    write_shard(path, broken.stages(), *broken.opt);
    const std::string before = target.values();
    try {
      read_shard(path, info_of(path, read(path)), target.stages(), *target.opt);
      ADD_FAILURE() << what << " was read";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("that is not finite"), std::string::npos) << what << ": " << e.what();
    }
    EXPECT_EQ(target.values(), before) << what;
    write_shard(path, finite.stages(), *finite.opt);
    read_shard(path, info_of(path, read(path)), target.stages(), *target.opt);
    EXPECT_EQ(target.values(), finite.values()) << what;
  }
  std::filesystem::remove(path);
}

}  // namespace

#include "lm_checkpoint.hpp"

namespace {

using troupe::kernels::detail::lm_manifest;

lm_manifest sample_manifest() {
  lm_manifest m;
  m.options = "model=gpt:layers=1,heads=2,embd=16,ctx=8\nsteps=6\nlr=0.01\n";
  m.ranks = 2;
  m.layout = {{0, 1, 1, 0}, {4, 7, 7, 3}};
  m.step = 3;
  m.skipped_steps = 1;
  m.loss_sum = 2.0 / 3.0;
  m.losses = 3;
  m.data_rng = "12 34 56";
  m.slot = "b";
  m.shards = {{"rank0-b.shard", 0xdeadbeef, 1234}, {"rank1-b.shard", 0x01020304, 99}};
  return m;
}

TEST(Manifest, ReadsBackWhatWasWrittenToTheBit) {
  const std::string dir = temp_path("manifest");
  std::filesystem::create_directories(dir);
  const auto m = sample_manifest();
  troupe::kernels::detail::write_manifest(dir, m);
  const auto r = troupe::kernels::detail::read_manifest(dir);
  EXPECT_EQ(r.options, m.options);
  EXPECT_EQ(r.ranks, 2);
  EXPECT_EQ(r.layout.rank_of_stage, m.layout.rank_of_stage);
  EXPECT_EQ(r.layout.stage_tensors, m.layout.stage_tensors);
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.loss_sum, m.loss_sum) << "a double survives its text form";
  EXPECT_EQ(r.losses, 3);
  EXPECT_EQ(r.data_rng, m.data_rng);
  EXPECT_EQ(r.slot, "b");
  EXPECT_EQ(r.shards, m.shards);
  std::filesystem::remove_all(dir);
}

/// `body` (the manifest without its crc= line) written to `dir`'s manifest with its CRC-32; what
/// read_manifest says of it ("" when it reads it).
std::string read_error(const std::string& dir, const std::string& body) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "crc=%08x\n", crc32(std::as_bytes(std::span(body.data(), body.size()))));
  write(dir + "/manifest", body + crc);
  try {
    (void)troupe::kernels::detail::read_manifest(dir);
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

// A key twice (the last would win silently), a count with a sign or a space (which std::stoll
// took), ranks beyond an int (which a cast cut to a small count) and a stage on a rank past
// them are refused, naming the line.
TEST(Manifest, RefusesDuplicateKeysSignedOrSpacedCountsAndRanksOutOfRange) {
  const std::string dir = temp_path("manifest_strict");
  std::filesystem::create_directories(dir);
  troupe::kernels::detail::write_manifest(dir, sample_manifest());
  const std::string good = read(dir + "/manifest");
  const std::string body = good.substr(0, good.rfind("crc="));
  ASSERT_EQ(read_error(dir, body), "");
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string b = body;
    const auto at = b.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return b.replace(at, from.size(), to);
  };
  EXPECT_NE(read_error(dir, edited("step=3\n", "step=3\nstep=5\n")).find("has two step= lines"), std::string::npos);
  EXPECT_NE(read_error(dir, edited("slot=b\n", "slot=a\nslot=b\n")).find("has two slot= lines"), std::string::npos);
  for (const std::string step : {"+3", " 3", "3 ", "\t3", "-0", "0x3", "99999999999999999999"})
    EXPECT_NE(read_error(dir, edited("step=3\n", "step=" + step + "\n")).find("has step=" + step + ", not a count"),
              std::string::npos)
        << step;
  for (const std::string place : {"+0,1,1,0", "0, 1,1,0"})
    EXPECT_NE(read_error(dir, edited("place=0,1,1,0\n", "place=" + place + "\n")).find("has a malformed place= line"),
              std::string::npos)
        << place;
  // 2^32 + 2 was 2 once cut to an int, as many as the shard lines.
  EXPECT_NE(read_error(dir, edited("ranks=2\n", "ranks=4294967298\n")).find("has ranks=4294967298 (1 to 2147483647)"),
            std::string::npos);
  EXPECT_NE(read_error(dir, edited("ranks=2\n", "ranks=0\n")).find("has ranks=0"), std::string::npos);
  EXPECT_NE(read_error(dir, edited("place=0,1,1,0\n", "place=0,1,4294967296,0\n")).find("a stage on rank 4294967296 of 2"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// Edited manifests that carry a matching checksum: every cut and every byte changed, at a
// stride, is read or refused with a message naming the file, never a crash.
TEST(Manifest, EditedTextWithAMatchingChecksumIsReadOrRefusedNamingTheFile) {
  const std::string dir = temp_path("manifest_edits");
  std::filesystem::create_directories(dir);
  troupe::kernels::detail::write_manifest(dir, sample_manifest());
  const std::string path = dir + "/manifest", good = read(path);
  const std::string body = good.substr(0, good.rfind("crc="));
  int refused = 0, accepted = 0;
  auto attempt = [&](const std::string& text) {
    char crc[16];
    std::snprintf(crc, sizeof crc, "crc=%08x\n", crc32(std::as_bytes(std::span(text.data(), text.size()))));
    write(path, text + crc);
    try {
      (void)troupe::kernels::detail::read_manifest(dir);
      ++accepted;
    } catch (const std::runtime_error& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()).rfind("the checkpoint manifest " + path + " ", 0), 0u) << e.what();
    }
  };
  for (std::size_t cut = 0; cut < body.size(); cut += 7) attempt(body.substr(0, cut));
  // Every byte of the numeric lines (before the options), a few of the rest.
  const std::size_t numbers = body.find("option ");
  for (std::size_t at = 0; at < body.size(); at += at < numbers ? 1 : 5)
    for (const char c : {'x', '=', '\n', '-', '9', ','}) {
      std::string edited = body;
      edited[at] = c;
      attempt(edited);
    }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
