#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <troupe/actors/actor_system.hpp>
#include <troupe/kernels/layers.hpp>
#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/render.hpp>
#include <troupe/pipeline/runtime.hpp>
#include <troupe/pipeline/simulator.hpp>
#include <troupe/pipeline/timeline.hpp>

namespace {

using troupe::tensor;
namespace kernels = troupe::kernels;
namespace pipeline = troupe::pipeline;
using pipeline::op;

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

/// An MLP of one linear layer per stage, cut into those stages.
std::vector<std::unique_ptr<kernels::sequential>> mlp_stages(int stages) {
  std::string spec = "mlp:12";
  std::vector<std::int64_t> sizes{12};
  for (int i = 1; i < stages; ++i) spec += "-16", sizes.push_back(16);
  spec += "-10";
  sizes.push_back(10);
  auto m = kernels::make_mlp(spec);
  m->initialize(3);
  return pipeline::cut_mlp(*m, sizes, stages);
}

/// The timeline a simulation of `plan` under `costs` (whole numbers) would measure, in ns.
pipeline::step_timeline simulated_timeline(const pipeline::schedule& plan, const pipeline::cost_model& costs) {
  const auto sim = pipeline::simulate(plan, costs);
  pipeline::step_timeline t(sim.timeline.size());
  for (std::size_t r = 0; r < sim.timeline.size(); ++r)
    for (const auto& a : sim.timeline[r]) {
      EXPECT_EQ(a.start.den(), 1);
      t[r].push_back({a.what, a.start.num(), a.end.num()});
    }
  return t;
}

/// Per stage F = f_base * (stage + 1), B = 2F (I = W = F when split).
pipeline::cost_model stage_costs(const pipeline::schedule& plan, std::int64_t f_base) {
  pipeline::cost_model c;
  for (int s = 0; s < plan.stages(); ++s) {
    pipeline::action_costs a;
    a.f = pipeline::rational(f_base * (s + 1));
    a.i = a.f;
    a.w = a.f;
    a.b = a.i + a.w;
    c.per_stage.push_back(a);
  }
  return c;
}

struct MeasuredTimeline : ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// Each rank records every action of its list, in the schedule's order, one after another: the
// recording is the schedule as it ran. Ranks in one process share a clock, so a tensor is
// received no earlier than its sender began to send it.
TEST_P(MeasuredTimeline, HasTheSchedulesActionsPerRankInOrderWithoutOverlap) {
  const auto [name, recompute] = GetParam();
  auto s = pipeline::generate(name, 4, 8);
  if (recompute) s = pipeline::with_checkpointing(s, pipeline::checkpoint_policy::parse("every:2"), 2);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, mlp_stages(s.stages()), {.optimizer = kernels::optimizer_kind::adamw});
  const auto& plan = t.plan();
  for (int step = 0; step < 2; ++step) {
    const auto r = t.step(random_batch(32, 12, 10 + step), random_labels(32, 20 + step));
    ASSERT_EQ(r.timeline.size(), static_cast<std::size_t>(plan.place.ranks));
    std::map<std::tuple<op, int, int>, pipeline::measured_action> sends;
    for (int rank = 0; rank < plan.place.ranks; ++rank) {
      const auto& row = r.timeline[static_cast<std::size_t>(rank)];
      std::vector<pipeline::action> want;
      for (const auto& a : plan.ranks[static_cast<std::size_t>(rank)])
        if (a) want.push_back(*a);
      ASSERT_EQ(row.size(), want.size()) << name << " rank " << rank;
      for (std::size_t k = 0; k < row.size(); ++k) {
        EXPECT_EQ(row[k].what, want[k]) << name << " rank " << rank << " action " << k;
        EXPECT_GE(row[k].start_ns, 0);
        EXPECT_LE(row[k].start_ns, row[k].end_ns);
        if (k > 0) {
          EXPECT_GE(row[k].start_ns, row[k - 1].end_ns) << name << " rank " << rank << " action " << k;
        }
        if (row[k].what.kind == op::send_f || row[k].what.kind == op::send_b)
          sends[{row[k].what.kind, row[k].what.stage, row[k].what.microbatch}] = row[k];
      }
    }
    for (const auto& row : r.timeline)
      for (const auto& a : row) {
        if (a.what.kind != op::recv_f && a.what.kind != op::recv_b) continue;
        const bool fwd = a.what.kind == op::recv_f;
        const auto it = sends.find({fwd ? op::send_f : op::send_b, a.what.stage + (fwd ? -1 : 1), a.what.microbatch});
        ASSERT_NE(it, sends.end()) << to_string(a.what);
        EXPECT_GE(a.end_ns, it->second.start_ns) << name << ": " << to_string(a.what) << " ended before its send began";
      }
    EXPECT_NO_THROW(pipeline::check_timeline(plan, r.timeline));
    EXPECT_GT(pipeline::span_ns(r.timeline), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllGenerators, MeasuredTimeline,
                         ::testing::Combine(::testing::ValuesIn(pipeline::schedule_names()), ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param);
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n + (std::get<1>(info.param) ? "_recompute" : "");
                         });

TEST(MeasuredTimeline, IsNotRecordedWhenTurnedOff) {
  const auto s = pipeline::generate("1f1b", 2, 4);
  troupe::actor_system sys{{.threads = 2}};
  pipeline::trainer t(sys, s, mlp_stages(2), {.optimizer = kernels::optimizer_kind::adamw, .record_timeline = false});
  const auto r = t.step(random_batch(8, 12, 1), random_labels(8, 2));
  EXPECT_TRUE(r.timeline.empty());
}

// The pipeline engine records only for an observer, which sees every step with the plan.
TEST(MeasuredTimeline, ReachesTheEnginesObserverEveryStep) {
  troupe::actor_system sys{{.threads = 2}};
  auto model = kernels::make_mlp("mlp:12-16-10");
  model->initialize(1);
  const kernels::engine_setup setup{.model = *model, .sizes = {12, 16, 10}, .hp = {}, .state = {}};
  int seen = 0;
  auto observed = pipeline::pipeline_engine(sys, pipeline::generate("1f1b", 2, 4), {},
                                            [&](const pipeline::schedule& plan, const pipeline::step_result& r) {
                                              ++seen;
                                              EXPECT_TRUE(plan.lowered());
                                              EXPECT_NO_THROW(pipeline::check_timeline(plan, r.timeline));
                                            })(setup);
  for (int k = 0; k < 3; ++k) observed->step(random_batch(8, 12, 5 + k), random_labels(8, 6 + k));
  EXPECT_EQ(seen, 3);
}

// The observer runs after the step was applied: a timeline that fails its check there (here a
// measured_steps given the step with two actions swapped, as a malformed report would give it)
// is logged and dropped, and the step counts: the weights are those of an engine without one.
TEST(MeasuredTimeline, ATimelineThatFailsItsCheckDoesNotFailTheStep) {
  troupe::actor_system sys{{.threads = 2}};
  auto observed_model = kernels::make_mlp("mlp:12-16-10"), plain_model = kernels::make_mlp("mlp:12-16-10");
  observed_model->initialize(1);
  plain_model->initialize(1);
  const kernels::engine_setup observed_setup{.model = *observed_model, .sizes = {12, 16, 10}, .hp = {}, .state = {}};
  const kernels::engine_setup plain_setup{.model = *plain_model, .sizes = {12, 16, 10}, .hp = {}, .state = {}};
  pipeline::measured_steps steps;
  int refused = 0;
  auto observed = pipeline::pipeline_engine(sys, pipeline::generate("1f1b", 2, 4), {},
                                            [&](const pipeline::schedule& plan, const pipeline::step_result& r) {
                                              auto t = r.timeline;
                                              std::swap(t[0][0].what, t[0][1].what);
                                              try {
                                                steps.add(plan, t);
                                              } catch (const std::invalid_argument&) {
                                                ++refused;
                                                throw;  // on to the engine, as an observer that does not catch it
                                              }
                                            })(observed_setup);
  auto plain = pipeline::pipeline_engine(sys, pipeline::generate("1f1b", 2, 4))(plain_setup);
  for (int k = 0; k < 3; ++k) {
    const auto x = random_batch(8, 12, 5 + k);
    const auto y = random_labels(8, 6 + k);
    const auto a = observed->step(x, y);
    const auto b = plain->step(x, y);
    EXPECT_TRUE(a.applied);
    EXPECT_EQ(a.loss, b.loss) << "step " << k;
  }
  EXPECT_EQ(refused, 3);
  EXPECT_EQ(steps.count(), 0);
  observed->sync(*observed_model);
  plain->sync(*plain_model);
  const auto pa = observed_model->parameters(), pb = plain_model->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(std::vector<float>(pa[i]->value.data<float>().begin(), pa[i]->value.data<float>().end()),
              std::vector<float>(pb[i]->value.data<float>().begin(), pb[i]->value.data<float>().end()))
        << pa[i]->name;
}

TEST(CheckTimeline, RefusesAnotherOrderAnOverlapAndAMissingAction) {
  const auto plan = pipeline::lower(pipeline::generate("1f1b", 2, 2));
  const auto good = simulated_timeline(plan, stage_costs(plan, 10));
  EXPECT_NO_THROW(pipeline::check_timeline(plan, good));
  auto swapped = good;
  std::swap(swapped[0][0].what, swapped[0][1].what);
  EXPECT_THROW(pipeline::check_timeline(plan, swapped), std::invalid_argument);
  auto overlap = good;
  overlap[1][1].start_ns = overlap[1][0].end_ns - 1;
  EXPECT_THROW(pipeline::check_timeline(plan, overlap), std::invalid_argument);
  auto missing = good;
  missing[1].pop_back();
  EXPECT_THROW(pipeline::check_timeline(plan, missing), std::invalid_argument);
  auto backwards = good;
  backwards[0][0].end_ns = backwards[0][0].start_ns - 1;
  EXPECT_THROW(pipeline::check_timeline(plan, backwards), std::invalid_argument);
  EXPECT_THROW(pipeline::check_timeline(plan, pipeline::step_timeline(1)), std::invalid_argument);
}

// The costs are the medians per stage and kind; the prediction is the simulator's makespan
// under them, and the measured step is the median span.
TEST(MeasuredCosts, AreMediansPerStageAndPredictWhatTheSimulatorSays) {
  for (const std::string name : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"}) {
    const auto plan = pipeline::lower(pipeline::generate(name, 2, 4));
    // Three steps with F = 10, 30, 20 (x stage + 1): the median is 20 per stage unit.
    std::vector<pipeline::step_timeline> steps;
    for (const std::int64_t base : {10, 30, 20}) steps.push_back(simulated_timeline(plan, stage_costs(plan, base)));
    const auto costs = pipeline::measured_costs(plan, steps);
    ASSERT_EQ(costs.per_stage.size(), static_cast<std::size_t>(plan.stages()));
    for (int s = 0; s < plan.stages(); ++s) {
      const auto& c = costs.per_stage[static_cast<std::size_t>(s)];
      EXPECT_EQ(c.f, pipeline::rational(20 * (s + 1))) << name << " stage " << s;
      EXPECT_EQ(c.b, pipeline::rational(40 * (s + 1))) << name << " stage " << s;
      EXPECT_EQ(c.i + c.w, c.b);
      EXPECT_EQ(c.comm, pipeline::rational(0));
    }
    const auto cmp = pipeline::compare_with_simulator(plan, steps);
    const auto expected = pipeline::simulate(plan, stage_costs(plan, 20)).makespan;
    EXPECT_DOUBLE_EQ(cmp.predicted_ms, expected.to_double() / 1e6) << name;
    // Each step is its simulation, so its span is its makespan; the median step is the middle one.
    EXPECT_DOUBLE_EQ(cmp.measured_ms, expected.to_double() / 1e6) << name;
    EXPECT_DOUBLE_EQ(cmp.ratio(), 1.0);
    EXPECT_EQ(cmp.steps, 3);
  }
}

TEST(MeasuredCosts, TakeTheMeanOfTheMiddleTwoOfAnEvenCount) {
  const auto plan = pipeline::lower(pipeline::generate("gpipe", 2, 2));
  std::vector<pipeline::step_timeline> steps;
  for (const std::int64_t base : {10, 11}) steps.push_back(simulated_timeline(plan, stage_costs(plan, base)));
  const auto costs = pipeline::measured_costs(plan, steps);
  EXPECT_EQ(costs.per_stage[0].f, pipeline::rational(21, 2));
  EXPECT_EQ(costs.per_stage[1].f, pipeline::rational(21));
  EXPECT_EQ(costs.per_stage[0].b, pipeline::rational(21));
  EXPECT_THROW(pipeline::measured_costs(plan, {}), std::invalid_argument);
}

TEST(MeasuredSteps, SkipTheWarmUpAndKeepTheLatest) {
  const auto plan = pipeline::lower(pipeline::generate("1f1b", 2, 2));
  pipeline::measured_steps m(2, 1);
  EXPECT_EQ(m.compare().steps, 0);
  m.add(plan, {});  // nothing recorded: ignored
  EXPECT_EQ(m.count(), 0);
  for (const std::int64_t base : {1000, 10, 20, 30}) m.add(plan, simulated_timeline(plan, stage_costs(plan, base)));
  EXPECT_EQ(m.count(), 4);
  const auto kept = m.kept();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0][0][0].end_ns - kept[0][0][0].start_ns, 20);  // the oldest kept: F of stage 0
  EXPECT_EQ(kept[1][0][0].end_ns - kept[1][0][0].start_ns, 30);
  EXPECT_EQ(m.last()[0][0].end_ns - m.last()[0][0].start_ns, 30);
  EXPECT_EQ(pipeline::measured_costs(plan, kept).per_stage[0].f, pipeline::rational(25));
  EXPECT_THROW(m.add(pipeline::lower(pipeline::generate("gpipe", 2, 2)), simulated_timeline(plan, stage_costs(plan, 1))),
               std::invalid_argument);
  EXPECT_THROW(pipeline::measured_steps(0, 1), std::invalid_argument);
}

