// troupe node start / troupe status: run a cluster node, and ask the head what runs where.

#include <dlfcn.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "dashboard_option.hpp"
#include "troupe/actors/remote.hpp"

namespace troupe::cli {

namespace {

std::atomic<bool> stop_signal{false};
extern "C" void on_stop_signal(int) { stop_signal.store(true); }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", c);
    else out += c;
  }
  return out + "\"";
}

struct node_args {
  bool head = false;
  std::string host = "0.0.0.0";
  unsigned port = 0;
  std::string address;
  std::string advertise;
  std::string token;
  unsigned threads = 0;
  unsigned heartbeat_ms = 100;
  unsigned timeout_ms = 800;
  std::vector<std::string> libraries;
  std::vector<std::string> labels;
  std::string tls_certificate, tls_private_key, tls_ca;
  dashboard_flags dashboard;
};

int start_node(const node_args& a) {
  if (a.head == !a.address.empty()) {
    std::cerr << "troupe node start: give either --head or --address HOST:PORT of the head\n";
    return 1;
  }
  // The library's own checks name its config fields; the flags are checked here in their names.
  const char* env_token = std::getenv("TROUPE_CLUSTER_TOKEN");
  if (a.token.empty() && (env_token == nullptr || *env_token == '\0')) {
    std::cerr << "troupe node start: give the cluster's shared secret with --token or TROUPE_CLUSTER_TOKEN\n";
    return 1;
  }
  if (a.heartbeat_ms >= a.timeout_ms) {
    std::cerr << "troupe node start: --heartbeat-ms " << a.heartbeat_ms << " must be below --node-timeout-ms "
              << a.timeout_ms << "\n";
    return 1;
  }
  if (!a.dashboard.where.empty() && !a.head) {
    std::cerr << "troupe node start: --dashboard serves the cluster's dashboard from the head: give it with --head\n";
    return 1;
  }
  // Libraries declare the classes (TROUPE_REMOTE) this node can host.
  for (auto& lib : a.libraries) {
    if (!dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      std::cerr << "troupe node start: cannot load " << lib << ": " << dlerror() << "\n";
      return 1;
    }
  }
  system_config cfg;
  cfg.threads = a.threads;
  cfg.node.listen = a.host + ":" + std::to_string(a.port);
  cfg.node.head = a.address;
  cfg.node.advertise = a.advertise;
  cfg.node.token = a.token;
  cfg.node.labels = a.labels;
  cfg.node.heartbeat = std::chrono::milliseconds(a.heartbeat_ms);
  cfg.node.node_timeout = std::chrono::milliseconds(a.timeout_ms);
  cfg.node.tls_certificate = a.tls_certificate;
  cfg.node.tls_private_key = a.tls_private_key;
  cfg.node.tls_ca = a.tls_ca;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  try {
    if (a.dashboard.where.empty()) {
      run_node(cfg, [] { return stop_signal.load(); });
    } else {
      // The head with its dashboard: run_node's loop (a head has no head to lose), and the
      // dashboard asks this head for the status as `troupe status` does, with the cluster's
      // token, which it also requires of its visitors.
      const std::string token = a.token.empty() ? std::string(env_token) : a.token;
      actor_system sys(cfg);
      auto board = open_dashboard(a.dashboard, token, "troupe cluster");
      const std::string host = a.host == "0.0.0.0" || a.host == "::" ? "127.0.0.1" : a.host;
      board->watch_cluster(host + ":" + std::to_string(sys.node_port()), token);
      std::printf("{\"node\":%u,\"port\":%u}\n", static_cast<unsigned>(sys.node()), static_cast<unsigned>(sys.node_port()));
      std::fflush(stdout);
      while (!stop_signal.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe node start: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int show_status(const std::string& address, const std::string& token, bool json) {
  quiet_info_logs();
  std::vector<node_status> nodes;
  try {
    nodes = cluster_status(address, token);
  } catch (const std::exception& e) {
    std::cerr << "troupe status: " << e.what() << "\n";
    return 1;
  }
  if (json) {
    std::string out = "{\"nodes\":[";
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      auto& n = nodes[i];
      std::string labels;
      for (auto& l : n.info.labels) labels += (labels.empty() ? "" : ",") + json_string(l);
      out += fmt::format("{}{{\"node\":{},\"address\":{},\"alive\":{},\"labels\":[{}],\"live_actors\":{},\"dead_letters\":{},",
                         i ? "," : "", n.info.id, json_string(n.info.host + ":" + std::to_string(n.info.port)),
                         n.info.alive ? "true" : "false", labels, n.info.actors, n.dead_letters);
      if (!n.problem.empty()) out += "\"problem\":" + json_string(n.problem) + ",";
      out += "\"actors\":[";
      for (std::size_t j = 0; j < n.actors.size(); ++j) {
        auto& x = n.actors[j];
        out += fmt::format("{}{{\"id\":{},\"type\":{},\"name\":{},\"mailbox_depth\":{},\"messages\":{},\"messages_per_s\":{:.1f},\"wire_id\":{},\"restarts\":{}}}",
                           j ? "," : "", x.id, json_string(x.type), json_string(x.name), x.mailbox_depth, x.messages,
                           x.messages_per_s, x.wire, x.restarts);
      }
      out += "],\"failures_by_type\":[";
      for (std::size_t j = 0; j < n.failures_by_type.size(); ++j) {
        auto& t = n.failures_by_type[j];
        out += fmt::format("{}{{\"type\":{},\"restarts\":{},\"failed\":{}}}", j ? "," : "", json_string(t.type), t.restarts,
                           t.failed);
      }
      out += "],\"recent_failures\":[";
      for (std::size_t j = 0; j < n.recent_failures.size(); ++j) {
        auto& f = n.recent_failures[j];
        out += fmt::format("{}{{\"seq\":{},\"unix_ms\":{},\"actor\":{},\"type\":{},\"restarted\":{},\"restarts\":{},\"what\":{}}}",
                           j ? "," : "", f.seq, f.unix_ms, f.actor, json_string(f.type), f.restarted ? "true" : "false",
                           f.restarts, json_string(f.what));
      }
      out += "]}";
    }
    std::cout << out << "]}\n";
    return 0;
  }
  for (auto& n : nodes) {
    std::string labels;
    for (auto& l : n.info.labels) labels += (labels.empty() ? "  labels " : ",") + l;
    std::cout << fmt::format("node {} {}:{} {}  actors {}  dead letters {}{}{}\n", n.info.id, n.info.host, n.info.port,
                             n.info.alive ? "alive" : "LOST", n.info.actors, n.dead_letters, labels,
                             n.problem.empty() ? "" : "  (" + n.problem + ")");
    if (!n.actors.empty())
      std::cout << fmt::format("  {:>8}  {:<32} {:<16} {:>8} {:>12} {:>10} {:>8}\n", "id", "type", "name", "mailbox",
                               "messages", "msg/s", "restarts");
    for (auto& x : n.actors)
      std::cout << fmt::format("  {:>8}  {:<32} {:<16} {:>8} {:>12} {:>10.1f} {:>8}\n", x.id, x.type, x.name,
                               x.mailbox_depth, x.messages, x.messages_per_s, x.restarts);
    for (auto& t : n.failures_by_type)
      std::cout << fmt::format("  failures of {}: {} restarted, {} stopped\n", t.type, t.restarts, t.failed);
  }
  return 0;
}

}  // namespace

void add_node_command(CLI::App& app, int& rc) {
  auto* node = app.add_subcommand("node", "run a node of a troupe cluster");
  node->require_subcommand(1);
  auto a = std::make_shared<node_args>();
  auto* start = node->add_subcommand(
      "start", "start a node: the head (--head) or one that joins it (--address); runs until SIGINT/SIGTERM");
  start->add_flag("--head", a->head, "this node is the head (membership and names)");
  start->add_option("--address", a->address, "HOST:PORT of the head to join");
  start->add_option("--host", a->host, "address to listen on")->capture_default_str();
  start->add_option("--port", a->port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0u, 65535u))->capture_default_str();
  start->add_option("--advertise", a->advertise, "host other nodes dial to reach this one");
  start->add_option("--token", a->token, "the cluster's shared secret (default: $TROUPE_CLUSTER_TOKEN)");
  start->add_option("--threads", a->threads, "worker threads (0: one per hardware thread)")->check(CLI::Range(0, 4096));
  start->add_option("--heartbeat-ms", a->heartbeat_ms, "heartbeat period")->check(CLI::Range(1u, 60'000u))
      ->capture_default_str();
  start->add_option("--node-timeout-ms", a->timeout_ms, "silence after which a node is lost")
      ->check(CLI::Range(2u, 600'000u))->capture_default_str();
  start->add_option("--label", a->labels, "a tag shown in the status, e.g. worker or gpu (repeatable)");
  start->add_option("--load", a->libraries, "a shared library with TROUPE_REMOTE classes (repeatable)");
  start->add_option("--tls-cert", a->tls_certificate, "PEM certificate: TLS on every connection (default: $TROUPE_TLS_CERTIFICATE)");
  start->add_option("--tls-key", a->tls_private_key, "PEM private key of the certificate (default: $TROUPE_TLS_PRIVATE_KEY)");
  start->add_option("--tls-ca", a->tls_ca, "PEM CA file peers' certificates must chain to (default: $TROUPE_TLS_CA)");
  add_dashboard_options(start, a->dashboard, true);
  start->callback([a, &rc] { rc = start_node(*a); });

  auto address = std::make_shared<std::string>();
  auto token = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* status = app.add_subcommand("status", "list a cluster's nodes and actors (asks the head)");
  status->add_option("--address", *address, "HOST:PORT of the head")->required();
  status->add_option("--token", *token, "the cluster's shared secret (default: $TROUPE_CLUSTER_TOKEN)");
  status->add_flag("--json", *json, "one JSON object");
  status->callback([address, token, json, &rc] { rc = show_status(*address, *token, *json); });
}

}  // namespace troupe::cli
