// Checkpoints: resuming bit-identically (synchronous and FedBuff), and every file a run does not
// write refused without changing anything.

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <unistd.h>

#include "troupe/federated/dp.hpp"
#include "troupe/federated/robust.hpp"
#include "troupe/federated/simulation.hpp"
#include "troupe/kernels/data.hpp"

#include "fashion_subset.hpp"
#include "support.hpp"

namespace {

using namespace troupe::federated;
using namespace test_support;

}  // namespace

TEST(Checkpoint, ResumingInAFreshSimulationIsBitIdenticalToNeverStopping) {
  // Each case keeps a different kind of state between rounds: server moments, SCAFFOLD's
  // control variates, error-feedback residuals, the privacy accountant and adaptive bound.
  struct config {
    std::string strategy, compress;
    bool dp;
  };
  for (const config& c : {config{"fedadam", "", false}, config{"scaffold", "", false}, config{"fedavgm", "topk:0.1", false},
                          config{"fedavg", "", true}}) {
    auto o = small(c.strategy, 2);
    o.rounds = 4;
    o.compress = c.compress;
    if (c.dp) {
      o.dp_clip = 0.5;
      o.dp_noise = 0.3;
      o.dp_adaptive = true;
    }
    simulation straight(o, fashion());
    std::vector<std::pair<std::string, double>> straight_metrics;
    for (int r = 0; r < o.rounds; ++r) straight_metrics = straight.run_round().metrics;

    const std::string file = temp_file("resume.ckpt");
    {
      simulation first(o, fashion());
      first.run_round();
      first.run_round();
      first.save_checkpoint(file);
      first.run_round();  // progress after the checkpoint is lost with the process
    }
    auto resumed_options = o;
    resumed_options.threads = 1;  // the thread count may change
    simulation resumed(resumed_options, fashion());
    resumed.load_checkpoint(file);
    ASSERT_EQ(resumed.rounds_done(), 2);
    std::vector<std::pair<std::string, double>> resumed_metrics;
    while (resumed.rounds_done() < o.rounds) resumed_metrics = resumed.run_round().metrics;
    const auto a = model_of(straight), b = model_of(resumed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << c.strategy << " " << c.compress;
    EXPECT_EQ(straight_metrics, resumed_metrics) << c.strategy;
    EXPECT_EQ(straight.client_state_bytes(), resumed.client_state_bytes()) << c.strategy;
    std::remove(file.c_str());
  }
}

TEST(Checkpoint, RefusesOtherOptionsAndDamagedFilesWithoutChangingAnything) {
  auto o = small("fedavgm", 1);
  const std::string file = temp_file("refuse.ckpt");
  {
    simulation sim(o, fashion());
    sim.run_round();
    sim.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  ASSERT_GT(bytes.size(), 1000u);
  auto expect_refusal = [&](const simulation_options& options, const std::string& message) {
    simulation sim(options, fashion());
    const auto before = model_of(sim);
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 0);
    EXPECT_EQ(model_of(sim), before);
  };
  auto other = o;
  other.seed = 7;
  expect_refusal(other, "it was saved with seed=42 and this run has seed=7");
  other = o;
  other.partition = "iid";
  expect_refusal(other, "partition=dirichlet:0.5 and this run has partition=iid");
  auto write = [&](const std::string& content) { write_file(file, content); };
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 1);
  write(flipped);
  expect_refusal(o, "CRC-32 mismatch");
  write(bytes.substr(0, bytes.size() - 1));
  expect_refusal(o, "corrupted or truncated");
  write("");
  expect_refusal(o, "not a fedsim checkpoint");
  std::remove(file.c_str());
  expect_refusal(o, "cannot read the checkpoint");
}

// ---- FedBuff ------------------------------------------------------------------------------------

