# Shared by the tests that run troupe nodes as processes (tests/actors/node_cli.sh,
# tests/pipeline/pipeline_nodes.sh). Set `name` (the prefix of failures), then source this:
# it makes $dir, kills every pid in $pids on exit, and defines fail, wait_for and start_head.

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

fail() { echo "$name: $*" >&2; exit 1; }
wait_for() {  # FILE PATTERN
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  fail "no '$2' in $1: $(cat "$1" 2>/dev/null)"
}

# start_head TROUPE [ARGS...]: a head node on a free loopback port (output in $dir/head); sets $port.
start_head() {
  "$1" node start --head --host 127.0.0.1 --port 0 --threads 1 "${@:2}" >"$dir/head" 2>"$dir/head.err" &
  pids+=($!)
  wait_for "$dir/head" '"port"'
  port=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' "$dir/head")
}
