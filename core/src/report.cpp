// Self-contained HTML reports with inline SVG charts (see report.hpp).

#include "troupe/core/report.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <span>
#include <cstdio>
#include <stdexcept>

#include "troupe/core/file.hpp"

namespace troupe {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string report_number(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[40];
  std::snprintf(buf, sizeof buf, std::fabs(v) >= 1e4 ? "%.0f" : "%.4g", v);
  return buf;
}

namespace {

constexpr const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
std::string coord(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// Round-number ticks covering [lo, hi] (about five of them): steps of 1, 2 or 5 times a power of ten.
std::vector<double> ticks(double& lo, double& hi) {
  if (hi <= lo) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) {
      step = m * power;
      break;
    }
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  std::vector<double> t;
  for (double v = lo; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string svg_open(int width, int height, const std::string& title) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
         std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) +
         "\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\"><title>" + html_escape(title) +
         "</title><text x=\"" + std::to_string(width / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">" +
         html_escape(title) + "</text>";
}

/// Axes, ticks and labels of a plot area; returns the mappings through the out parameters.
struct frame {
  double x0, x1, y0, y1;       // data ranges
  double left, right, top, bottom;  // pixel box
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (right - left); }
  double py(double y) const { return bottom - (y - y0) / (y1 - y0) * (bottom - top); }
};

std::string axes(frame& f, const std::string& x_label, const std::string& y_label) {
  const auto xt = ticks(f.x0, f.x1), yt = ticks(f.y0, f.y1);
  std::string s = "<g stroke=\"#888\" stroke-width=\"1\"><line x1=\"" + coord(f.left) + "\" y1=\"" + coord(f.bottom) +
                  "\" x2=\"" + coord(f.right) + "\" y2=\"" + coord(f.bottom) + "\"/><line x1=\"" + coord(f.left) +
                  "\" y1=\"" + coord(f.top) + "\" x2=\"" + coord(f.left) + "\" y2=\"" + coord(f.bottom) + "\"/></g>";
  for (double v : xt)
    s += "<line x1=\"" + coord(f.px(v)) + "\" y1=\"" + coord(f.bottom) + "\" x2=\"" + coord(f.px(v)) + "\" y2=\"" +
         coord(f.bottom + 4) + "\" stroke=\"#888\"/><text x=\"" + coord(f.px(v)) + "\" y=\"" + coord(f.bottom + 16) +
         "\" text-anchor=\"middle\">" + number(v) + "</text>";
  for (double v : yt)
    s += "<line x1=\"" + coord(f.left) + "\" y1=\"" + coord(f.py(v)) + "\" x2=\"" + coord(f.right) + "\" y2=\"" +
         coord(f.py(v)) + "\" stroke=\"#eee\"/><text x=\"" + coord(f.left - 6) + "\" y=\"" + coord(f.py(v) + 4) +
         "\" text-anchor=\"end\">" + number(v) + "</text>";
  s += "<text x=\"" + coord((f.left + f.right) / 2) + "\" y=\"" + coord(f.bottom + 32) + "\" text-anchor=\"middle\">" +
       html_escape(x_label) + "</text>";
  s += "<text transform=\"translate(14 " + coord((f.top + f.bottom) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       html_escape(y_label) + "</text>";
  return s;
}

}  // namespace

std::string render_svg(const line_chart& c) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        x0 = std::min(x0, x), x1 = std::max(x1, x);
        y0 = std::min(y0, y), y1 = std::max(y1, y);
      }
  const int legend = static_cast<int>(c.series.size()) * 16;
  const int height = c.height + legend;
  std::string s = svg_open(c.width, height, c.title);
  if (!std::isfinite(x0)) {
    s += "<text x=\"" + std::to_string(c.width / 2) + "\" y=\"" + std::to_string(height / 2) +
         "\" text-anchor=\"middle\" fill=\"#888\">no finite values to draw</text></svg>";
    return s;
  }
  frame f{x0, x1, y0, y1, 72, static_cast<double>(c.width - 16), 32, static_cast<double>(c.height - 44)};
  s += axes(f, c.x_label, c.y_label);
  for (std::size_t k = 0; k < c.series.size(); ++k) {
    const auto& series = c.series[k];
    const char* colour = palette[k % std::size(palette)];
    std::string points;
    std::size_t drawn = 0;
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      points += (drawn++ ? " " : "") + coord(f.px(x)) + "," + coord(f.py(y));
    }
    s += "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"1.5\" points=\"" + points + "\"/>";
    if (drawn < 60)
      for (const auto& [x, y] : series.points)
        if (std::isfinite(x) && std::isfinite(y))
          s += "<circle cx=\"" + coord(f.px(x)) + "\" cy=\"" + coord(f.py(y)) + "\" r=\"2.5\" fill=\"" + colour + "\"/>";
    const int ly = c.height + static_cast<int>(k) * 16 + 4;
    s += "<rect x=\"72\" y=\"" + std::to_string(ly) + "\" width=\"12\" height=\"10\" fill=\"" + colour + "\"/><text x=\"90\" y=\"" +
         std::to_string(ly + 9) + "\">" + html_escape(series.name) + "</text>";
  }
  return s + "</svg>";
}

