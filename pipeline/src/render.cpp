// The pictures of a schedule. All three drawings read the simulator's timeline; none of them
// re-derives timing. The ASCII grid stays exact: its cell is the greatest rational dividing every
// time on the timeline, so an action always covers whole cells unless the picture had to be
// scaled down to fit a terminal.

#include "troupe/pipeline/render.hpp"

#include "troupe/core/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace troupe::pipeline {
namespace {

__extension__ using wide = __int128;  // products of two 64-bit terms

// ---- shared helpers -------------------------------------------------------------------------

char letter(op k) {
  switch (k) {
    case op::F: return 'F';
    case op::B: return 'B';
    case op::I: return 'I';
    case op::W: return 'W';
    case op::recompute: return 'R';
    default: return '?';
  }
}

const char* kind_name(op k) {
  switch (k) {
    case op::F: return "forward";
    case op::B: return "backward";
    case op::I: return "backward for inputs";
    case op::W: return "backward for weights";
    case op::recompute: return "recompute";
    default: return "communication";
  }
}

constexpr op drawn_kinds[] = {op::F, op::B, op::I, op::W, op::recompute};

int digits(int n) {
  int d = 1;
  while (n >= 10) n /= 10, ++d;
  return d;
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * x);
  return buf;
}

// A number for SVG or JSON: fixed point, at most `decimals` digits, no trailing zeros.
std::string number(double x, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string summary(const schedule& s, const simulation& sim) {
  return s.name + ": p=" + std::to_string(s.place.ranks) + " m=" + std::to_string(s.microbatches) +
         " v=" + std::to_string(s.place.stages_per_rank) + ", makespan " + sim.makespan.str() +
         ", bubble " + percent(sim.bubble) + ", bubble_span " + percent(sim.bubble_span);
}

// The compute actions of one rank, in time order (the simulator lists them in execution order,
// and a rank runs one action at a time).
std::vector<const timed_action*> compute_actions(const std::vector<timed_action>& row) {
  std::vector<const timed_action*> out;
  for (const auto& t : row)
    if (is_compute(t.what.kind)) out.push_back(&t);
  return out;
}

// ---- ascii --------------------------------------------------------------------------------

// The greatest rational dividing both (for non-negative a, b): gcd of the numerators over the
// lcm of the denominators. nullopt when the lcm leaves 64 bits.
std::optional<rational> rational_gcd(rational a, rational b) {
  const std::int64_t num = std::gcd(a.num(), b.num());
  const wide den = static_cast<wide>(a.den() / std::gcd(a.den(), b.den())) * b.den();
  if (den > static_cast<wide>(INT64_MAX / 4)) return std::nullopt;
  return rational(num, static_cast<std::int64_t>(den));
}

// ceil(a / b) for a >= 0, b > 0, as a cell count (in 128 bits: a tiny b gives a huge count).
wide ceil_div(rational a, rational b) {
  const wide n = static_cast<wide>(a.num()) * b.den();
  const wide d = static_cast<wide>(a.den()) * b.num();
  return (n + d - 1) / d;
}

// b - a as a long double, through 128-bit integers: the difference of two exact times can
// leave 64-bit fractions even when both fit (costs like 1/1000000007 and 1/1000000009).
long double difference(rational a, rational b) {
  const wide num = static_cast<wide>(b.num()) * a.den() - static_cast<wide>(a.num()) * b.den();
  const wide den = static_cast<wide>(a.den()) * b.den();
  return static_cast<long double>(num) / static_cast<long double>(den);
}

// The smallest k x 10^e (k = 1..9) that cuts `makespan` (> 0) into at most max_cells cells: a
// cell width a reader can use.
rational round_unit(rational makespan, std::int64_t max_cells) {
  int e = static_cast<int>(std::floor(std::log10(makespan.to_double() / static_cast<double>(max_cells)))) - 1;
  e = std::clamp(e, -15, 15);
  for (;; ++e) {
    std::int64_t power = 1;
    for (int i = 0; i < (e < 0 ? -e : e); ++i) power *= 10;
    const rational base = e < 0 ? rational(1, power) : rational(power);
    for (int k = 1; k <= 9; ++k)
      if (ceil_div(makespan, rational(k) * base) <= max_cells) return rational(k) * base;
  }
}

const char* ansi_colour(op k, bool odd_chunk) {
  switch (k) {
    case op::F: return odd_chunk ? "\x1b[30;104m" : "\x1b[97;44m";
    case op::B:
    case op::I: return odd_chunk ? "\x1b[30;102m" : "\x1b[30;42m";
    case op::W: return odd_chunk ? "\x1b[30;103m" : "\x1b[30;43m";
    default: return odd_chunk ? "\x1b[97;100m" : "\x1b[30;47m";
  }
}
constexpr const char* ansi_reset = "\x1b[0m";

std::string render_ascii(const schedule& s, const simulation& sim, const render_options& o) {
  const int p = s.place.ranks, v = s.place.stages_per_rank;
  const int width = 1 + digits(std::max(0, s.microbatches - 1));  // characters per cell
  const std::int64_t max_cells = std::max(1, o.max_columns / width);

  std::vector<std::vector<const timed_action*>> rows(p);
  std::optional<rational> exact = sim.makespan;
  bool kinds_present[std::size(drawn_kinds)] = {};
  for (int r = 0; r < p; ++r) {
    rows[r] = compute_actions(sim.timeline[r]);
    for (const auto* t : rows[r]) {
      for (std::size_t k = 0; k < std::size(drawn_kinds); ++k)
        if (drawn_kinds[k] == t->what.kind && t->end > t->start) kinds_present[k] = true;
      if (exact) exact = rational_gcd(*exact, t->start);
      if (exact) exact = rational_gcd(*exact, t->end);
    }
  }

  // The cell: the exact grid when it fits, else a round number (k x 10^e) of time units.
  rational unit(1);
  std::int64_t cells = 0;
  bool scaled = false;
  if (sim.makespan > rational(0)) {
    if (exact && ceil_div(sim.makespan, *exact) <= max_cells) {
      unit = *exact;
    } else {
      unit = round_unit(sim.makespan, max_cells);
      scaled = true;
    }
    cells = static_cast<std::int64_t>(ceil_div(sim.makespan, unit));
  }

  std::string out = summary(s, sim) + "\n";
  const std::string unit_text =
      "one cell = " + unit.str() + (unit > rational(1) ? " time units" : " time unit");
  if (scaled)
    out += unit_text + " (scaled down to fit " + std::to_string(o.max_columns) +
           " columns; actions shorter than a cell may not show)\n";
  else
    out += unit_text + "\n";

  const int label_width = digits(std::max(0, p - 1));
  for (int r = 0; r < p; ++r) {
    std::string rank = std::to_string(r);
    out += "rank " + std::string(static_cast<std::size_t>(label_width) - rank.size(), ' ') + rank + " |";
    const auto& row = rows[r];
    std::size_t first = 0;
    const timed_action* previous = nullptr;
    int run_cells = 0;  // cells of `previous` drawn after its first
    bool open = false;  // a coloured run is open
    for (std::int64_t c = 0; c < cells; ++c) {
      const rational from = unit * rational(c), to = unit * rational(c + 1);
      while (first < row.size() && row[first]->end <= from) ++first;
      // The action that covers most of the cell; the earliest on a tie.
      const timed_action* best = nullptr;
      std::size_t best_index = 0;
      long double best_overlap = 0;
      for (std::size_t i = first; i < row.size() && row[i]->start < to; ++i) {
        const long double overlap = difference(std::max(row[i]->start, from), std::min(row[i]->end, to));
        if (overlap > best_overlap) best = row[i], best_index = i, best_overlap = overlap;
      }
      if (best != previous && open) {
        out += ansi_reset;
        open = false;
      }
      auto label_of = [&](const timed_action& t) {
        const bool odd = s.place.chunk_of(t.what.stage) % 2 == 1;
        char l = letter(t.what.kind);
        if (odd) l = static_cast<char>(l - 'A' + 'a');
        std::string label = l + std::to_string(t.what.microbatch);
        label.resize(static_cast<std::size_t>(width), ' ');
        return label;
      };
      if (!best) {
        out.append(static_cast<std::size_t>(width), '.');
        run_cells = 0;
      } else if (best == previous) {
        // An overlapped pair (OVERLAP_F_B) shows its second action in its second cell.
        if (++run_cells == 1 && best->what.overlapped && best_index + 1 < row.size())
          out += label_of(*row[best_index + 1]);
        else
          out.append(static_cast<std::size_t>(width), ' ');
      } else {
        const bool odd = s.place.chunk_of(best->what.stage) % 2 == 1;
        if (o.color) {
          out += ansi_colour(best->what.kind, odd);
          open = true;
        }
        out += label_of(*best);
        run_cells = 0;
      }
      previous = best;
    }
    if (open) out += ansi_reset;
    out += "|\n";
  }

  out += "legend:";
  bool first_entry = true;
  for (std::size_t k = 0; k < std::size(drawn_kinds); ++k) {
    if (!kinds_present[k]) continue;
    out += first_entry ? " " : ", ";
    first_entry = false;
    const op kind = drawn_kinds[k];
    if (o.color)
      out += std::string(ansi_colour(kind, false)) + letter(kind) + ansi_reset;
    else
      out += letter(kind);
    out += std::string(" ") + kind_name(kind);
  }
  out += first_entry ? " . idle" : ", . idle";
  if (v > 1) {
    out += "; lower case";
    out += o.color ? " and a lighter shade: " : ": ";
    out += v == 2 ? "the rank's second stage (chunk 1)" : "odd chunks (the rank's 2nd, 4th, ... stage)";
  }
  out += "\n";
  return out;
}

// ---- svg ----------------------------------------------------------------------------------

struct rgb {
  int r, g, b;
};

// Per kind, the shade of the rank's first chunk and of its last; chunks between are blended.
std::pair<rgb, rgb> palette(op k) {
  switch (k) {
    case op::F: return {{0xa8, 0xc8, 0xf0}, {0x5a, 0x8a, 0xd6}};
    case op::B: return {{0xb4, 0xe0, 0xa8}, {0x6c, 0xb8, 0x60}};
    case op::I: return {{0xa8, 0xe0, 0xcf}, {0x52, 0xb5, 0x96}};
    case op::W: return {{0xf8, 0xe0, 0x8e}, {0xe5, 0xb5, 0x2e}};
    default: return {{0xdd, 0xdd, 0xdd}, {0xa8, 0xa8, 0xa8}};
  }
}

std::string fill_of(op k, int chunk, int v) {
  const auto [light, dark] = palette(k);
  const double t = v > 1 ? static_cast<double>(chunk) / (v - 1) : 0.0;
  auto mix = [t](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix(light.r, dark.r), mix(light.g, dark.g),
                mix(light.b, dark.b));
  return buf;
}

// A tick step of 1, 2 or 5 times a power of ten giving at most about ten ticks.
double tick_step(double span) {
  if (span <= 0) return 1;
  const double raw = span / 10;
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * base >= raw) return f * base;
  return 10 * base;
}

