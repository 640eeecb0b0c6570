// A float32 sum all-reduce across processes on this host: this process is the head and holds
// ring member 0; it starts p-1 copies of itself as worker nodes, one ring member each. Each
// process makes its own input (as each torch process does), so the clock covers the all-reduce
// alone: from the call on every member to the last member's result. Prints one JSON object per
// repetition and checks every 997th element of every member's result against the plain sum.
// torch_allreduce.py is the same measurement with torch.distributed and the gloo backend.
//
//   allreduce_bench [--processes 4] [--megabytes 100] [--repeat 5] [--segment 65536] [--threads 2]
//   allreduce_bench --worker HEAD:PORT [--threads 2]     (what the head starts)

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/collective.hpp"

extern char** environ;

/// The process's side of the measurement: its input, made here, and the call on its ring member
/// (on the same node, so the vector moves instead of crossing the wire).
class allreduce_peer {
public:
  /// Makes this process's input, x_i = (7 i + 13 rank) mod 101, for `member`.
  void setup(troupe::actor_ref<troupe::ring_member> member, std::uint32_t rank, std::uint64_t n) {
    member_ = std::move(member);
    x_.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) x_[i] = static_cast<float>((i * 7 + rank * 13) % 101);
  }
  /// Copies the input for the next run (the call moves its vector) and frees the last result:
  /// before the clock starts (as torch's tensor lives on after its all_reduce).
  void prepare() {
    sum_ = {};
    in_ = x_;
  }
  /// The all-reduce of the prepared input; every 997th element of the result.
  troupe::task<std::vector<float>> run() {
    sum_ = co_await member_.ask(&troupe::ring_member::allreduce, std::move(in_), troupe::reduce_op::sum);
    std::vector<float> samples;
    for (std::size_t i = 0; i < sum_.size(); i += 997) samples.push_back(sum_[i]);
    co_return samples;
  }

private:
  troupe::actor_ref<troupe::ring_member> member_;
  std::vector<float> x_, in_, sum_;
};

TROUPE_REMOTE(allreduce_peer, setup, prepare, run)

