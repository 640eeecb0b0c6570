// The dashboard's views (state.hpp): JSON for the page and for scripts, Prometheus text for
// scrapers. Every string goes through http::json_string or http::prometheus_label.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <ctime>
#include <map>

#include "dashboard/state.hpp"
#include "troupe/actors/http_server.hpp"

namespace troupe::detail {

namespace {

/// a + b for mailbox depths that came in other nodes' status reports: a negative depth counts as
/// 0 and the sum stops at the largest int64 instead of overflowing.
std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(a, std::max<std::int64_t>(b, 0), &sum)) return std::numeric_limits<std::int64_t>::max();
  return sum;
}

using http::json_string;

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// A Prometheus sample value: Go's float syntax, NaN and ±Inf included.
std::string sample(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string address(const node_info& n) { return n.host + ":" + std::to_string(n.port); }

struct type_totals {
  std::size_t count = 0;
  std::int64_t depth = 0, max_depth = 0;
  std::uint64_t messages = 0;
  double rate = 0;
  std::uint64_t restarts = 0, failed = 0;  // since each node started, stopped actors included
};

/// Live actors by type, with the types whose actors failed (none of them may be live now).
std::map<std::string, type_totals> by_type(const dashboard_state& s) {
  std::map<std::string, type_totals> types;
  for (auto& n : s.nodes) {
    for (auto& a : n.actors) {
      auto& t = types[a.type];
      ++t.count;
      t.depth = saturating_add(t.depth, a.mailbox_depth);
      t.max_depth = std::max(t.max_depth, a.mailbox_depth);
      t.messages += a.messages;
      t.rate += a.messages_per_s;
    }
    for (auto& f : n.failures_by_type) {
      auto& t = types[f.type];
      t.restarts += f.restarts;
      t.failed += f.failed;
    }
  }
  return types;
}

/// "12:34:56 UTC" of a time in milliseconds since 1970.
std::string utc_time(std::int64_t unix_ms) {
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return std::string(buf) + " UTC";
}

/// One family: its HELP and TYPE lines, then its samples.
class family {
public:
  family(std::string& out, const char* name, const char* type, const char* help) : out_(out), name_(name) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void add(const std::vector<std::pair<const char*, std::string>>& labels, double v) {
    out_ += name_;
    if (!labels.empty()) {
      out_ += '{';
      for (std::size_t i = 0; i < labels.size(); ++i)
        out_ += std::string(i ? "," : "") + labels[i].first + "=\"" + http::prometheus_label(labels[i].second) + "\"";
      out_ += '}';
    }
    out_ += ' ' + sample(v) + '\n';
  }

private:
  std::string& out_;
  const char* name_;
};

}  // namespace

std::string nodes_json(const dashboard_state& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.nodes.size(); ++i) {
    auto& n = s.nodes[i];
    std::int64_t depth = 0;
    double rate = 0;
    for (auto& a : n.actors) depth = saturating_add(depth, a.mailbox_depth), rate += a.messages_per_s;
    std::string labels;
    for (auto& l : n.info.labels) labels += (labels.empty() ? "" : ",") + json_string(l);
    out += std::string(i ? "," : "") + "{\"node\":" + std::to_string(n.info.id) + ",\"address\":" + json_string(address(n.info)) +
           ",\"alive\":" + (n.info.alive ? "true" : "false") + ",\"labels\":[" + labels + "],\"actors\":" +
           std::to_string(n.info.actors) + ",\"mailbox_depth\":" + std::to_string(depth) + ",\"messages_per_s\":" + num(rate) +
           ",\"dead_letters\":" + std::to_string(n.dead_letters) + ",\"problem\":" + json_string(n.problem) + "}";
  }
  return out + "]";
}

std::string actor_types_json(const dashboard_state& s) {
  std::string out = "[";
  bool first = true;
  for (auto& [type, t] : by_type(s)) {
    out += std::string(first ? "" : ",") + "{\"type\":" + json_string(type) + ",\"count\":" + std::to_string(t.count) +
           ",\"mailbox_depth\":" + std::to_string(t.depth) + ",\"max_mailbox_depth\":" + std::to_string(t.max_depth) +
           ",\"messages\":" + std::to_string(t.messages) + ",\"messages_per_s\":" + num(t.rate) +
           ",\"restarts\":" + std::to_string(t.restarts) + ",\"failed\":" + std::to_string(t.failed) + "}";
    first = false;
  }
  return out + "]";
}

