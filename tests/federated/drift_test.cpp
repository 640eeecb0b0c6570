// The drift detectors: DDM against the paper's definition, ADWIN2's buckets against the plain
// ADWIN test on the raw window, and both on a Bernoulli stream whose error rate steps from 0.1
// to 0.5 at t = 1000 (200 seeds).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#include "support.hpp"
#include "troupe/federated/drift.hpp"
#include "troupe/federated/rng.hpp"

namespace {

using namespace troupe::federated;

constexpr int change_at = 1000, stream_length = 2000, seeds = 200;

/// 0/1 errors with rate 0.1 before t = 1000 and 0.5 from then on.
std::vector<bool> bernoulli_switch(std::uint64_t seed) {
  splitmix64 g{derive_seed(seed, 0xB0)};
  std::vector<bool> s(stream_length);
  for (int t = 0; t < stream_length; ++t) s[static_cast<std::size_t>(t)] = g.uniform01() < (t < change_at ? 0.1 : 0.5);
  return s;
}

struct outcome {
  int seeds_with_early_alarm = 0;  // an alarm before t = 1000
  std::vector<int> delays;         // first alarm at or after t = 1000, less 1000 (-1: none)
};

template <class Alarm>
outcome run_switch(Alarm&& alarm_for) {
  outcome o;
  for (int seed = 0; seed < seeds; ++seed) {
    auto alarm = alarm_for();
    const auto s = bernoulli_switch(static_cast<std::uint64_t>(seed));
    bool early = false;
    int delay = -1;
    for (int t = 0; t < stream_length && delay < 0; ++t)
      if (alarm(s[static_cast<std::size_t>(t)])) {
        if (t < change_at)
          early = true;
        else
          delay = t - change_at;
      }
    o.seeds_with_early_alarm += early ? 1 : 0;
    o.delays.push_back(delay);
  }
  return o;
}

/// The figures, printed with the test's output: seeds with an early alarm, the delays' median
/// and 99th percentile among seeds that detected, and seeds that missed.
void print(const char* name, const outcome& o) {
  std::vector<int> d;
  for (int x : o.delays)
    if (x >= 0) d.push_back(x);
  std::sort(d.begin(), d.end());
  const int median = d.empty() ? -1 : d[d.size() / 2], p99 = d.empty() ? -1 : d[d.size() * 99 / 100];
  std::printf("%s on 0.1 -> 0.5 at t = 1000, %d seeds: early alarm in %d, delay median %d, 99th percentile %d, missed %d\n",
              name, seeds, o.seeds_with_early_alarm, median, p99, seeds - static_cast<int>(d.size()));
}

int detected_within(const outcome& o, int delay) {
  int n = 0;
  for (int d : o.delays) n += d >= 0 && d <= delay ? 1 : 0;
  return n;
}

// ---- DDM -------------------------------------------------------------------------------------

TEST(Ddm, SignalsAsThePaperDefinesOnARandomStream) {
  // The definition, written out: p_i, s_i over the errors since the last reset; from the 30th
  // observation the lowest p + s is (p_min, s_min); after the 30th, warning at p + s > p_min + 2
  // s_min, drift (and a reset) at p + s > p_min + 3 s_min (MOA's DDM.java: strict, and no test
  // at the observation that first sets the minimum).
  splitmix64 g{42};
  ddm detector;
  std::int64_t n = 0, errors = 0;
  double p_min = std::numeric_limits<double>::infinity(), s_min = 0;
  int drifts = 0, warnings = 0;
  for (int t = 0; t < 20000; ++t) {
    // An error-free start (s_min = 0, where >= and a test at the 30th observation alarmed with no
    // error), then the rate alternates.
    const double rate = t < 100 ? 0.0 : (t / 2500) % 2 == 0 ? 0.05 : 0.4;
    const bool error = g.uniform01() < rate;
    ++n;
    errors += error;
    drift_signal expected = drift_signal::none;
    if (n >= 30) {
      const double p = static_cast<double>(errors) / static_cast<double>(n);
      const double s = std::sqrt(p * (1 - p) / static_cast<double>(n));
      if (p + s < p_min + s_min) p_min = p, s_min = s;
      if (n == 30) {
        // the minimum was just set here: no test
      } else if (p + s > p_min + 3 * s_min) {
        expected = drift_signal::drift;
        n = errors = 0;
        p_min = std::numeric_limits<double>::infinity();
        s_min = 0;
      } else if (p + s > p_min + 2 * s_min) {
        expected = drift_signal::warning;
      }
    }
    const drift_signal got = detector.observe(error);
    ASSERT_EQ(got, expected) << "observation " << t;
    drifts += got == drift_signal::drift;
    warnings += got == drift_signal::warning;
  }
  EXPECT_GE(drifts, 4);  // the rate rises four times
  EXPECT_GT(warnings, 0);
}

TEST(Ddm, SaysNothingBeforeThirtyObservationsAndResetsAfterADrift) {
  ddm d;
  for (int i = 0; i < 29; ++i) EXPECT_EQ(d.observe(i >= 20), drift_signal::none);
  EXPECT_EQ(d.observations(), 29);
  // 30 correct, then errors: the drift level comes, and the detector starts over.
  ddm e;
  for (int i = 0; i < 60; ++i) e.observe(i % 10 == 0);
  drift_signal s = drift_signal::none;
  int steps = 0;
  while (s != drift_signal::drift && steps < 1000) s = e.observe(true), ++steps;
  EXPECT_EQ(s, drift_signal::drift);
  EXPECT_EQ(e.observations(), 0);
  test_support::expect_error<std::invalid_argument>([] { ddm bad({.min_observations = 0}); }, "min_observations");
  test_support::expect_error<std::invalid_argument>(
      [] { ddm bad({.min_observations = 30, .warning_level = 3, .drift_level = 2}); }, "0 < warning <= drift");
}

TEST(Ddm, AFirstStretchWithoutErrorsIsNoAlarmButTheFirstErrorAfterItIs) {
  // 200 correct observations: from the 30th p_min = s_min = 0, and p + s = 0 is at no level
  // (the rule p + s >= p_min + 3 s_min alarmed at the 30th, reset, and again every 30).
  ddm d;
  for (int i = 1; i <= 200; ++i) ASSERT_EQ(d.observe(false), drift_signal::none) << "observation " << i;
  EXPECT_EQ(d.observations(), 200);
  // The next error makes p + s > 0 = p_min + 3 s_min: a drift, and the detector starts over.
  EXPECT_EQ(d.observe(true), drift_signal::drift);
  EXPECT_EQ(d.observations(), 0);
  // Afresh: 29 observations (errors among them) say nothing, the 30th sets the minimum.
  for (int i = 1; i <= 30; ++i) ASSERT_EQ(d.observe(i % 3 == 0), drift_signal::none) << "observation " << i;
  // Nothing but errors: p_min = 1, s_min = 0, and p + s = 1 is at no level either (the former
  // rule alarmed every 30 observations here too). A first correct observation takes p + s below
  // 1 (p + s = 1 - 1/n + sqrt((n - 1) / n^3)): a new minimum, no alarm.
  ddm e;
  for (int i = 1; i <= 200; ++i) ASSERT_EQ(e.observe(true), drift_signal::none) << "observation " << i;
  EXPECT_EQ(e.observe(false), drift_signal::none);
  for (int i = 1; i <= 100; ++i) ASSERT_EQ(e.observe(true), drift_signal::none) << "error " << i << " after it";
  EXPECT_EQ(e.observations(), 301);
  // With a first stretch that has errors, s_min > 0 and an error now and then is no alarm.
  ddm f;
  for (int i = 1; i <= 30; ++i) f.observe(i % 10 == 0);
  EXPECT_EQ(f.observe(false), drift_signal::none);
  EXPECT_EQ(f.observe(true), drift_signal::none);
}

TEST(Ddm, DetectsTheSwitchToHalfErrorsWithin300Observations) {
  const outcome o = run_switch([] {
    return [d = ddm()](bool error) mutable { return d.observe(error) == drift_signal::drift; };
  });
  print("DDM", o);
  // Among the seeds, a DDM restarted by an early false alarm still catches the change.
  EXPECT_GE(detected_within(o, 300), seeds * 99 / 100);
  // It does not keep quiet before the change (measured: 86 of 200 seeds); the next test says why.
  EXPECT_GT(o.seeds_with_early_alarm, seeds / 5);
  EXPECT_LT(o.seeds_with_early_alarm, seeds / 2);
}

TEST(Ddm, NoThreeSigmaTestRepeatedOverAThousandObservationsAtTenPercentKeepsQuietInNinetyNinePercent) {
  // Why DDM cannot meet "no alarm before the change in 99% of seeds" on 1000 observations at
  // p = 0.1, over 1000 seeds of the stationary part alone, three tests of decreasing idealisation:
  //  (a) DDM as the paper defines it (the running minimum of p_i + s_i, s_i from p_i);
  //  (b) the same running minimum with the true sigma_i = sqrt(0.1 * 0.9 / i) in place of s_i;
  //  (c) a fixed 3-sigma test against the true rate, p_i >= 0.1 + 3 sigma_i, at every i >= 30.
  // (c) is the best a 3-sigma test can do, and repeated over 971 correlated steps it already
  // crosses in more than 1% of streams: the multiple-testing rate. (b) adds the running minimum,
  // a reference chosen where the path was lowest. (a) adds the plug-in s_i, which shrinks with
  // p_i just where the minimum is taken: a stream with no error among its first 30 observations
  // (0.9^30 = 4.2%) sets s_min = 0, and its next error alarms.
  // TROUPE_DDM_SEEDS=10000 gives the bracketed figures of docs/federated/time.md.
  const int n_seeds = [] {
    const char* env = std::getenv("TROUPE_DDM_SEEDS");
    return env != nullptr && std::atoi(env) >= 1000 ? std::atoi(env) : 1000;
  }();
  constexpr int length = 1000, min_n = 30;
  constexpr double p = 0.1;
  int ddm_alarmed = 0, true_sigma_alarmed = 0, fixed_alarmed = 0, no_error_in_30 = 0, of_those_alarmed = 0,
      of_those_at_first_error = 0;
  for (int seed = 0; seed < n_seeds; ++seed) {
    splitmix64 g{derive_seed(static_cast<std::uint64_t>(seed), 0xB0)};
    ddm d;
    bool a = false, b = false, c = false, none_in_30 = false;
    int first_alarm = 0, first_error = 0;
    std::int64_t errors = 0;
    double ref = std::numeric_limits<double>::infinity(), ref_sigma = 0;
    for (int i = 1; i <= length; ++i) {
      const bool error = g.uniform01() < p;
      errors += error ? 1 : 0;
      if (error && first_error == 0) first_error = i;
      const bool alarm = d.observe(error) == drift_signal::drift;
      if (alarm && first_alarm == 0) first_alarm = i;
      a = alarm || a;
      if (i < min_n) continue;
      const double rate = static_cast<double>(errors) / i, sigma = std::sqrt(p * (1 - p) / i);
      if (rate + sigma < ref + ref_sigma) ref = rate, ref_sigma = sigma;
      b = b || rate + sigma >= ref + 3 * ref_sigma;
      c = c || rate >= p + 3 * sigma;
      none_in_30 = none_in_30 || (i == min_n && errors == 0);
    }
    no_error_in_30 += none_in_30;
    of_those_alarmed += none_in_30 && a;
    of_those_at_first_error += none_in_30 && first_alarm == first_error;
    ddm_alarmed += a;
    true_sigma_alarmed += b;
    fixed_alarmed += c;
  }
  std::printf("1000 observations at p = 0.1, %d seeds: DDM alarms in %d, its running minimum with the true sigma in %d, "
              "a fixed 3-sigma test in %d; no error in the first 30: %d\n",
              n_seeds, ddm_alarmed, true_sigma_alarmed, fixed_alarmed, no_error_in_30);
  EXPECT_GT(fixed_alarmed, n_seeds / 100) << "the repeated 3-sigma test alone passes the 99% criterion";
  EXPECT_GT(true_sigma_alarmed, fixed_alarmed);
  EXPECT_GT(ddm_alarmed, 3 * true_sigma_alarmed);
  // Measured over 10,000 seeds: 41.2% (DDM), 6.1% (true sigma), 3.6% (fixed).
  EXPECT_GT(ddm_alarmed, n_seeds * 35 / 100);
  EXPECT_LT(ddm_alarmed, n_seeds * 48 / 100);
  EXPECT_GT(no_error_in_30, 0);
  // s_min = 0: no alarm while no error comes (not at the 30th observation), and the first error,
  // past the 30th, is at the drift level.
  EXPECT_EQ(of_those_at_first_error, no_error_in_30);
  EXPECT_EQ(of_those_alarmed, no_error_in_30);
}

// ---- ADWIN ---------------------------------------------------------------------------------

TEST(Adwin, CutThresholdIsTheHoeffdingBoundOfThePaper) {
  // n0 = n1 = 100, delta = 0.002: m = 1 / (1/100 + 1/100) = 50, delta' = 0.002 / 200 = 1e-5,
  // eps = sqrt(ln(4 / 1e-5) / (2 * 50)) = sqrt(12.8992 / 100).
  EXPECT_NEAR(adwin::cut_threshold(100, 100, 0.002), std::sqrt(std::log(4e5) / 100.0), 1e-12);
  EXPECT_NEAR(adwin::cut_threshold(100, 100, 0.002), 0.359155, 1e-6);
  // Unequal parts: m = 1 / (1/10 + 1/990) = 9.9.
  EXPECT_NEAR(adwin::cut_threshold(10, 990, 0.1), std::sqrt(std::log(4.0 / (0.1 / 1000)) / (2 * 9.9)), 1e-12);
}

TEST(Adwin, BucketsHoldExactlyTheLastWObservationsAndEveryCutIsOneTheDefinitionMakes) {
  // A stream with a rise and a fall, replayed into the bucketed window and, raw, into the
  // reference, which follows the bucketed window's cuts. After each observation: width and sum
  // agree; the buckets are powers of two, at most 3 of each size, none larger after a smaller
  // one (newest last); no cut is left at any bucket boundary; and when the window shrank, the
  // raw window before the cut had a split that meets ADWIN's test.
  int shrinks = 0;
  for (std::uint64_t seed = 0; seed < 3; ++seed) {
    adwin a(0.01, 3);
    adwin_reference plain(0.01);
    splitmix64 g{seed};
    for (int t = 0; t < 3000; ++t) {
      const double rate = t < 1000 ? 0.2 : t < 1800 ? 0.7 : 0.3;
      const double x = g.uniform01() < rate ? 1.0 : 0.0;
      const std::int64_t before = a.width();
      a.observe(x);
      plain.push(x);
      const std::int64_t dropped = before + 1 - a.width();
      if (dropped > 0) {
        ++shrinks;
        bool holds = false;
        for (std::int64_t n0 = 1; n0 < plain.width() && !holds; ++n0) holds = plain.cut_holds(n0);
        ASSERT_TRUE(holds) << "seed " << seed << " t " << t << ": a cut the definition does not make";
        plain.drop(dropped);
      }
      ASSERT_EQ(plain.width(), a.width()) << t;
      ASSERT_NEAR(plain.sum(), a.sum(), 1e-9) << t;
      const auto lengths = a.bucket_lengths();
      std::int64_t total = 0;
      for (std::size_t i = 0; i < lengths.size(); ++i) {
        total += lengths[i];
        ASSERT_EQ(lengths[i] & (lengths[i] - 1), 0) << "not a power of two";
        if (i > 0) {
          ASSERT_LE(lengths[i], lengths[i - 1]);
        }
      }
      ASSERT_EQ(total, a.width());
      std::int64_t boundary = 0;
      for (std::size_t i = 0; i + 1 < lengths.size(); ++i) {
        boundary += lengths[i];
        ASSERT_FALSE(plain.cut_holds(boundary)) << "t " << t << ": a cut left at " << boundary;
      }
      for (std::int64_t len = 1; len <= total; len *= 2) {
        int same = 0;
        for (auto l : lengths) same += l == len;
        ASSERT_LE(same, 3);
      }
    }
  }
  EXPECT_GE(shrinks, 6);  // each stream's two changes
}

TEST(Adwin, TheReferenceCutsNoLaterThanTheBuckets) {
  // Until the first cut both windows are the whole stream; the reference tries every split, the
  // buckets only their boundaries: the reference cuts first or at once, and the buckets follow
  // within a few dozen observations.
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    adwin a;
    adwin_reference r;
    const auto s = bernoulli_switch(seed);
    int first_a = -1, first_r = -1;
    for (int t = 0; t < stream_length && (first_a < 0 || first_r < 0); ++t) {
      const double x = s[static_cast<std::size_t>(t)] ? 1.0 : 0.0;
      if (first_a < 0 && a.observe(x) != adwin_change::none) first_a = t;
      if (first_r < 0 && r.observe(x) != adwin_change::none) first_r = t;
    }
    ASSERT_GE(first_r, change_at) << seed;
    ASSERT_GE(first_a, first_r) << seed;
    EXPECT_LE(first_a - first_r, 64) << seed;
  }
}

