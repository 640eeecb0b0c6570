// The troupe command: one binary, one subcommand per capability.

#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "actors_bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: a Ray-style actor framework in C++"};
  app.require_subcommand(1);

  auto* bench = app.add_subcommand("bench", "run a benchmark suite");
  bench->require_subcommand(1);
  troupe::bench::options opts;
  auto* actors = bench->add_subcommand("actors", "the actor runtime: latency, throughput, memory");
  actors->add_flag("--json", opts.json, "one JSON object per line");
  actors->add_flag("--quick", opts.quick, "smaller sizes (for CI)");
  std::string only_help = "run one workload:";
  for (auto* n = troupe::bench::actor_bench_names(); *n; ++n) only_help += std::string(" ") + *n;
  actors->add_option("--only", opts.only, only_help);
  actors->add_option("--threads", opts.threads, "worker threads (default: hardware threads)");
  int rc = 0;
  actors->callback([&] { rc = troupe::bench::run_actors(opts, std::cout); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}
