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
  std::string backend = "r255";
  bool json = false;
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct measured {
  double prove_ms = 0, verify_ms = 0, product_us = 0, generators_ms = 0;
  std::size_t bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_row(const zkbench_flags& f, std::size_t dim, troupe::federated::zk::group_backend b, const measured& m,
               const measured* reference) {
  namespace zk = troupe::federated::zk;
  const double per = 1000.0 / static_cast<double>(dim);
  const std::string name(zk::backend_name(b));
  if (f.json) {
    std::string extra;
    if (reference != nullptr) {
      char buf[256];
      std::snprintf(buf, sizeof buf, ",\"cross_verified\":true,\"prove_speedup\":%.1f,\"verify_speedup\":%.1f",
                    reference->prove_ms / m.prove_ms, reference->verify_ms / m.verify_ms);
      extra = buf;
    }
    std::printf("{\"backend\":\"%s\",\"dim\":%zu,\"bits\":%d,\"bound\":%s,\"repeat\":%d,\"prove_ms\":%.1f,"
                "\"verify_ms\":%.1f,\"proof_bytes\":%zu,\"bytes_per_coordinate\":%.1f,\"us_per_coordinate\":%.1f,"
                "\"prove_us_per_coordinate\":%.1f,\"verify_us_per_coordinate\":%.1f,\"generators_ms\":%.1f,"
                "\"product_us\":%.2f%s}\n",
                name.c_str(), dim, f.bits, json_number(f.bound, "%.6g").c_str(), f.repeat, m.prove_ms, m.verify_ms,
                m.bytes, static_cast<double>(m.bytes) / static_cast<double>(dim), (m.prove_ms + m.verify_ms) * per,
                m.prove_ms * per, m.verify_ms * per, m.generators_ms, m.product_us, extra.c_str());
  } else {
    std::printf("%s: d = %zu, k = %d: prove %.1f ms, verify %.1f ms (%.1f + %.1f us per coordinate), proof %zu bytes "
                "(%.1f per coordinate); generators made in %.1f ms; one scalar multiplication %.2f us",
                name.c_str(), dim, f.bits, m.prove_ms, m.verify_ms, m.prove_ms * per, m.verify_ms * per, m.bytes,
                static_cast<double>(m.bytes) / static_cast<double>(dim), m.generators_ms, m.product_us);
    if (reference != nullptr)
      std::printf("; %.1fx faster to prove, %.1fx to verify than sodium (each verified the other's proof)",
                  reference->prove_ms / m.prove_ms, reference->verify_ms / m.verify_ms);
    std::printf("\n");
  }
  std::fflush(stdout);
}

/// One row per backend: a random update of norm 0.9 B (every coordinate drawn, then scaled),
/// proved and verified `repeat` times; the medians. With both backends, each verifies the other's
/// proof (the same protocol, the same bytes format) and the fast row carries the speedups.
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
  const bool both = f.backend == "both";
  std::vector<zk::group_backend> backends;
  if (both || f.backend == "sodium") backends.push_back(zk::group_backend::sodium);
  if (both || f.backend == "r255") backends.push_back(zk::group_backend::fast);
  std::vector<measured> m(backends.size());
  std::vector<std::vector<double>> prove(backends.size()), verify(backends.size());
  for (std::size_t b = 0; b < backends.size(); ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    zk::prepare(p, backends[b]);
    m[b].generators_ms = ms_since(t0);
  }
  for (int r = 0; r < f.repeat; ++r) {
    std::vector<std::vector<std::uint8_t>> proofs(backends.size());
    for (std::size_t b = 0; b < backends.size(); ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      proofs[b] = zk::prove_norm(x, p, backends[b]);
      prove[b].push_back(ms_since(t0));
      m[b].bytes = proofs[b].size();
    }
    for (std::size_t b = 0; b < backends.size(); ++b) {
      // With two backends, each verifies the proof the other made.
      const auto& proof = proofs[backends.size() - 1 - b];
      const auto t0 = std::chrono::steady_clock::now();
      const auto v = zk::verify_norm(proof, p, x, backends[b]);
      verify[b].push_back(ms_since(t0));
      if (!v.ok) {
        std::fprintf(stderr, "troupe zkbench: the proof for d = %zu did not verify on %s: %s\n", dim,
                     std::string(zk::backend_name(backends[b])).c_str(), v.reason.c_str());
        return 1;
      }
    }
  }
  for (std::size_t b = 0; b < backends.size(); ++b) {
    m[b].prove_ms = median(prove[b]);
    m[b].verify_ms = median(verify[b]);
    m[b].product_us = zk::product_us(backends[b]);
  }
  for (std::size_t b = 0; b < backends.size(); ++b)
    print_row(f, dim, backends[b], m[b], both && backends[b] == zk::group_backend::fast ? &m[0] : nullptr);
  return 0;
}

}  // namespace

void add_zkbench_command(CLI::App& app, int& rc) {
  auto f = std::make_shared<zkbench_flags>();
  auto* cmd = app.add_subcommand("zkbench",
                                 "measure the zero-knowledge norm proof (Bulletproofs on ristretto255, the project's own or "
                                 "libsodium's): proving, verifying and bytes per client update");
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
  cmd->add_option("--backend", f->backend,
                  "r255 (the project's ristretto255), sodium (libsodium's calls, the reference) or both (side by side, "
                  "each verifying the other's proofs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"r255", "sodium", "both"}));
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