std::string actors_json(const dashboard_state& s) {
  struct row {
    node_id node;
    const actor_status* a;
  };
  std::vector<row> rows;
  for (auto& n : s.nodes)
    for (auto& a : n.actors) rows.push_back({n.info.id, &a});
  const std::size_t shown = std::min<std::size_t>(rows.size(), 200);
  std::partial_sort(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(shown), rows.end(), [](const row& x, const row& y) {
    if (x.a->mailbox_depth != y.a->mailbox_depth) return x.a->mailbox_depth > y.a->mailbox_depth;
    if (x.a->messages_per_s != y.a->messages_per_s) return x.a->messages_per_s > y.a->messages_per_s;
    return std::pair(x.node, x.a->id) < std::pair(y.node, y.a->id);
  });
  std::string out = "[";
  for (std::size_t i = 0; i < shown; ++i) {
    auto& a = *rows[i].a;
    out += std::string(i ? "," : "") + "{\"node\":" + std::to_string(rows[i].node) + ",\"id\":" + std::to_string(a.id) +
           ",\"type\":" + json_string(a.type) + ",\"name\":" + json_string(a.name) + ",\"mailbox_depth\":" +
           std::to_string(a.mailbox_depth) + ",\"messages\":" + std::to_string(a.messages) + ",\"messages_per_s\":" +
           num(a.messages_per_s) + ",\"restarts\":" + std::to_string(a.restarts) + "}";
  }
  return out + "]";
}

std::string failures_json(const dashboard_state& s) {
  struct row {
    node_id node;
    const actor_failure* f;
  };
  std::vector<row> rows;
  for (auto& n : s.nodes)
    for (auto& f : n.recent_failures) rows.push_back({n.info.id, &f});
  std::stable_sort(rows.begin(), rows.end(), [](const row& x, const row& y) { return x.f->unix_ms > y.f->unix_ms; });
  if (rows.size() > 100) rows.resize(100);
  std::string out = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto& f = *rows[i].f;
    out += std::string(i ? "," : "") + "{\"node\":" + std::to_string(rows[i].node) + ",\"actor\":" + std::to_string(f.actor) +
           ",\"type\":" + json_string(f.type) + ",\"when\":" + json_string(utc_time(f.unix_ms)) + ",\"unix_ms\":" +
           std::to_string(f.unix_ms) + ",\"restarted\":" + (f.restarted ? "true" : "false") + ",\"restarts\":" +
           std::to_string(f.restarts) + ",\"what\":" + json_string(f.what) + "}";
  }
  return out + "]";
}

std::string run_json(const dashboard_state& s) {
  std::string out = "{\"kind\":" + json_string(s.run_kind) + ",\"options\":[";
  for (std::size_t i = 0; i < s.run_options.size(); ++i)
    out += std::string(i ? "," : "") + "[" + json_string(s.run_options[i].first) + "," + json_string(s.run_options[i].second) + "]";
  out += "],\"charts\":[";
  for (std::size_t c = 0; c < s.charts.size(); ++c) {
    auto& ch = s.charts[c];
    out += std::string(c ? "," : "") + "{\"title\":" + json_string(ch.title) + ",\"x_label\":" + json_string(ch.x_label) +
           ",\"y_label\":" + json_string(ch.y_label) + ",\"series\":[";
    for (std::size_t k = 0; k < ch.series.size(); ++k) {
      out += std::string(k ? "," : "") + "{\"name\":" + json_string(ch.series[k].name) + ",\"points\":[";
      bool first = true;
      for (auto& [x, y] : ch.series[k].points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        out += std::string(first ? "" : ",") + "[" + num(x) + "," + num(y) + "]";
        first = false;
      }
      out += "]}";
    }
    out += "]}";
  }
  out += "],\"figures\":[";
  for (std::size_t i = 0; i < s.figures.size(); ++i)
    out += std::string(i ? "," : "") + "{\"name\":" + json_string(s.figures[i].name) + ",\"value\":" + num(s.figures[i].value) +
           ",\"help\":" + json_string(s.figures[i].help) + "}";
  out += "],\"tables\":[";
  for (std::size_t i = 0; i < s.tables.size(); ++i) {
    auto& t = s.tables[i];
    auto list = [](const std::vector<std::string>& cells) {
      std::string o = "[";
      for (std::size_t k = 0; k < cells.size(); ++k) o += std::string(k ? "," : "") + json_string(cells[k]);
      return o + "]";
    };
    out += std::string(i ? "," : "") + "{\"title\":" + json_string(t.title) + ",\"columns\":" + list(t.columns) + ",\"rows\":[";
    for (std::size_t r = 0; r < t.rows.size(); ++r) out += std::string(r ? "," : "") + list(t.rows[r]);
    out += "]}";
  }
  out += std::string("],\"schedule\":") + (s.schedule_svg.empty() ? "false" : "true") +
         ",\"timeline\":" + std::to_string(s.timelines) + "}";
  return out;
}

std::string state_json(const dashboard_state& s) {
  std::string events = "[";
  for (auto it = s.events.rbegin(); it != s.events.rend(); ++it)  // the latest first
    events += std::string(events.size() > 1 ? "," : "") + "{\"when\":" + json_string(it->when) + ",\"text\":" + json_string(it->text) + "}";
  events += "]";
  return "{\"title\":" + json_string(s.title) + ",\"version\":" + std::to_string(s.version) +
         ",\"cluster\":" + (s.has_cluster ? "true" : "false") + ",\"nodes\":" + nodes_json(s) +
         ",\"actor_types\":" + actor_types_json(s) + ",\"actors\":" + actors_json(s) + ",\"failures\":" + failures_json(s) +
         ",\"events\":" + events +
         ",\"run\":" + run_json(s) + "}";
}