TEST(Adwin, DetectsTheSwitchWithin150ObservationsAndNeverBefore) {
  const outcome o = run_switch([] {
    return [a = adwin()](bool error) mutable { return a.observe(error ? 1.0 : 0.0) != adwin_change::none; };
  });
  print("ADWIN", o);
  EXPECT_GE(seeds - o.seeds_with_early_alarm, seeds * 99 / 100) << "seeds with a cut before the change";
  EXPECT_GE(detected_within(o, 150), seeds * 99 / 100);
}

TEST(Adwin, ShrinksAStationaryWindowLessOftenThanDelta) {
  // Theorem 3.1: on a stationary stream the window shrinks at a given step with probability at
  // most delta. With delta = 0.1, 0.01: count the steps with a cut over 200 streams of 2000.
  for (const double delta : {0.1, 0.01}) {
    for (const double p : {0.1, 0.5}) {
      std::int64_t steps = 0, cuts = 0;
      for (std::uint64_t seed = 0; seed < 200; ++seed) {
        adwin a(delta);
        splitmix64 g{derive_seed(seed, 0x57A7)};
        for (int t = 0; t < 2000; ++t, ++steps) cuts += a.observe(g.uniform01() < p ? 1.0 : 0.0) != adwin_change::none;
      }
      EXPECT_LE(static_cast<double>(cuts), delta * static_cast<double>(steps)) << "delta " << delta << " p " << p;
    }
  }
  // A step of 0.4 in the mean is cut at once, whatever delta: the bound is not vacuous.
  adwin a(0.1);
  for (int t = 0; t < 500; ++t) a.observe(0.0);
  int t = 0;
  while (a.observe(1.0) == adwin_change::none && t < 100) ++t;
  EXPECT_LT(t, 30);
}

