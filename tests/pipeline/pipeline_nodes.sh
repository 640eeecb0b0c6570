#!/usr/bin/env bash
# The pipeline runtime across processes: `troupe train --pipeline ... --head` puts its ranks on
# `troupe node start` processes, which exchange activations and gradients over loopback TCP.
#   - one microbatch per step: the weights equal those of training in one process, to the bit;
#   - a GPT with 4 microbatches a step: the weights of the one-rank run with those microbatches,
#     also when stopped after a step and resumed from its sharded checkpoint;
#   - a zero-bubble V schedule (two stages per rank) trains to a sensible accuracy, and the ranks'
#     measured steps come back to the driver;
#   - a driver killed mid-run leaves no ranks behind on the nodes;
#   - a node killed mid-run fails the run with a clear error, promptly, instead of hanging; a GPT's
#     run so failed goes on from its last checkpoint to the weights of a run that never stopped.
#
#   tests/pipeline/pipeline_nodes.sh PATH/TO/troupe
set -euo pipefail
troupe=${1:?usage: $0 PATH/TO/troupe}
name=pipeline_nodes
source "$(dirname "$0")/../nodes_lib.sh"
export TROUPE_CLUSTER_TOKEN=pipeline-nodes-test-token
export TROUPE_LOG_LEVEL=${TROUPE_LOG_LEVEL:-error}

start_head "$troupe"
head="127.0.0.1:$port"
declare -A worker_pid
for w in 2 3; do
  "$troupe" node start --address "$head" --host 127.0.0.1 --threads 1 >"$dir/worker$w" 2>"$dir/worker$w.err" &
  pids+=($!)
  worker_pid[$w]=$!
  wait_for "$dir/worker$w" '"node"'
done

# One microbatch per step: the same weights as the whole model trained here.
"$troupe" train --epochs 1 --seed 5 --save "$dir/local.trpw" >/dev/null 2>&1 || fail "training in one process failed"
"$troupe" train --epochs 1 --seed 5 --pipeline gpipe --ranks 2 --microbatches 1 --head "$head" \
  --save "$dir/nodes.trpw" >"$dir/gpipe.out" 2>"$dir/gpipe.err" || fail "training on nodes failed: $(cat "$dir/gpipe.err")"
grep -q "2 ranks on nodes" "$dir/gpipe.err" || fail "no placement reported: $(cat "$dir/gpipe.err")"
cmp -s "$dir/local.trpw" "$dir/nodes.trpw" || fail "the weights trained on nodes differ from those trained here"

# A GPT (dropout on), 4 microbatches a step: its embedding, blocks, norm and head as stages on the
# nodes write the weights of the one-rank run with the same microbatches, to the bit.
gpt=(--model gpt:layers=1,heads=2,embd=16,ctx=16,dropout=0.1 --steps 3 --batch 4 --microbatches 4
     --eval-every 3 --eval-batches 1 --seed 2)
"$troupe" train "${gpt[@]}" --save "$dir/gpt-local" >/dev/null 2>&1 || fail "a gpt in one process failed"
"$troupe" train "${gpt[@]}" --pipeline 1f1b --ranks 2 --head "$head" --save "$dir/gpt-nodes" \
  >"$dir/gpt.out" 2>"$dir/gpt.err" || fail "a gpt on nodes failed: $(cat "$dir/gpt.err")"
grep -q "2 ranks on nodes" "$dir/gpt.err" || fail "no placement reported for the gpt: $(cat "$dir/gpt.err")"
cmp -s "$dir/gpt-local/weights.trpw" "$dir/gpt-nodes/weights.trpw" ||
  fail "the gpt's weights trained on nodes differ from those trained here"

# The same GPT stopped after its second step and resumed on the nodes: each rank wrote its shard
# from its own process, and read it back in a new one; the weights are still the one-rank run's.
# (The driver runs elsewhere and names a relative directory: the ranks write where it means.)
troupe_path=$(realpath "$troupe")
(cd "$dir" && "$troupe_path" train "${gpt[@]}" --pipeline 1f1b --ranks 2 --head "$head" --checkpoint gpt-ck \
  --stop-after 2 >/dev/null 2>"$dir/gpt-ck.err") || fail "a gpt stopped on nodes failed: $(cat "$dir/gpt-ck.err")"
[ -f "$dir/gpt-ck/rank1-a.shard" ] || fail "rank 1 wrote no shard: $(ls "$dir/gpt-ck")"
"$troupe" train "${gpt[@]}" --pipeline 1f1b --ranks 2 --head "$head" --resume "$dir/gpt-ck" --save "$dir/gpt-resumed" \
  >/dev/null 2>"$dir/gpt-resumed.err" || fail "a gpt resumed on nodes failed: $(cat "$dir/gpt-resumed.err")"
cmp -s "$dir/gpt-local/weights.trpw" "$dir/gpt-resumed/weights.trpw" ||
  fail "the gpt stopped and resumed on nodes trained other weights than the one-rank run"

# Zero bubble with a V placement: each rank holds two stages and hands one to the other itself;
# the stages recompute their activations (RECOMPUTE travels in the schedule).
"$troupe" train --epochs 1 --json --pipeline zb-v --ranks 2 --microbatches 8 --model mlp:784-256-128-64-10 \
  --recompute --head "$head" >"$dir/zbv.out" 2>"$dir/zbv.err" || fail "zb-v on nodes failed: $(cat "$dir/zbv.err")"
