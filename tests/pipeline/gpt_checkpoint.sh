#!/usr/bin/env bash
# Sharded checkpoints from the command line: a GPT trained through the pipeline runtime, stopped
# after step 3 (--checkpoint DIR --stop-after 3) and resumed (--resume DIR), writes the weights
# file of the run that never stopped and reports its validation losses, to the bit, for two
# schedules and fp32 and 8-bit optimizer state; a damaged shard is refused naming the file.
#
#   tests/pipeline/gpt_checkpoint.sh PATH/TO/troupe
set -euo pipefail
troupe=${1:?usage: $0 PATH/TO/troupe}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "gpt_checkpoint: $*" >&2; exit 1; }

common=(--model gpt:layers=2,heads=2,embd=32,ctx=16,dropout=0.1 --steps 6 --batch 4 --microbatches 4
        --eval-every 4 --eval-batches 2 --clip 0.05 --seed 3 --ranks 2 --json)
losses() { grep '"step"' "$1" | sed -n 's/.*"val_loss":\([0-9.]*\).*/\1/p' | tr '\n' ' '; }

for state in fp32 int8; do
  for s in 1f1b zb-v; do
    name=$s-$state
    "$troupe" train "${common[@]}" --pipeline "$s" --state "$state" --save "$dir/$name-straight" \
      >"$dir/$name-straight.out" 2>"$dir/$name-straight.err" || fail "$name failed: $(cat "$dir/$name-straight.err")"
    "$troupe" train "${common[@]}" --pipeline "$s" --state "$state" --checkpoint "$dir/$name-ck" --stop-after 3 \
      >"$dir/$name-stopped.out" 2>"$dir/$name-stopped.err" || fail "$name stopped: $(cat "$dir/$name-stopped.err")"
    grep -q "checkpoint of step 3 in $dir/$name-ck (go on with --resume $dir/$name-ck)" "$dir/$name-stopped.err" ||
      fail "$name: the stop is not reported: $(cat "$dir/$name-stopped.err")"
    for f in manifest rank0-a.shard rank1-a.shard; do
      [ -f "$dir/$name-ck/$f" ] || fail "$name: the checkpoint has no $f: $(ls "$dir/$name-ck")"
    done
    "$troupe" train "${common[@]}" --pipeline "$s" --state "$state" --checkpoint "$dir/$name-ck" \
      --resume "$dir/$name-ck" --save "$dir/$name-resumed" >"$dir/$name-resumed.out" 2>"$dir/$name-resumed.err" ||
      fail "$name resumed: $(cat "$dir/$name-resumed.err")"
    grep -q "resumed at step 3 of the checkpoint" "$dir/$name-resumed.err" ||
      fail "$name: the resume is not reported: $(cat "$dir/$name-resumed.err")"
    cmp -s "$dir/$name-straight/weights.trpw" "$dir/$name-resumed/weights.trpw" ||
      fail "$name: stopped and resumed, it trained other weights than the run that never stopped"
    [ "$(losses "$dir/$name-resumed.out")" = "$(losses "$dir/$name-straight.out")" ] ||
      fail "$name: other validation losses: $(losses "$dir/$name-resumed.out") against $(losses "$dir/$name-straight.out")"
  done
done

# A finished run has nothing left to resume; a shard cut short is refused naming the file; a
# manifest changed by hand is refused.
"$troupe" train "${common[@]}" --pipeline 1f1b --resume "$dir/1f1b-fp32-ck" >"$dir/bad.out" 2>"$dir/bad.err" &&
  fail "a finished run was resumed"
grep -q "the checkpoint is at step 6, the last of --steps 6: nothing is left to train" "$dir/bad.err" ||
  fail "a finished run: $(cat "$dir/bad.err")"
ck=$dir/cut-ck
"$troupe" train "${common[@]}" --pipeline 1f1b --checkpoint "$ck" --stop-after 2 >/dev/null 2>"$dir/cut.err" ||
  fail "stopping at step 2 failed: $(cat "$dir/cut.err")"
cp "$ck/rank1-a.shard" "$dir/whole.shard"
head -c 1000 "$dir/whole.shard" >"$ck/rank1-a.shard"
"$troupe" train "${common[@]}" --pipeline 1f1b --resume "$ck" >"$dir/bad.out" 2>"$dir/bad.err" &&
  fail "a truncated shard was resumed from"
grep -q "rank 1: checkpoint shard $ck/rank1-a.shard is truncated or was replaced: 1000 bytes" "$dir/bad.err" ||
  fail "a truncated shard: $(cat "$dir/bad.err")"
cp "$dir/whole.shard" "$ck/rank1-a.shard"
sed -i 's/^step=2$/step=1/' "$ck/manifest"
"$troupe" train "${common[@]}" --pipeline 1f1b --resume "$ck" >"$dir/bad.out" 2>"$dir/bad.err" &&
  fail "a changed manifest was resumed from"
grep -q "the checkpoint manifest $ck/manifest is corrupted" "$dir/bad.err" || fail "a changed manifest: $(cat "$dir/bad.err")"
echo "gpt_checkpoint: ok"
