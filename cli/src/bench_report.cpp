// The reports of troupe bench runs (see bench_report.hpp).

#include "bench_report.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>
#include <troupe/core/report.hpp>

namespace troupe::cli {

namespace {

std::string field_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

using row_key = std::tuple<std::string, std::string, std::string>;  // bench, metric, variant
row_key key_of(const bench_row& r) { return {r.bench, r.metric, r.variant}; }

std::string label_of(const bench_row& r) { return r.variant.empty() ? r.bench : r.bench + " (" + r.variant + ")"; }

}  // namespace

std::vector<bench_row> parse_bench_rows(std::string_view text, const std::string& source) {
  std::vector<bench_row> rows;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const auto end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] != '{') continue;  // progress text, blank lines
    const std::string at = source + " line " + std::to_string(line_no);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw std::invalid_argument(at + ": not a JSON object");
    bench_row r;
    bool has_value = false;
    for (const auto& [k, v] : j.items()) {
      if (k == "suite") {
        r.suite = field_text(v);
      } else if (k == "bench") {
        r.bench = field_text(v);
      } else if (k == "metric") {
        r.metric = field_text(v);
      } else if (k == "unit") {
        r.unit = field_text(v);
      } else if (k == "value") {
        if (!v.is_number()) throw std::invalid_argument(at + ": \"value\" is not a number");
        r.value = v.get<double>();
        has_value = true;
      } else {
        r.variant += (r.variant.empty() ? "" : ", ") + k + "=" + field_text(v);
      }
    }
    if (r.bench.empty() || r.metric.empty() || !has_value)
      throw std::invalid_argument(at + ": a benchmark row needs \"bench\", \"metric\" and a numeric \"value\"");
    rows.push_back(std::move(r));
  }
  return rows;
}

void write_bench_report(const std::string& path, const std::string& suite, const std::vector<bench_row>& rows,
                        const std::vector<std::pair<std::string, std::vector<bench_row>>>& anchors) {
  std::vector<std::map<row_key, double>> anchor_values;
  for (const auto& [name, anchor_rows] : anchors) {
    auto& m = anchor_values.emplace_back();
    for (const auto& r : anchor_rows) m[key_of(r)] = r.value;
  }
  troupe::report page("troupe bench " + suite);
  page.paragraph(std::to_string(rows.size()) + " rows" +
                 (anchors.empty() ? std::string(".") : ", each beside the anchors' row for the same workload where they have one; "
                                                       "the ratio is troupe's value over the anchor's (the unit says which way is better)."));
  std::vector<std::string> header = {"bench", "metric", "value", "unit"};
  for (const auto& [name, _] : anchors) {
    header.push_back(name);
    header.push_back("troupe / " + name);
  }
  std::vector<std::vector<std::string>> table;
  // One chart per metric and unit, its groups in the rows' order.
  std::map<std::pair<std::string, std::string>, troupe::bar_chart> charts;
  std::vector<std::pair<std::string, std::string>> chart_order;
  for (const auto& r : rows) {
    std::vector<std::string> cells = {label_of(r), r.metric, troupe::report_number(r.value), r.unit};
    std::vector<double> values = {r.value};
    for (const auto& m : anchor_values) {
      const auto it = m.find(key_of(r));
      if (it == m.end()) {
        cells.insert(cells.end(), {"", ""});
        values.push_back(NAN);
        continue;
      }
      cells.push_back(troupe::report_number(it->second));
      cells.push_back(it->second != 0 ? troupe::report_number(r.value / it->second) : "n/a");
      values.push_back(it->second);
    }
    table.push_back(std::move(cells));
    const std::pair<std::string, std::string> ck{r.metric, r.unit};
    auto [it, fresh] = charts.try_emplace(ck);
    if (fresh) {
      chart_order.push_back(ck);
      it->second.title = r.metric + (r.unit.empty() ? "" : " (" + r.unit + ")");
      it->second.value_label = r.unit;
      it->second.series = {"troupe"};
      for (const auto& [name, _] : anchors) it->second.series.push_back(name);
    }
    it->second.groups.push_back({label_of(r), std::move(values)});
  }
  page.heading("Rows");
  page.table(header, table);
  page.heading("Charts");
  for (const auto& ck : chart_order) page.svg(troupe::render_bar_svg(charts.at(ck)));
  page.write(path);
}

void print_bench_rows(std::ostream& out, const std::vector<bench_row>& rows) {
  std::size_t width = 5;
  for (const auto& r : rows) width = std::max(width, label_of(r).size() + 1 + r.metric.size());
  for (const auto& r : rows) {
    std::string name = label_of(r) + " " + r.metric;
    name.resize(width, ' ');
    out << name << "  " << troupe::report_number(r.value) << " " << r.unit << "\n";
  }
}

}  // namespace troupe::cli