std::string render_svg(const schedule& s, const simulation& sim, const render_options& o) {
  const int p = s.place.ranks, v = s.place.stages_per_rank;
  constexpr double left = 80, right = 24, top = 60, row_h = 30, full_box_h = 24;
  constexpr double target_box = 28;  // pixels for the shortest action
  constexpr double min_width = 480, max_width = 2400;

  rational shortest(0);
  bool kinds_present[std::size(drawn_kinds)] = {};
  for (const auto& row : sim.timeline)
    for (const auto& t : row) {
      if (!is_compute(t.what.kind)) continue;
      for (std::size_t k = 0; k < std::size(drawn_kinds); ++k)
        if (drawn_kinds[k] == t.what.kind) kinds_present[k] = true;
      const rational d = t.end - t.start;
      if (d > rational(0) && (shortest == rational(0) || d < shortest)) shortest = d;
    }
  const double span = sim.makespan.to_double();
  double plot = min_width;
  if (span > 0 && shortest > rational(0))
    plot = std::clamp(span / shortest.to_double() * target_box, min_width, max_width);
  const double scale = span > 0 ? plot / span : 0;  // pixels per time unit
  const double axis_y = top + p * row_h + 4;
  const double legend_y = axis_y + 44;
  const double width = left + plot + right, height = legend_y + 24;
  auto x_of = [&](const rational& t) { return left + t.to_double() * scale; };

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(width) + "\" height=\"" +
         number(height) + "\" viewBox=\"0 0 " + number(width) + " " + number(height) +
         "\" font-family=\"sans-serif\">\n";
  out += "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" + number(width) + "\" height=\"" +
         number(height) + "\" fill=\"#ffffff\"/>\n";
  out += "<text x=\"" + number(left) + "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" +
         html_escape(s.name + ": p=" + std::to_string(p) + " m=" + std::to_string(s.microbatches) +
                    " v=" + std::to_string(v)) +
         "</text>\n";
  out += "<text x=\"" + number(left) + "\" y=\"42\" font-size=\"12\" fill=\"#444444\">" +
         html_escape("makespan " + sim.makespan.str() + (o.time_unit.empty() ? "" : " " + o.time_unit) + ", bubble " +
                     percent(sim.bubble) +
                    ", bubble_span " + percent(sim.bubble_span)) +
         "</text>\n";

  for (int r = 0; r < p; ++r) {
    const double y = top + r * row_h;
    out += "<text x=\"" + number(left - 8) + "\" y=\"" + number(y + row_h / 2 + 4) +
           "\" font-size=\"12\" text-anchor=\"end\">rank " + std::to_string(r) + "</text>\n";
    bool second_of_pair = false;
    for (const auto& t : sim.timeline[r]) {
      if (!is_compute(t.what.kind)) continue;
      const double x0 = x_of(t.start), w = x_of(t.end) - x0;
      // An overlapped pair (OVERLAP_F_B) shares its step: the first on top, the second below.
      const bool paired = t.what.overlapped || second_of_pair;
      const double box_h = paired ? full_box_h / 2 : full_box_h;
      const double by = y + (row_h - full_box_h) / 2 + (second_of_pair ? full_box_h / 2 : 0.0);
      second_of_pair = t.what.overlapped;
      const int chunk = s.place.chunk_of(t.what.stage);
      const std::string mb = std::to_string(t.what.microbatch);
      const double font = std::clamp(w / (0.62 * static_cast<double>(mb.size()) + 0.5), 4.0, 12.0);
      out += "<rect class=\"box " + to_string(t.what.kind) + "\" x=\"" + number(x0) + "\" y=\"" +
             number(by) + "\" width=\"" + number(w) + "\" height=\"" + number(box_h) +
             "\" fill=\"" + fill_of(t.what.kind, chunk, v) +
             "\" stroke=\"#333333\" stroke-width=\"0.5\"><title>" +
             html_escape(to_string(t.what) + ": " + t.start.str() + " to " + t.end.str()) +
             "</title></rect>\n";
      out += "<text x=\"" + number(x0 + w / 2) + "\" y=\"" + number(by + box_h / 2 + font / 3) +
             "\" font-size=\"" + number(font) + "\" text-anchor=\"middle\">" + mb + "</text>\n";
    }
  }

  // The time axis.
  out += "<line x1=\"" + number(left) + "\" y1=\"" + number(axis_y) + "\" x2=\"" +
         number(left + plot) + "\" y2=\"" + number(axis_y) + "\" stroke=\"#333333\"/>\n";
  const double step = tick_step(span);
  for (int i = 0; span > 0 && i * step <= span * (1 + 1e-12); ++i) {
    const double x = left + i * step * scale;
    out += "<line x1=\"" + number(x) + "\" y1=\"" + number(axis_y) + "\" x2=\"" + number(x) +
           "\" y2=\"" + number(axis_y + 5) + "\" stroke=\"#333333\"/>\n";
    out += "<text x=\"" + number(x) + "\" y=\"" + number(axis_y + 18) +
           "\" font-size=\"10\" text-anchor=\"middle\">" + number(i * step, 6) + "</text>\n";
  }
  out += "<text x=\"" + number(left + plot / 2) + "\" y=\"" + number(axis_y + 34) +
         "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#444444\">" +
         html_escape("time (" + (o.time_unit.empty() ? std::string("cost units") : o.time_unit) + ")") + "</text>\n";

  // The legend: one key per kind drawn (chunk 0's shade).
  double lx = left;
  for (std::size_t k = 0; k < std::size(drawn_kinds); ++k) {
    if (!kinds_present[k]) continue;
    const op kind = drawn_kinds[k];
    out += "<rect class=\"key\" x=\"" + number(lx) + "\" y=\"" + number(legend_y) +
           "\" width=\"14\" height=\"14\" fill=\"" + fill_of(kind, 0, v) +
           "\" stroke=\"#333333\" stroke-width=\"0.5\"/>\n";
    const std::string label = std::string(1, letter(kind)) + " " + kind_name(kind);
    out += "<text x=\"" + number(lx + 18) + "\" y=\"" + number(legend_y + 11) +
           "\" font-size=\"11\">" + html_escape(label) + "</text>\n";
    lx += 30 + 6.5 * static_cast<double>(label.size());
  }
  if (v > 1)
    out += "<text x=\"" + number(lx) + "\" y=\"" + number(legend_y + 11) +
           "\" font-size=\"11\" fill=\"#444444\">darker: later chunks</text>\n";
  out += "</svg>\n";
  return out;
}

