#!/usr/bin/env bash
# `troupe node start` and `troupe status` as processes: a head and a worker join, status lists
# both with the worker's labels (text and JSON), a wrong token is refused, bad flags are errors.
#
#   tests/actors/node_cli.sh PATH/TO/troupe
set -euo pipefail
troupe=${1:?usage: $0 PATH/TO/troupe}
name=node_cli
source "$(dirname "$0")/../nodes_lib.sh"
export TROUPE_CLUSTER_TOKEN=node-cli-test-token
export TROUPE_LOG_LEVEL=warn

start_head "$troupe"
"$troupe" node start --address "127.0.0.1:$port" --host 127.0.0.1 --threads 1 --label worker --label zone=b \
  >"$dir/worker" 2>"$dir/worker.err" &
pids+=($!)
wait_for "$dir/worker" '"node":2'

"$troupe" status --address "127.0.0.1:$port" >"$dir/status"
grep -q "^node 1 127.0.0.1:$port alive" "$dir/status" || fail "status lacks the head: $(cat "$dir/status")"
grep -q "^node 2 .* alive .* labels worker,zone=b" "$dir/status" || fail "status lacks the worker: $(cat "$dir/status")"
"$troupe" status --address "127.0.0.1:$port" --json >"$dir/status.json"
grep -q '^{"nodes":\[{"node":1,.*"alive":true,"labels":\[\].*},{"node":2,.*"alive":true,"labels":\["worker","zone=b"\]' "$dir/status.json" ||
  fail "bad JSON status: $(cat "$dir/status.json")"

# A wrong token, an unreachable head and bad flags are errors with exit code 1 (or CLI11's).
if "$troupe" status --address "127.0.0.1:$port" --token wrong >/dev/null 2>"$dir/err"; then fail "a wrong token was accepted"; fi
grep -q "wrong cluster token" "$dir/err" || fail "no reason for the refusal: $(cat "$dir/err")"
if "$troupe" status --address "127.0.0.1:1" >/dev/null 2>&1; then fail "an unreachable head gave a status"; fi
if "$troupe" node start >/dev/null 2>&1; then fail "node start without --head or --address ran"; fi
if "$troupe" node start --head --port 70000 >/dev/null 2>&1; then fail "port 70000 was accepted"; fi
if timeout 10 "$troupe" node start --head --label "two words" >/dev/null 2>"$dir/err"; then fail "a label with a space was accepted"; fi
grep -q "labels (--label)" "$dir/err" || fail "no reason for the bad label: $(cat "$dir/err")"
if "$troupe" node start --head --load /nonexistent/lib.so >/dev/null 2>&1; then fail "a missing library was accepted"; fi

# A head out of file descriptors waits between accepts and logs the failure once (it spun a core
# and wrote a line per retry), then serves again once descriptors are free.
(ulimit -n 64; exec "$troupe" node start --head --host 127.0.0.1 --port 0 --threads 1 >"$dir/small" 2>"$dir/small.err") &
pids+=($!)
wait_for "$dir/small" '"port"'
small=$(sed -n 's/.*"port":\([0-9]*\).*/\1/p' "$dir/small")
(
  fds=()
  for _ in $(seq 100); do exec {fd}<>"/dev/tcp/127.0.0.1/$small" && fds+=("$fd"); done
  sleep 1
  for fd in "${fds[@]}"; do exec {fd}>&-; done
) 2>/dev/null
# Once per episode: an episode ends when an accept succeeds (the head may close a connection that
# never authenticates while the others wait), so a few are possible, never thousands.
failures=$(grep -c "accept failed" "$dir/small.err" || true)
[ "$failures" -ge 1 ] && [ "$failures" -le 10 ] ||
  fail "a head out of descriptors logged $failures accept failures (want 1 to 10): $(head -c 2000 "$dir/small.err")"
"$troupe" status --address "127.0.0.1:$small" >/dev/null || fail "the head did not serve again after running out of descriptors"

# A worker that stalls past the node timeout (SIGSTOP) is lost. When it runs again the head
# tells it so: it stops dialling (it redialled thousands of times a second) and exits with an
# error, so that a restart joins anew.
"$troupe" node start --address "127.0.0.1:$port" --host 127.0.0.1 --threads 1 >"$dir/stalled" 2>"$dir/stalled.err" &
stalled=$!
pids+=($stalled)
wait_for "$dir/stalled" '"node":3'
kill -STOP "$stalled"
sleep 1.5
kill -CONT "$stalled"
for _ in $(seq 100); do kill -0 "$stalled" 2>/dev/null || break; sleep 0.05; done
kill -0 "$stalled" 2>/dev/null && fail "a worker the head counts as lost kept running: $(tail -c 2000 "$dir/stalled.err")"
if wait "$stalled"; then fail "a lost worker exited with status 0"; fi
grep -q "the head is lost" "$dir/stalled.err" || fail "the lost worker did not say why it stopped: $(tail -c 2000 "$dir/stalled.err")"
[ "$(wc -l <"$dir/stalled.err")" -lt 50 ] || fail "the lost worker logged $(wc -l <"$dir/stalled.err") lines"
"$troupe" status --address "127.0.0.1:$port" >"$dir/status"
grep -q "^node 2 .* alive" "$dir/status" || fail "the first worker suffered from the other's stall: $(cat "$dir/status")"

# The worker leaves on SIGTERM; the head then reports one node alive.
kill -TERM "${pids[1]}"
wait "${pids[1]}" || fail "the worker did not stop cleanly on SIGTERM"
for _ in $(seq 100); do
  "$troupe" status --address "127.0.0.1:$port" >"$dir/status" && ! grep -q "^node 2 .* alive" "$dir/status" && break
  sleep 0.05
done
grep -q "^node 2 .* LOST" "$dir/status" || fail "the head still lists the worker alive: $(cat "$dir/status")"
# Nodes gone for 10 s are forgotten (the head's list grew with every node that ever joined).
for _ in $(seq 150); do
  "$troupe" status --address "127.0.0.1:$port" >"$dir/status" && ! grep -q "^node [23] " "$dir/status" && break
  sleep 0.1
done
grep -q "^node [23] " "$dir/status" && fail "nodes gone long ago are still listed: $(cat "$dir/status")"
grep -q "^node 1 .* alive" "$dir/status" || fail "the head is not listed: $(cat "$dir/status")"
echo "node_cli: ok"
