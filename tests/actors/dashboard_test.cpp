// troupe::dashboard (dashboard.hpp): /metrics parsed back as Prometheus text (HELP and TYPE
// before every family, label values unescaped to the names given), hostile names escaped in the
// JSON, changes of the cluster as events, a run's points, and the live stream of the state.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/actors/actor_system.hpp"
#include "troupe/actors/dashboard.hpp"

using namespace std::chrono_literals;

namespace {

const std::string hostile = "<img src=x onerror=alert(1)>";
const std::string tricky = "a\"b\\c\nd";  // every character a Prometheus label escapes

struct sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// A strict reader of the Prometheus text format (0.0.4): every sample's family has had its
/// # HELP and # TYPE (once each, before its samples), names and labels are well formed, values
/// parse. Fails the test on the first bad line.
std::vector<sample> parse_prometheus(const std::string& text) {
  std::vector<sample> out;
  std::map<std::string, std::string> types;
  std::set<std::string> helps, seen_samples;
  auto is_name = [](const std::string& s) {
    if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_' || s[0] == ':')) return false;
    for (char c : s)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
    return true;
  };
  std::size_t pos = 0;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "the text does not end with a newline";
  while (pos < text.size()) {
    const auto end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("# HELP ", 0) == 0) {
      const auto name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(is_name(name)) << line;
      EXPECT_TRUE(helps.insert(name).second) << "two HELP lines for " << name;
      EXPECT_FALSE(seen_samples.count(name)) << "HELP after samples of " << name;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const auto sp = line.find(' ', 7);
      const auto name = line.substr(7, sp - 7), type = line.substr(sp + 1);
      EXPECT_TRUE(type == "gauge" || type == "counter") << line;
      EXPECT_TRUE(types.emplace(name, type).second) << "two TYPE lines for " << name;
      EXPECT_FALSE(seen_samples.count(name)) << "TYPE after samples of " << name;
      if (type == "counter") {
        EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
      }
      continue;
    }
    EXPECT_FALSE(line.empty() || line[0] == '#') << "unexpected line: " << line;
    sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    EXPECT_TRUE(is_name(s.name)) << line;
    EXPECT_TRUE(types.count(s.name) && helps.count(s.name)) << "a sample of " << s.name << " without HELP and TYPE";
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::string key, value;
        while (i < line.size() && line[i] != '=') key += line[i++];
        EXPECT_TRUE(is_name(key)) << line;
        EXPECT_EQ(line.substr(i, 2), "=\"") << line;
        i += 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\') {
            ++i;
            EXPECT_TRUE(line[i] == '\\' || line[i] == '"' || line[i] == 'n') << "bad escape in " << line;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        ++i;  // the closing quote
        EXPECT_TRUE(s.labels.emplace(key, value).second) << "label " << key << " twice: " << line;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;
    }
    EXPECT_EQ(line[i], ' ') << line;
    const std::string v = line.substr(i + 1);
    if (v == "NaN" || v == "+Inf" || v == "-Inf") {
      s.value = v == "NaN" ? std::numeric_limits<double>::quiet_NaN() : v == "+Inf" ? HUGE_VAL : -HUGE_VAL;
    } else {
      std::size_t used = 0;
      s.value = std::stod(v, &used);
      EXPECT_EQ(used, v.size()) << line;
    }
    seen_samples.insert(s.name);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<troupe::node_status> a_cluster(bool second_alive = true) {
  troupe::node_status head;
  head.info = {1, "127.0.0.1", 7100, true, 2, {"head"}};
  head.actors = {{11, "kv_store", hostile, 3, 100, 12.5, 0, 0}, {12, tricky, "", 0, 7, 0, 0, 0}};
  troupe::node_status worker;
  worker.info = {2, "127.0.0.1", 7101, second_alive, 1, {}};
  worker.actors = {{21, "kv_store", "", 5, 40, 2.5, 0, 0}};
  if (!second_alive) worker.problem = "no answer within 800 ms";
  return {head, worker};
}

std::string get(std::uint16_t port, const std::string& target) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace

TEST(Dashboard, MetricsParseBackAsPrometheusTextWithTheNamesGiven) {
  troupe::dashboard d({});
  d.set_cluster(a_cluster());
  d.add_point("loss per round", "test \"loss\"", 1, 0.5, "round", "loss");
  d.add_point("loss per round", "test \"loss\"", 2, 0.25, "round", "loss");
  d.set_figure("epsilon", 1.5, "privacy budget spent");
  const auto samples = parse_prometheus(d.metrics());
  std::map<std::string, double> depth_by_name;
  double up_worker = -1, kv_count = -1, loss = -1;
  for (auto& s : samples) {
    if (s.name == "troupe_actor_mailbox_depth") depth_by_name[s.labels.at("type") + "/" + s.labels.at("name")] = s.value;
    if (s.name == "troupe_node_up" && s.labels.at("node") == "2") up_worker = s.value;
    if (s.name == "troupe_actors" && s.labels.at("type") == "kv_store") kv_count = s.value;
    if (s.name == "troupe_run_value" && s.labels.at("series") == "test \"loss\"") loss = s.value;
  }
  EXPECT_EQ(depth_by_name.at("kv_store/" + hostile), 3);
  EXPECT_EQ(depth_by_name.at(tricky + "/"), 0);  // the escaped type reads back as given
  EXPECT_EQ(up_worker, 1);
  EXPECT_EQ(kv_count, 2);
  EXPECT_EQ(loss, 0.25);
}

TEST(Dashboard, JsonCarriesNoMarkupOfAHostileName) {
  troupe::dashboard d({});
  d.set_cluster(a_cluster());
  for (const auto& json : {d.state_json(), d.actors_json(), d.nodes_json(), d.run_json()}) {
    EXPECT_EQ(json.find('<'), std::string::npos) << json;
    EXPECT_EQ(json.find('>'), std::string::npos) << json;
  }
  EXPECT_NE(d.actors_json().find("\\u003cimg src=x onerror=alert(1)\\u003e"), std::string::npos);
  // Actors by type: kv_store twice, its mailboxes summed, the deepest kept.
  EXPECT_NE(d.actors_json().find("{\"type\":\"kv_store\",\"count\":2,\"mailbox_depth\":8,\"max_mailbox_depth\":5,"),
            std::string::npos)
      << d.actors_json();
}

TEST(Dashboard, MailboxDepthsFromOtherNodesSumWithoutOverflow) {
  // Depths come in other nodes' reports: a huge one saturates the sums, a negative one counts as 0.
  auto nodes = a_cluster();
  nodes[0].actors[0].mailbox_depth = std::numeric_limits<std::int64_t>::max();
  nodes[1].actors[0].mailbox_depth = std::numeric_limits<std::int64_t>::max();
  nodes[0].actors[1].mailbox_depth = -5;
  troupe::dashboard d({});
  d.set_cluster(nodes);
  const std::string big = std::to_string(std::numeric_limits<std::int64_t>::max());
  EXPECT_NE(d.actors_json().find("{\"type\":\"kv_store\",\"count\":2,\"mailbox_depth\":" + big + ","), std::string::npos)
      << d.actors_json();
  EXPECT_NE(d.nodes_json().find("\"mailbox_depth\":" + big), std::string::npos) << d.nodes_json();
}

TEST(Dashboard, ChangesOfTheClusterBecomeEvents) {
  troupe::dashboard d({});
  d.set_cluster(a_cluster());
  EXPECT_NE(d.state_json().find("\"events\":[]"), std::string::npos);
  d.set_cluster(a_cluster(false));
  auto s = d.state_json();
  EXPECT_NE(s.find("node 2 (127.0.0.1:7101) lost: no answer within 800 ms"), std::string::npos) << s;
  auto back = a_cluster();
  back[0].actors.pop_back();  // the actor of the tricky type stops
  d.set_cluster(back);
  s = d.state_json();
  EXPECT_NE(s.find("node 2 (127.0.0.1:7101) is back"), std::string::npos) << s;
  EXPECT_NE(s.find("actor 12 (a\\\"b\\\\c\\nd) on node 1 stopped"), std::string::npos) << s;
}

TEST(Dashboard, ServesThePageItsScriptApiAndMetrics) {
  troupe::dashboard_config cfg;
  cfg.title = "cluster " + hostile;
  troupe::dashboard d(cfg);
  d.set_run("troupe fedsim", {{"clients", "100"}});
  d.add_point("test accuracy per round", "test accuracy", 1, 0.7, "round", "accuracy");
  const auto page = get(d.port(), "/");
  EXPECT_NE(page.find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(page.find("Content-Security-Policy: default-src 'none'; script-src 'self'"), std::string::npos) << page;
  EXPECT_NE(page.find("<script src=\"/dashboard.js\"></script>"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos);  // nothing from elsewhere
  EXPECT_EQ(page.find("https://"), std::string::npos);
  const auto script = get(d.port(), "/dashboard.js");
  EXPECT_NE(script.find("text/javascript"), std::string::npos);
  EXPECT_EQ(script.find("innerHTML"), std::string::npos);  // names go in as text only
  EXPECT_EQ(script.find("insertAdjacentHTML"), std::string::npos);
  EXPECT_NE(get(d.port(), "/api/run").find("\"points\":[[1,0.7]]"), std::string::npos);
  EXPECT_NE(get(d.port(), "/metrics").find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(get(d.port(), "/schedule.svg").find("HTTP/1.1 404"), std::string::npos);
}

TEST(Dashboard, ServesTheLastMeasuredPipelineStepAsDrawingAndData) {
  troupe::dashboard d({});
  EXPECT_NE(get(d.port(), "/timeline.svg").find("HTTP/1.1 404"), std::string::npos);
  EXPECT_NE(get(d.port(), "/api/timeline").find("HTTP/1.1 404"), std::string::npos);
  EXPECT_NE(d.run_json().find("\"timeline\":0"), std::string::npos);
  d.set_timeline("<svg>first</svg>", "{\"step\":1}");
  d.set_timeline("<svg>second</svg>", "{\"step\":2}");
  const auto svg = get(d.port(), "/timeline.svg?n=2");
  EXPECT_NE(svg.find("HTTP/1.1 200"), std::string::npos) << svg;
  EXPECT_NE(svg.find("image/svg+xml"), std::string::npos);
  EXPECT_NE(svg.find("<svg>second</svg>"), std::string::npos);
  const auto data = get(d.port(), "/api/timeline");
  EXPECT_NE(data.find("application/json"), std::string::npos);
  EXPECT_NE(data.find("{\"step\":2}"), std::string::npos) << data;
  EXPECT_NE(d.run_json().find("\"timeline\":2"), std::string::npos);  // the page reloads the drawing on a change
}

TEST(Dashboard, OpenPagesGetTheStateWhenItChanges) {
  troupe::dashboard_config cfg;
  cfg.update_every = 20ms;
  troupe::dashboard d(cfg);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(d.port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /events HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  auto read_until = [&](const std::string& what) {
    while (got.find(what) == std::string::npos) {
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got.find(what) != std::string::npos;
  };
  EXPECT_TRUE(read_until("\"version\":0")) << got;
  d.add_point("loss", "train", 3, 0.125, "step", "loss");
  EXPECT_TRUE(read_until("[[3,0.125]]")) << got;
  ::close(fd);
}

TEST(Dashboard, ActorFailuresBecomeEventsOnceAndCountPerType) {
  troupe::dashboard d({});
  auto c = a_cluster();
  c[1].actors[0].restarts = 2;
  c[1].failures_by_type = {{"kv_store", 2, 1}};
  c[1].recent_failures = {{1, 0, 21, "kv_store", true, 1, "disk full"},
                          {2, 1000, 21, "kv_store", true, 2, "disk full"},
                          {3, 2000, 22, "kv_store", false, 0, hostile}};
  d.set_cluster(c);
  d.set_cluster(c);  // the same failures again: no new events
  auto s = d.state_json();
  auto count = [&](const std::string& part) {
    std::size_t n = 0;
    for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("actor 21 (kv_store) on node 2 failed: disk full; restart 1"), 1u) << s;
  EXPECT_EQ(count("actor 21 (kv_store) on node 2 failed: disk full; restart 2"), 1u) << s;
  EXPECT_EQ(count("actor 22 (kv_store) on node 2 failed: <img"), 0u);  // escaped in JSON
  EXPECT_EQ(count("actor 22 (kv_store) on node 2 failed: \\u003cimg src=x onerror=alert(1)\\u003e; no restart left, it stopped"), 1u) << s;
  EXPECT_NE(s.find("{\"type\":\"kv_store\",\"count\":2,"), std::string::npos) << s;
  EXPECT_NE(s.find("\"restarts\":2,\"failed\":1}"), std::string::npos) << s;
  // The node starts again: its failures count from 1 and are new.
  c[1].recent_failures = {{1, 5000, 23, "kv_store", true, 1, "after the restart"}};
  d.set_cluster(c);
  s = d.state_json();
  EXPECT_EQ(count("actor 23 (kv_store) on node 2 failed: after the restart; restart 1"), 1u) << s;
  bool found = false;
  for (auto& m : parse_prometheus(d.metrics()))
    if (m.name == "troupe_actor_restarts_total" && m.labels["type"] == "kv_store") {
      found = true;
      EXPECT_EQ(m.value, 2);
    }
  EXPECT_TRUE(found);
}

namespace dashboard_test {

/// An actor that fails when told to.
struct crashing {
  int calls = 0;
  void crash() { throw std::runtime_error("told to crash"); }
  int ping() { return ++calls; }
};

}  // namespace dashboard_test

// A real head: an actor fails under a restart policy (twice) and another without one; the head's
// status report carries them to a dashboard that watches it, which shows them on /api/actors,
// /metrics and in its events.
TEST(Dashboard, RestartsOfAnActorOnAWatchedHeadReachApiActorsAndMetrics) {
  using dashboard_test::crashing;
  const std::string token = "dashboard-test-secret";
  troupe::system_config sc{.threads = 2};
  sc.node.listen = "127.0.0.1:0";
  sc.node.token = token;
  troupe::actor_system head(sc);
  auto supervised = head.spawn<crashing>(troupe::spawn_options{.restart = {.max_restarts = 5}});
  auto unsupervised = head.spawn<crashing>();
  supervised.tell(&crashing::crash);
  supervised.tell(&crashing::crash);
  EXPECT_EQ(supervised.ask(&crashing::ping).get(), 1);  // a new object after each failure
  auto down = head.monitor(unsupervised);
  unsupervised.tell(&crashing::crash);
  EXPECT_EQ(down.get().reason, troupe::exit_reason::failed);
  EXPECT_EQ(head.stats(supervised).restarts, 2u);

  troupe::dashboard d({});
  d.watch_cluster("127.0.0.1:" + std::to_string(head.node_port()), token, 50ms);
  std::string actors;
  for (int i = 0; i < 200 && actors.find("\"restarts\":2") == std::string::npos; ++i) {
    std::this_thread::sleep_for(25ms);
    actors = get(d.port(), "/api/actors");
  }
  const auto body = actors.substr(actors.find("\r\n\r\n") + 4);
  const std::string id = std::to_string(supervised.id());
  EXPECT_NE(body.find("{\"node\":1,\"id\":" + id + ",\"type\":\"dashboard_test::crashing\",\"name\":\"\",\"mailbox_depth\":0,"),
            std::string::npos) << body;
  EXPECT_NE(body.find("\"restarts\":2}"), std::string::npos) << body;
  EXPECT_NE(body.find("{\"type\":\"dashboard_test::crashing\",\"count\":1,"), std::string::npos) << body;
  EXPECT_NE(body.find(",\"restarts\":2,\"failed\":1}"), std::string::npos) << body;
  EXPECT_NE(body.find("\"failures\":[{\"node\":1,"), std::string::npos) << body;
  EXPECT_NE(body.find("\"restarted\":true,\"restarts\":2,\"what\":\"told to crash\"}"), std::string::npos) << body;
  EXPECT_NE(body.find("\"restarted\":false,\"restarts\":0,\"what\":\"told to crash\"}"), std::string::npos) << body;

  const auto metrics = get(d.port(), "/metrics");
  std::map<std::string, double> seen;
  for (auto& m : parse_prometheus(metrics.substr(metrics.find("\r\n\r\n") + 4))) {
    if (m.name == "troupe_actor_restarts_total" || m.name == "troupe_actor_failures_total")
      seen[m.name + "{" + m.labels["type"] + "}"] = m.value;
    if (m.name == "troupe_actor_restarts" && m.labels["id"] == id) seen["actor " + id] = m.value;
  }
  EXPECT_EQ(seen["troupe_actor_restarts_total{dashboard_test::crashing}"], 2) << metrics;
  EXPECT_EQ(seen["troupe_actor_failures_total{dashboard_test::crashing}"], 1) << metrics;
  EXPECT_EQ(seen["actor " + id], 2) << metrics;
  const auto state = d.state_json();
  EXPECT_NE(state.find("actor " + id + " (dashboard_test::crashing) on node 1 failed: told to crash; restart 2"), std::string::npos)
      << state;
  EXPECT_NE(state.find("failed: told to crash; no restart left, it stopped"), std::string::npos) << state;
}

TEST(Dashboard, TablesKeepTheirLatestRowsFirstAndRefuseAnotherWidth) {
  troupe::dashboard d({});
  const std::vector<std::string> columns{"round", "clients", "ids"};
  for (int r = 1; r <= 5; ++r) d.add_row("sampled clients", columns, {std::to_string(r), "2", std::to_string(r) + " " + hostile}, 3);
  const auto run = d.run_json();
  EXPECT_NE(run.find("\"tables\":[{\"title\":\"sampled clients\",\"columns\":[\"round\",\"clients\",\"ids\"],\"rows\":[[\"5\",\"2\","
                     "\"5 \\u003cimg src=x onerror=alert(1)\\u003e\"],[\"4\","),
            std::string::npos)
      << run;
  EXPECT_EQ(run.find("[\"2\",\"2\""), std::string::npos) << "only the last 3 rows are kept: " << run;
  EXPECT_NE(run.find("[\"3\",\"2\""), std::string::npos) << run;
  EXPECT_THROW(d.add_row("sampled clients", columns, {"6", "2"}), std::invalid_argument);
  EXPECT_THROW(d.add_row("sampled clients", {"round", "clients"}, {"6", "2"}), std::invalid_argument);
  EXPECT_THROW(d.add_row("other", columns, {"1", "2", "3"}, 0), std::invalid_argument);
}