TEST(FedBuffCheckpoint, ResumingIsBitIdenticalToNeverStoppingAtOneAndTwoThreads) {
  // Each case carries other state across server steps: server moments and error-feedback
  // residuals; failed clients in flight; the privacy accountant; a robust rule's buffer.
  struct config {
    std::string strategy, compress;
    double dropout;
    bool dp;
  };
  for (const config& c : {config{"fedadam", "topk:0.2", 0, false}, config{"fedavg", "", 0.3, false},
                          config{"fedavg", "", 0.2, true}, config{"median", "", 0, false}}) {
    const std::string what = c.strategy + " " + c.compress + (c.dropout > 0 ? " dropout" : "") + (c.dp ? " dp" : "");
    auto o = small_async(c.strategy, 2);
    o.compress = c.compress;
    o.dropout = c.dropout;
    if (c.dp) {
      o.dp_clip = 0.5;
      o.dp_noise = 0.3;
    }
    simulation straight(o, fashion());
    const auto straight_metrics = run_to(straight, o.rounds);
    for (auto [saving, resuming] : {std::pair{1u, 2u}, std::pair{2u, 1u}}) {
      const std::string file = temp_file("async.ckpt");
      {
        auto first_options = o;
        first_options.threads = saving;
        simulation first(first_options, fashion());
        run_to(first, 3);
        first.save_checkpoint(file);
        run_to(first, o.rounds);  // saving changes nothing in the run that saved
        const auto a = model_of(straight), b = model_of(first);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << ": the saving run diverged";
      }
      auto resumed_options = o;
      resumed_options.threads = resuming;
      simulation resumed(resumed_options, fashion());
      resumed.load_checkpoint(file);
      ASSERT_EQ(resumed.rounds_done(), 3) << what;
      const auto resumed_metrics = run_to(resumed, o.rounds);
      const auto a = model_of(straight), b = model_of(resumed);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << what << ": saved at " << saving << " threads, resumed at " << resuming;
      EXPECT_EQ(straight_metrics, resumed_metrics) << what;
      EXPECT_EQ(straight.simulated_seconds(), resumed.simulated_seconds()) << what;
      // (client_state_bytes is not compared: the clients in flight allocate theirs whenever
      // their training starts in wall time.)
      std::remove(file.c_str());
    }
  }
}

TEST(FedBuffCheckpoint, ACheckpointBeforeTheFirstStepResumesToo) {
  auto o = small_async("fedavg", 2);
  o.rounds = 2;
  simulation straight(o, fashion());
  run_to(straight, o.rounds);
  const std::string file = temp_file("async0.ckpt");
  simulation(o, fashion()).save_checkpoint(file);
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 0);
  run_to(resumed, o.rounds);
  EXPECT_EQ(model_of(straight), model_of(resumed));
  std::remove(file.c_str());
}

TEST(FedBuffCheckpoint, RefusesOtherOptionsAndDamagedFilesWithoutChangingAnything) {
  auto o = small_async("fedavg", 1);
  o.dropout = 0.2;
  const std::string file = temp_file("async_refuse.ckpt");
  {
    simulation sim(o, fashion());
    run_to(sim, 2);
    sim.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  auto expect_refusal = [&](const simulation_options& options, const std::string& message) {
    simulation sim(options, fashion());
    run_to(sim, 1);  // clients in flight: a refused load keeps them
    const auto before = model_of(sim);
    const double clock = sim.simulated_seconds();
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 1);
    EXPECT_EQ(model_of(sim), before);
    EXPECT_EQ(sim.simulated_seconds(), clock);
    sim.run_round();  // and it goes on
  };
  auto other = o;
  other.async = "fedbuff:4";
  expect_refusal(other, "it was saved with async=fedbuff:3 and this run has async=fedbuff:4");
  other = o;
  other.async = "";
  expect_refusal(other, "it was saved with async=fedbuff:3 and this run has async=");
  other = o;
  other.dropout = 0.1;
  expect_refusal(other, "it was saved with dropout=0.20000000000000001 and this run has dropout=0.10000000000000001");
  auto write = [&](const std::string& content) { write_file(file, content); };
  std::string flipped = bytes;
  flipped[flipped.size() - 40] = static_cast<char>(flipped[flipped.size() - 40] ^ 1);  // in the updates in flight
  write(flipped);
  expect_refusal(o, "CRC-32 mismatch");
  write(bytes.substr(0, bytes.size() - 100));
  expect_refusal(o, "corrupted or truncated");
  std::remove(file.c_str());
}

