#pragma once
// The dashboard's state (dashboard.cpp keeps it under its lock) and the views made of it: the
// JSON of /api/... and /events, and the Prometheus text of /metrics (views.cpp), the page and
// its script and style (page.cpp).

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/dashboard.hpp"
#include "troupe/core/report.hpp"

namespace troupe::detail {

struct dashboard_figure {
  std::string name;
  double value = 0;
  std::string help;
};

struct dashboard_table {
  std::string title;
  std::vector<std::string> columns;
  std::deque<std::vector<std::string>> rows;  // the latest first
};

struct dashboard_event {
  std::string when;  // "12:34:56 UTC"
  std::string text;
};

struct dashboard_state {
  std::string title;
  std::uint64_t version = 0;  // one more at every change
  // a run
  std::string run_kind;
  std::vector<std::pair<std::string, std::string>> run_options;
  std::vector<line_chart> charts;
  std::vector<dashboard_figure> figures;
  std::vector<dashboard_table> tables;
  std::string schedule_svg;
  std::string timeline_svg, timeline_json;  // the last measured pipeline step
  std::uint64_t timelines = 0;              // set_timeline calls
  // a cluster
  bool has_cluster = false;
  std::vector<node_status> nodes;
  /// Per node, the latest actor_failure::seq already turned into an event.
  std::map<node_id, std::uint64_t> failures_seen;
  std::deque<dashboard_event> events;
};

std::string state_json(const dashboard_state& s);
std::string nodes_json(const dashboard_state& s);
/// Actors grouped by type: count, mailbox depths (sum and largest), messages and rates.
std::string actor_types_json(const dashboard_state& s);
/// The 200 actors with the deepest mailboxes (then the busiest).
std::string actors_json(const dashboard_state& s);
/// The nodes' latest actor failures (restarted or not), the latest first, at most 100.
std::string failures_json(const dashboard_state& s);
std::string run_json(const dashboard_state& s);
std::string prometheus_text(const dashboard_state& s, std::size_t streams);

const std::string& dashboard_page();
const std::string& dashboard_script();
const std::string& dashboard_style();

}  // namespace troupe::detail
