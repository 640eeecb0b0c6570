#include <gtest/gtest.h>

#include <random>
#include <string>

#include <troupe/pipeline/generators.hpp>
#include <troupe/pipeline/schedule.hpp>
#include <troupe/pipeline/simulator.hpp>

namespace {

using namespace troupe::pipeline;

TEST(Action, PrintsAndParsesPyTorchsTextForm) {
  EXPECT_EQ(to_string(action{2, op::F, 0}), "2F0");
  EXPECT_EQ(to_string(action{3, op::I, 1}), "3I1");
  EXPECT_EQ(to_string(action{1, op::send_f, 2}), "1SEND_F2");
  EXPECT_EQ(to_string(action{0, op::recompute, 11}), "0RECOMPUTE11");
  for (auto text : {"2F0", "3I1", "1SEND_F2", "12RECV_B30", "0W7", "4B5", "0RECOMPUTE1"})
    EXPECT_EQ(to_string(parse_action(text)), text);
}

TEST(Action, RejectsMalformedText) {
  for (auto text : {"", "F0", "2F", "2X0", "2F0x", "-1F0", "2f0", "2SEND0", "2F-1"})
    EXPECT_THROW(parse_action(text), std::invalid_argument) << text;
}

TEST(Placement, LoopedAndVShapedMapStagesToRanks) {
  placement looped{4, 2, placement_kind::looped};
  EXPECT_EQ(looped.stages_of(1), (std::vector<int>{1, 5}));
  EXPECT_EQ(looped.rank_of(6), 2);
  placement v{4, 2, placement_kind::v_shape};
  EXPECT_EQ(v.stages_of(0), (std::vector<int>{0, 7}));
  EXPECT_EQ(v.stages_of(3), (std::vector<int>{3, 4}));
  EXPECT_EQ(v.chunk_of(5), 1);
}

struct closed_form_case {
  std::string name;
  int p, m, v;
};

// Unit costs: F = 1, B = 2 (I = W = 1) per rank's whole shard, no communication.
TEST(Simulator, GPipeAnd1F1BMatchTheirClosedFormBubble) {
  for (const char* name : {"gpipe", "1f1b"})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 24; ++m) {
        auto sim = simulate(generate(name, p, m));
        EXPECT_EQ(sim.makespan, rational(3 * (m + p - 1))) << name << " p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(sim.bubble, static_cast<double>(p - 1) / (m + p - 1)) << name;
      }
}

TEST(Simulator, PeakActivationsAreMForGPipeAndPFor1F1B) {
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 24; ++m) {
      EXPECT_DOUBLE_EQ(simulate(generate("gpipe", p, m)).peak_activations[0], m);
      EXPECT_DOUBLE_EQ(simulate(generate("1f1b", p, m)).peak_activations[0], p);
    }
}

TEST(Simulator, InterleavedAndLoopedBfsMatchTheirClosedFormWhenPDividesM) {
  for (const char* name : {"interleaved-1f1b", "looped-bfs"})
    for (int p = 1; p <= 6; ++p)
      for (int v = 2; v <= 4; ++v)
        for (int m = p; m <= 4 * p; m += p) {
          auto sim = simulate(generate(name, p, m, v));
          EXPECT_NEAR(sim.bubble, static_cast<double>(p - 1) / (v * m + p - 1), 1e-12)
              << name << " p=" << p << " m=" << m << " v=" << v;
        }
}

