#pragma once
/// @file
/// The live dashboard of a cluster or a run (`--dashboard [HOST:]PORT` of `troupe node start
/// --head`, `troupe fedsim` and `troupe train`), served by troupe::http::server:
///
///   /              the page (its script and style are /dashboard.js and /dashboard.css: no CDN)
///   /events        server-sent events: the state as JSON, at most once per update period
///   /api/state     the state: {"title","nodes","actor_types","actors","failures","events","run"}
///   /api/nodes, /api/actors, /api/run   its parts
///   /metrics       the same figures in the Prometheus text format
///   /schedule.svg  a run's pipeline schedule drawing, when it has one
///   /timeline.svg, /api/timeline  a pipeline run's last measured step: the drawing, the data
///
///   troupe::dashboard d({.listen = "127.0.0.1:8080", .token = token});
///   d.add_point("loss per round", "test loss", round, loss, "round", "loss");   // a run's figures
///   d.watch_cluster("127.0.0.1:7100", token);                                    // or a cluster's
///
/// What a run publishes costs it a lock and a copy of the point; the JSON is made on the
/// server's thread, and only while someone looks. Every name is escaped on its way out (JSON
/// strings escape <, > and &; Prometheus labels \, " and newlines) and the page puts names in
/// the document as text only, so a hostile actor name shows as text and runs nothing.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/remote.hpp"

namespace troupe {

struct dashboard_config {
  /// HOST:PORT (see http::listen_address for `--dashboard`'s [HOST:]PORT).
  std::string listen = "127.0.0.1:0";
  /// When not empty, every request needs it (bearer field or the /login cookie).
  std::string token;
  std::string title = "troupe";
  /// How often open pages get the state (when it changed).
  std::chrono::milliseconds update_every{1000};
  /// Requests per second one client address may make (429 past it), and at once.
  double requests_per_s = 50, burst = 100;
};

/// Serves the dashboard from construction to destruction. @threadsafe
class dashboard {
public:
  /// Throws std::runtime_error when it cannot listen on cfg.listen.
  explicit dashboard(dashboard_config cfg);
  ~dashboard();
  dashboard(const dashboard&) = delete;
  dashboard& operator=(const dashboard&) = delete;

  std::uint16_t port() const noexcept;

  // ---- a run (fedsim, train) -----------------------------------------------------------

  /// What runs ("troupe fedsim") and its options as (name, value) rows.
  void set_run(std::string kind, std::vector<std::pair<std::string, std::string>> options);
  /// A point of a chart's series, as troupe::chart_book::add. A series keeps its last 2,000
  /// points at most (older ones thinned to every other).
  void add_point(const std::string& chart, const std::string& series, double x, double y, const std::string& x_label,
                 const std::string& y_label);
  /// A row of a table shown under the charts ("sampled clients": round, count, ids), the latest
  /// first. A table keeps its last `keep` rows (1 to 1,000); `columns` names its columns (set by
  /// the first row; a row of another width throws std::invalid_argument).
  void add_row(const std::string& table, const std::vector<std::string>& columns, std::vector<std::string> cells,
               std::size_t keep = 20);
  /// A figure's current value ("samples per second", "epsilon spent"), with what it means.
  void set_figure(const std::string& name, double value, const std::string& help);
  /// An SVG drawing this program made (a pipeline schedule), served as /schedule.svg.
  void set_schedule_svg(std::string svg);
  /// A pipeline run's last measured step: its drawing (served as /timeline.svg) and its data,
  /// a JSON value this program made with every name escaped (served as /api/timeline). Each
  /// call replaces the last; /api/run's "timeline" counts the calls (0: none yet).
  void set_timeline(std::string svg, std::string json);
  /// A line in the page's list of recent events (failures, restarts, aborted rounds).
  void note(std::string event);

  // ---- a cluster (the head) ------------------------------------------------------------

  /// The cluster as `troupe status` reports it. Nodes lost or back and actors gone since the
  /// last report become events.
  void set_cluster(std::vector<node_status> nodes);
  /// Asks the head at `head` for the status every `every` on a thread of its own (a failed
  /// ask becomes an event) until destruction.
  void watch_cluster(std::string head, std::string token, std::chrono::milliseconds every = std::chrono::seconds(1));

  // ---- what it serves (also for tests and scripts) -------------------------------------

  std::string state_json() const;
  std::string nodes_json() const;
  std::string actors_json() const;
  std::string run_json() const;
  /// The Prometheus text exposition format (version 0.0.4).
  std::string metrics() const;

  struct impl;  ///< its state (src/dashboard/dashboard.cpp)

private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
