#pragma once
// The troupe command's subcommands. Each adds itself to the app; its callback stores the
// process exit code in `rc`.

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/core/log.hpp"

namespace troupe::cli {

/// A number > 0 and finite (CLI::PositiveNumber's message prints the largest double).
inline const CLI::Validator positive_number(
    [](std::string& text) {
      double v = 0;
      return CLI::detail::lexical_cast(text, v) && v > 0 && std::isfinite(v) ? std::string()
                                                                              : "must be a positive number, not " + text;
    },
    "POSITIVE");

/// A number strictly between 0 and 1.
inline const CLI::Validator open_unit_interval(
    [](std::string& text) {
      double v = 0;
      return CLI::detail::lexical_cast(text, v) && v > 0 && v < 1 ? std::string()
                                                                  : "must be above 0 and below 1, not " + text;
    },
    "(0, 1)");

/// A number for a JSON line: printf's `format` ("%.4f") for a finite value, null otherwise (JSON
/// has no inf or NaN: a privacy bound can be infinite, a diverged loss NaN).
inline std::string json_number(double v, const char* format) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// For a command whose output is its report (`status`, `bench remote`): the runtime's info
/// logs (connections opened and closed, nodes joining) go unless TROUPE_LOG_LEVEL asks for them.
inline void quiet_info_logs() {
  if (const char* level = std::getenv("TROUPE_LOG_LEVEL"); level == nullptr || *level == 0)
    troupe::log().set_level(spdlog::level::warn);
}

void add_bench_command(CLI::App& app, int& rc);
void add_schedule_command(CLI::App& app, int& rc);
void add_partition_command(CLI::App& app, int& rc);
void add_train_command(CLI::App& app, int& rc);
void add_fedsim_command(CLI::App& app, int& rc);
void add_node_command(CLI::App& app, int& rc);
void add_attest_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_generate_command(CLI::App& app, int& rc);
}  // namespace troupe::cli

#include "troupe/kernels/lm.hpp"

namespace troupe {
class dashboard;
}

namespace troupe::cli {
class timeline_view;
/// `troupe train --model gpt:...` (train_lm_command.cpp): in this thread, or with `engine` (a
/// pipeline's) when set; returns the exit code. `board` (may be null) shows the losses and
/// tokens/s; `view` (may be null) the pipeline's measured steps, also in the final summary.
int run_lm_train(const troupe::kernels::lm_options& o, bool json, const troupe::kernels::lm_engine_factory& engine = {},
                 troupe::dashboard* board = nullptr, timeline_view* view = nullptr);
void add_zkbench_command(CLI::App& app, int& rc);
}  // namespace troupe::cli

namespace troupe::federated {
struct simulation_options;
}

namespace troupe::cli {
/// `troupe fedsim --client-models ...` (fedsim_heterogeneous.cpp); returns the exit code.
/// With `report` not empty, also writes the HTML report there.
int run_fedsim_heterogeneous(const troupe::federated::simulation_options& o, bool json, const std::string& report);

}  // namespace troupe::cli
