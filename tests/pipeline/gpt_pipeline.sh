#!/usr/bin/env bash
# A GPT through the pipeline runtime from the command line: every generator's schedule on 2 ranks
# and 4 microbatches (with --recompute, with bf16 and 8-bit optimizer state) writes the weights
# file of the one-rank run with the same 4 microbatches, to the bit, and reports the same
# validation losses; the clipping (0.05: every step clips) uses the norm over every rank; each
# pipelined run's summary has its measured step beside the simulator's prediction.
#
#   tests/pipeline/gpt_pipeline.sh PATH/TO/troupe
set -euo pipefail
troupe=${1:?usage: $0 PATH/TO/troupe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "gpt_pipeline: $*" >&2; exit 1; }

common=(--model gpt:layers=2,heads=2,embd=32,ctx=16,dropout=0.1 --steps 4 --batch 4 --microbatches 4
        --eval-every 2 --eval-batches 2 --clip 0.05 --seed 3 --json)
losses() { sed -n 's/.*"val_loss":\([0-9.]*\).*/\1/p' "$1" | tr '\n' ' '; }

run() {  # NAME [FLAGS...]: trains into $dir/NAME
  local name=$1
  shift
  "$troupe" train "${common[@]}" "$@" --save "$dir/$name" >"$dir/$name.out" 2>"$dir/$name.err" ||
    fail "$name failed: $(cat "$dir/$name.err")"
}
check() {  # NAME REFERENCE
  cmp -s "$dir/$2/weights.trpw" "$dir/$1/weights.trpw" || fail "$1 trained other weights than $2"
  [ "$(losses "$dir/$1.out")" = "$(losses "$dir/$2.out")" ] ||
    fail "$1 reported other validation losses: $(losses "$dir/$1.out") against $(losses "$dir/$2.out")"
}

for state in fp32 bf16 int8; do
  run "one-$state" --state "$state"
done
[ "$(grep -c '"val_loss"' "$dir/one-fp32.out")" -eq 3 ] || fail "not 2 evaluations and a summary: $(cat "$dir/one-fp32.out")"
for s in gpipe 1f1b interleaved-1f1b looped-bfs zb-h1 zb-h2 zb-v interleaved-zb dualpipe-v v-half v-min; do
  run "$s" --pipeline "$s" --ranks 2
  check "$s" one-fp32
  # The summary sets the measured step beside the simulator's prediction from the measured costs.
  tail -1 "$dir/$s.out" | grep -q '"step_ms_measured":[0-9.]*,"step_ms_predicted":[0-9.]*,"step_ms_ratio":[0-9.]*}$' ||
    fail "$s's summary has no measured step: $(tail -1 "$dir/$s.out")"
done
grep -q step_ms "$dir/one-fp32.out" && fail "a run in one thread reports a pipeline step: $(tail -1 "$dir/one-fp32.out")"
for s in 1f1b zb-v; do
  run "$s-recompute" --pipeline "$s" --ranks 2 --recompute
  check "$s-recompute" one-fp32
done
for state in bf16 int8; do
  run "1f1b-$state" --pipeline 1f1b --ranks 2 --state "$state"
  check "1f1b-$state" "one-$state"
done
echo "gpt_pipeline: ok"
