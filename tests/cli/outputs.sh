#!/usr/bin/env bash
# What the troupe command writes: files it replaces and JSON it prints.
#
#   tests/cli/outputs.sh PATH/TO/troupe
#
# - An output path that is not a regular file (a FIFO) is refused and left as it was; a symbolic
#   link is written through (the file it points to changes, the link stays).
# - A refused command leaves alone a file of the user's named like a temporary file.
# - fedsim refuses a dataset without test examples, and its --json lines stay valid JSON when a
#   value is not finite (an infinite privacy bound), and show the update counts of a round in
#   which clients failed or were late.
# - fedsim trains on a user's .npz, whose client_train sets the clients (a --clients that does
#   not match is refused with the number to use); stateful clients report their state's bytes.
# - TROUPE_SIMD caps the kernels' vectors (none runs the portable loops); a value it does not
#   know is named on stderr and the CPU's vectors are used.
set -euo pipefail

troupe="$(realpath "$1")"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

show=(schedule show --schedule 1f1b --stages 2 --microbatches 2)
mkfifo fifo
if "$troupe" "${show[@]}" --out fifo 2>err; then fail "wrote into a FIFO"; fi
grep -q "is not a regular file" err || fail "the FIFO's refusal says: $(cat err)"
[[ -p fifo ]] || fail "the FIFO was replaced"

echo old >real.txt
ln -s real.txt link.txt
"$troupe" "${show[@]}" --out link.txt >/dev/null
[[ -L link.txt ]] || fail "the link was replaced by a file"
grep -q "F" real.txt || fail "the link's file was not written"

echo precious >out.w.tmp
if "$troupe" train --save out.w --optimizer no_such_optimizer 2>err; then fail "train accepted a bad optimizer"; fi
[[ "$(cat out.w.tmp)" == precious ]] || fail "a refused train touched out.w.tmp"
[[ ! -e out.w ]] || fail "a refused train wrote out.w"
[[ "$(ls)" == "$(printf 'err\nfifo\nlink.txt\nout.w.tmp\nreal.txt')" ]] || fail "files left behind: $(ls | tr '\n' ' ')"

# A dataset whose test split holds no example (valid IDX files of zero images and labels).
data=/usr/share/datasets/fashion-mnist
mkdir empty_test
ln -s "$data/train-images-idx3-ubyte.gz" "$data/train-labels-idx1-ubyte.gz" empty_test/
printf '\x00\x00\x08\x03\x00\x00\x00\x00\x00\x00\x00\x1c\x00\x00\x00\x1c' | gzip >empty_test/t10k-images-idx3-ubyte.gz
printf '\x00\x00\x08\x01\x00\x00\x00\x00' | gzip >empty_test/t10k-labels-idx1-ubyte.gz
if "$troupe" fedsim --data-dir empty_test --clients 2 --per-round 1 --rounds 1 --json >out 2>err; then
  fail "fedsim ran without test examples: $(cat out)"
fi
grep -q "60000 training and 0 test examples" err || fail "the empty test split's refusal says: $(cat err)"

# Noise so small that the privacy bound is infinite: epsilon is null, every line parses.
"$troupe" fedsim --clients 10 --per-round 3 --rounds 2 --dp-clip 1 --dp-noise 1e-300 --json >out
# A deadline no client meets: each round says so, and so does a warning at the end.
"$troupe" fedsim --clients 10 --per-round 3 --rounds 2 --deadline 1e-9 --json >late 2>err
grep -q "in 2 of 2 rounds no update arrived" err || fail "no warning about the empty rounds: $(cat err)"
# Each line is one JSON object of numbers, strings and nulls: no inf or nan anywhere.
if grep -Eiq '(^|[^a-z_])(-?inf|-?nan)([^a-z_]|$)' out late; then fail "a value that is not JSON: $(cat out late)"; fi
rounds=$(grep -c '^{"round":' out) || true
[[ "$rounds" -ge 1 ]] || fail "no round line: $(cat out)"
[[ "$(grep -c '"epsilon":null' out)" == "$rounds" ]] || fail "epsilon is not null in every round: $(cat out)"
if grep -q '"updates"' out; then fail "update counts in a round where nobody failed: $(cat out)"; fi
grep -q '^{"final_accuracy":' out || fail "no summary line: $(cat out)"
late_rounds=$(grep -c '^{"round":' late) || true
[[ "$late_rounds" -ge 1 && "$(grep -c '"updates":0,"sampled":3,"failed":0,"late":3' late)" == "$late_rounds" ]] ||
  fail "the late rounds do not say so: $(cat late)"
# A user's data: NumPy's own .npz (6 examples of 4x5 pixels, 3 classes, client_train 0..5).
npz="$source_dir/tests/kernels/golden/npz/savez.npz"
if "$troupe" fedsim --data "npz:$npz" --model mlp:20-8-3 --json >out 2>err; then fail "ran with 100 clients: $(cat out)"; fi
grep -q "assigns its training examples to 6 clients (client_train): run with --clients 6" err ||
  fail "the clients' refusal says: $(cat err)"
"$troupe" fedsim --data "npz:$npz" --clients 6 --per-round 2 --rounds 2 --model mlp:20-8-3 --json >out
grep -q '^{"final_accuracy":' out || fail "no summary for the user's data: $(cat out)"
if "$troupe" fedsim --data npz:missing.npz --json >out 2>err; then fail "ran without its data"; fi
grep -q "missing.npz" err || fail "the missing file's error says: $(cat err)"
# Stateful clients: AdamW's 8-bit moments, about 1.03 bytes per parameter and moment.
"$troupe" fedsim --clients 10 --per-round 3 --rounds 2 --client-optimizer adamw --client-state int8 --lr 0.001 --json >out
bytes=$(grep -o '"state_bytes_per_client":[0-9]*' out | cut -d: -f2)
[[ -n "$bytes" && "$bytes" -gt 150000 && "$bytes" -lt 200000 ]] || fail "state bytes per client: $(cat out)"
TROUPE_SIMD=none "$troupe" bench optim --quick --only sgd --json >simd 2>err
[[ "$(grep -c '"bench":"sgd"' simd)" == 3 && ! -s err ]] || fail "TROUPE_SIMD=none: $(cat simd err)"
TROUPE_SIMD=avx1024 "$troupe" bench optim --quick --only sgd --json >simd 2>err
grep -q "TROUPE_SIMD=avx1024 is not one of avx512, avx2, none" err || fail "a bad TROUPE_SIMD: $(cat err)"
[[ "$(grep -c '"bench":"sgd"' simd)" == 3 ]] || fail "a bad TROUPE_SIMD stopped the bench: $(cat simd)"
echo "outputs: all checks passed"
