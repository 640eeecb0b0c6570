#pragma once
// The troupe command's subcommands. Each adds itself to the app; its callback stores the
// process exit code in `rc`.

#include <CLI/CLI.hpp>

namespace troupe::cli {

void add_bench_command(CLI::App& app, int& rc);
void add_schedule_command(CLI::App& app, int& rc);
void add_partition_command(CLI::App& app, int& rc);
void add_train_command(CLI::App& app, int& rc);
void add_fedsim_command(CLI::App& app, int& rc);
void add_node_command(CLI::App& app, int& rc);

}  // namespace troupe::cli