grep -q '^{"test_accuracy":0\.[89]' "$dir/zbv.out" || fail "zb-v on nodes trained badly: $(cat "$dir/zbv.out")"
# The ranks' measured steps came back with their reports (each rank's actions, in order).
grep -q '"step_ms_measured":[0-9.]*,"step_ms_predicted":[0-9.]*,"step_ms_ratio":[0-9.]*}$' "$dir/zbv.out" ||
  fail "no measured step from the ranks on nodes: $(cat "$dir/zbv.out")"

# A driver killed mid-run: its ranks see it go and stop, instead of staying on their nodes.
ranks_left() {  # the rank actors the cluster lists (a failed status fails the test)
  local status
  status=$("$troupe" status --address "$head" --json) || fail "troupe status failed"
  grep -q '"nodes":\[{"node"' <<<"$status" || fail "troupe status listed no nodes: $status"
  grep -o 'rank_actor' <<<"$status" | wc -l
}
wait_for_ranks() {  # N: the driver prints its placement before it loads the data and spawns the ranks
  for _ in $(seq 300); do [ "$(ranks_left)" -eq "$1" ] && return 0; sleep 0.1; done
  fail "the $1 ranks are not on the nodes: $("$troupe" status --address "$head")"
}
"$troupe" train --epochs 5 --pipeline 1f1b --ranks 2 --microbatches 4 --head "$head" \
  >"$dir/orphan.out" 2>"$dir/orphan.err" &
driver=$!
pids+=($driver)
wait_for "$dir/orphan.err" 'ranks on nodes'
wait_for_ranks 2
kill -KILL "$driver"
for _ in $(seq 150); do [ "$(ranks_left)" -eq 0 ] && break; sleep 0.1; done
[ "$(ranks_left)" -eq 0 ] || fail "ranks stayed on their nodes after their driver was killed: $("$troupe" status --address "$head")"

# A worker killed mid-run: the run fails with the reason within seconds.
"$troupe" train --epochs 5 --pipeline 1f1b --ranks 3 --microbatches 4 --model mlp:784-256-128-64-10 \
  --head "$head" >"$dir/killed.out" 2>"$dir/killed.err" &
run=$!
pids+=($run)
wait_for "$dir/killed.err" 'ranks on nodes'
wait_for_ranks 3
sleep 1  # mid-step
kill -KILL "${pids[2]}"
start=$(date +%s)
if wait "$run"; then fail "the run went on after its node was killed"; fi
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -le 15 ] || fail "the run took $elapsed s to notice its node was gone"
grep -q "the step failed: rank [0-9]: .*lost" "$dir/killed.err" || fail "no clear reason: $(cat "$dir/killed.err")"

# A GPT whose rank's node is killed (SIGKILL) mid-run: the driver says which rank was lost; the
# last checkpoint, resumed on the nodes left, gives the weights of the run that never stopped.
long=(--model gpt:layers=1,heads=2,embd=16,ctx=16,dropout=0.1 --steps 600 --batch 4 --microbatches 4
      --eval-every 600 --eval-batches 1 --seed 2)
"$troupe" train "${long[@]}" --save "$dir/long-local" >/dev/null 2>&1 || fail "a long gpt in one process failed"
"$troupe" node start --address "$head" --host 127.0.0.1 --threads 1 >"$dir/worker4" 2>"$dir/worker4.err" &
pids+=($!)
worker_pid[4]=$!
wait_for "$dir/worker4" '"node"'
node_alive() { "$troupe" status --address "$head" | grep -q "^node $1 .* alive"; }  # NODE
node_of() { sed -n 's/.*"node":\([0-9]*\).*/\1/p' "$1" | head -1; }              # FILE: a node's id
for _ in $(seq 100); do node_alive "$(node_of "$dir/worker4")" && break; sleep 0.1; done
"$troupe" train "${long[@]}" --pipeline 1f1b --ranks 2 --head "$head" --checkpoint "$dir/long-ck" --checkpoint-every 5 \
  >"$dir/long.out" 2>"$dir/long.err" &
run=$!
pids+=($run)
wait_for "$dir/long.err" 'ranks on nodes'
# The victim: a worker (not the head) that holds a rank; killed once the first checkpoint is in.
placed=$(sed -n 's/.*ranks on nodes //p' "$dir/long.err")
victim=
for w in 2 3 4; do
  [ -s "$dir/worker$w" ] || continue
  id=$(node_of "$dir/worker$w")
  if grep -qw "$id" <<<"${placed//,/ }" && node_alive "$id"; then victim=$w; victim_node=$id; fi
done
[ -n "$victim" ] || fail "no worker holds a rank (ranks on nodes $placed)"
wait_for "$dir/long-ck/manifest" '^step='
kill -KILL "${worker_pid[$victim]}"
if wait "$run"; then fail "the gpt run went on after its node was killed (or ended before)"; fi
grep -q "rank [0-9].* lost\|rank [0-9] is gone" "$dir/long.err" || fail "no rank named as lost: $(cat "$dir/long.err")"
for _ in $(seq 150); do node_alive "$victim_node" || break; sleep 0.1; done
"$troupe" train "${long[@]}" --pipeline 1f1b --ranks 2 --head "$head" --checkpoint "$dir/long-ck" --resume "$dir/long-ck" \
  --save "$dir/long-resumed" >"$dir/long-resumed.out" 2>"$dir/long-resumed.err" ||
  fail "resuming after a lost node failed: $(cat "$dir/long-resumed.err")"
grep -q "resumed at step [1-9]" "$dir/long-resumed.err" || fail "no resume reported: $(cat "$dir/long-resumed.err")"
cmp -s "$dir/long-local/weights.trpw" "$dir/long-resumed/weights.trpw" ||
  fail "resumed after a lost node, the gpt trained other weights than the run that never stopped"
echo "pipeline_nodes: ok"
