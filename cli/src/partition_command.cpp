#include <iostream>
#include <memory>

#include <troupe/pipeline/partition_cli.hpp>
#include <troupe/pipeline/profile.hpp>

#include "commands.hpp"

namespace troupe::cli {

void add_partition_command(CLI::App& app, int& rc) {
  auto opts = std::make_shared<troupe::pipeline::partition_cli_options>();
  auto* part = app.add_subcommand("partition", "cut layer costs into balanced pipeline stages");
  part->add_option("--costs", opts->costs, "c1,c2,...: the cost of every layer");
  auto* profile =
      part->add_option("--profile", opts->profile, "measure the layers of a model (mlp:784-256-128-10) for the costs");
  part->add_option("--batch", opts->batch, "rows per profiled batch")
      ->capture_default_str()
      ->check(positive_number)
      ->needs(profile);
  part->add_option("--repeats", opts->repeats, "timed runs per profiled layer")
      ->capture_default_str()
      ->check(CLI::Range(1, pipeline::max_profile_repeats))
      ->needs(profile);
  part->add_option("--stages", opts->stages, "the number of stages")->required();
  part->add_option("--memory", opts->memory, "m1,m2,...: the memory of every layer");
  part->add_option("--memory-limit", opts->memory_limit, "the most memory one stage may hold");
  part->add_flag("--json", opts->json, "one JSON object");
  part->callback([opts, &rc] {
    rc = troupe::pipeline::run_partition_command(*opts, std::cout, std::cerr);
  });
}

}  // namespace troupe::cli
