#pragma once
// The workloads of `troupe bench remote`: two processes on loopback. Raw TCP ping-pong is the
// anchor; remote actor calls (one at a time, pipelined, bulk), remote spawns and failover to
// another node are measured against it.

#include <iosfwd>
#include <string>

namespace troupe::bench {

struct remote_options {
  bool json = false;
  bool quick = false;
  std::string only;  ///< run one workload
  std::string peer;  ///< hidden: run as the peer process, connecting to "host:raw_port:net_port"
};

/// The workload names, in the order they run.
const char* const* remote_bench_names();

/// Runs the remote suite (starting the peer process itself) and prints one line per metric.
/// Returns 0, or 1 when a workload failed or its result was wrong, 2 for an unknown workload.
int run_remote(const remote_options& opts, std::ostream& out);

/// The peer's side: echoes raw ping-pongs and answers calls until the parent closes.
int run_remote_peer(const remote_options& opts);

}  // namespace troupe::bench
