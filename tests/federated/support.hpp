#pragma once
// What the simulation tests share: the error check, the model as a vector, the engine tests
// configurations and their checkpoint files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "fashion_subset.hpp"
#include "troupe/federated/simulation.hpp"

namespace troupe::federated::test_support {

/// Runs `f`, which must throw E with `words` in its message.
template <class E, class F>
void expect_error(F&& f, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error about " << words;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

/// n values uniform in [-scale, scale), seeded.
inline std::vector<float> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  splitmix64 g{seed};
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((g.uniform01() * 2 - 1) * scale);
  return v;
}

inline std::vector<float> model_of(const simulation& sim) { return {sim.global_model().begin(), sim.global_model().end()}; }

// ---- the engine's test configurations and checkpoint files -----------------------------------

inline const shared_data& fashion() { return test_data::fashion_subset(); }

inline void write_file(const std::string& file, const std::string& content) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << content;
}

inline simulation_options small(const std::string& strategy, unsigned threads) {
  simulation_options o;
  o.clients = 30;
  o.per_round = 6;
  o.rounds = 3;
  o.model = "mlp:784-24-10";
  o.partition = "dirichlet:0.5";
  o.strategy = strategy;
  o.threads = threads;
  o.test_limit = 500;
  o.seed = 42;
  o.window = 3;  // smaller than a round: replies queue behind the window
  return o;
}

/// small() under FedBuff (K = 3) with exponential latencies.
inline simulation_options small_async(const std::string& strategy, unsigned threads) {
  auto o = small(strategy, threads);
  o.async = "fedbuff:3";
  o.rounds = 6;
  o.latency = "exponential:1";
  return o;
}

inline std::vector<std::pair<std::string, double>> run_to(simulation& sim, int rounds) {
  std::vector<std::pair<std::string, double>> metrics;
  while (sim.rounds_done() < rounds) metrics = sim.run_round().metrics;
  return metrics;
}

inline std::string temp_file(const std::string& name) {
  return ::testing::TempDir() + "/troupe_engine_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// CRC-32 (IEEE, reflected), bit by bit: the checksum a checkpoint ends with.
inline std::uint32_t plain_crc32(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

/// `body` with its version field (after the 8-byte magic) set to `version` and a fresh CRC-32.
inline std::string reversioned(std::string body, std::uint32_t version) {
  std::memcpy(body.data() + 8, &version, sizeof version);
  const std::uint32_t crc = plain_crc32(body);
  body.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return body;
}

}  // namespace troupe::federated::test_support
