#include <iostream>
#include <memory>
#include <string>

#include "actors_bench.hpp"
#include "nn_bench.hpp"
#include "commands.hpp"

namespace troupe::cli {

void add_bench_command(CLI::App& app, int& rc) {
  auto* bench = app.add_subcommand("bench", "run a benchmark suite");
  bench->require_subcommand(1);
  auto opts = std::make_shared<troupe::bench::options>();
  auto* actors = bench->add_subcommand("actors", "the actor runtime: latency, throughput, memory");
  actors->add_flag("--json", opts->json, "one JSON object per line");
  actors->add_flag("--quick", opts->quick, "smaller sizes (for CI)");
  std::string only_help = "run one workload:";
  for (auto* n = troupe::bench::actor_bench_names(); *n; ++n) only_help += std::string(" ") + *n;
  actors->add_option("--only", opts->only, only_help);
  actors->add_option("--threads", opts->threads, "worker threads (default: hardware threads)");
  actors->callback([opts, &rc] { rc = troupe::bench::run_actors(*opts, std::cout); });

  auto nn_opts = std::make_shared<troupe::bench::options>();
  auto* nn = bench->add_subcommand("nn", "GEMM at the default MLP's shapes, and its training throughput");
  nn->add_flag("--json", nn_opts->json, "one JSON object per line");
  nn->add_flag("--quick", nn_opts->quick, "shorter timings (for CI)");
  nn->add_option("--only", nn_opts->only, "gemm, train, or one GEMM shape");
  nn->callback([nn_opts, &rc] { rc = troupe::bench::run_nn(*nn_opts, std::cout); });
}

}  // namespace troupe::cli
