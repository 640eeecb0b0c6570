// `troupe bench group`: microseconds of CPU per ristretto255 operation, the project's own code
// (r255.hpp, and ristretto.hpp's byte-level functions on it) beside libsodium 1.0.18's, and the
// multi-scalar multiplication's microseconds per point at the sizes a verifier meets (79,510 is
// a 100-client round of the default MLP's 79,510 parameters, one commitment each).

#include "group_bench.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

#include <troupe/federated/r255.hpp>
#include <troupe/federated/ristretto.hpp>

namespace troupe::bench {
namespace {

namespace r255 = federated::r255;

void line(const options& o, std::ostream& out, const std::string& bench, const char* metric, double value,
          const char* unit) {
  char num[64];
  std::snprintf(num, sizeof num, "%.3f", value);
  if (o.json)
    out << "{\"suite\":\"group\",\"bench\":\"" << bench << "\",\"metric\":\"" << metric << "\",\"value\":" << num
        << ",\"unit\":\"" << unit << "\"}\n";
  else
    out << bench << "  " << metric << "  " << num << " " << unit << "\n";
  out.flush();
}

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// Microseconds of CPU per call of f(i), over `runs` calls (after one warm-up call).
template <class F>
double us_per_call(int runs, F&& f) {
  f(0);
  const double t0 = cpu_seconds();
  for (int i = 0; i < runs; ++i) f(i);
  return (cpu_seconds() - t0) * 1e6 / runs;
}

const char* const workloads[] = {"multiply", "base", "hash", "msm", nullptr};

// The timed results land here, so that no timed call is optimised away.
volatile std::uint8_t benchmark_sink;

}  // namespace

int run_group(const options& o, std::ostream& out) {
  if (!o.only.empty() && std::none_of(workloads, workloads + 4, [&](const char* w) { return o.only == w; })) {
    std::cerr << "troupe bench group: unknown workload '" << o.only << "' (known: multiply, base, hash, msm)\n";
    return 2;
  }
  if (sodium_init() < 0) {
    std::cerr << "troupe bench group: libsodium failed to initialise\n";
    return 1;
  }
  auto want = [&](const char* w) { return o.only.empty() || o.only == w; };
  const int runs = o.quick ? 50 : 1000;
  std::vector<r255::point> points(256);
  std::vector<federated::ristretto::element> encoded(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    r255::bytes64 h;
    randombytes_buf(h.data(), h.size());
    points[i] = r255::from_uniform_bytes(h);
    encoded[i] = r255::encode(points[i]);
  }
  const federated::ristretto::scalar s = federated::ristretto::random_scalar();
  bool ok = true;
  std::uint8_t sink = 0;
  if (want("multiply")) {
    // Bytes in, bytes out (decode, product, encode), as PSI calls it; then the product alone.
    federated::ristretto::element q, ref;
    line(o, out, "multiply_bytes_sodium", "us", us_per_call(runs, [&](int i) {
      if (crypto_scalarmult_ristretto255(ref.data(), s.data(), encoded[i % 256].data()) != 0) ok = false;
      sink ^= ref[0];
    }), "us");
    line(o, out, "multiply_bytes_fast", "us", us_per_call(runs, [&](int i) {
      q = federated::ristretto::multiply(s, encoded[i % 256]);
      sink ^= q[0];
    }), "us");
    ok = ok && crypto_scalarmult_ristretto255(ref.data(), s.data(), encoded[0].data()) == 0 &&
         federated::ristretto::multiply(s, encoded[0]) == ref;
    bool canonical = false;
    const r255::scalar k = r255::scalar_from_canonical(s, canonical);
    ok = ok && canonical;
    line(o, out, "multiply_point_fast", "us", us_per_call(runs, [&](int i) {
      sink ^= static_cast<std::uint8_t>((k * points[i % 256]).X.limb[0]);
    }), "us");
    std::vector<federated::ristretto::element> many(encoded.begin(), encoded.end());
    line(o, out, "multiply_each_fast", "us_per_element", us_per_call(o.quick ? 1 : 8, [&](int) {
      sink ^= federated::ristretto::multiply_each(s, many)[0][0];
    }) / static_cast<double>(many.size()), "us");
  }
  if (want("base")) {
    federated::ristretto::element ref;
    bool canonical = false;
    const r255::scalar k = r255::scalar_from_canonical(s, canonical);
    line(o, out, "base_mul_sodium", "us", us_per_call(runs, [&](int) {
      if (crypto_scalarmult_ristretto255_base(ref.data(), s.data()) != 0) ok = false;
      sink ^= ref[0];
    }), "us");
    line(o, out, "base_mul_fast", "us", us_per_call(runs, [&](int) {
      sink ^= static_cast<std::uint8_t>(r255::base_mul(k).X.limb[0]);
    }), "us");
    ok = ok && crypto_scalarmult_ristretto255_base(ref.data(), s.data()) == 0 && r255::encode(r255::base_mul(k)) == ref;
  }
  if (want("hash")) {
    r255::bytes64 h{};
    federated::ristretto::element ref;
    line(o, out, "from_hash_sodium", "us", us_per_call(runs, [&](int i) {
      h[0] = static_cast<std::uint8_t>(i);
      crypto_core_ristretto255_from_hash(ref.data(), h.data());
      sink ^= ref[0];
    }), "us");
    line(o, out, "from_hash_fast", "us", us_per_call(runs, [&](int i) {
      h[0] = static_cast<std::uint8_t>(i);
      sink ^= r255::encode(r255::from_uniform_bytes(h))[0];
    }), "us");
    crypto_core_ristretto255_from_hash(ref.data(), h.data());
    ok = ok && r255::encode(r255::from_uniform_bytes(h)) == ref;
  }
  if (want("msm")) {
    std::vector<std::size_t> sizes{1000, 8000};
    if (!o.quick) sizes.push_back(79'510);
    std::vector<r255::scalar> scalars(sizes.back());
    std::vector<r255::point> msm_points(sizes.back());
    for (std::size_t i = 0; i < scalars.size(); ++i) {
      scalars[i] = r255::random_scalar();
      msm_points[i] = i < points.size() ? points[i] : msm_points[i - points.size()] + points[i % points.size()];
    }
    for (std::size_t n : sizes) {
      const std::span<const r255::scalar> sn(scalars.data(), n);
      const std::span<const r255::point> pn(msm_points.data(), n);
      r255::point result;
      const double us = us_per_call(1, [&](int) { result = r255::msm(sn, pn); });
      line(o, out, "msm_" + std::to_string(n), "us_per_point", us / static_cast<double>(n), "us");
      if (n == sizes.front()) {
        const double ref_us = us_per_call(1, [&](int) { ok = ok && result == r255::msm_reference(sn, pn); });
        line(o, out, "msm_reference_" + std::to_string(n), "us_per_point", ref_us / static_cast<double>(n), "us");
      }
    }
  }
  if (!ok) std::cerr << "troupe bench group: a result disagreed with its reference\n";
  benchmark_sink = sink;
  return ok ? 0 : 1;
}

}  // namespace troupe::bench
