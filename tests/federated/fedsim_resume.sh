#!/usr/bin/env bash
# troupe fedsim --checkpoint: a run killed with SIGKILL once a checkpoint exists and then resumed
# ends bit-identical to the same run never stopped (final model CRC-32, accuracy and loss), and
# a checkpoint that does not fit (other options, corrupted, truncated) is refused with exit code
# 1 and left as it was.
#
#   tests/federated/fedsim_resume.sh PATH/TO/troupe
#
# The run carries state of every kind across rounds: server moments (fedadam), error-feedback
# residuals (topk), the privacy accountant and the adaptive clipping bound, client generators.
set -euo pipefail

troupe="$1"
work="$(mktemp -d)"
pid=""
cleanup() {
  if [[ -n "$pid" ]]; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

args=(fedsim --clients 20 --per-round 5 --rounds 16 --eval-every 4 --partition dirichlet:0.5 --model mlp:784-32-10
      --strategy fedadam --compress topk:0.2 --dp-clip 1 --dp-noise 0.3 --dp-adaptive --threads 2 --json)
# The fields a resumed run must reproduce exactly.
final_state() { grep '"final_accuracy"' "$1" | grep -o '"final_accuracy":[^,]*\|"final_loss":[^,]*\|"model_crc32":"[0-9a-f]*"' | tr '\n' ' '; }

"$troupe" "${args[@]}" >"$work/straight.json"
expected="$(final_state "$work/straight.json")"
[[ -n "$expected" ]] || { echo "FAIL: no final line from the uninterrupted run"; exit 1; }

# The interrupted run: killed as soon as its first checkpoint is in place.
"$troupe" "${args[@]}" --checkpoint "$work/ck" --checkpoint-every 2 >"$work/killed.json" &
pid=$!
for _ in $(seq 1 2000); do
  [[ -f "$work/ck/fedsim.ckpt" ]] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
if ! kill -9 "$pid" 2>/dev/null; then
  echo "FAIL: the run ended before it could be killed (make it longer)"
  exit 1
fi
wait "$pid" 2>/dev/null || true
pid=""
[[ -f "$work/ck/fedsim.ckpt" ]] || { echo "FAIL: no checkpoint was written"; exit 1; }

"$troupe" "${args[@]}" --checkpoint "$work/ck" --checkpoint-every 2 >"$work/resumed.json" 2>"$work/resumed.err"
from="$(grep -o 'resumed from the checkpoint of round [0-9]*' "$work/resumed.err" | grep -o '[0-9]*$' || true)"
if [[ -z "$from" || "$from" -ge 16 ]]; then
  echo "FAIL: the second run did not resume from an intermediate checkpoint ($(cat "$work/resumed.err"))"
  exit 1
fi
got="$(final_state "$work/resumed.json")"
if [[ "$got" != "$expected" ]]; then
  echo "FAIL: resumed from round $from: $got; uninterrupted: $expected"
  exit 1
fi
echo "killed, resumed from round $from, identical: $got"

# Refusals leave the checkpoint as it was.
sum_before="$(cksum <"$work/ck/fedsim.ckpt")"
expect_refusal() {
  local what="$1" message="$2"
  shift 2
  local out rc=0
  out="$("$troupe" "$@" 2>&1)" || rc=$?
  if [[ "$rc" -ne 1 || "$out" != *"$message"* ]]; then
    echo "FAIL: $what: exit $rc, output: $out"
    exit 1
  fi
}
expect_refusal "another seed" "it was saved with seed=0 and this run has seed=7" \
  "${args[@]}" --seed 7 --checkpoint "$work/ck"
expect_refusal "another strategy" "it was saved with strategy=fedadam and this run has strategy=fedyogi" \
  "${args[@]/fedadam/fedyogi}" --checkpoint "$work/ck"
[[ "$(cksum <"$work/ck/fedsim.ckpt")" == "$sum_before" ]] || { echo "FAIL: a refused run changed the checkpoint"; exit 1; }

mkdir "$work/bad"
cp "$work/ck/fedsim.ckpt" "$work/bad/fedsim.ckpt"
size="$(stat -c %s "$work/bad/fedsim.ckpt")"
byte="$(od -An -tu1 -j $((size / 2)) -N1 "$work/bad/fedsim.ckpt" | tr -d ' ')"
printf "\\x$(printf %02x $((byte ^ 0xff)))" | dd of="$work/bad/fedsim.ckpt" bs=1 seek=$((size / 2)) conv=notrunc status=none
expect_refusal "a corrupted checkpoint" "CRC-32 mismatch" "${args[@]}" --checkpoint "$work/bad"
head -c $((size - 100)) "$work/ck/fedsim.ckpt" >"$work/bad/fedsim.ckpt"
expect_refusal "a truncated checkpoint" "corrupted or truncated" "${args[@]}" --checkpoint "$work/bad"
head -c 5 "$work/ck/fedsim.ckpt" >"$work/bad/fedsim.ckpt"
expect_refusal "a stub" "not a fedsim checkpoint" "${args[@]}" --checkpoint "$work/bad"
echo "refusals: ok"
