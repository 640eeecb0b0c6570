// SecAgg+ against plain rounds in one process: two simulations of the same configuration (100
// clients, all sampled every round, IID, the default MLP), their rounds alternated A B B A ... so
// that a change in the machine's load falls on both alike. Prints the medians of the per-round
// wall and CPU times and their ratios (the bar: a SecAgg+ round <= 1.5x a plain one).
//
//   build/bin/secagg_round_bench [pairs (12)] [clients (100)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/federated/simulation.hpp>

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int whole(const char* text, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end || v < 1 || v > 100000) throw std::invalid_argument(std::string(what) + " must be a whole number >= 1, got '" + text + "'");
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace troupe::federated;
  const int pairs = argc > 1 ? whole(argv[1], "pairs") : 12;
  simulation_options o;
  o.clients = argc > 2 ? static_cast<std::size_t>(whole(argv[2], "clients")) : 100;
  o.per_round = o.clients;
  o.partition = "iid";
  o.rounds = 2 * pairs + 2;
  o.eval_every = o.rounds;
  simulation plain(o);
  o.secagg = true;
  simulation secure(o);
  plain.run_round();  // warm-up: first-touch of buffers, OpenSSL contexts
  secure.run_round();
  std::vector<double> wall[2], cpu[2], wall_ratio, cpu_ratio;
  for (int i = 0; i < pairs; ++i) {
    double w[2], c[2];
    for (int k = 0; k < 2; ++k) {
      const int which = (i % 2 == 0) ? k : 1 - k;  // 0: plain, 1: SecAgg+
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      (which ? secure : plain).run_round();
      w[which] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      c[which] = cpu_seconds() - c0;
    }
    for (int k = 0; k < 2; ++k) {
      wall[k].push_back(w[k]);
      cpu[k].push_back(c[k]);
    }
    wall_ratio.push_back(w[1] / w[0]);
    cpu_ratio.push_back(c[1] / c[0]);
  }
  std::printf("{\"bench\":\"secagg_round\",\"clients\":%zu,\"pairs\":%d,\"plain_wall_s\":%.4f,\"plain_cpu_s\":%.4f,"
              "\"secagg_wall_s\":%.4f,\"secagg_cpu_s\":%.4f,\"wall_ratio\":%.3f,\"cpu_ratio\":%.3f,"
              "\"median_pair_wall_ratio\":%.3f,\"median_pair_cpu_ratio\":%.3f}\n",
              o.clients, pairs, median(wall[0]), median(cpu[0]), median(wall[1]), median(cpu[1]),
              median(wall[1]) / median(wall[0]), median(cpu[1]) / median(cpu[0]), median(wall_ratio), median(cpu_ratio));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "secagg_round_bench: %s\n", e.what());
  return 1;
}
