#pragma once
/// @file
/// Reports people read after a run: one self-contained HTML file (inline SVG charts, no script,
/// no external resource), what `--report FILE.html` writes for `troupe fedsim`, `troupe train`
/// and `troupe bench`.
///
///   report r("troupe fedsim");
///   r.table({"option", "value"}, {{"clients", "100"}});
///   r.chart({"test accuracy per round", "round", "accuracy", {{"FedAvg", {{1, 0.5}, {2, 0.6}}}}});
///   r.write("run.html");
///
/// Every text that goes into the page (titles, names, cells) is escaped, so a hostile name shows
/// as text and runs nothing.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

/// "&lt;img&gt;" for "<img>": &, <, >, " and ' escaped for HTML text and attribute values.
std::string html_escape(std::string_view text);

/// A number for a report's table: four significant digits, whole numbers from 10,000 up ("0.8607",
/// "4.312", "18550"), "n/a" when not finite.
std::string report_number(double v);

/// One line of a chart: its points in the order drawn. Non-finite points are left out.
struct chart_series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

struct line_chart {
  std::string title, x_label, y_label;
  std::vector<chart_series> series;
  int width = 720, height = 320;
};

/// The chart as an SVG element: axes with round-number ticks, one polyline per series (each
/// series its own colour and a legend entry), the points of a series with fewer than 60 points
/// marked. A chart with no finite point says so instead of drawing axes.
std::string render_svg(const line_chart& chart);

/// A histogram of `values` in `bins` equal bins over [lo, hi] as an SVG element (values outside
/// are counted in the first or last bin).
std::string render_histogram_svg(const std::string& title, const std::string& x_label, const std::vector<double>& values,
                                 double lo, double hi, int bins = 20);

/// A bar chart: horizontal bars, one row of bars per group, one bar per series in the series'
/// colours, on a common linear scale from zero; each bar labelled with its value. A value that is
/// not finite or is negative draws no bar.
struct bar_group {
  std::string label;
  std::vector<double> values;  ///< one per series
};
struct bar_chart {
  std::string title, value_label;
  std::vector<std::string> series;
  std::vector<bar_group> groups;
  int width = 720;
};
/// Throws std::invalid_argument when a group has not one value per series.
std::string render_bar_svg(const bar_chart& chart);

class report {
public:
  explicit report(std::string title);
  void heading(std::string_view text);
  void paragraph(std::string_view text);
  /// A table; cells are text (escaped).
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
  void chart(const line_chart& chart);
  /// SVG this program made (a schedule drawing, render_histogram_svg): inserted as it is (less a
  /// leading XML declaration), after a check that it is an <svg> element without script.
  void svg(std::string_view element);
  std::string html() const;
  /// Writes html() to `path` atomically; throws std::runtime_error naming the file when it cannot.
  void write(const std::string& path) const;

private:
  std::string title_, body_;
};

/// Charts filled point by point as a run goes: one per title, in the order of their first point,
/// each with its series in the order of their first point.
class chart_book {
public:
  void add(const std::string& chart, const std::string& series, double x, double y, const std::string& x_label,
           const std::string& y_label);
  /// Every chart into `r`, in order.
  void add_to(report& r) const;
  const std::vector<line_chart>& charts() const noexcept { return charts_; }

private:
  std::vector<line_chart> charts_;
};

/// Throws std::runtime_error, naming `path`, when a report could not be written there (a missing
/// directory, no permission): checked before a run rather than after it.
void check_report_path(const std::string& path);

}  // namespace troupe
