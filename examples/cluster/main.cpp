// A small cluster: a head node, worker nodes, and a driver that spawns actors on the workers
// and calls them exactly as it would call local ones. examples/cluster/run.sh starts it all on
// one machine; on real machines, start the same roles on each (see the README).
//
//   example_cluster head                       the head: membership and the names
//   example_cluster worker --head HOST:P       a worker node (runs until SIGINT/SIGTERM)
//   example_cluster driver --head HOST:P       joins, works, cleans up, leaves
//
// Every role takes --listen ADDRESS, the interface it accepts connections on: 127.0.0.1 (the
// default) keeps the cluster on this machine, 0.0.0.0 or the machine's own address lets other
// machines reach it; and --port P, the port it listens on (0, the default: any free one).
// Every node needs the cluster's token: --token T, or TROUPE_CLUSTER_TOKEN.

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <troupe/actors/remote.hpp>

// ---- the actors: plain classes, declared remote once -------------------------------------

/// A key-value store, named "kv" cluster-wide so that any node finds it.
class kv_store {
public:
  void put(std::string key, std::int64_t value) { data_[std::move(key)] = value; }
  std::optional<std::int64_t> get(const std::string& key) const {
    auto it = data_.find(key);
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }
  std::uint64_t size() const { return data_.size(); }

private:
  std::map<std::string, std::int64_t> data_;
};

/// Counts words and says where it runs.
class word_counter {
public:
  std::int64_t count(const std::string& text) const {
    std::istringstream in(text);
    std::int64_t n = 0;
    for (std::string w; in >> w;) ++n;
    return n;
  }
  std::int64_t pid() const { return ::getpid(); }
};

TROUPE_REMOTE(kv_store, put, get, size)
TROUPE_REMOTE(word_counter, count, pid)

namespace {

std::atomic<bool> stop_requested{false};
extern "C" void on_signal(int) { stop_requested.store(true); }

struct options {
  std::string head;  // empty: this node is the head
  std::string listen = "127.0.0.1";
  unsigned port = 0;
  std::string token;  // empty: TROUPE_CLUSTER_TOKEN
};

troupe::system_config node_config(const options& o) {
  troupe::system_config cfg{.threads = 2};
  cfg.node.listen = o.listen + ":" + std::to_string(o.port);
  cfg.node.head = o.head;
  cfg.node.token = o.token;
  return cfg;
}

int run_node(const options& o) {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  auto cfg = node_config(o);
  if (!o.head.empty()) cfg.node.labels = {"worker"};  // what drivers look for
  troupe::run_node(cfg, [] { return stop_requested.load(); });
  return 0;
}

int run_driver(const options& o) {
  troupe::actor_system sys(node_config(o));
  std::printf("driver: joined as node %u\n", sys.node());

  // Wait until two workers have joined: the nodes labelled "worker" (a driver, the head or
  // another driver is none).
  std::vector<troupe::node_id> workers;
  for (int i = 0; i < 100 && workers.size() < 2; ++i) {
    workers.clear();
    for (auto& n : troupe::cluster_status(o.head, o.token))
      if (n.info.alive && std::ranges::count(n.info.labels, "worker") && workers.size() < 2) workers.push_back(n.info.id);
    if (workers.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (workers.size() < 2) {
    std::fprintf(stderr, "driver: the two workers did not join\n");
    return 1;
  }

  // What the driver makes on the workers lives as long as the driver: when it leaves, their
  // nodes stop it (the name "kv" goes with its actor), so the driver can run again against the
  // same nodes.
  // A store on the first worker, named so that every node can find it.
  auto store = sys.spawn_on<kv_store>(workers[0]);
  sys.register_name("kv", store);

  // One counter per worker; the same calls as in process.
  const std::vector<std::string> texts = {"the quick brown fox", "jumps over the lazy dog",
                                          "actors on other machines", "answer like local ones"};
  std::vector<troupe::actor_ref<word_counter>> counters;
  for (auto w : workers) counters.push_back(sys.spawn_on<word_counter>(w));
  std::vector<troupe::future<std::int64_t>> counts;
  for (std::size_t i = 0; i < texts.size(); ++i)
    counts.push_back(counters[i % counters.size()].ask(&word_counter::count, texts[i]));
  std::int64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    auto n = counts[i].get();
    std::printf("driver: node %u counted %lld words in \"%s\"\n", counters[i % counters.size()].node(),
                static_cast<long long>(n), texts[i].c_str());
    store.tell(&kv_store::put, texts[i], n);
    total += n;
  }
  for (auto& c : counters)
    std::printf("driver: a counter runs in process %lld on node %u (the driver is process %d)\n",
                static_cast<long long>(c.ask(&word_counter::pid).get()), c.node(), ::getpid());

  // Any node finds the store by name.
  auto found = sys.lookup<kv_store>("kv");
  if (!found) {
    std::fprintf(stderr, "driver: the name kv is unknown\n");
    return 1;
  }
  auto stored = found->ask(&kv_store::size).get();
  auto fox = found->ask(&kv_store::get, "the quick brown fox").get();
  std::printf("driver: the store holds %llu entries; \"the quick brown fox\" -> %lld; %lld words in all\n",
              static_cast<unsigned long long>(stored), static_cast<long long>(fox.value_or(-1)),
              static_cast<long long>(total));
  bool ok = stored == texts.size() && fox == 4 && total == 17;
  std::printf("driver: %s\n", ok ? "all answers check out" : "WRONG ANSWERS");
  return ok ? 0 : 1;
}

}  // namespace

const char* const usage =
    "usage: example_cluster head | worker --head HOST:P | driver --head HOST:P\n"
    "       each role also takes --listen ADDRESS (127.0.0.1 by default, 0.0.0.0 to be reachable from\n"
    "       other machines), --port P (0 by default: any free port) and --token T (by default\n"
    "       TROUPE_CLUSTER_TOKEN)\n"
    "(examples/cluster/run.sh BIN_DIR starts a head, two workers and the driver)\n";

int main(int argc, char** argv) {
  std::string role = argc > 1 ? argv[1] : "";
  if (role == "--help" || role == "-h") return std::fputs(usage, stdout), 0;
  options o;
  for (int i = 2; i < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return std::fputs(usage, stdout), 0;
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", argv[i]);
      return 2;
    }
    std::string value = argv[i + 1];
    if (flag == "--head") {
      o.head = value;
    } else if (flag == "--listen") {
      o.listen = value;
    } else if (flag == "--token") {
      o.token = value;
    } else if (flag == "--port") {
      char* end = nullptr;
      const unsigned long p = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || p > 65535) {
        std::fprintf(stderr, "--port %s: not a port number (0-65535)\n", value.c_str());
        return 2;
      }
      o.port = static_cast<unsigned>(p);
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", argv[i], usage);
      return 2;
    }
  }
  if (role == "head" && !o.head.empty()) {
    std::fprintf(stderr, "example_cluster head: the head joins no other (--head %s)\n", o.head.c_str());
    return 2;
  }
  try {
    if (role == "head") return run_node(o);
    if (role == "worker" && !o.head.empty()) return run_node(o);
    if (role == "driver" && !o.head.empty()) return run_driver(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_cluster %s: %s\n", role.c_str(), e.what());
    return 1;
  }
  std::fputs(usage, stderr);
  return 2;
}