// ---- chrome -------------------------------------------------------------------------------

std::string json_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// One cost unit is 1000 us; exact when that is a whole number of microseconds, else to the ns.
std::string microseconds(const rational& t) {
  const rational us = t * rational(1000);
  return us.den() == 1 ? std::to_string(us.num()) : number(us.to_double(), 3);
}

std::string render_chrome(const schedule& s, const simulation& sim) {
  const int p = s.place.ranks;
  std::string out = "{\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"" +
         json_escape(s.name + " p=" + std::to_string(p) + " m=" + std::to_string(s.microbatches) +
                     " v=" + std::to_string(s.place.stages_per_rank)) +
         "\"}}";
  for (int r = 0; r < p; ++r) {
    const std::string tid = std::to_string(r);
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid +
           ",\"args\":{\"name\":\"rank " + tid + "\"}}";
    out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (int r = 0; r < p; ++r)
    for (const auto& t : sim.timeline[r]) {
      if (!is_compute(t.what.kind)) continue;
      out += ",\n{\"name\":\"" + std::string(1, letter(t.what.kind)) +
             std::to_string(t.what.microbatch) + "\",\"cat\":\"" + to_string(t.what.kind) +
             "\",\"ph\":\"X\",\"pid\":0,\"tid\":" + std::to_string(r) +
             ",\"ts\":" + microseconds(t.start) + ",\"dur\":" + microseconds(t.end - t.start) +
             ",\"args\":{\"stage\":" + std::to_string(t.what.stage) +
             ",\"microbatch\":" + std::to_string(t.what.microbatch) + "}}";
    }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"time_unit\":\"1 cost unit = 1000 us\"}}\n";
  return out;
}

}  // namespace