std::string prometheus_text(const dashboard_state& s, std::size_t streams) {
  std::string out;
  if (s.has_cluster) {
    {
      family f(out, "troupe_node_up", "gauge", "1 while the head hears from the node, 0 once it is lost.");
      for (auto& n : s.nodes) f.add({{"node", std::to_string(n.info.id)}, {"address", address(n.info)}}, n.info.alive ? 1 : 0);
    }
    {
      family f(out, "troupe_node_actors", "gauge", "Live actors on the node.");
      for (auto& n : s.nodes) f.add({{"node", std::to_string(n.info.id)}, {"address", address(n.info)}}, static_cast<double>(n.info.actors));
    }
    {
      family f(out, "troupe_node_dead_letters_total", "counter", "Messages that reached no method on the node.");
      for (auto& n : s.nodes)
        f.add({{"node", std::to_string(n.info.id)}, {"address", address(n.info)}}, static_cast<double>(n.dead_letters));
    }
    const auto types = by_type(s);
    {
      family f(out, "troupe_actors", "gauge", "Live actors of the type in the cluster.");
      for (auto& [type, t] : types) f.add({{"type", type}}, static_cast<double>(t.count));
    }
    {
      family f(out, "troupe_actor_type_mailbox_depth", "gauge", "Messages waiting in the mailboxes of the type's actors.");
      for (auto& [type, t] : types) f.add({{"type", type}}, static_cast<double>(t.depth));
    }
    {
      family f(out, "troupe_actor_type_messages_per_second", "gauge", "Messages per second the type's actors handle.");
      for (auto& [type, t] : types) f.add({{"type", type}}, t.rate);
    }
    {
      family f(out, "troupe_actor_restarts_total", "counter",
               "Failures of the type's actors after which their restart policy re-created them (live nodes, since each started).");
      for (auto& [type, t] : types) f.add({{"type", type}}, static_cast<double>(t.restarts));
    }
    {
      family f(out, "troupe_actor_failures_total", "counter",
               "Failures that stopped an actor of the type (no restart left; live nodes, since each started).");
      for (auto& [type, t] : types) f.add({{"type", type}}, static_cast<double>(t.failed));
    }
    auto labels = [](const node_status& n, const actor_status& a) {
      return std::vector<std::pair<const char*, std::string>>{
          {"node", std::to_string(n.info.id)}, {"id", std::to_string(a.id)}, {"type", a.type}, {"name", a.name}};
    };
    {
      family f(out, "troupe_actor_mailbox_depth", "gauge", "Normal messages waiting in the actor's mailbox.");
      for (auto& n : s.nodes)
        for (auto& a : n.actors) f.add(labels(n, a), static_cast<double>(a.mailbox_depth));
    }
    {
      family f(out, "troupe_actor_messages_total", "counter", "Messages the actor has handled.");
      for (auto& n : s.nodes)
        for (auto& a : n.actors) f.add(labels(n, a), static_cast<double>(a.messages));
    }
    {
      family f(out, "troupe_actor_messages_per_second", "gauge", "Messages per second the actor handled over the last status interval.");
      for (auto& n : s.nodes)
        for (auto& a : n.actors) f.add(labels(n, a), a.messages_per_s);
    }
    {
      family f(out, "troupe_actor_restarts", "gauge", "Times the live actor's restart policy re-created it.");
      for (auto& n : s.nodes)
        for (auto& a : n.actors) f.add(labels(n, a), static_cast<double>(a.restarts));
    }
  }
  if (!s.charts.empty()) {
    family f(out, "troupe_run_value", "gauge", "The latest point of each series of the run's charts (y).");
    for (auto& c : s.charts)
      for (auto& se : c.series)
        if (!se.points.empty()) f.add({{"chart", c.title}, {"series", se.name}}, se.points.back().second);
    family x(out, "troupe_run_position", "gauge", "Where the latest point of each series is (x: round, epoch, step).");
    for (auto& c : s.charts)
      for (auto& se : c.series)
        if (!se.points.empty()) x.add({{"chart", c.title}, {"series", se.name}, {"unit", c.x_label}}, se.points.back().first);
  }
  if (!s.figures.empty()) {
    family f(out, "troupe_run_figure", "gauge", "A figure of the run (its help is in /api/run).");
    for (auto& g : s.figures) f.add({{"name", g.name}}, g.value);
  }
  family e(out, "troupe_dashboard_events", "gauge", "Events in the dashboard's list (failures, lost nodes, stopped actors; the last 100).");
  e.add({}, static_cast<double>(s.events.size()));
  family st(out, "troupe_dashboard_streams", "gauge", "Pages that follow the dashboard's event stream now.");
  st.add({}, static_cast<double>(streams));
  return out;
}

}  // namespace troupe::detail