TEST(Checkpoint, ReadsVersionOneAndTwoFilesOfSynchronousRunsAndRefusesUnknownVersions) {
  auto o = small("fedavgm", 2);
  const std::string file = temp_file("v1.ckpt");
  simulation straight(o, fashion());
  run_to(straight, 3);
  {
    simulation first(o, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  ASSERT_EQ(plain_crc32(bytes.substr(0, bytes.size() - 4)),
            *reinterpret_cast<const std::uint32_t*>(bytes.data() + bytes.size() - 4));
  // Version 1 had no FedBuff section: 24 bytes (server version, dispatches, clients in flight,
  // all zero in a synchronous run) before the CRC.
  const std::string v3 = bytes.substr(0, bytes.size() - 4);
  ASSERT_EQ(v3.substr(v3.size() - 24), std::string(24, '\0'));
  // Version 2 had no optimizer state after each client's: 30 clients of 24 bytes (generator,
  // an empty state, an empty optimizer state) before the FedBuff section become 16 bytes each.
  const std::size_t clients_at = v3.size() - 24 - 30 * 24;
  std::string body = v3.substr(0, clients_at);
  for (std::size_t c = 0; c < 30; ++c) {
    ASSERT_EQ(v3.substr(clients_at + 24 * c + 8, 16), std::string(16, '\0'));
    body += v3.substr(clients_at + 24 * c, 16);
  }
  body += v3.substr(v3.size() - 24);
  auto write = [&](const std::string& content) { write_file(file, content); };
  write(reversioned(body, 2));
  {
    simulation resumed(o, fashion());
    resumed.load_checkpoint(file);
    EXPECT_EQ(resumed.rounds_done(), 1);
    run_to(resumed, 3);
    EXPECT_EQ(model_of(straight), model_of(resumed));
  }
  write(reversioned(body.substr(0, body.size() - 24), 1));
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 1);
  run_to(resumed, 3);
  EXPECT_EQ(model_of(straight), model_of(resumed));

  write(reversioned(v3, 4));
  simulation other(o, fashion());
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "has version 4; this build reads 1 to 3");
  // A version 2 file of a synchronous run that claims clients in flight is malformed.
  std::string forged = body;
  forged[forged.size() - 8] = 1;
  write(reversioned(forged, 2));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: FedBuff state in a synchronous run");
  EXPECT_EQ(other.rounds_done(), 0);
  std::remove(file.c_str());
}