namespace {

constexpr const char* token = "allreduce-bench";

int run_worker(const std::string& head, unsigned threads) {
  troupe::system_config cfg{.threads = threads};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.head = head;
  cfg.node.token = token;
  cfg.node.node_timeout = std::chrono::seconds(10);  // a loaded host (shared cores) may delay heartbeats
  troupe::actor_system sys(cfg);
  std::printf("%u\n", sys.node());
  std::fflush(stdout);
  char buf[64];
  while (std::fread(buf, 1, sizeof buf, stdin) > 0) {
  }
  return 0;
}

struct worker_process {
  pid_t pid = -1;
  int out = -1, in = -1;
  troupe::node_id node = 0;
};

worker_process start_worker(const std::string& head, unsigned threads) {
  int out[2], in[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string(), flag = "--worker", h = head,
              tflag = "--threads", t = std::to_string(threads);
  char* argv[] = {self.data(), flag.data(), h.data(), tflag.data(), t.data(), nullptr};
  worker_process w;
  if (posix_spawn(&w.pid, self.c_str(), &fa, nullptr, argv, environ) != 0) throw std::runtime_error("cannot start " + self);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(in[0]);
  w.out = out[0];
  w.in = in[1];
  std::string line;
  char c;
  while (read(w.out, &c, 1) == 1 && c != '\n') line += c;
  if (line.empty()) throw std::runtime_error("a worker node did not join");
  w.node = static_cast<troupe::node_id>(std::stoul(line));
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t processes = 4, megabytes = 100, segment = 1 << 16, threads = 2;
  int repeat = 5;
  std::string worker_of;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "allreduce_bench: %s needs a value\n", f.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    try {
      if (f == "--worker") worker_of = v;
      else if (f == "--threads") threads = std::stoul(v);
      else if (f == "--processes") processes = std::stoul(v);
      else if (f == "--megabytes") megabytes = std::stoul(v);
      else if (f == "--repeat") repeat = std::stoi(v);
      else if (f == "--segment") segment = std::stoul(v);
      else {
        std::fprintf(stderr, "allreduce_bench: unknown flag %s\n", f.c_str());
        return 2;
      }
    } catch (const std::logic_error&) {  // std::invalid_argument, std::out_of_range
      std::fprintf(stderr, "allreduce_bench: %s needs a number, not '%s'\n", f.c_str(), v.c_str());
      return 2;
    }
  }
  if (processes < 2 || megabytes < 1 || repeat < 1 || segment < 1 || threads < 1 || threads > 64) {
    std::fprintf(stderr, "allreduce_bench: --processes >= 2, --megabytes, --repeat and --segment >= 1, --threads 1 to 64\n");
    return 2;
  }
  if (!worker_of.empty()) return run_worker(worker_of, static_cast<unsigned>(threads));
  troupe::system_config cfg{.threads = static_cast<unsigned>(threads)};
  cfg.node.listen = "127.0.0.1:0";
  cfg.node.token = token;
  cfg.node.node_timeout = std::chrono::seconds(10);
  troupe::actor_system head(cfg);
  const std::string address = "127.0.0.1:" + std::to_string(head.node_port());
  std::vector<worker_process> workers;
  for (std::size_t i = 1; i < processes; ++i) workers.push_back(start_worker(address, static_cast<unsigned>(threads)));
  std::vector<troupe::actor_ref<troupe::ring_member>> ring{head.spawn<troupe::ring_member>(troupe::ring_member_options())};
  std::vector<troupe::actor_ref<allreduce_peer>> peers{head.spawn<allreduce_peer>()};
  for (auto& w : workers) {
    ring.push_back(head.spawn_on<troupe::ring_member>(w.node, troupe::ring_member_options()));
    peers.push_back(head.spawn_on<allreduce_peer>(w.node));
  }
  troupe::form_ring(ring, {.segment_elements = segment, .timeout = std::chrono::seconds(600)});
  const std::size_t n = megabytes * 1'000'000 / sizeof(float);
  std::vector<troupe::future<void>> ready;
  for (std::size_t r = 0; r < processes; ++r)
    ready.push_back(peers[r].ask(&allreduce_peer::setup, ring[r], static_cast<std::uint32_t>(r), std::uint64_t{n}));
  for (auto& f : ready) f.get();
  int failures = 0;
  for (int rep = 0; rep < repeat; ++rep) {
    ready.clear();
    for (auto& p : peers) ready.push_back(p.ask(&allreduce_peer::prepare));
    for (auto& f : ready) f.get();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<troupe::future<std::vector<float>>> f;
    for (auto& p : peers) f.push_back(p.ask(&allreduce_peer::run));
    std::vector<std::vector<float>> out;
    for (auto& fu : f) out.push_back(fu.get());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bool ok = true;
    for (std::size_t i = 0, k = 0; i < n && ok; i += 997, ++k) {
      float sum = 0;
      for (std::size_t r = 0; r < processes; ++r) sum += static_cast<float>((i * 7 + r * 13) % 101);
      for (auto& o : out) ok = ok && k < o.size() && o[k] == sum;
    }
    failures += !ok;
    std::printf("{\"impl\":\"troupe\",\"processes\":%zu,\"megabytes\":%zu,\"segment\":%zu,\"seconds\":%.4f,"
                "\"algbw_gb_s\":%.3f,\"correct\":%s}\n",
                processes, megabytes, segment, s, static_cast<double>(n * sizeof(float)) / s / 1e9, ok ? "true" : "false");
    std::fflush(stdout);
  }
  for (auto& w : workers) {
    close(w.in);
    waitpid(w.pid, nullptr, 0);
    close(w.out);
  }
  return failures == 0 ? 0 : 1;
}