TEST(Generators, RefuseWhatTheyCannotScheduleWithAMessageSayingWhatToChange) {
  try {
    generate("interleaved-1f1b", 4, 9, 2);  // two rounds cannot share 9 microbatches
    FAIL();
  } catch (const std::invalid_argument& e) {
    // The nearest shapes that do split (it suggested 12, though 10 runs as two rounds of 5).
    EXPECT_NE(std::string(e.what()).find("use m=8 or m=10"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(validate(generate("interleaved-1f1b", 4, 10, 2)));
  EXPECT_NO_THROW(validate(generate("interleaved-1f1b", 4, 6, 2)));  // one round of 6
  EXPECT_THROW(generate("1f1b", 4, 8, 2), std::invalid_argument);
  EXPECT_THROW(generate("no-such", 4, 8), std::invalid_argument);
  EXPECT_THROW(generate("gpipe", 0, 8), std::invalid_argument);
  EXPECT_THROW(generate("gpipe", 2, 0), std::invalid_argument);
  // More cells than fit in memory: refused, with the sizes, before anything is allocated.
  EXPECT_THROW(generate("gpipe", 2'000'000'000, 1), std::invalid_argument);
  EXPECT_THROW(generate("interleaved-1f1b", 2, 4, 2'000'000'000), std::invalid_argument);
  EXPECT_THROW(generate("1f1b", 65'536, 65'536), std::invalid_argument);
  // The V-shaped generators built over 2p - 1 microbatches whatever m: 20000 stages and one
  // microbatch (40000 cells) took 23 GB before they were held to what they build.
  for (const char* padded : {"zb-v", "v-half", "v-min"}) {
    EXPECT_THROW(generate(padded, 20'000, 1), std::invalid_argument) << padded;
    EXPECT_NO_THROW(generate(padded, 100, 1)) << padded;
  }
  EXPECT_NO_THROW(generate("1f1b", 20'000, 1));
}

TEST(Generators, EveryScheduleIsValidForSmallShapes) {
  for (const auto& name : schedule_names())
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 32; ++m)
        for (int v = 1; v <= 4; ++v) {
          schedule s;
          try {
            s = generate(name, p, m, v);
          } catch (const std::invalid_argument&) {
            continue;  // refused with a message: allowed
          }
          EXPECT_NO_THROW(validate(s)) << name << " p=" << p << " m=" << m << " v=" << v;
          EXPECT_NO_THROW(validate(lower(s))) << name << " lowered, p=" << p << " m=" << m;
          // Every rank does all of its work: m microbatches through its whole shard.
          auto sim = simulate(s, cost_model::parse("F=1,B=2,I=1,W=1,FB=3"));
          for (int r = 0; r < p; ++r) {
            EXPECT_EQ(sim.busy[r], rational(3 * m)) << name << " p=" << p << " m=" << m << " r=" << r;
            EXPECT_LE(sim.busy[r], sim.makespan);
            EXPECT_GE(sim.peak_activations[r], 1.0 / s.place.stages_per_rank - 1e-12);
          }
          EXPECT_GE(sim.bubble, 0.0);
          EXPECT_LT(sim.bubble, 1.0);
        }
}

TEST(Lowering, InsertsMatchingSendsAndReceivesAndKeepsTheTiming) {
  auto s = generate("1f1b", 3, 4);
  auto l = lower(s);
  EXPECT_TRUE(l.lowered());
  EXPECT_EQ(l.ranks[1].front(), (std::optional<action>{action{1, op::recv_f, 0}}));
  EXPECT_EQ(l.ranks[0][1], (std::optional<action>{action{0, op::send_f, 0}}));
  cost_model c = cost_model::parse("F=1,B=2,comm=1/2");
  EXPECT_EQ(simulate(s, c).makespan, simulate(l, c).makespan);
  EXPECT_EQ(lower(l).ranks, l.ranks);
}

TEST(Validator, PointsAtTheFirstOffendingAction) {
  auto s = generate("1f1b", 2, 2);
  std::swap(s.ranks[0][0], s.ranks[0].back());  // a backward before its forward
  try {
    validate(s);
    FAIL();
  } catch (const schedule_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0, step 0 (0B1)"), std::string::npos) << e.what();
  }
  auto missing = generate("gpipe", 2, 2);
  missing.ranks[1].pop_back();
  EXPECT_THROW(validate(missing), schedule_error);
  auto wrong_rank = generate("gpipe", 2, 1);
  wrong_rank.ranks[0][0] = action{1, op::F, 0};
  EXPECT_THROW(validate(wrong_rank), schedule_error);
  // Data that would cross the pipeline's ends is named as such (a receive on stage 0 was
  // reported as lacking "-1SEND_F0").
  const std::pair<const char*, const char*> ends[] = {
      {"0RECV_F0,0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "receives a forward on stage 0"},
      {"0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1SEND_F0,1B0,1SEND_B0\n", "sends a forward from the last stage"},
      {"0F0,0SEND_F0,0RECV_B0,0B0,0SEND_B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "sends a gradient from stage 0"},
      {"0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1RECV_B0,1B0,1SEND_B0\n", "receives a gradient on the last stage"}};
  for (const auto& [csv, why] : ends) {
    try {
      validate(from_csv(csv));
      ADD_FAILURE() << csv;
    } catch (const schedule_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(Validator, FindsADeadlockAcrossRanks) {
  // Rank 0 waits for 1B0 before it runs 0F1; rank 1 waits for 0F1 before it runs 1B0.
  auto s = from_csv("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n");
  try {
    validate(s);
    FAIL();
  } catch (const schedule_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(Csv, RoundTripsEverySchedule) {
  for (const auto& name : schedule_names()) {
    auto s = generate(name, 4, 8);
    auto back = from_csv(to_csv(s), name);
    EXPECT_EQ(back.ranks, s.ranks) << name;
    EXPECT_EQ(back.place.stages_per_rank, s.place.stages_per_rank);
    EXPECT_EQ(back.place.kind, s.place.kind);
    EXPECT_EQ(back.microbatches, 8);
    auto lowered = lower(s);
    EXPECT_EQ(from_csv(to_csv(lowered)).ranks, lowered.ranks);
  }
}

TEST(Csv, KeepsDeliberateIdleSteps) {
  auto s = from_csv("0F0,,0B0\n,1F0,1B0\n");
  ASSERT_EQ(s.ranks[0].size(), 3u);
  EXPECT_FALSE(s.ranks[0][1].has_value());
  EXPECT_FALSE(s.ranks[1][0].has_value());
  EXPECT_EQ(to_csv(s), "0F0,,0B0\n,1F0,1B0\n");
  EXPECT_NO_THROW(validate(s));
}

TEST(Csv, ReadsTheOlderFormWhereBWithAWMeansI) {
  // Two ranks, looped placement of four stages, split backward written as B + W.
  auto s = from_csv("0F0,2F0,2B0,2W0,0B0,0W0\n,1F0,3F0,3B0,3W0,1B0,1W0\n");
  EXPECT_EQ(s.place.stages_per_rank, 2);
  EXPECT_EQ(s.ranks[0][2], (std::optional<action>{action{2, op::I, 0}}));
  EXPECT_TRUE(s.split_backward());
  EXPECT_NO_THROW(validate(s));
  EXPECT_NO_THROW(validate(lower(s)));
}

TEST(Csv, SkipsPyTorchsShardingAndGradientReductionActions) {
  // As PyTorch's _dump_csv writes a lowered 1F1B for FSDP-sharded stages with data parallelism.
  const auto s = from_csv(
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD,0RESHARD\n"
      "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1RESHARD\n");
  const auto plain = from_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  EXPECT_EQ(s.ranks, plain.ranks);
  EXPECT_EQ(s.microbatches, 2);
  EXPECT_NO_THROW(validate(s));
  // The names are read whole: a near miss is still an error, and so is a stray suffix.
  EXPECT_THROW(from_csv("0F0,0UNSHAR\n"), std::invalid_argument);
  EXPECT_THROW(from_csv("0F0,0REDUCE_GRADx\n"), std::invalid_argument);
  EXPECT_THROW(from_csv("0F0,UNSHARD\n"), std::invalid_argument);
}

TEST(Csv, RejectsCellsThatAreNotActions) {
  EXPECT_THROW(from_csv("0F0,zz\n"), std::invalid_argument);
  EXPECT_THROW(from_csv(""), std::invalid_argument);
  EXPECT_THROW(from_csv("0F0\n0F1\n"), std::invalid_argument);  // stage 0 on two ranks
}

TEST(Costs, ParseNamesAndExactValues) {
  auto c = cost_model::parse("F=1.5,b=3,comm=1/4");
  EXPECT_EQ(c.uniform.f, rational(3, 2));
  EXPECT_EQ(c.uniform.b, rational(3));
  EXPECT_EQ(c.uniform.comm, rational(1, 4));
  EXPECT_EQ(cost_model::parse("I=2,W=3").uniform.b, rational(5));
  EXPECT_THROW(cost_model::parse("F=x"), std::invalid_argument);
  EXPECT_THROW(cost_model::parse("Q=1"), std::invalid_argument);
  EXPECT_THROW(cost_model::parse("F=-1"), std::invalid_argument);
  EXPECT_THROW(cost_model::parse("F"), std::invalid_argument);
  EXPECT_THROW(cost_model::parse("F=922337203685477580.8"), std::invalid_argument);  // 10x overflows
  // A model built in code is held to the same rule when it is used.
  cost_model negative;
  negative.uniform.b = rational(-5);
  EXPECT_THROW(simulate(generate("1f1b", 2, 2), negative), std::invalid_argument);
  cost_model per_stage;
  per_stage.per_stage = {action_costs{}, action_costs{.f = rational(-1)}};
  EXPECT_THROW(simulate(generate("1f1b", 2, 2), per_stage), std::invalid_argument);
  // One backward, split or not: B = I + W. B alone split 4 into 2 + 2 for the split schedules
  // only while the others ran with 4 (ZB-H1 took 27 to 1F1B's 55 at p=4 m=8).
  const auto b_alone = cost_model::parse("F=1,B=4").uniform;
  EXPECT_EQ(b_alone.i, rational(2));
  EXPECT_EQ(b_alone.w, rational(2));
  const auto b_and_i = cost_model::parse("B=4,I=3").uniform;
  EXPECT_EQ(b_and_i.w, rational(1));
  EXPECT_EQ(cost_model::parse("I=3,W=2").uniform.b, rational(5));
  EXPECT_EQ(cost_model::parse("W=3").uniform.b, rational(4));  // I stays 1
  EXPECT_THROW(cost_model::parse("B=1,I=1,W=1"), std::invalid_argument);
  EXPECT_THROW(cost_model::parse("B=1,W=2"), std::invalid_argument);
  cost_model uneven;
  uneven.uniform.b = rational(4);  // I and W stay 1
  EXPECT_THROW(simulate(generate("1f1b", 2, 2), uneven), std::invalid_argument);
  // With one model, the split schedules are faster, never by a wrong backward.
  const auto model = cost_model::parse("F=1,B=4");
  EXPECT_EQ(simulate(generate("1f1b", 4, 8), model).makespan, rational(3 * 5 + 8 * 5));
  EXPECT_LT(simulate(generate("zb-h1", 4, 8), model).makespan, simulate(generate("1f1b", 4, 8), model).makespan);
  EXPECT_GT(simulate(generate("zb-h1", 4, 8), model).makespan, rational(8 * 5));
}

TEST(Rational, ArithmeticIsExactOrThrowsNeverWraps) {
  // Sums of fractions with large coprime denominators are exact while they fit...
  const rational a(1, 999'999'937), b(1, 999'999'929);
  EXPECT_EQ(a + b - b, a);
  EXPECT_GT(a + b, a);
  EXPECT_EQ((a * rational(999'999'937)) / rational(2), rational(1, 2));
  // ...and throw when the reduced result does not fit in 64-bit terms.
  EXPECT_THROW(a * b * rational(1, 999'999'893), std::overflow_error);
  EXPECT_THROW(rational(std::int64_t{1} << 62) + rational(std::int64_t{1} << 62), std::overflow_error);
  EXPECT_THROW(rational(1) / rational(0), std::invalid_argument);
  EXPECT_THROW(rational(INT64_MIN, -1), std::overflow_error);  // 2^63 does not fit
  EXPECT_THROW(rational(1, INT64_MIN), std::overflow_error);
}

TEST(Rational, ParsesDecimalsAndFractionsAndSaysWhatItTakes) {
  EXPECT_EQ(rational::parse("1.25"), rational(5, 4));
  EXPECT_EQ(rational::parse(".5"), rational(1, 2));
  EXPECT_EQ(rational::parse("3/4"), rational(3, 4));
  for (const char* bad : {".", "1e3", "", "1.", "-.5x", ".-5", "1/0"}) {
    try {
      (void)rational::parse(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("no exponents"), std::string::npos) << e.what();
    }
  }
}

TEST(Validate, RefusesShapesBeyondMemoryAndPlacementsWithoutRanks) {
  // Two actions that name microbatch 3e8: refused before a table of that size is allocated.
  EXPECT_THROW(validate(from_csv("0F300000000,0B300000000\n")), std::invalid_argument);
  EXPECT_THROW(from_csv("0F2147483647,0B2147483647\n"), std::invalid_argument);
  schedule s = generate("gpipe", 2, 2);
  s.place.ranks = 0;
  EXPECT_THROW(lower(s), std::invalid_argument);
  EXPECT_THROW(validate(s), std::invalid_argument);
  s = generate("gpipe", 2, 2);
  s.place.stages_per_rank = 0;
  EXPECT_THROW(validate(s), std::invalid_argument);
}

TEST(Simulator, CommunicationDelaysCrossRankDependenciesOnly) {
  auto s = generate("gpipe", 2, 1);
  auto c = cost_model::parse("F=1,B=2,comm=3");
  // 0F0 [0,1] -> 3 -> 1F0 [4,5] -> 1B0 [5,7] -> 3 -> 0B0 [10,12]
  EXPECT_EQ(simulate(s, c).makespan, rational(12));
}

}  // namespace

namespace {

using namespace troupe::pipeline;

// Unit costs for split schedules: F = I = W = 1 per rank's whole shard.
TEST(ZeroBubble, H1MatchesThePapersBubbleAndMemory) {
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 32; ++m) {
      auto sim = simulate(generate("zb-h1", p, m));
      EXPECT_DOUBLE_EQ(sim.bubble_span, static_cast<double>(p - 1) / (3 * m + p - 1))
          << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(sim.peak_activations[0], p);
    }
}

TEST(ZeroBubble, H2HasNoBubbleOnceMIsAtLeast2PMinus1) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 2 * p - 1; m <= 32; ++m) {
      auto sim = simulate(generate("zb-h2", p, m));
      EXPECT_EQ(sim.bubble_span, 0.0) << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(sim.peak_activations[0], 2 * p - 1);
    }
}

// Shapes where m cuts the warm-up short: the makespans of PyTorch's zero-bubble order with one
// stage per rank (unit costs), at the same peak memory.
TEST(ZeroBubble, H1DoesNotHoldWBackWhenFewMicrobatchesCutTheWarmUpShort) {
  struct shape {
    int p, m, makespan;
    double peak;
  };
  for (const auto& s : {shape{4, 2, 11, 2}, shape{8, 4, 23, 4}, shape{4, 3, 13, 3}, shape{8, 1, 17, 1}}) {
    const auto sim = simulate(generate("zb-h1", s.p, s.m));
    EXPECT_EQ(sim.makespan, rational(s.makespan)) << "p=" << s.p << " m=" << s.m;
    double peak = 0;
    for (double a : sim.peak_activations) peak = std::max(peak, a);
    EXPECT_DOUBLE_EQ(peak, s.peak) << "p=" << s.p << " m=" << s.m;
  }
  // With m >= p every rank idles p-1 units: 3m + p - 1.
  for (int p = 1; p <= 16; ++p)
    for (int m = p; m <= 48; ++m)
      EXPECT_EQ(simulate(generate("zb-h1", p, m)).makespan, rational(3 * m + p - 1)) << "p=" << p << " m=" << m;
}

TEST(ZeroBubble, H2IsNeverSlowerThanH1) {
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 48; ++m) {
      const auto h1 = simulate(generate("zb-h1", p, m)), h2 = simulate(generate("zb-h2", p, m));
      EXPECT_LE(h2.makespan, h1.makespan) << "p=" << p << " m=" << m;
    }
  // p = 4, m = 4: the doubled warm-up would take 16 (17 while the W's waited for the uncut
  // warm-up); H1's order takes 15.
  EXPECT_EQ(simulate(generate("zb-h2", 4, 4)).makespan, rational(15));
  EXPECT_EQ(to_csv(generate("zb-h2", 4, 4)), to_csv(generate("zb-h1", 4, 4)));
}

TEST(ZeroBubble, VHasNoBubbleOnceMIsAtLeast2PMinus1AndHoldsP) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 2 * p - 1; m <= 32; ++m) {
      auto sim = simulate(generate("zb-v", p, m));
      EXPECT_EQ(sim.bubble_span, 0.0) << "p=" << p << " m=" << m;
      double peak = 0;
      for (double a : sim.peak_activations) peak = std::max(peak, a);
      EXPECT_DOUBLE_EQ(peak, p) << "p=" << p << " m=" << m;
    }
}

// Table 5 of the Zero Bubble paper, recomputed from the profiled times of its Table 9
// (T_F, T_B = backward for inputs, T_W, T_comm), to three decimals.
TEST(ZeroBubble, ReproducesThePapersTable5FromItsProfiledTimes) {
  struct row {
    int p, m;
    const char *f, *b, *w, *c;
    double one_f_one_b, h1, h2;
  };
  const row rows[] = {
      {8, 24, "18.522", "18.086", "9.337", "0.601", 0.2431, 0.1585, 0.1083},
      {8, 32, "18.513", "18.086", "9.331", "0.626", 0.1985, 0.1242, 0.0837},
      {8, 64, "18.546", "18.097", "9.321", "0.762", 0.1240, 0.0674, 0.0444},
      {8, 24, "29.718", "29.444", "19.927", "0.527", 0.2347, 0.1323, 0.0698},
      {8, 32, "29.802", "29.428", "19.530", "0.577", 0.1898, 0.1045, 0.0559},
      {8, 64, "29.935", "29.621", "19.388", "0.535", 0.1091, 0.0554, 0.0294},
      {16, 48, "11.347", "11.248", "8.132", "0.377", 0.2552, 0.1397, 0.0672},
      {16, 64, "11.307", "11.254", "8.101", "0.379", 0.2082, 0.1088, 0.0516},
      {16, 128, "11.325", "11.308", "8.109", "0.378", 0.1251, 0.0576, 0.0266},
      {32, 96, "10.419", "10.207", "7.715", "0.408", 0.2646, 0.1421, 0.0641},
      {32, 128, "10.408", "10.204", "7.703", "0.408", 0.2168, 0.1106, 0.0490},
      {32, 256, "10.402", "10.248", "7.698", "0.460", 0.1352, 0.0594, 0.0257},
  };
  for (const auto& r : rows) {
    cost_model split;
    split.uniform.f = rational::parse(r.f);
    split.uniform.i = rational::parse(r.b);
    split.uniform.w = rational::parse(r.w);
    split.uniform.comm = rational::parse(r.c);
    split.uniform.b = split.uniform.i + split.uniform.w;
    const cost_model& full = split;  // 1F1B's backward is the two halves
    const std::string at = "p=" + std::to_string(r.p) + " m=" + std::to_string(r.m) + " F=" + r.f;
    EXPECT_NEAR(simulate(generate("1f1b", r.p, r.m), full).bubble_span, r.one_f_one_b, 5e-4) << at;
    EXPECT_NEAR(simulate(generate("zb-h1", r.p, r.m), split).bubble_span, r.h1, 5e-4) << at;
    EXPECT_NEAR(simulate(generate("zb-h2", r.p, r.m), split).bubble_span, r.h2, 5e-4) << at;
  }
}

}  // namespace

namespace {

using namespace troupe::pipeline;

TEST(Checkpointing, PoliciesKeepTheDocumentedShare) {
  EXPECT_EQ(checkpoint_policy::parse("none").kept(8), rational(1));
  EXPECT_EQ(checkpoint_policy::parse("every:2").kept(8), rational(1, 2));
  EXPECT_EQ(checkpoint_policy::parse("every:3").kept(8), rational(3, 8));
  EXPECT_EQ(checkpoint_policy::parse("sqrt").kept(9), rational(1, 3));
  EXPECT_EQ(checkpoint_policy::parse("sqrt").kept(10), rational(4, 10));
  // The largest layer counts do not overflow (ceil(sqrt(2^31 - 1)) = 46341).
  EXPECT_EQ(checkpoint_policy::parse("sqrt").kept(2'147'483'647), rational(46'341, 2'147'483'647));
  EXPECT_EQ(checkpoint_policy::parse("every:2").kept(2'147'483'647), rational(1'073'741'824, 2'147'483'647));
  for (auto bad : {"", "every:0", "every:x", "all", "sqrt:2"})
    EXPECT_THROW(checkpoint_policy::parse(bad), std::invalid_argument) << bad;
}

TEST(Checkpointing, RecomputeCostsAForwardAndSavesActivationMemory) {
  auto plain = generate("1f1b", 4, 8);
  auto ckpt = with_checkpointing(plain, checkpoint_policy::parse("every:2"), 4);
  EXPECT_NO_THROW(validate(ckpt));
  EXPECT_NO_THROW(validate(lower(ckpt)));
  auto a = simulate(plain), b = simulate(ckpt);
  // Each backward now costs B + F = 3: 1F1B's makespan (m + p - 1)(F + B) becomes 11 x 4.
  EXPECT_EQ(a.makespan, rational(33));
  EXPECT_EQ(b.makespan, rational(44));
  // Rank 0 holds half of 4 microbatches plus the one being recomputed.
  EXPECT_DOUBLE_EQ(a.peak_activations[0], 4);
  EXPECT_DOUBLE_EQ(b.peak_activations[0], 2.5);
  EXPECT_EQ(simulate(lower(ckpt), cost_model::parse("comm=1")).makespan,
            simulate(ckpt, cost_model::parse("comm=1")).makespan);
}

TEST(Checkpointing, TheSplitBackwardKeepsRecomputedActivationsUntilW) {
  auto s = with_checkpointing(generate("zb-h2", 2, 4), checkpoint_policy::parse("sqrt"), 9);
  EXPECT_NO_THROW(validate(s));
  auto sim = simulate(s);
  // Rank 0 of ZB-H2 (p = 2): F0 F1 F2 hold 3 x 1/3; the recompute of 0 restores 2/3; its I
  // frees nothing; W0 frees all of microbatch 0.
  EXPECT_DOUBLE_EQ(sim.peak_activations[0], 5.0 / 3.0);
}

// A recompute goes before the overlapped pair its backward closes: put between the two, it
// took the forward's place in the pair, and the pair's FB price was silently lost.
TEST(Checkpointing, KeepsDualPipeVsOverlappedPairsOfAForwardAndABackward) {
  const auto s = with_checkpointing(generate("dualpipe-v", 2, 4), checkpoint_policy::parse("sqrt"), 4);
  EXPECT_NO_THROW(validate(s));
  int pairs = 0;
  for (const auto& row : s.ranks)
    for (std::size_t k = 0; k + 1 < row.size(); ++k)
      if (row[k] && row[k]->overlapped) {
        ++pairs;
        ASSERT_TRUE(row[k + 1]);
        EXPECT_TRUE((row[k]->kind == op::F && row[k + 1]->kind == op::B) ||
                    (row[k]->kind == op::B && row[k + 1]->kind == op::F))
            << to_string(*row[k]) << " with " << to_string(*row[k + 1]);
      }
  EXPECT_GT(pairs, 0);
  // So an overlapped step's price counts: FB = 2 instead of F + B = 6.
  const auto slow = simulate(s, cost_model::parse("F=2,B=4,I=2,W=2"));
  const auto fast = simulate(s, cost_model::parse("F=2,B=4,I=2,W=2,FB=2"));
  EXPECT_LT(fast.makespan, slow.makespan);
}

TEST(Checkpointing, IsRefusedOnALoweredSchedule) {
  EXPECT_THROW(with_checkpointing(lower(generate("1f1b", 2, 2)), checkpoint_policy::parse("sqrt"), 4),
               std::invalid_argument);
}

}  // namespace

namespace {

using namespace troupe::pipeline;

TEST(DualPipeV, OverlapsAForwardWithABackwardInTheSteadyState) {
  auto s = generate("dualpipe-v", 4, 10);
  int pairs = 0;
  for (const auto& a : s.ranks[0])
    if (a && a->overlapped) ++pairs;
  EXPECT_EQ(pairs, 2 * 10 - 3 * 4 + 0 + 1);  // 2m - 3p + r + 1 on rank 0
  const std::string csv = to_csv(s);
  EXPECT_NE(csv.find("(0F7;7B3)OVERLAP_F_B"), std::string::npos) << csv;
  auto back = from_csv(csv, "dualpipe-v");
  EXPECT_EQ(back.ranks, s.ranks);
  EXPECT_EQ(to_csv(lower(back)), to_csv(lower(s)));
}

// DeepSeek's table: with PP = 2p stages the bubble is (PP/2 - 1)(F&B + B - 3W), the idle time
// of the last rank; activations PP + 1 chunks (p + 1/2 of a rank's whole shard).
TEST(DualPipeV, MatchesThePublishedBubbleAndMemory) {
  for (const char* fb : {"6", "5", "4"})
    for (int p = 2; p <= 8; ++p)
      for (int m = 2 * p; m <= 2 * p + 6; ++m) {
        // Per stage (chunk): F = I = W = 1, B = 2, F&B = fb / 2.
        auto costs = cost_model::parse(std::string("F=2,I=2,W=2,B=4,FB=") + fb);
        auto sim = simulate(generate("dualpipe-v", p, m), costs);
        const rational idle = sim.makespan - sim.busy[p - 1];
        const rational expected = rational(p - 1) * (rational::parse(fb) / rational(2) + rational(2) - rational(3));
        EXPECT_EQ(idle, expected) << "p=" << p << " m=" << m << " FB=" << fb;
        for (double a : sim.peak_activations) EXPECT_DOUBLE_EQ(a, p + 0.5) << "p=" << p << " m=" << m;
      }
}

TEST(DualPipeV, RefusesTooFewMicrobatches) {
  try {
    generate("dualpipe-v", 4, 7);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("m >= 8"), std::string::npos) << e.what();
  }
}

TEST(Overlap, APairMustBeTwoIndependentComputeActions) {
  auto s = from_csv("(0F0;0B0)OVERLAP_F_B\n");
  EXPECT_THROW(validate(s), schedule_error);  // the backward needs that very forward
  EXPECT_THROW(from_csv("(0F0)OVERLAP_F_B\n"), std::invalid_argument);
  EXPECT_THROW(from_csv("(0F0;0B0)OVERLAP\n"), std::invalid_argument);
}

}  // namespace

namespace {

using namespace troupe::pipeline;

double max_peak(const simulation& sim) {
  return *std::max_element(sim.peak_activations.begin(), sim.peak_activations.end());
}

/// The longest rank span minus its busy time, in the units of the costs.
rational span_bubble(const simulation& sim) {
  rational worst(0);
  for (std::size_t r = 0; r < sim.timeline.size(); ++r) {
    rational first = sim.timeline[r].front().start, last = sim.timeline[r].back().end;
    if (last - first - sim.busy[r] > worst) worst = last - first - sim.busy[r];
  }
  return worst;
}

// The authors' figures: V-Min holds (p+4)//3 microbatches of activations, V-Half (p+2)//2,
// against p for 1F1B and ZB-V.
TEST(ControllableMemory, VMinAndVHalfHoldAThirdAndAHalfOfTheActivations) {
  for (int p = 2; p <= 12; ++p)
    for (int m = 2 * p; m <= 2 * p + 8; m += 4) {
      auto vmin = generate("v-min", p, m), vhalf = generate("v-half", p, m);
      ASSERT_NO_THROW(validate(vmin)) << "p=" << p << " m=" << m;
      ASSERT_NO_THROW(validate(vhalf)) << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(max_peak(simulate(vmin)), (p + 4) / 3) << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(max_peak(simulate(vhalf)), (p + 2) / 2) << "p=" << p << " m=" << m;
    }
}

// With every pass of one stage costing 1 (F = I = W = 2 for a rank's two stages), the bubble
// (longest span minus its busy time) is 3p-7 (even p) or 3p-4 (odd p) for V-Half, and 4p-7
// (p divisible by 3) or 4p-5 for V-Min, once m is large enough.
TEST(ControllableMemory, BubblesMatchTheReferenceConstruction) {
  const auto unit = cost_model::parse("F=2,I=2,W=2");
  for (int p = 3; p <= 8; ++p) {
    const int m = 4 * p;
    const int half = p % 2 == 0 ? 3 * p - 7 : 3 * p - 4;
    const int min = p % 3 == 0 ? 4 * p - 7 : 4 * p - 5;
    EXPECT_EQ(span_bubble(simulate(generate("v-half", p, m), unit)), rational(half)) << "p=" << p;
    EXPECT_EQ(span_bubble(simulate(generate("v-min", p, m), unit)), rational(min)) << "p=" << p;
  }
  EXPECT_EQ(simulate(generate("v-min", 4, 8), unit).makespan, rational(59));
  EXPECT_EQ(simulate(generate("v-half", 4, 8), unit).makespan, rational(53));
}

}  // namespace