TEST(Checkpoint, RefusesValuesNoRunWritesEvenWithAValidChecksum) {
  // A crafted file: a NaN or negative clock, a NaN in the model. Each is refused on load (it was
  // found rounds later as a NaN accuracy or an infinite clock), and nothing changes.
  auto o = small("fedadam", 2);
  const std::string file = temp_file("forged.ckpt");
  {
    simulation first(o, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  const std::string body = bytes.substr(0, bytes.size() - 4);
  // Layout: magic (8), version (4), the options' fingerprint (u64 length, chars), rounds (i64),
  // clock (f64), the model (u64 length, floats), ...
  std::uint64_t fingerprint = 0;
  std::memcpy(&fingerprint, body.data() + 12, 8);
  const std::size_t clock_at = 12 + 8 + fingerprint + 8, model_at = clock_at + 8 + 8;
  auto forged = [&](std::size_t at, auto value) {
    std::string b = body;
    std::memcpy(b.data() + at, &value, sizeof value);
    write_file(file, reversioned(b, 3));
  };
  simulation other(o, fashion());
  forged(clock_at, std::nan(""));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the simulated clock is nan");
  forged(clock_at, -1e300);
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the simulated clock is");
  forged(model_at + 4 * 10, std::nanf(""));
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "malformed: the model holds a value that is not finite");
  EXPECT_EQ(other.rounds_done(), 0);
  // The untouched file still loads.
  write_file(file, bytes);
  other.load_checkpoint(file);
  EXPECT_EQ(other.rounds_done(), 1);
  std::remove(file.c_str());
}

namespace {

/// Where a checkpoint's parts start: the strategy's state (its u64 count, then doubles) and the
/// transforms' (their u64 count, then each one's u64 count and doubles).
struct checkpoint_layout {
  std::size_t strategy_at = 0, strategy_values = 0, transforms_at = 0;
};

checkpoint_layout layout_of(const std::string& body, std::size_t dim) {
  checkpoint_layout l;
  std::uint64_t fingerprint = 0;
  std::memcpy(&fingerprint, body.data() + 12, 8);
  l.strategy_at = 12 + 8 + fingerprint + 8 + 8 + 8 + 4 * dim;
  std::memcpy(&l.strategy_values, body.data() + l.strategy_at, 8);
  l.transforms_at = l.strategy_at + 8 + 8 * l.strategy_values;
  return l;
}

}  // namespace

TEST(Checkpoint, RefusesStrategyAndTransformStateThatDoesNotFitWithoutChangingAnything) {
  // A FedBuff run with momentum and DP clipping, refused with clients in flight: the refusal
  // used to come after the clients in flight were dropped and the strategy's state replaced
  // (the next round then crashed), and a momentum of the wrong length loaded and failed every
  // round after.
  auto o = small_async("fedavgm", 1);
  o.dp_clip = 0.5;
  o.dp_noise = 0.3;
  const std::string file = temp_file("state.ckpt");
  std::size_t dim = 0;
  {
    simulation first(o, fashion());
    run_to(first, 2);
    dim = first.global_model().size();
    first.save_checkpoint(file);
  }
  const std::string bytes = file_bytes(file);
  const std::string body = bytes.substr(0, bytes.size() - 4);
  const auto l = layout_of(body, dim);
  ASSERT_EQ(l.strategy_values, dim);
  std::uint64_t transforms = 0;
  double bound = 0;
  std::memcpy(&transforms, body.data() + l.transforms_at, 8);
  std::memcpy(&bound, body.data() + l.transforms_at + 16, 8);
  ASSERT_EQ(transforms, 1u);
  ASSERT_EQ(bound, 0.5);
  auto with_strategy = [&](const std::vector<double>& s) {
    std::string b = body.substr(0, l.strategy_at);
    const std::uint64_t n = s.size();
    b.append(reinterpret_cast<const char*>(&n), 8);
    b.append(reinterpret_cast<const char*>(s.data()), 8 * s.size());
    b += body.substr(l.transforms_at);
    return reversioned(b, 3);
  };
  auto expect_refusal = [&](const std::string& content, const std::string& message) {
    write_file(file, content);
    simulation sim(o, fashion()), twin(o, fashion());
    run_to(sim, 1);
    run_to(twin, 1);
    expect_error<std::runtime_error>([&] { sim.load_checkpoint(file); }, message);
    EXPECT_EQ(sim.rounds_done(), 1);
    run_to(sim, 3);  // the state, the clients in flight and the DP bound as they were
    run_to(twin, 3);
    EXPECT_EQ(model_of(sim), model_of(twin)) << message;
  };
  expect_refusal(with_strategy({1, 2, 3}),
                 "malformed: strategy 'fedavgm': the checkpoint's state has 3 values for a model of " + std::to_string(dim));
  std::vector<double> huge(dim, 0.0);
  huge[7] = 1e300;  // finite, but not as a float
  expect_refusal(with_strategy(huge), "state value 7 (");
  std::string b = body;
  const double minus = -1;
  std::memcpy(b.data() + l.transforms_at + 16, &minus, 8);
  expect_refusal(reversioned(b, 3), "dp-clip: the saved state has no valid clipping bound");
  expect_refusal(reversioned(body, 1), "has version 1, which holds only synchronous runs; this run is FedBuff");
  write_file(file, bytes);
  simulation resumed(o, fashion());
  resumed.load_checkpoint(file);
  EXPECT_EQ(resumed.rounds_done(), 2);

  // FedAdam's step count at the largest int would overflow at the next step.
  auto adam = small("fedadam", 1);
  {
    simulation first(adam, fashion());
    run_to(first, 1);
    first.save_checkpoint(file);
  }
  std::string a = file_bytes(file);
  a.resize(a.size() - 4);
  const auto la = layout_of(a, dim);
  ASSERT_EQ(la.strategy_values, 1 + 2 * dim);
  const double last = 2147483647.0;
  std::memcpy(a.data() + la.strategy_at + 8, &last, 8);
  write_file(file, reversioned(a, 3));
  simulation other(adam, fashion());
  expect_error<std::runtime_error>([&] { other.load_checkpoint(file); }, "fedadam': the checkpoint's step count is malformed");
  EXPECT_EQ(other.rounds_done(), 0);
  std::remove(file.c_str());
}
