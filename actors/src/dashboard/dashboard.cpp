// The dashboard (dashboard.hpp): its state under one lock, the routes over it, the thread that
// pushes the state to open pages when it changed, and the thread that asks a head for the
// cluster's status. The JSON and Prometheus views are in views.cpp, the page in page.cpp.

#include "dashboard/state.hpp"

#include <condition_variable>
#include <ctime>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "troupe/actors/http_server.hpp"

namespace troupe {

struct dashboard::impl {
  explicit impl(dashboard_config c) : cfg(std::move(c)), routes({.token = cfg.token, .title = cfg.title}) {
    st.title = cfg.title;
  }

  /// Stops the threads (the server is stopped after them).
  void stop() {
    {
      std::lock_guard lock(stop_mu);
      stopping = true;
    }
    stop_cv.notify_all();
    if (publisher.joinable()) publisher.join();
    if (watcher.joinable()) watcher.join();
  }

  /// Waits `d` or until stop; false when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock lock(stop_mu);
    return !stop_cv.wait_for(lock, d, [&] { return stopping; });
  }

  void add_event(std::string text) { add_event(std::time(nullptr), std::move(text)); }  // under mu
  void add_event(std::time_t when_s, std::string text) {  // under mu
    std::tm tm{};
    gmtime_r(&when_s, &tm);
    char when[16];
    std::strftime(when, sizeof when, "%H:%M:%S", &tm);
    st.events.push_back({std::string(when) + " UTC", std::move(text)});
    while (st.events.size() > 100) st.events.pop_front();
  }

  dashboard_config cfg;
  mutable std::mutex mu;
  detail::dashboard_state st;  // under mu
  http::router routes;
  std::unique_ptr<http::server> server;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread publisher, watcher;
};