std::vector<std::string> render_format_names() { return {"ascii", "csv", "svg", "chrome"}; }

render_format parse_render_format(std::string_view name) {
  if (name == "ascii") return render_format::ascii;
  if (name == "csv") return render_format::csv;
  if (name == "svg") return render_format::svg;
  if (name == "chrome") return render_format::chrome;
  throw std::invalid_argument("unknown format '" + std::string(name) +
                              "' (use ascii, csv, svg or chrome)");
}

std::string render(const schedule& s, const simulation& sim, render_format f,
                   const render_options& options) {
  if (static_cast<int>(sim.timeline.size()) != s.place.ranks || static_cast<int>(s.ranks.size()) != s.place.ranks)
    throw std::invalid_argument("the simulation has " + std::to_string(sim.timeline.size()) +
                                " timelines for a schedule of " + std::to_string(s.place.ranks) +
                                " ranks: simulate this schedule first");
  // The timeline of each rank lists that rank's actions in order (simulate()): anything else is
  // the simulation of another schedule.
  for (int r = 0; r < s.place.ranks; ++r) {
    const auto& row = sim.timeline[static_cast<std::size_t>(r)];
    std::size_t k = 0;
    for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (!a) continue;
      if (k >= row.size() || !(row[k].what == *a))
        throw std::invalid_argument("the simulation is not of this schedule (rank " + std::to_string(r) +
                                    " differs at action " + std::to_string(k) + "): simulate this schedule first");
      ++k;
    }
    if (k != row.size())
      throw std::invalid_argument("the simulation is not of this schedule (rank " + std::to_string(r) + " has " +
                                  std::to_string(row.size() - k) + " more actions): simulate this schedule first");
  }
  switch (f) {
    case render_format::ascii: return render_ascii(s, sim, options);
    case render_format::csv: return to_csv(s);
    case render_format::svg: return render_svg(s, sim, options);
    case render_format::chrome: return render_chrome(s, sim);
  }
  throw std::invalid_argument("unknown render format");
}

}  // namespace troupe::pipeline
