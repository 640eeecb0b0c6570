// Measured steps: their checks, the costs they imply, the simulator's prediction from those
// costs, and the views (a simulation for render(), JSON) of one step.

#include "troupe/pipeline/timeline.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>

namespace troupe::pipeline {
namespace {

/// The length of the well-formed UTF-8 sequence at the start of `s` (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or 0 when it is not one.
std::size_t utf8_length(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto tail = [&](std::size_t i) { return i < s.size() && (b(i) & 0xc0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return tail(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!tail(1) || !tail(2)) return 0;
    if (c == 0xe0 && b(1) < 0xa0) return 0;   // overlong
    if (c == 0xed && b(1) >= 0xa0) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!tail(1) || !tail(2) || !tail(3)) return 0;
    if (c == 0xf0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xf4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

/// `text` as the inside of a JSON string: well-formed UTF-8 passes through, each byte of an
/// ill-formed sequence becomes U+FFFD (JSON is UTF-8: a stray byte would make it invalid).
std::string json_escape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const std::size_t n = utf8_length(text.substr(i));
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out += text.substr(i, n);
        i += n;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      // < > & escaped too: the JSON may end up inside a page.
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
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

// The median of `v` (not empty) as an exact number: the middle one, or the mean of the middle two.
rational median(std::vector<std::int64_t>& v) {
  const std::size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const std::int64_t hi = v[mid];
  if (n % 2 == 1) return rational(hi);
  const std::int64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return rational(lo) + (rational(hi) - rational(lo)) / rational(2);
}

std::int64_t whole_us(std::int64_t ns) { return (ns + 500) / 1000; }

}  // namespace

std::int64_t span_ns(const step_timeline& t) {
  bool any = false;
  std::int64_t first = 0, last = 0;
  for (const auto& row : t)
    for (const auto& a : row) {
      if (!any || a.start_ns < first) first = a.start_ns;
      if (!any || a.end_ns > last) last = a.end_ns;
      any = true;
    }
  return any ? last - first : 0;
}

void check_timeline(const schedule& plan, const step_timeline& t) {
  if (static_cast<int>(t.size()) != plan.place.ranks)
    throw std::invalid_argument("the timeline has " + std::to_string(t.size()) + " ranks; the schedule '" + plan.name +
                                "' has " + std::to_string(plan.place.ranks));
  for (int r = 0; r < plan.place.ranks; ++r) {
    const auto& row = t[static_cast<std::size_t>(r)];
    const auto where = [&](std::size_t k) { return "rank " + std::to_string(r) + ", action " + std::to_string(k); };
    std::size_t k = 0;
    for (const auto& a : plan.ranks[static_cast<std::size_t>(r)]) {
      if (!a) continue;
      if (k >= row.size())
        throw std::invalid_argument("the timeline of rank " + std::to_string(r) + " ends before " + to_string(*a));
      const auto& m = row[k];
      if (!(m.what == *a))
        throw std::invalid_argument(where(k) + " is " + to_string(m.what) + "; the schedule has " + to_string(*a) + " there");
      if (m.start_ns < 0 || m.end_ns < m.start_ns)
        throw std::invalid_argument(where(k) + " (" + to_string(m.what) + ") runs from " + std::to_string(m.start_ns) +
                                    " to " + std::to_string(m.end_ns) + " ns");
      if (k > 0 && m.start_ns < row[k - 1].end_ns)
        throw std::invalid_argument(where(k) + " (" + to_string(m.what) + ") starts before the action before it ended");
      ++k;
    }
    if (k != row.size())
      throw std::invalid_argument("the timeline of rank " + std::to_string(r) + " has " + std::to_string(row.size() - k) +
                                  " actions more than the schedule");
  }
}

cost_model measured_costs(const schedule& plan, const std::vector<step_timeline>& steps) {
  if (steps.empty()) throw std::invalid_argument("measured_costs: no step was measured");
  const auto slot = [](op k) { return k == op::F ? 0 : k == op::B ? 1 : k == op::I ? 2 : k == op::W ? 3 : -1; };
  // Per stage and kind, every measured duration.
  std::vector<std::array<std::vector<std::int64_t>, 4>> d(static_cast<std::size_t>(plan.stages()));
  for (const auto& t : steps) {
    check_timeline(plan, t);
    for (const auto& row : t)
      for (const auto& a : row)
        if (const int s = slot(a.what.kind); s >= 0)
          d[static_cast<std::size_t>(a.what.stage)][static_cast<std::size_t>(s)].push_back(a.end_ns - a.start_ns);
  }
  const bool split = plan.split_backward();
  cost_model out;
  for (int st = 0; st < plan.stages(); ++st) {
    auto& mine = d[static_cast<std::size_t>(st)];
    const auto get = [&](op k) {
      auto& v = mine[static_cast<std::size_t>(slot(k))];
      if (v.empty())
        throw std::invalid_argument("measured_costs: stage " + std::to_string(st) + " has no measured " + to_string(k));
      return median(v);
    };
    action_costs c;
    c.f = get(op::F);
    c.comm = rational(0);
    if (split) {
      c.i = get(op::I);
      c.w = get(op::W);
      c.b = c.i + c.w;
    } else {
      c.b = get(op::B);
      c.i = c.b / rational(2);
      c.w = c.b - c.i;
    }
    out.per_stage.push_back(c);
  }
  return out;
}

timeline_comparison compare_with_simulator(const schedule& plan, const std::vector<step_timeline>& steps) {
  const cost_model costs = measured_costs(plan, steps);
  std::vector<std::int64_t> spans;
  for (const auto& t : steps) spans.push_back(span_ns(t));
  timeline_comparison c;
  c.steps = static_cast<int>(steps.size());
  c.measured_ms = median(spans).to_double() / 1e6;
  c.predicted_ms = simulate(plan, costs).makespan.to_double() / 1e6;
  return c;
}

measured_steps::measured_steps(std::size_t keep, std::int64_t skip) : keep_(keep), skip_(skip) {
  if (keep < 1) throw std::invalid_argument("measured_steps: keep must be at least 1");
  if (skip < 0) throw std::invalid_argument("measured_steps: skip must be >= 0");
}

void measured_steps::add(const schedule& plan, step_timeline t) {
  if (t.empty()) return;
  if (plan_.empty()) {
    plan_.push_back(plan);
    std::size_t actions = 0;
    for (const auto& row : plan.ranks)
      for (const auto& a : row) actions += a.has_value() ? 1 : 0;
    keep_ = std::max<std::size_t>(1, std::min(keep_, max_kept_actions / std::max<std::size_t>(1, actions)));
  } else if (plan_.front().ranks != plan.ranks) {
    throw std::invalid_argument("measured_steps: a step of the schedule '" + plan.name + "' among steps of '" +
                                plan_.front().name + "'");
  }
  check_timeline(plan, t);
  ++count_;
  if (count_ > skip_) {
    if (ring_.size() < keep_) {
      ring_.push_back(t);
    } else {
      ring_[next_] = t;
      next_ = (next_ + 1) % keep_;
    }
  }
  last_ = std::move(t);
}

std::vector<step_timeline> measured_steps::kept() const {
  std::vector<step_timeline> out;
  out.reserve(ring_.size());
  for (std::size_t k = 0; k < ring_.size(); ++k) out.push_back(ring_[(next_ + k) % ring_.size()]);
  return out;
}

timeline_comparison measured_steps::compare() const {
  if (ring_.empty()) return {};
  return compare_with_simulator(plan_.front(), ring_);  // (medians do not depend on the order)
}

simulation as_simulation(const schedule& plan, const step_timeline& t) {
  check_timeline(plan, t);
  const int p = plan.place.ranks;
  // From the earliest start, in whole microseconds.
  std::int64_t origin = 0;
  bool any = false;
  for (const auto& row : t)
    for (const auto& a : row)
      if (!any || a.start_ns < origin) origin = a.start_ns, any = true;
  simulation sim;
  sim.busy.assign(static_cast<std::size_t>(p), rational(0));
  sim.peak_activations.assign(static_cast<std::size_t>(p), 0.0);
  sim.timeline.resize(static_cast<std::size_t>(p));
  std::vector<rational> first(static_cast<std::size_t>(p)), last(static_cast<std::size_t>(p));
  std::vector<bool> seen(static_cast<std::size_t>(p), false);
  for (int r = 0; r < p; ++r) {
    const auto i = static_cast<std::size_t>(r);
    for (const auto& a : t[i]) {
      const rational start(whole_us(a.start_ns - origin)), end(whole_us(a.end_ns - origin));
      sim.timeline[i].push_back({a.what, start, end});
      if (end > sim.makespan) sim.makespan = end;
      if (!is_compute(a.what.kind)) continue;
      sim.busy[i] += end - start;
      if (!seen[i] || start < first[i]) first[i] = start;
      if (!seen[i] || end > last[i]) last[i] = end;
      seen[i] = true;
    }
  }
  rational total(0);
  for (const auto& b : sim.busy) total += b;
  if (sim.makespan > rational(0)) sim.bubble = 1.0 - (total / (rational(p) * sim.makespan)).to_double();
  int widest = -1;
  for (int r = 0; r < p; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (seen[i] && (widest < 0 || last[i] - first[i] > last[static_cast<std::size_t>(widest)] - first[static_cast<std::size_t>(widest)]))
      widest = r;
  }
  if (widest >= 0) {
    const auto w = static_cast<std::size_t>(widest);
    const rational span = last[w] - first[w];
    if (span > rational(0)) sim.bubble_span = ((span - sim.busy[w]) / span).to_double();
  }
  return sim;
}

std::string timeline_json(const schedule& plan, const step_timeline& t, std::int64_t step) {
  check_timeline(plan, t);
  std::string out = "{\"schedule\":\"" + json_escape(plan.name) + "\",\"step\":" + std::to_string(step) +
                    ",\"unit\":\"ns\",\"span_ns\":" + std::to_string(span_ns(t)) + ",\"ranks\":[";
  for (std::size_t r = 0; r < t.size(); ++r) {
    out += r ? ",[" : "[";
    for (std::size_t k = 0; k < t[r].size(); ++k) {
      const auto& a = t[r][k];
      out += std::string(k ? "," : "") + "{\"action\":\"" + json_escape(to_string(a.what)) + "\",\"kind\":\"" +
             json_escape(to_string(a.what.kind)) + "\",\"stage\":" + std::to_string(a.what.stage) +
             ",\"microbatch\":" + std::to_string(a.what.microbatch) + ",\"start_ns\":" + std::to_string(a.start_ns) +
             ",\"end_ns\":" + std::to_string(a.end_ns) + "}";
    }
    out += "]";
  }
  return out + "]}";
}

}  // namespace troupe::pipeline