TEST(Adwin, RefusesWhatItCannotTake) {
  test_support::expect_error<std::invalid_argument>([] { adwin a(0.0); }, "delta must be in (0, 1)");
  test_support::expect_error<std::invalid_argument>([] { adwin a(0.1, 1); }, "at least 2 buckets");
  adwin a;
  test_support::expect_error<std::invalid_argument>([&] { a.observe(1.5); }, "observations must be in [0, 1]");
}

TEST(ErrorDetector, AlarmsOnARisingErrorRateOnly) {
  for (const char* kind : {"ddm", "adwin"}) {
    error_detector d(kind);
    splitmix64 g{5};
    int alarms_while_falling = 0, alarms_after_rise = 0;
    // A model that learns: errors fall from 0.9 to 0.1.
    for (int t = 0; t < 3000; ++t) alarms_while_falling += d.observe(g.uniform01() < 0.9 - 0.8 * std::min(1.0, t / 1500.0));
    for (int t = 0; t < 500; ++t) alarms_after_rise += d.observe(g.uniform01() < 0.5);
    EXPECT_EQ(alarms_while_falling, 0) << kind;
    EXPECT_GE(alarms_after_rise, 1) << kind;
  }
  test_support::expect_error<std::invalid_argument>([] { error_detector d("page-hinkley"); },
                                                             "--drift-detect 'page-hinkley': use ddm or adwin");
}

