// troupe zkbench: the zero-knowledge norm proof's costs (zkproof.hpp) for updates of D
// coordinates: proving, verifying, the proof's bytes, per client and per coordinate.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <troupe/federated/rng.hpp>
#include <troupe/federated/zkproof.hpp>

#include "commands.hpp"

namespace troupe::cli {

namespace {

struct zkbench_flags {
  std::vector<std::size_t> dims{1000};
  int bits = 16;
  double bound = 1.0;
  int repeat = 1;
  bool json = false;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// One row: a random update of norm 0.9 B (every coordinate drawn, then scaled), proved and
/// verified `repeat` times; the medians.
int run_row(const zkbench_flags& f, std::size_t dim) {
  namespace zk = troupe::federated::zk;
  const zk::norm_params p{.dim = dim, .bits = f.bits, .bound = f.bound};
  zk::check_params(p);
  troupe::federated::splitmix64 g{0x2B3C4D5Eull + dim};
  std::vector<float> update(dim);
  double norm = 0;
  for (auto& v : update) {
    v = static_cast<float>(g.uniform01() * 2 - 1);
    norm += static_cast<double>(v) * v;
  }
  const double scale = 0.9 * f.bound / std::sqrt(std::max(norm, 1e-30));
  for (auto& v : update) v = static_cast<float>(v * scale);
  const auto x = zk::quantize(update, p);
  auto t0 = std::chrono::steady_clock::now();
  zk::prepare(p);
  const double generators_ms = ms_since(t0);
  std::vector<double> prove, verify;
  std::size_t bytes = 0;
  for (int r = 0; r < f.repeat; ++r) {
    t0 = std::chrono::steady_clock::now();
    const auto proof = zk::prove_norm(x, p);
    prove.push_back(ms_since(t0));
    bytes = proof.size();
    t0 = std::chrono::steady_clock::now();
    const auto v = zk::verify_norm(proof, p, x);
    verify.push_back(ms_since(t0));
    if (!v.ok) {
      std::fprintf(stderr, "troupe zkbench: the proof for d = %zu did not verify: %s\n", dim, v.reason.c_str());
      return 1;
    }
  }
  std::sort(prove.begin(), prove.end());
  std::sort(verify.begin(), verify.end());
  const double pm = prove[prove.size() / 2], vm = verify[verify.size() / 2];
  const double product = zk::product_us();
  const double per = 1000.0 / static_cast<double>(dim);
  if (f.json)
    std::printf("{\"backend\":\"sodium\",\"dim\":%zu,\"bits\":%d,\"bound\":%s,\"repeat\":%d,\"prove_ms\":%.1f,\"verify_ms\":%.1f,"
                "\"proof_bytes\":%zu,\"bytes_per_coordinate\":%.1f,\"us_per_coordinate\":%.1f,"
                "\"prove_us_per_coordinate\":%.1f,\"verify_us_per_coordinate\":%.1f,\"generators_ms\":%.1f,"
                "\"product_us\":%.1f}\n",
                dim, f.bits, json_number(f.bound, "%.6g").c_str(), f.repeat, pm, vm, bytes,
                static_cast<double>(bytes) / static_cast<double>(dim), (pm + vm) * per, pm * per, vm * per, generators_ms,
                product);
  else
    std::printf("d = %zu, k = %d: prove %.1f ms, verify %.1f ms (%.1f + %.1f us per coordinate), proof %zu bytes "
                "(%.1f per coordinate); generators made in %.1f ms; one scalar multiplication %.1f us\n",
                dim, f.bits, pm, vm, pm * per, vm * per, bytes, static_cast<double>(bytes) / static_cast<double>(dim),
                generators_ms, product);
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_zkbench_command(CLI::App& app, int& rc) {
  auto f = std::make_shared<zkbench_flags>();
  auto* cmd = app.add_subcommand("zkbench",
                                 "measure the zero-knowledge norm proof (Bulletproofs on ristretto255 through libsodium): "
                                 "proving, verifying and bytes per client update");
  cmd->add_option("--dim", f->dims, "coordinates of the update: D or D1,D2,... (a row each)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24));
  cmd->add_option("--bits", f->bits, "bits per quantized coordinate: 8, 16 or 32")
      ->capture_default_str()
      ->check(CLI::IsMember({8, 16, 32}));
  cmd->add_option("--bound", f->bound, "the L2 bound B (the update has norm 0.9 B)")
      ->capture_default_str()
      ->check(positive_number);
  cmd->add_option("--repeat", f->repeat, "proofs per row (the medians are reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", f->json, "one JSON object per row");
  cmd->callback([f, &rc] {
    try {
      for (auto d : f->dims)
        if ((rc = run_row(*f, d)) != 0) return;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe zkbench: %s\n", e.what());
      rc = 1;
    }
  });
}

}  // namespace troupe::cli
