// The troupe command: one binary, one subcommand per capability.

#include <CLI/CLI.hpp>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"troupe: a Ray-style actor framework in C++"};
  app.require_subcommand(1);
  int rc = 0;
  troupe::cli::add_bench_command(app, rc);
  troupe::cli::add_schedule_command(app, rc);
  troupe::cli::add_partition_command(app, rc);
  troupe::cli::add_train_command(app, rc);
  troupe::cli::add_fedsim_command(app, rc);
  troupe::cli::add_node_command(app, rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}