// ---- the injected drift --------------------------------------------------------------------

TEST(DriftSwap, ParsesTheSpecAndRefusesMalformedOnes) {
  const drift_swap d = parse_drift("swap:100:0.3:0-6");
  EXPECT_EQ(d.round, 100);
  EXPECT_DOUBLE_EQ(d.fraction, 0.3);
  EXPECT_EQ(d.a, 0);
  EXPECT_EQ(d.b, 6);
  using test_support::expect_error;
  expect_error<std::invalid_argument>([] { parse_drift("flip:100:0.3:0-6"); }, "use swap:ROUND:FRACTION:A-B");
  expect_error<std::invalid_argument>([] { parse_drift("swap:100:0.3"); }, "use swap:ROUND:FRACTION:A-B");
  expect_error<std::invalid_argument>([] { parse_drift("swap:0:0.3:0-6"); }, "ROUND must be a whole number");
  expect_error<std::invalid_argument>([] { parse_drift("swap:10:1.5:0-6"); }, "FRACTION must be in (0, 1]");
  expect_error<std::invalid_argument>([] { parse_drift("swap:10:0.3:06"); }, "use swap:ROUND:FRACTION:A-B");
  expect_error<std::invalid_argument>([] { parse_drift("swap:10:0.3:3-3"); }, "two different labels");
  expect_error<std::invalid_argument>([] { parse_drift("swap:10:0.3:0-x"); }, "is not a number");
}

TEST(DriftSwap, DriftsExactlyTheSeededFraction) {
  const drift_swap d = parse_drift("swap:5:0.3:0-6");
  const auto a = drifted_clients(d, 100, 1), b = drifted_clients(d, 100, 1), c = drifted_clients(d, 100, 2);
  int n = 0;
  for (char x : a) n += x;
  EXPECT_EQ(n, 30);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
