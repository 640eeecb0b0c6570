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
# A FedBuff run does the same with its clients in flight (some of them failed), its virtual clock
# and its dispatch counter; it is resumed at another thread count.
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

# kill_and_resume NAME THREADS ARGS...: runs ARGS uninterrupted, then with a checkpoint killed by
# SIGKILL as soon as the first checkpoint exists, then resumed with --threads THREADS instead of
# the value ARGS give; the resumed run must end exactly as the uninterrupted one.
kill_and_resume() {
  local name="$1" threads="$2"
  shift 2
  local run=("$@") ck="$work/ck-$name" resumed=() i
  resumed=("$@")
  for i in "${!resumed[@]}"; do
    if [[ "${resumed[$i]}" == "--threads" ]]; then resumed[$((i + 1))]="$threads"; fi
  done
  "$troupe" "${run[@]}" >"$work/$name-straight.json"
  local expected
  expected="$(final_state "$work/$name-straight.json")"
  [[ -n "$expected" ]] || { echo "FAIL: $name: no final line from the uninterrupted run"; exit 1; }

  "$troupe" "${run[@]}" --checkpoint "$ck" --checkpoint-every 2 >"$work/$name-killed.json" &
  pid=$!
  for _ in $(seq 1 2000); do
    [[ -f "$ck/fedsim.ckpt" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  if ! kill -9 "$pid" 2>/dev/null; then
    echo "FAIL: $name: the run ended before it could be killed (make it longer)"
    exit 1
  fi
  wait "$pid" 2>/dev/null || true
  pid=""
  [[ -f "$ck/fedsim.ckpt" ]] || { echo "FAIL: $name: no checkpoint was written"; exit 1; }

  "$troupe" "${resumed[@]}" --checkpoint "$ck" --checkpoint-every 2 >"$work/$name-resumed.json" 2>"$work/$name-resumed.err"
  local from last
  from="$(grep -o 'resumed from the checkpoint of round [0-9]*' "$work/$name-resumed.err" | grep -o '[0-9]*$' || true)"
  last="$(grep -o '"rounds":[0-9]*' "$work/$name-straight.json" | grep -o '[0-9]*$')"
  if [[ -z "$from" || "$from" -ge "$last" ]]; then
    echo "FAIL: $name: the second run did not resume from an intermediate checkpoint ($(cat "$work/$name-resumed.err"))"
    exit 1
  fi
  local got
  got="$(final_state "$work/$name-resumed.json")"
  if [[ "$got" != "$expected" ]]; then
    echo "FAIL: $name: resumed from round $from: $got; uninterrupted: $expected"
    exit 1
  fi
  echo "$name: killed, resumed from round $from, identical: $got"
}

kill_and_resume sync 2 "${args[@]}"
# FedBuff: 8 clients in flight, a step every 3 arrivals, 20% of the dispatches fail, fixed-bound
# DP over each step's buffer; uninterrupted at 2 threads, resumed at 1.
fedbuff_common=(fedsim --clients 30 --per-round 8 --rounds 60 --eval-every 6 --partition dirichlet:0.5 --model mlp:784-32-10
                --dropout 0.2 --strategy fedadam --compress topk:0.2 --dp-clip 1 --dp-noise 0.3 --latency exponential:1
                --threads 2 --json)
fedbuff=("${fedbuff_common[@]}" --async fedbuff:3)
kill_and_resume fedbuff 1 "${fedbuff[@]}"
work_ck="$work/ck-sync"

# Refusals leave the checkpoint as it was.
sum_before="$(cksum <"$work_ck/fedsim.ckpt")"
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
  "${args[@]}" --seed 7 --checkpoint "$work_ck"
expect_refusal "another strategy" "it was saved with strategy=fedadam and this run has strategy=fedyogi" \
  "${args[@]/fedadam/fedyogi}" --checkpoint "$work_ck"
[[ "$(cksum <"$work_ck/fedsim.ckpt")" == "$sum_before" ]] || { echo "FAIL: a refused run changed the checkpoint"; exit 1; }
expect_refusal "FedBuff with another K" "it was saved with async=fedbuff:3 and this run has async=fedbuff:4" \
  "${fedbuff[@]/fedbuff:3/fedbuff:4}" --checkpoint "$work/ck-fedbuff"
expect_refusal "a FedBuff checkpoint in a synchronous run" "it was saved with async=fedbuff:3 and this run has async=" \
  "${fedbuff_common[@]}" --checkpoint "$work/ck-fedbuff"

mkdir "$work/bad"
cp "$work_ck/fedsim.ckpt" "$work/bad/fedsim.ckpt"
size="$(stat -c %s "$work/bad/fedsim.ckpt")"
byte="$(od -An -tu1 -j $((size / 2)) -N1 "$work/bad/fedsim.ckpt" | tr -d ' ')"
printf "\\x$(printf %02x $((byte ^ 0xff)))" | dd of="$work/bad/fedsim.ckpt" bs=1 seek=$((size / 2)) conv=notrunc status=none
expect_refusal "a corrupted checkpoint" "CRC-32 mismatch" "${args[@]}" --checkpoint "$work/bad"
head -c $((size - 100)) "$work_ck/fedsim.ckpt" >"$work/bad/fedsim.ckpt"
expect_refusal "a truncated checkpoint" "corrupted or truncated" "${args[@]}" --checkpoint "$work/bad"
head -c 5 "$work_ck/fedsim.ckpt" >"$work/bad/fedsim.ckpt"
expect_refusal "a stub" "not a fedsim checkpoint" "${args[@]}" --checkpoint "$work/bad"
echo "refusals: ok"