std::string render_histogram_svg(const std::string& title, const std::string& x_label, const std::vector<double>& values,
                                 double lo, double hi, int bins) {
  if (bins < 1 || !(hi > lo)) throw std::invalid_argument("render_histogram_svg: needs bins >= 1 and hi > lo");
  std::vector<double> count(static_cast<std::size_t>(bins), 0.0);
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    const int b = std::clamp(static_cast<int>(std::floor((v - lo) / (hi - lo) * bins)), 0, bins - 1);
    ++count[static_cast<std::size_t>(b)];
  }
  const int width = 720, height = 300;
  std::string s = svg_open(width, height, title);
  frame f{lo, hi, 0, std::max(1.0, *std::max_element(count.begin(), count.end())), 72, width - 16.0, 32, height - 44.0};
  s += axes(f, x_label, "count");
  for (int b = 0; b < bins; ++b) {
    const double a = lo + (hi - lo) * b / bins, z = lo + (hi - lo) * (b + 1) / bins;
    const double top = f.py(count[static_cast<std::size_t>(b)]);
    s += "<rect x=\"" + coord(f.px(a) + 0.5) + "\" y=\"" + coord(top) + "\" width=\"" + coord(std::max(0.0, f.px(z) - f.px(a) - 1)) +
         "\" height=\"" + coord(f.bottom - top) + "\" fill=\"" + palette[0] + "\"/>";
  }
  return s + "</svg>";
}

std::string render_bar_svg(const bar_chart& c) {
  const std::size_t n = c.series.size();
  double hi = 0;
  for (const auto& g : c.groups) {
    if (g.values.size() != n)
      throw std::invalid_argument("render_bar_svg: group '" + g.label + "' has " + std::to_string(g.values.size()) +
                                  " values for " + std::to_string(n) + " series");
    for (double v : g.values)
      if (std::isfinite(v) && v > hi) hi = v;
  }
  const int bar = 14, gap = 10, label_width = 240, top = 32;
  const int rows_height = static_cast<int>(c.groups.size()) * (static_cast<int>(n) * bar + gap);
  const int legend = static_cast<int>(n) * 16;
  const int height = top + rows_height + 40 + legend;
  std::string s = svg_open(c.width, height, c.title);
  if (hi <= 0) {
    s += "<text x=\"" + std::to_string(c.width / 2) + "\" y=\"" + std::to_string(height / 2) +
         "\" text-anchor=\"middle\" fill=\"#888\">no positive values to draw</text></svg>";
    return s;
  }
  double lo = 0;
  const auto t = ticks(lo, hi);
  frame f{0, hi, 0, 1, static_cast<double>(label_width), static_cast<double>(c.width - 70), static_cast<double>(top),
          static_cast<double>(top + rows_height)};
  for (double v : t)
    s += "<line x1=\"" + coord(f.px(v)) + "\" y1=\"" + coord(f.top) + "\" x2=\"" + coord(f.px(v)) + "\" y2=\"" +
         coord(f.bottom) + "\" stroke=\"#eee\"/><text x=\"" + coord(f.px(v)) + "\" y=\"" + coord(f.bottom + 16) +
         "\" text-anchor=\"middle\">" + number(v) + "</text>";
  s += "<text x=\"" + coord((f.left + f.right) / 2) + "\" y=\"" + coord(f.bottom + 32) + "\" text-anchor=\"middle\">" +
       html_escape(c.value_label) + "</text>";
  int y = top;
  for (const auto& g : c.groups) {
    s += "<text x=\"" + std::to_string(label_width - 8) + "\" y=\"" + std::to_string(y + static_cast<int>(n) * bar / 2 + 4) +
         "\" text-anchor=\"end\">" + html_escape(g.label) + "</text>";
    for (std::size_t k = 0; k < n; ++k, y += bar) {
      const double v = g.values[k];
      if (!std::isfinite(v) || v < 0) continue;
      s += "<rect x=\"" + coord(f.left) + "\" y=\"" + std::to_string(y + 1) + "\" width=\"" + coord(f.px(v) - f.left) +
           "\" height=\"" + std::to_string(bar - 2) + "\" fill=\"" + palette[k % std::size(palette)] + "\"/><text x=\"" +
           coord(f.px(v) + 4) + "\" y=\"" + std::to_string(y + bar - 3) + "\" font-size=\"10\">" + report_number(v) + "</text>";
    }
    y += gap;
  }
  s += "<line x1=\"" + coord(f.left) + "\" y1=\"" + coord(f.top) + "\" x2=\"" + coord(f.left) + "\" y2=\"" +
       coord(f.bottom) + "\" stroke=\"#888\"/>";
  for (std::size_t k = 0; k < n; ++k) {
    const int ly = top + rows_height + 40 + static_cast<int>(k) * 16;
    s += "<rect x=\"" + std::to_string(label_width) + "\" y=\"" + std::to_string(ly) + "\" width=\"12\" height=\"10\" fill=\"" +
         palette[k % std::size(palette)] + "\"/><text x=\"" + std::to_string(label_width + 18) + "\" y=\"" + std::to_string(ly + 9) +
         "\">" + html_escape(c.series[k]) + "</text>";
  }
  return s + "</svg>";
}