// A large schedule keeps fewer steps: about a million actions in all.
TEST(MeasuredSteps, KeepFewerStepsOfALargeSchedule) {
  const auto plan = pipeline::lower(pipeline::generate("1f1b", 8, 256));
  std::size_t actions = 0;
  for (const auto& row : plan.ranks)
    for (const auto& a : row) actions += a.has_value();
  ASSERT_GT(actions, 5000u);
  pipeline::measured_steps m(500, 0);
  const auto t = simulated_timeline(plan, stage_costs(plan, 1));
  for (int k = 0; k < 300; ++k) m.add(plan, t);
  EXPECT_EQ(m.kept().size(), pipeline::measured_steps::max_kept_actions / actions);
  EXPECT_EQ(m.count(), 300);
}

// A measured step draws as a simulated one does (render() checks it is the schedule's), in
// microseconds; its JSON names every action.
TEST(MeasuredTimeline, DrawsAndWritesAsJson) {
  auto plan = pipeline::lower(pipeline::generate("1f1b", 2, 2));
  plan.name = "<b>1f1b</b>";
  const auto t = simulated_timeline(plan, stage_costs(plan, 2000));
  const auto sim = pipeline::as_simulation(plan, t);
  EXPECT_EQ(sim.makespan, pipeline::simulate(plan, stage_costs(plan, 2000)).makespan / pipeline::rational(1000));
  pipeline::render_options o;
  o.time_unit = "us";
  const auto svg = pipeline::render(plan, sim, pipeline::render_format::svg, o);
  EXPECT_NE(svg.find("time (us)"), std::string::npos);
  EXPECT_NE(svg.find("&lt;b&gt;1f1b&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  const auto json = pipeline::timeline_json(plan, t, 7);
  EXPECT_NE(json.find("\"schedule\":\"\\u003cb\\u003e1f1b\\u003c/b\\u003e\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"step\":7"), std::string::npos);
  EXPECT_NE(json.find("{\"action\":\"0F0\",\"kind\":\"F\",\"stage\":0,\"microbatch\":0,\"start_ns\":0,\"end_ns\":2000}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"kind\":\"SEND_F\""), std::string::npos);
}

// JSON is UTF-8: a name with ill-formed bytes (a stray continuation byte, a cut sequence, an
// overlong form, a surrogate, a byte that never begins one) still gives JSON that a strict
// parser reads, each bad byte as U+FFFD; well-formed UTF-8 (2, 3 and 4 bytes) passes unchanged.
TEST(MeasuredTimeline, JsonOfANameWithIllFormedUtf8IsValidJson) {
  auto plan = pipeline::lower(pipeline::generate("1f1b", 2, 2));
  const auto t = simulated_timeline(plan, stage_costs(plan, 2000));
  const std::string good = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
  plan.name = good;
  auto j = nlohmann::json::parse(pipeline::timeline_json(plan, t, 1));
  EXPECT_EQ(j["schedule"].get<std::string>(), good);
  EXPECT_NE(pipeline::timeline_json(plan, t, 1).find(good), std::string::npos) << "passed through, not escaped";
  const std::string fffd = "\xef\xbf\xbd";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a\x80" "b", "a" + fffd + "b"},                   // a continuation byte alone
      {"a\xc3", "a" + fffd},                              // cut at the end
      {"\xe2\x82z", fffd + fffd + "z"},                  // cut in the middle
      {"\xc0\xaf", fffd + fffd},                         // overlong '/'
      {"\xe0\x80\xaf", fffd + fffd + fffd},             // overlong, 3 bytes
      {"\xed\xa0\x80", fffd + fffd + fffd},             // a surrogate (U+D800)
      {"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd}, // above U+10FFFF
      {"\xff\xfe", fffd + fffd},                         // never in UTF-8
  };
  for (const auto& [name, read] : bad) {
    plan.name = name;
    const auto json = pipeline::timeline_json(plan, t, 1);
    try {
      EXPECT_EQ(nlohmann::json::parse(json)["schedule"].get<std::string>(), read) << json;
    } catch (const nlohmann::json::exception& e) {
      ADD_FAILURE() << "not valid JSON: " << e.what() << " in " << json;
    }
  }
}

}  // namespace
