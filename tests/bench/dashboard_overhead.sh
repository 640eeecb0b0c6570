#!/usr/bin/env bash
# What an open dashboard costs what it watches (docs/PERFORMANCE.md): runs alternate with and
# without it, and a poller that asks it for /api/state and /metrics every 100 ms while it is on.
#
#   fedsim: `troupe fedsim` (defaults, ROUNDS rounds) with `--dashboard 0` and the poller on its
#           dashboard, against the same run without; the figure is rounds per second (--json).
#   actors: `troupe bench actors --only ONLY` beside a head node started with `--dashboard 0` and
#           the poller on it (the head asks itself for the status every second), against the
#           same bench beside a head without; the figure is the bench's first value.
#
#   tests/bench/dashboard_overhead.sh PATH/TO/troupe [REPEAT=3] [ROUNDS=20] [ONLY=ping_pong]
# Prints one line per run and the medians.
set -euo pipefail
troupe=$(realpath "${1:?usage: $0 PATH/TO/troupe [REPEAT] [ROUNDS] [ONLY]}")
repeat=${2:-3}
rounds=${3:-20}
only=${4:-ping_pong}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export TROUPE_LOG_LEVEL=warn TROUPE_CLUSTER_TOKEN=overhead-token

poll() {  # URL TOKEN: /api/state and /metrics every 100 ms on one kept-alive connection, as a page would
  exec python3 - "$1" "$2" <<'PY'
import http.client, sys, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
headers = {"Authorization": "Bearer " + sys.argv[2]} if sys.argv[2] else {}
conn = None
while True:
    try:
        conn = conn or http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        for path in ("/api/state", "/metrics"):
            conn.request("GET", path, headers=headers)
            conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        conn = None
    time.sleep(0.1)
PY
}

dashboard_url() {  # STDERR-FILE: waits for the dashboard's line
  for _ in $(seq 600); do
    if grep -q '^dashboard: http' "$1" 2>/dev/null; then sed -n "s/^dashboard: \(http[^ ]*\)\/.*/\1/p" "$1"; return; fi
    sleep 0.05
  done
  echo "no dashboard line in $1" >&2
  exit 1
}

fedsim_run() {  # with|without -> rounds per second
  local err="$work/fedsim.err" poller=""
  rm -f "$err"
  if [[ $1 == with ]]; then
    "$troupe" fedsim --rounds "$rounds" --json --dashboard 0 >"$work/fedsim.out" 2>"$err" &
    local run=$!
    poll "$(dashboard_url "$err")" "" &
    poller=$!
    wait "$run"
    kill "$poller"
    wait "$poller" 2>/dev/null || true
  else
    "$troupe" fedsim --rounds "$rounds" --json >"$work/fedsim.out" 2>"$err"
  fi
  tail -1 "$work/fedsim.out" | sed -n 's/.*"rounds_per_s":\([0-9.]*\).*/\1/p'
}

actors_run() {  # with|without -> the bench's first value
  local flags=() poller=""
  [[ $1 == with ]] && flags=(--dashboard 0)
  "$troupe" node start --head --host 127.0.0.1 --port 0 --threads 1 "${flags[@]}" >"$work/head" 2>"$work/head.err" &
  local head=$!
  for _ in $(seq 200); do grep -q '"port"' "$work/head" 2>/dev/null && break; sleep 0.05; done
  if [[ $1 == with ]]; then
    poll "$(dashboard_url "$work/head.err")" "$TROUPE_CLUSTER_TOKEN" &
    poller=$!
  fi
  "$troupe" bench actors --only "$only" --json >"$work/bench.out"
  [[ -n $poller ]] && { kill "$poller"; wait "$poller" 2>/dev/null || true; }
  kill "$head"
  wait "$head" 2>/dev/null || true
  head -1 "$work/bench.out" | sed -n 's/.*"value":\([0-9.e+-]*\).*/\1/p'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for suite in fedsim actors; do
  : >"$work/$suite.with"
  : >"$work/$suite.without"
  for i in $(seq "$repeat"); do
    for mode in without with; do
      v=$("${suite}_run" "$mode")
      echo "$suite $mode run $i: $v  (load $(cut -d' ' -f1 /proc/loadavg))"
      echo "$v" >>"$work/$suite.$mode"
    done
  done
  w=$(median <"$work/$suite.with")
  wo=$(median <"$work/$suite.without")
  echo "$suite median: without $wo, with $w, with/without $(awk -v a="$w" -v b="$wo" 'BEGIN {printf "%.3f", a / b}')"
done