report::report(std::string title) : title_(std::move(title)) {}

void report::heading(std::string_view text) { body_ += "<h2>" + html_escape(text) + "</h2>\n"; }
void report::paragraph(std::string_view text) { body_ += "<p>" + html_escape(text) + "</p>\n"; }

void report::table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  body_ += "<table><tr>";
  for (const auto& h : header) body_ += "<th>" + html_escape(h) + "</th>";
  body_ += "</tr>\n";
  for (const auto& row : rows) {
    body_ += "<tr>";
    for (const auto& cell : row) body_ += "<td>" + html_escape(cell) + "</td>";
    body_ += "</tr>\n";
  }
  body_ += "</table>\n";
}

void report::chart(const line_chart& chart) { body_ += "<figure>" + render_svg(chart) + "</figure>\n"; }

namespace {
/// True when `lower` holds an event-handler attribute (whitespace, "on", letters, '=').
bool has_event_handler(const std::string& lower) {
  for (std::size_t i = 0; i + 3 < lower.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(lower[i])) || lower.compare(i + 1, 2, "on") != 0) continue;
    std::size_t j = i + 3;
    while (j < lower.size() && std::isalpha(static_cast<unsigned char>(lower[j]))) ++j;
    while (j < lower.size() && std::isspace(static_cast<unsigned char>(lower[j]))) ++j;
    if (j > i + 3 && j < lower.size() && lower[j] == '=') return true;
  }
  return false;
}
}  // namespace

void report::svg(std::string_view element) {
  if (element.rfind("<?xml", 0) == 0) {  // a standalone file's declaration has no place in a page
    const auto end = element.find("?>");
    element.remove_prefix(end == std::string_view::npos ? element.size() : end + 2);
  }
  while (!element.empty() && std::isspace(static_cast<unsigned char>(element.front()))) element.remove_prefix(1);
  std::string lower(element);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.rfind("<svg", 0) != 0 || lower.find("<script") != std::string::npos ||
      lower.find("javascript:") != std::string::npos || has_event_handler(lower))
    throw std::invalid_argument("report::svg: not an <svg> element free of script");
  body_ += "<figure>" + std::string(element) + "</figure>\n";
}

std::string report::html() const {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + html_escape(title_) +
         "</title><style>body{font-family:sans-serif;max-width:64em;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
         "th{background:#f4f4f4}figure{margin:1em 0}</style></head><body><h1>" +
         html_escape(title_) + "</h1>\n" + body_ + "</body></html>\n";
}

void report::write(const std::string& path) const {
  const std::string page = html();
  write_file_atomically(path, std::as_bytes(std::span<const char>(page.data(), page.size())));
}

void chart_book::add(const std::string& chart, const std::string& series, double x, double y, const std::string& x_label,
                     const std::string& y_label) {
  auto c = std::find_if(charts_.begin(), charts_.end(), [&](const line_chart& l) { return l.title == chart; });
  if (c == charts_.end()) {
    charts_.push_back({chart, x_label, y_label, {}});
    c = charts_.end() - 1;
  }
  auto s = std::find_if(c->series.begin(), c->series.end(), [&](const chart_series& e) { return e.name == series; });
  if (s == c->series.end()) {
    c->series.push_back({series, {}});
    s = c->series.end() - 1;
  }
  s->points.emplace_back(x, y);
}

void chart_book::add_to(report& r) const {
  for (const auto& c : charts_) r.chart(c);
}

void check_report_path(const std::string& path) {
  try {
    check_writable(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("--report " + path + ": " + e.what());
  }
}

}  // namespace troupe
