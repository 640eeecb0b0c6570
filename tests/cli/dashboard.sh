#!/usr/bin/env bash
# The live dashboard of `troupe node start --head --dashboard` and `troupe fedsim --dashboard`:
# a head serves it on loopback with the cluster's token required; a worker joins with a kv store
# named `<img src=x onerror=alert(1)>`; the API and /metrics list both nodes and the name,
# escaped; bad --dashboard flags are refused; a fedsim run shows its curves and its sampled
# clients by id; a pipelined train run shows its last measured step per rank (/api/timeline,
# /timeline.svg), newer ones as it goes. In headless Chromium and in headless Firefox, each where installed, it signs in
# through the login page, waits for the node list and a live update, checks that the name shows as
# text and that nothing ran, and takes a screenshot (Chromium's into $TROUPE_DASHBOARD_SHOT when
# set, the training run's measured step into $TROUPE_TIMELINE_SHOT); a browser that is absent is
# said to be skipped.
#
#   tests/cli/dashboard.sh PATH/TO/troupe PATH/TO/remote_test_node
set -euo pipefail
troupe=$(realpath "${1:?usage: $0 PATH/TO/troupe PATH/TO/remote_test_node}")
worker=$(realpath "${2:?usage: $0 PATH/TO/troupe PATH/TO/remote_test_node}")
here=$(cd "$(dirname "$0")" && pwd)
name=dashboard.sh
source "$here/../nodes_lib.sh"
export TROUPE_CLUSTER_TOKEN=dashboard-test-token
export TROUPE_LOG_LEVEL=warn
hostile='<img src=x onerror=alert(1)>'
auth=(-H "Authorization: Bearer $TROUPE_CLUSTER_TOKEN")

