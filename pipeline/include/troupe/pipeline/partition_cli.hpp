#pragma once
/// @file
/// `troupe partition`: cut layer costs into balanced pipeline stages from the command line.
///
///     troupe partition --costs c1,c2,... --stages S [--memory m1,m2,... [--memory-limit X]] [--json]
///
/// The command line front end fills a `partition_cli_options` (every list and number as the
/// text the user typed, so that all checks and messages live here) and calls
/// `run_partition_command`. With CLI11, for example:
///
///     troupe::pipeline::partition_cli_options popts;
///     auto* part = app.add_subcommand("partition", "cut layer costs into balanced stages");
///     part->add_option("--costs", popts.costs, "c1,c2,...: cost of every layer")->required();
///     part->add_option("--stages", popts.stages, "number of stages")->required();
///     part->add_option("--memory", popts.memory, "m1,m2,...: memory of every layer");
///     part->add_option("--memory-limit", popts.memory_limit, "most memory one stage may hold");
///     part->add_flag("--json", popts.json, "one JSON object");
///     part->callback([&] { rc = troupe::pipeline::run_partition_command(popts, std::cout, std::cerr); });

#include <cstddef>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <troupe/pipeline/partition.hpp>

namespace troupe::pipeline {

/// The options of `troupe partition`, as typed on the command line.
struct partition_cli_options {
  std::string costs;         ///< --costs: comma-separated, finite, non-negative cost per layer
  std::size_t stages = 0;    ///< --stages: number of stages, 1 to the number of layers
  std::string memory;        ///< --memory: comma-separated memory per layer; empty when not given
  std::string memory_limit;  ///< --memory-limit: one number; empty when not given (needs --memory)
  bool json = false;         ///< --json: print one JSON object instead of a table
  std::string profile;       ///< --profile MODEL: measure the layers of MODEL instead of --costs
  std::int64_t batch = 64;   ///< --batch: rows per profiled batch
  int repeats = 20;          ///< --repeats: timed runs per layer (the median counts)
};

/// Parses a comma-separated list of finite, non-negative numbers ("1,2.5,3e2"); spaces around
/// an item are allowed. `option` names the list in messages (for example "--costs").
/// @throws std::invalid_argument for an empty list, an empty item, something that is not a
///         number, or a negative or non-finite number; the message names the item.
std::vector<double> parse_number_list(std::string_view text, std::string_view option);

/// One JSON object, on one line, without a trailing newline:
/// `{"stages":S,"boundaries":[0,...,L],"stage_costs":[...],"max_cost":X}`, followed by
/// `,"stage_memory":[...]` before the closing brace when the partition has stage memory.
/// Numbers use the shortest text that reads back as the same double ("6", not "6.000000").
std::string partition_to_json(const partition& p);

/// Runs `troupe partition`: parses and checks `opts`, cuts with `partition_balanced`, and
/// writes the result to `out` (a table, or with `json` the object of `partition_to_json` and a
/// newline). On bad input writes "troupe partition: <what to change>" to `err`, writes nothing
/// to `out`, and returns 1; returns 0 on success.
int run_partition_command(const partition_cli_options& opts, std::ostream& out, std::ostream& err);

}  // namespace troupe::pipeline