dashboard::dashboard(dashboard_config cfg) : impl_(std::make_unique<impl>(std::move(cfg))) {
  auto& m = *impl_;
  using http::request;
  using http::response;
  auto json = [](std::string body) { return response(200, std::move(body), "application/json"); };
  m.routes.route("/", [](const request&) {
    response r(200, detail::dashboard_page(), "text/html; charset=utf-8");
    // Only the page's own script and style run: a name that slipped into markup could not.
    r.headers = {{"Content-Security-Policy",
                  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
                  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
                 {"Referrer-Policy", "no-referrer"}};
    return r;
  });
  m.routes.route("/dashboard.js", [](const request&) {
    return response(200, detail::dashboard_script(), "text/javascript; charset=utf-8");
  });
  m.routes.route("/dashboard.css", [](const request&) { return response(200, detail::dashboard_style(), "text/css; charset=utf-8"); });
  m.routes.route("/api/state", [this, json](const request&) { return json(state_json()); });
  m.routes.route("/api/nodes", [this, json](const request&) { return json(nodes_json()); });
  m.routes.route("/api/actors", [this, json](const request&) { return json(actors_json()); });
  m.routes.route("/api/run", [this, json](const request&) { return json(run_json()); });
  m.routes.route("/metrics", [this](const request&) {
    return response(200, metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  m.routes.route("/schedule.svg", [this](const request&) {
    std::lock_guard lock(impl_->mu);
    if (impl_->st.schedule_svg.empty()) return response(404, "this run has no schedule drawing\n");
    response r(200, impl_->st.schedule_svg, "image/svg+xml");
    r.headers = {{"Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"}};
    return r;
  });
  m.routes.route("/timeline.svg", [this](const request&) {
    std::lock_guard lock(impl_->mu);
    if (impl_->st.timeline_svg.empty()) return response(404, "this run has measured no pipeline step yet\n");
    response r(200, impl_->st.timeline_svg, "image/svg+xml");
    r.headers = {{"Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"}};
    return r;
  });
  m.routes.route("/api/timeline", [this, json](const request&) {
    std::lock_guard lock(impl_->mu);
    if (impl_->st.timeline_json.empty()) return response(404, "this run has measured no pipeline step yet\n");
    return json(impl_->st.timeline_json);
  });
  m.routes.route("/events", [this](const request&) {
    response r(200, state_json());  // the first event: the state now
    r.event_stream = true;
    return r;
  });
  http::server_config sc;
  sc.listen = m.cfg.listen;
  sc.requests_per_s = m.cfg.requests_per_s;
  sc.burst = m.cfg.burst;
  m.server = std::make_unique<http::server>(sc, m.routes);
  m.publisher = std::thread([&m, this] {
    std::uint64_t sent = 0;
    while (m.pause(m.cfg.update_every)) {
      std::uint64_t version;
      {
        std::lock_guard lock(m.mu);
        version = m.st.version;
      }
      if (version == sent || m.server->streams() == 0) continue;
      sent = version;
      m.server->publish(state_json());
    }
  });
}

dashboard::~dashboard() {
  impl_->stop();
  // Routes read impl_->server under mu on the server's thread: take it out under mu, then stop it
  // (its destructor joins that thread, so it must not run while holding mu).
  std::unique_ptr<http::server> server;
  {
    std::lock_guard lock(impl_->mu);
    server = std::move(impl_->server);
  }
  server.reset();
}

std::uint16_t dashboard::port() const noexcept { return impl_->server->port(); }

void dashboard::set_run(std::string kind, std::vector<std::pair<std::string, std::string>> options) {
  std::lock_guard lock(impl_->mu);
  impl_->st.run_kind = std::move(kind);
  impl_->st.run_options = std::move(options);
  ++impl_->st.version;
}

void dashboard::add_point(const std::string& chart, const std::string& series, double x, double y, const std::string& x_label,
                          const std::string& y_label) {
  std::lock_guard lock(impl_->mu);
  auto& charts = impl_->st.charts;
  auto c = std::find_if(charts.begin(), charts.end(), [&](auto& e) { return e.title == chart; });
  if (c == charts.end()) c = charts.insert(charts.end(), line_chart{chart, x_label, y_label, {}});
  auto s = std::find_if(c->series.begin(), c->series.end(), [&](auto& e) { return e.name == series; });
  if (s == c->series.end()) s = c->series.insert(c->series.end(), chart_series{series, {}});
  if (s->points.size() >= 2000) {  // thin the history to every other point
    std::size_t k = 0;
    for (std::size_t i = 0; i < s->points.size(); i += 2) s->points[k++] = s->points[i];
    s->points.resize(k);
  }
  s->points.emplace_back(x, y);
  ++impl_->st.version;
}

void dashboard::add_row(const std::string& table, const std::vector<std::string>& columns, std::vector<std::string> cells,
                        std::size_t keep) {
  if (keep < 1 || keep > 1000) throw std::invalid_argument("dashboard::add_row: keep must be 1 to 1000, not " + std::to_string(keep));
  if (cells.size() != columns.size())
    throw std::invalid_argument("dashboard::add_row: " + std::to_string(cells.size()) + " cells for " + std::to_string(columns.size()) +
                                " columns of \"" + table + "\"");
  std::lock_guard lock(impl_->mu);
  auto& tables = impl_->st.tables;
  auto t = std::find_if(tables.begin(), tables.end(), [&](auto& e) { return e.title == table; });
  if (t == tables.end()) t = tables.insert(tables.end(), detail::dashboard_table{table, columns, {}});
  if (t->columns.size() != cells.size())
    throw std::invalid_argument("dashboard::add_row: " + std::to_string(cells.size()) + " cells for the " +
                                std::to_string(t->columns.size()) + " columns of \"" + table + "\"");
  t->rows.push_front(std::move(cells));
  while (t->rows.size() > keep) t->rows.pop_back();
  ++impl_->st.version;
}

void dashboard::set_figure(const std::string& name, double value, const std::string& help) {
  std::lock_guard lock(impl_->mu);
  auto& f = impl_->st.figures;
  auto it = std::find_if(f.begin(), f.end(), [&](auto& e) { return e.name == name; });
  if (it == f.end()) f.push_back({name, value, help});
  else it->value = value, it->help = help;
  ++impl_->st.version;
}

void dashboard::set_schedule_svg(std::string svg) {
  std::lock_guard lock(impl_->mu);
  impl_->st.schedule_svg = std::move(svg);
  ++impl_->st.version;
}

void dashboard::set_timeline(std::string svg, std::string json) {
  std::lock_guard lock(impl_->mu);
  impl_->st.timeline_svg = std::move(svg);
  impl_->st.timeline_json = std::move(json);
  ++impl_->st.timelines;
  ++impl_->st.version;
}

void dashboard::note(std::string event) {
  std::lock_guard lock(impl_->mu);
  impl_->add_event(std::move(event));
  ++impl_->st.version;
}

void dashboard::set_cluster(std::vector<node_status> nodes) {
  std::lock_guard lock(impl_->mu);
  auto& st = impl_->st;
  // What changed since the last report becomes events: nodes that joined, were lost or came
  // back, and (a few, then a count) actors that are gone.
  std::map<node_id, const node_status*> before;
  std::set<std::pair<node_id, std::uint64_t>> now_actors;
  for (auto& n : st.nodes) before[n.info.id] = &n;
  for (auto& n : nodes)
    for (auto& a : n.actors) now_actors.insert({n.info.id, a.id});
  const std::string none;
  for (auto& n : nodes) {
    const std::string where = "node " + std::to_string(n.info.id) + " (" + n.info.host + ":" + std::to_string(n.info.port) + ")";
    auto b = before.find(n.info.id);
    if (b == before.end()) {
      if (st.has_cluster) impl_->add_event(where + " joined");
    } else if (b->second->info.alive && !n.info.alive) {
      impl_->add_event(where + " lost" + (n.problem.empty() ? "" : ": " + n.problem));
    } else if (!b->second->info.alive && n.info.alive) {
      impl_->add_event(where + " is back");
    } else if (n.info.alive && !n.problem.empty() && n.problem != b->second->problem) {
      impl_->add_event(where + ": " + n.problem);
    }
  }
  std::size_t gone = 0;
  for (auto& n : st.nodes) {
    bool still = std::any_of(nodes.begin(), nodes.end(), [&](auto& x) { return x.info.id == n.info.id && x.info.alive; });
    if (!still) continue;  // a lost node's actors are its own event
    for (auto& a : n.actors)
      if (!now_actors.count({n.info.id, a.id}) && ++gone <= 5)
        impl_->add_event("actor " + std::to_string(a.id) + " (" + a.type + (a.name.empty() ? "" : " \"" + a.name + "\"") +
                         ") on node " + std::to_string(n.info.id) + " stopped");
  }
  if (gone > 5) impl_->add_event(std::to_string(gone - 5) + " more actors stopped");
  // Actor failures the nodes report that are new since the last report (a node's seq numbers
  // them; one that starts again counts from 1), with the time they happened.
  for (auto& n : nodes) {
    if (n.recent_failures.empty()) continue;
    auto& seen = st.failures_seen[n.info.id];
    if (n.recent_failures.back().seq < seen) seen = 0;  // the node started again
    for (auto& f : n.recent_failures) {
      if (f.seq <= seen) continue;
      std::string name;
      for (auto& a : n.actors)
        if (a.id == f.actor && !a.name.empty()) name = " \"" + a.name + "\"";
      impl_->add_event(static_cast<std::time_t>(f.unix_ms / 1000),
                       "actor " + std::to_string(f.actor) + " (" + f.type + name + ") on node " + std::to_string(n.info.id) +
                           " failed: " + f.what +
                           (f.restarted ? "; restart " + std::to_string(f.restarts) : "; no restart left, it stopped"));
    }
    seen = n.recent_failures.back().seq;
  }
  st.nodes = std::move(nodes);
  st.has_cluster = true;
  ++st.version;
}

void dashboard::watch_cluster(std::string head, std::string token, std::chrono::milliseconds every) {
  auto& m = *impl_;
  // Under stop_mu: stop() sets `stopping` under it before it joins the watcher, so no watcher
  // starts (nor is assigned) once stop() has begun.
  std::lock_guard stop_lock(m.stop_mu);
  if (m.stopping) throw std::logic_error("dashboard::watch_cluster: the dashboard is stopping");
  if (m.watcher.joinable()) throw std::logic_error("dashboard::watch_cluster: it watches a cluster already");
  m.watcher = std::thread([this, &m, head = std::move(head), token = std::move(token), every] {
    std::string last_error;
    do {
      try {
        set_cluster(cluster_status(head, token, std::max(every * 2, std::chrono::milliseconds(2000))));
        last_error.clear();
      } catch (const std::exception& e) {
        if (e.what() != last_error) note(std::string("cannot ask the head at ") + head + ": " + e.what());
        last_error = e.what();
      }
    } while (m.pause(every));
  });
}

std::string dashboard::state_json() const {
  std::lock_guard lock(impl_->mu);
  return detail::state_json(impl_->st);
}
std::string dashboard::nodes_json() const {
  std::lock_guard lock(impl_->mu);
  return detail::nodes_json(impl_->st);
}
std::string dashboard::actors_json() const {
  std::lock_guard lock(impl_->mu);
  return "{\"actor_types\":" + detail::actor_types_json(impl_->st) + ",\"actors\":" + detail::actors_json(impl_->st) +
         ",\"failures\":" + detail::failures_json(impl_->st) + "}";
}
std::string dashboard::run_json() const {
  std::lock_guard lock(impl_->mu);
  return detail::run_json(impl_->st);
}
std::string dashboard::metrics() const {
  std::lock_guard lock(impl_->mu);
  return detail::prometheus_text(impl_->st, impl_->server ? impl_->server->streams() : 0);
}

}  // namespace troupe