start_head "$troupe" --dashboard 0
wait_for "$dir/head.err" '^dashboard: http'
url=$(sed -n 's/^dashboard: \(http[^ ]*\).*/\1/p' "$dir/head.err")
url=${url%/}
[[ $url == http://127.0.0.1:* ]] || fail "the dashboard does not listen on loopback: $url"

# The worker runs until its standard input closes: this script holds the pipe open.
mkfifo "$dir/worker.in"
exec 3<>"$dir/worker.in"
"$worker" --head "127.0.0.1:$port" --token "$TROUPE_CLUSTER_TOKEN" --name "$hostile" --label worker \
  <"$dir/worker.in" >"$dir/worker" 2>"$dir/worker.err" &
pids+=($!)
wait_for "$dir/worker" '"node":2'

code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[[ $(code "$url/api/state") == 401 ]] || fail "the API answered without the token"
[[ $(code -H "Authorization: Bearer wrong" "$url/metrics") == 401 ]] || fail "the API answered a wrong token"
[[ $(code "$url/login") == 200 ]] || fail "no login page"
[[ $(code "${auth[@]}" "$url/nope") == 404 ]] || fail "an unknown path did not get 404"

# The head's watcher asks for the status every second: wait until both nodes and the name show.
for _ in $(seq 100); do
  curl -s "${auth[@]}" "$url/api/state" >"$dir/state.json"
  grep -q 'onerror' "$dir/state.json" && grep -q '"node":2' "$dir/state.json" && break
  sleep 0.1
done
python3 - "$dir/state.json" "$hostile" <<'PY' || fail "the state is not as expected: $(head -c 3000 "$dir/state.json")"
import json, sys
raw = open(sys.argv[1]).read()
assert "<" not in raw and ">" not in raw, "markup characters in the JSON"
s = json.loads(raw)
assert [n["node"] for n in s["nodes"]] == [1, 2], s["nodes"]
assert all(n["alive"] for n in s["nodes"])
assert s["nodes"][1]["labels"] == ["worker"]
assert any(a["name"] == sys.argv[2] for a in s["actors"]), "the named actor is missing"
assert any(t["count"] >= 1 for t in s["actor_types"])
PY
curl -s "${auth[@]}" "$url/metrics" >"$dir/metrics"
grep -q '^# TYPE troupe_actor_mailbox_depth gauge$' "$dir/metrics" || fail "no mailbox depths in /metrics"
grep -q "^troupe_actor_mailbox_depth{node=\"2\",id=\"[0-9]*\",type=\"[^\"]*\",name=\"$hostile\"} 0$" "$dir/metrics" ||
  fail "/metrics lacks the named actor: $(grep mailbox_depth "$dir/metrics")"
grep -q '^troupe_node_up{node="2",address="127.0.0.1:[0-9]*"} 1$' "$dir/metrics" || fail "/metrics lacks the worker"

# Refusals: a dashboard on a node that is not the head, a bad port, flags that cannot combine.
if "$troupe" node start --address "127.0.0.1:$port" --dashboard 0 >/dev/null 2>"$dir/err"; then fail "a worker served a dashboard"; fi
grep -q -- "--dashboard serves the cluster's dashboard from the head" "$dir/err" || fail "the refusal says: $(cat "$dir/err")"
if timeout 20 "$troupe" fedsim --rounds 1 --dashboard 70000 >/dev/null 2>"$dir/err"; then fail "port 70000 was accepted"; fi
grep -q -- "--dashboard: the port of 70000 is not a number from 0 to 65535" "$dir/err" || fail "the refusal says: $(cat "$dir/err")"
if "$troupe" fedsim --vertical 2 --dashboard 0 >/dev/null 2>"$dir/err"; then fail "--dashboard with --vertical ran"; fi
grep -q -- "--dashboard follows the rounds of a federated run with one server model; it cannot combine with --vertical" "$dir/err" ||
  fail "the refusal says: $(cat "$dir/err")"
if "$troupe" fedsim --dashboard-token x >/dev/null 2>&1; then fail "--dashboard-token without --dashboard ran"; fi

# A federated run's dashboard, read while it runs: the curves per round and their metrics.
TROUPE_DASHBOARD_TOKEN= "$troupe" fedsim --clients 20 --per-round 4 --rounds 100000 --eval-every 2 --dashboard 0 \
  >"$dir/fedsim" 2>"$dir/fedsim.err" &
fedsim=$!
pids+=($fedsim)
wait_for "$dir/fedsim.err" '^dashboard: http'
run_url=$(sed -n 's/^dashboard: \(http[^ ]*\).*/\1/p' "$dir/fedsim.err")
run_url=${run_url%/}
for _ in $(seq 200); do
  curl -s "$run_url/api/run" >"$dir/run.json" || true
  grep -q '"test accuracy per round"' "$dir/run.json" && break
  sleep 0.1
done
python3 - "$dir/run.json" <<'PY' || fail "the run's state is not as expected: $(head -c 2000 "$dir/run.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["kind"] == "troupe fedsim"
titles = [c["title"] for c in r["charts"]]
assert "test accuracy per round" in titles and "clients per round" in titles, titles
sampled = next(s for c in r["charts"] if c["title"] == "clients per round" for s in c["series"] if s["name"] == "sampled")
assert all(p[1] == 4 for p in sampled["points"]), sampled
assert any(f["name"] == "rounds per second" for f in r["figures"])
# The sampled clients by id, the latest round first: 4 distinct clients of the 20 per round.
table = next(t for t in r["tables"] if t["title"] == "sampled clients")
assert table["columns"] == ["round", "clients", "ids"], table["columns"]
rounds = [int(row[0]) for row in table["rows"]]
assert rounds and rounds == sorted(rounds, reverse=True) and len(rounds) <= 20, rounds
for row in table["rows"]:
    ids = [int(i) for i in row[2].split()]
    assert row[1] == "4" and len(ids) == 4 and ids == sorted(set(ids)) and all(0 <= i < 20 for i in ids), row
assert len({row[2] for row in table["rows"]}) > 1, "every round sampled the same clients"
PY
curl -s "$run_url/metrics" | grep -q '^troupe_run_value{chart="test accuracy per round",series="test accuracy"} ' ||
  fail "the run's /metrics lacks its accuracy"
kill "$fedsim"

# A pipelined training run's dashboard: the last measured step, per rank, as data and drawing.
TROUPE_DASHBOARD_TOKEN= "$troupe" train --model mlp:784-32-16-10 --pipeline 1f1b --ranks 2 --microbatches 4 --batch 64 \
  --epochs 100000 --dashboard 0 >"$dir/train" 2>"$dir/train.err" &
train=$!
pids+=($train)
wait_for "$dir/train.err" '^dashboard: http'
train_url=$(sed -n 's/^dashboard: \(http[^ ]*\).*/\1/p' "$dir/train.err")
train_url=${train_url%/}
for _ in $(seq 300); do
  curl -sf "$train_url/api/timeline" >"$dir/timeline.json" && break
  sleep 0.1
done
python3 - "$dir/timeline.json" <<'PY' || fail "the measured timeline is not as expected: $(head -c 2000 "$dir/timeline.json")"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["schedule"] == "1f1b" and t["unit"] == "ns" and t["step"] >= 1, t
assert len(t["ranks"]) == 2, len(t["ranks"])
for rank, row in enumerate(t["ranks"]):
    kinds = [a["kind"] for a in row]
    # 1f1b on 2 ranks with 4 microbatches: every forward and backward of the rank's stage, and the
    # sends and receives between them.
    assert kinds.count("F") == 4 and kinds.count("B") == 4, kinds
    assert kinds.count("SEND_F" if rank == 0 else "RECV_F") == 4, kinds
    assert all(a["stage"] == rank for a in row), row
    for before, after in zip(row, row[1:]):
        assert 0 <= before["start_ns"] <= before["end_ns"] <= after["start_ns"], (before, after)
PY
svg=$(curl -s -w '%{http_code} %{content_type}' -o "$dir/timeline.svg" "$train_url/timeline.svg")
[[ $svg == "200 image/svg+xml" ]] || fail "/timeline.svg answered $svg"
grep -q 'time (us)' "$dir/timeline.svg" || fail "the drawing has no time axis in microseconds"
grep -q 'step [0-9]* as measured' "$dir/timeline.svg" || fail "the drawing does not say which step it measured"

# The page in both browsers the dashboard is made for, each where it is installed.
chromium=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $chromium ]]; then
  echo "dashboard.sh: Chromium is not installed: the dashboard was not loaded in Chromium (skipped)"
else
  python3 "$here/dashboard_browser.py" "$chromium" "$url" "$TROUPE_CLUSTER_TOKEN" "$hostile" "${TROUPE_DASHBOARD_SHOT:-}" ||
    fail "the Chromium check failed"
  python3 "$here/dashboard_browser.py" "$chromium" --timeline "$train_url" "${TROUPE_TIMELINE_SHOT:-}" ||
    fail "the Chromium check of the training run's timeline failed"
fi
firefox=$(command -v firefox-esr || command -v firefox || true)
if [[ -z $firefox ]]; then
  echo "dashboard.sh: Firefox is not installed: the dashboard was not loaded in Firefox (skipped)"
else
  python3 "$here/dashboard_browser.py" "$firefox" "$url" "$TROUPE_CLUSTER_TOKEN" "$hostile" ||
    fail "the Firefox check failed"
  python3 "$here/dashboard_browser.py" "$firefox" --timeline "$train_url" ||
    fail "the Firefox check of the training run's timeline failed"
fi
kill "$train"
echo "dashboard.sh: ok"
