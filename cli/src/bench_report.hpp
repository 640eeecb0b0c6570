#pragma once
// `troupe bench SUITE --report FILE.html [--anchor ROWS.jsonl]`: the suite's rows in one
// self-contained HTML page, each beside the anchor's row for the same workload when one is given
// (CAF's, PyTorch's, Flower's: any program that writes the same JSON rows).

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cli {

/// One JSON row of a benchmark: {"suite", "bench", "metric", "value", "unit", ...}; the other
/// fields ("state":"int8", "threads":2) say which variant of the workload it measured.
struct bench_row {
  std::string suite, bench, metric, unit;
  std::string variant;  ///< the other fields, "key=value" joined by ", " in the row's order
  double value = 0;
};

/// The rows of JSON Lines text (blank lines and lines that are not objects, such as a suite's
/// progress text, are skipped). Throws std::invalid_argument naming `source` and the line for an
/// object that is not valid JSON or lacks bench, metric or a numeric value.
std::vector<bench_row> parse_bench_rows(std::string_view text, const std::string& source);

/// Writes the report: a table of every row (with the anchor's value and the ratio where an
/// anchor row has the same bench, metric and variant) and a bar chart per metric and unit.
void write_bench_report(const std::string& path, const std::string& suite, const std::vector<bench_row>& rows,
                        const std::vector<std::pair<std::string, std::vector<bench_row>>>& anchors);

/// The rows as a plain table (what a suite run for a report prints when --json was not asked).
void print_bench_rows(std::ostream& out, const std::vector<bench_row>& rows);

}  // namespace troupe::cli
