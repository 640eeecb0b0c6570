#!/usr/bin/env bash
# Starts a head and two worker nodes on this machine, runs the driver twice, and stops the nodes.
#
#   examples/cluster/run.sh BIN_DIR     (BIN_DIR holds example_cluster; `make tour` runs it)
set -euo pipefail
bin=${1:?usage: $0 BIN_DIR}/example_cluster
export TROUPE_CLUSTER_TOKEN=${TROUPE_CLUSTER_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export TROUPE_LOG_LEVEL=${TROUPE_LOG_LEVEL:-warn}
out=$(mktemp -d)
pids=()
cleanup() {
  # Workers first, then the head (a worker that loses its head reports it and exits).
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$out"
}
trap cleanup EXIT

"$bin" head --port 0 >"$out/head" &
pids+=($!)
for _ in $(seq 100); do grep -q '"port"' "$out/head" 2>/dev/null && break; sleep 0.05; done
port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' "$out/head")
[[ -n $port ]] || { echo "the head did not start" >&2; exit 1; }
echo "head: node 1 on 127.0.0.1:$port"
for w in 1 2; do
  "$bin" worker --head "127.0.0.1:$port" >"$out/worker$w" &
  pids+=($!)
  for _ in $(seq 100); do grep -q '"node"' "$out/worker$w" 2>/dev/null && break; sleep 0.05; done
  echo "worker $w: $(cat "$out/worker$w")"
done
"$bin" driver --head "127.0.0.1:$port"
# What a driver made goes with it: a second run finds the nodes as the first did.
"$bin" driver --head "127.0.0.1:$port"
