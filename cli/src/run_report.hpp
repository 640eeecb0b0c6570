#pragma once
// What `--report FILE.html` writes for troupe fedsim (its options and summary beside the charts
// filled as the run goes); troupe train and troupe bench build theirs from troupe/core/report.hpp
// directly.

#include <string>
#include <utility>
#include <vector>

#include <troupe/core/report.hpp>

namespace troupe::federated {
struct simulation_options;
}

namespace troupe::cli {

/// A fedsim run's options as (name, value) rows: those that shape the run, the defaults included.
std::vector<std::vector<std::string>> fedsim_option_rows(const troupe::federated::simulation_options& o);

/// Writes the report of a run: its options, its summary rows and its charts.
void write_run_report(const std::string& path, const std::string& title, const std::vector<std::vector<std::string>>& options,
                      const std::vector<std::vector<std::string>>& summary, const troupe::chart_book& charts);

}  // namespace troupe::cli
