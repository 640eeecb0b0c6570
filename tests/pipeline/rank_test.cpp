// A rank actor called as the driver on another node calls it: everything it is given came over
// the network, so what does not fit its schedule is refused with why, and nothing else changes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <optional>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/schedule.hpp>

#include "rank.hpp"

namespace {

using troupe::tensor;
namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;
using pipeline::detail::outcome;
using pipeline::detail::portable_stage;
using pipeline::detail::rank_actor;
using pipeline::detail::step_plan;

troupe::system_config listening() {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = "rank-test-token";
  return cfg;
}

/// One stage of 4 inputs and 3 classes, as it travels.
portable_stage small_stage() {
  auto m = kernels::make_mlp("mlp:4-3");
  m->initialize(5);
  return pipeline::detail::to_portable(*m, 0);
}

/// One rank, one stage, two microbatches.
const std::string one_rank = "0F0,0F1,0B0,0B1";

troupe::actor_ref<rank_actor> spawn_rank(troupe::actor_system& sys, int rank, const std::string& csv,
                                         std::vector<portable_stage> stages, pipeline::training_options options = {},
                                         std::optional<std::vector<std::uint64_t>> first_params = std::nullopt) {
  if (!first_params) {  // the stages' parameters apart in the model
    first_params.emplace();
    for (std::size_t i = 0; i < stages.size(); ++i) first_params->push_back(1000 * i);
  }
  return sys.spawn_on<rank_actor>(sys.node(), troupe::spawn_options{.reentrant = true}, rank, std::string("test"), csv,
                                  std::move(stages), options, std::move(*first_params));
}

/// Why a rank could not be made ("" when it was): the spawn says so on this node, the first
/// call on another.
std::string construction_error(troupe::actor_system& sys, int rank, const std::string& csv,
                               std::vector<portable_stage> stages, pipeline::training_options options = {}) {
  try {
    (void)spawn_rank(sys, rank, csv, std::move(stages), options).ask(&rank_actor::parameter_values, 0).get();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

tensor rows(std::int64_t n, std::int64_t features) {
  std::vector<float> v(static_cast<std::size_t>(n * features));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.7f);
  return tensor::from<float>(v, {n, features});
}

tensor labels(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(i % 3);
  return tensor::from<std::int64_t>(v, {n});
}

step_plan plan_for(std::uint64_t step, int microbatches, std::int64_t each = 2) {
  step_plan p{.step = step, .inputs = {}, .labels = {}};
  for (int j = 0; j < microbatches; ++j) {
    p.inputs.push_back(rows(each, 4));
    p.labels.push_back(labels(each));
  }
  return p;
}

/// A connected one-rank pipeline on a listening node.
struct one_rank_pipeline {
  troupe::actor_system sys{listening()};
  troupe::actor_ref<rank_actor> rank;
  troupe::actor_ref<pipeline::detail::driver_actor> driver = sys.spawn<pipeline::detail::driver_actor>();
  explicit one_rank_pipeline(pipeline::training_options options = {})
      : rank(spawn_rank(sys, 0, one_rank, {small_stage()}, std::move(options))) {
    rank.ask(&rank_actor::connect, std::vector{rank}, driver).get();
  }
  std::vector<tensor> weights() { return rank.ask(&rank_actor::parameter_values, 0).get(); }
};

bool same(const std::vector<tensor>& a, const std::vector<tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || std::memcmp(a[i].bytes(), b[i].bytes(), a[i].nbytes()) != 0) return false;
  return true;
}

TEST(RuntimeRank, ARankMadeOnAnotherNodeChecksWhatItIsGiven) {
  troupe::actor_system sys(listening());
  auto refused = [&](int rank, const std::string& csv, std::vector<portable_stage> stages,
                     pipeline::training_options options, const std::string& why) {
    const auto got = construction_error(sys, rank, csv, std::move(stages), options);
    EXPECT_NE(got.find(why), std::string::npos) << "expected '" << why << "', got '" << got << "'";
  };
  EXPECT_EQ(construction_error(sys, 0, one_rank, {small_stage()}), "");
  // The schedule is checked as the driver checks it: a cell twice, a receive nobody sends.
  refused(0, "0F0,0B0,0F0,0B0", {small_stage()}, {}, "appears a second time");
  refused(0, "0RECV_F0,0F0,0B0", {small_stage()}, {}, "RECV_F");
  // The rank and its stages must be the schedule's.
  refused(5, one_rank, {small_stage()}, {}, "rank 5 is not one of the schedule's 1 ranks");
  refused(-1, one_rank, {small_stage()}, {}, "rank -1 is not one of the schedule's 1 ranks");
  refused(0, one_rank, {small_stage(), small_stage()}, {}, "rank 0 got 2 stages; the schedule 'test' gives it 1");
  // Options no rank can follow.
  for (double bad : {std::nan(""), -5.0, 1e-300, std::numeric_limits<double>::infinity()})
    refused(0, one_rank, {small_stage()}, {.cosine_steps = bad}, "cosine_steps must be 0");
  // A short description of a large stage, without its values: refused before it is built.
  portable_stage big = small_stage();
  big.layers = "sequential(linear(1048576->255))";
  big.names.clear();
  big.values.clear();
  const auto t0 = std::chrono::steady_clock::now();
  refused(0, one_rank, {big}, {}, "(267387135 parameter values) with 0 values");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "the stage was built first";
}

TEST(RuntimeRank, AStepsInputsAndLabelsMustFitTheSchedule) {
  one_rank_pipeline p;
  const auto before = p.weights();
  auto run = [&](step_plan plan) { return p.rank.ask(&rank_actor::run, std::move(plan)).get(); };
  auto expect_bad = [&](step_plan plan, const std::string& why) {
    const auto step = plan.step;
    const auto report = run(std::move(plan));
    EXPECT_EQ(report.result, outcome::bad_input) << report.why;
    EXPECT_NE(report.why.find(why), std::string::npos) << report.why;
    p.rank.ask(&rank_actor::apply, step, false, 1.0).get();
  };
  expect_bad(plan_for(1, 3), "rank 0 got 3 microbatches of inputs for a schedule of 2");
  expect_bad(plan_for(2, 1), "rank 0 got 1 microbatches of inputs for a schedule of 2");
  auto uneven = plan_for(3, 2);
  uneven.inputs[1] = rows(3, 4);
  uneven.labels[1] = labels(3);
  expect_bad(std::move(uneven), "must have as many rows each");
  auto no_labels = plan_for(4, 2);
  no_labels.labels.clear();
  expect_bad(std::move(no_labels), "0 microbatches of labels");
  EXPECT_TRUE(same(p.weights(), before));
  // A transfer for a stage the rank does not hold is dropped; the next step runs as usual.
  p.rank.tell(&rank_actor::deliver, pipeline::detail::transfer{5, false, 7, 0, rows(2, 4)});
  p.rank.tell(&rank_actor::deliver, pipeline::detail::transfer{5, true, 0, 9, rows(2, 3)});
  EXPECT_EQ(run(plan_for(5, 2)).result, outcome::done);
  p.rank.ask(&rank_actor::apply, std::uint64_t{5}, true, 1.0).get();
  EXPECT_FALSE(same(p.weights(), before));
}

TEST(RuntimeRank, AStepIsAppliedOnceAndOnlyWhenItFinished) {
  one_rank_pipeline p;
  const auto start = p.weights();
  auto apply = [&](std::uint64_t step, bool keep) {
    try {
      p.rank.ask(&rank_actor::apply, step, keep, 1.0).get();
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  // Nothing ran yet.
  EXPECT_NE(apply(0, true).find("has no gradient of step 0"), std::string::npos);
  EXPECT_NE(apply(1, true).find("cannot apply step 1: its last step is 0"), std::string::npos);
  // A step that failed half way leaves a partial gradient: it is dropped, never applied.
  auto bad = plan_for(1, 2);
  bad.inputs[1] = rows(2, 5);
  EXPECT_EQ(p.rank.ask(&rank_actor::run, std::move(bad)).get().result, outcome::bad_input);
  EXPECT_NE(apply(1, true).find("has no gradient of step 1"), std::string::npos);
  EXPECT_EQ(apply(1, false), "");
  EXPECT_TRUE(same(p.weights(), start));
  // A finished step is applied once.
  EXPECT_EQ(p.rank.ask(&rank_actor::run, plan_for(2, 2)).get().result, outcome::done);
  EXPECT_EQ(apply(2, true), "");
  const auto once = p.weights();
  EXPECT_FALSE(same(once, start));
  EXPECT_NE(apply(2, true).find("applied it already"), std::string::npos);
  EXPECT_TRUE(same(p.weights(), once));
}

/// Stage `i` of a two-stage model (4 -> 5 -> 3), as it travels.
portable_stage stage_of_two(int i) {
  auto l = kernels::make_layer(i == 0 ? "sequential(linear(4->5))" : "sequential(relu, linear(5->3))");
  auto& s = dynamic_cast<kernels::sequential&>(*l);
  s.initialize(11);
  return pipeline::detail::to_portable(s, i);
}

TEST(RuntimeRank, NothingIsAppliedOrDroppedWhileAStepRuns) {
  troupe::actor_system sys(listening());
  const std::string csv = pipeline::to_csv(pipeline::generate("1f1b", 2, 2));
  auto first = spawn_rank(sys, 0, csv, {stage_of_two(0)});
  auto second = spawn_rank(sys, 1, csv, {stage_of_two(1)});
  auto driver = sys.spawn<pipeline::detail::driver_actor>();
  for (auto& r : {first, second}) r.ask(&rank_actor::connect, std::vector{first, second}, driver).get();
  const auto before = second.ask(&rank_actor::parameter_values, 1).get();
  // The second rank waits for activations the first (never run) does not send; the asks after
  // the run reach the rank (reentrant) while it waits.
  step_plan plan{.step = 1, .inputs = {}, .labels = {labels(2), labels(2)}};
  auto running = second.ask(&rank_actor::run, std::move(plan));
  try {
    second.ask(&rank_actor::apply, std::uint64_t{1}, true, 1.0).get();
    ADD_FAILURE() << "a running step was applied";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot apply step 1: step 1 is running"), std::string::npos) << e.what();
  }
  second.ask(&rank_actor::apply, std::uint64_t{1}, false, 1.0).get();  // nothing to drop yet
  second.tell(&rank_actor::abort, std::uint64_t{1}, std::string("the test stops it"));
  const auto report = std::move(running).get();
  EXPECT_EQ(report.result, outcome::aborted);
  EXPECT_NE(report.why.find("the test stops it"), std::string::npos) << report.why;
  EXPECT_TRUE(same(second.ask(&rank_actor::parameter_values, 1).get(), before));
}

}  // namespace

namespace {

// The shard paths come in messages that any peer holding the cluster's token may send: a rank
// writes and reads only its own shard, only in a directory the driver named when it made the
// rank, and never through a symbolic link.
TEST(RuntimeRank, ARankWritesAndReadsOnlyItsOwnShardInTheDirectoriesItWasGiven) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_rank_shard_" + std::to_string(::getpid()))).string();
  const std::string other = dir + "_other";
  std::filesystem::remove_all(dir);  // (what a failed run left)
  std::filesystem::remove_all(other);
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(other);
  auto error_of = [](auto&& call) {
    try {
      call();
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  pipeline::training_options options;
  options.checkpoint_dirs = {dir + "/"};  // (as the driver may spell it)
  one_rank_pipeline p(options);
  // Any other file name is refused before anything is written.
  for (const std::string name : {"rank1-a.shard", "rank0-c.shard", "weights.trpw", "manifest"})
    EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::save_shard, dir + "/" + name).get(); })
                  .find("rank 0 writes and reads only its own shard (rank0-a.shard or rank0-b.shard), not " + dir + "/" + name),
              std::string::npos)
        << name;
  // Its own name in another directory (writable, and the same one by another spelling) is refused.
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::save_shard, other + "/rank0-a.shard").get(); })
                .find("writes and reads shards only in the checkpoint directories the trainer was given, not in " + other),
            std::string::npos);
  const std::string base = std::filesystem::path(dir).filename().string();
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::save_shard, dir + "/../" + base + "/rank0-a.shard").get(); })
                .find("must not hold '.' or '..'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::save_shard, std::string("rank0-a.shard")).get(); })
                .find("must be an absolute path"),
            std::string::npos);
  // A shard planted as a symbolic link (to a file elsewhere) is neither followed nor replaced.
  std::filesystem::create_symlink(other + "/planted", dir + "/rank0-a.shard");
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::save_shard, dir + "/rank0-a.shard").get(); })
                .find("refuses the shard " + dir + "/rank0-a.shard: it is a symbolic link"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(other));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/rank0-a.shard"));
  // Its own: written, then read back after a step changed the weights.
  const auto start = p.weights();
  const auto info = p.rank.ask(&rank_actor::save_shard, dir + "/rank0-b.shard").get();
  EXPECT_EQ(info.file, "rank0-b.shard");
  EXPECT_EQ(p.rank.ask(&rank_actor::run, plan_for(1, 2)).get().result, outcome::done);
  p.rank.ask(&rank_actor::apply, std::uint64_t{1}, true, 1.0).get();
  EXPECT_FALSE(same(p.weights(), start));
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::load_shard, dir + "/../rank7-a.shard", info).get(); }).find("not "),
            std::string::npos);
  // A copy of the shard elsewhere, and a link to it in the directory: neither is read.
  std::filesystem::copy_file(dir + "/rank0-b.shard", other + "/rank0-b.shard");
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::load_shard, other + "/rank0-b.shard", info).get(); })
                .find("not in " + other),
            std::string::npos);
  std::filesystem::remove(dir + "/rank0-a.shard");
  std::filesystem::create_symlink(other + "/rank0-b.shard", dir + "/rank0-a.shard");
  auto linked = info;
  linked.file = "rank0-a.shard";
  EXPECT_NE(error_of([&] { p.rank.ask(&rank_actor::load_shard, dir + "/rank0-a.shard", linked).get(); })
                .find("it is a symbolic link"),
            std::string::npos);
  EXPECT_FALSE(same(p.weights(), start));
  p.rank.ask(&rank_actor::load_shard, dir + "/rank0-b.shard", info).get();
  EXPECT_TRUE(same(p.weights(), start));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

// The directories come from the driver: a rank refuses a relative one, or one with '..'.
TEST(RuntimeRank, ARankRefusesCheckpointDirectoriesThatAreNotAbsoluteAndNormal) {
  troupe::actor_system sys{listening()};
  for (const std::string dir : {"ck", "", "/tmp/../etc", "/tmp/./ck"}) {
    pipeline::training_options options;
    options.checkpoint_dirs = {dir};
    EXPECT_NE(construction_error(sys, 0, one_rank, {small_stage()}, options).find("a checkpoint directory must"),
              std::string::npos)
        << dir;
  }
}

}  // namespace
