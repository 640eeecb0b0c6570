#!/usr/bin/env bash
# Compares troupe's training of the default MLP (784-256-128-10 on Fashion-MNIST, AdamW, batch
# 64) with PyTorch's CPU training of the same model, in one run on one machine, and prints the
# ratio of training samples per second.
#
#   tests/bench/nn_compare.sh [--epochs N] [--torch-threads "N ..."] [--build DIR] [--python PY]
#
#   --epochs N            epochs of `troupe train` and of the PyTorch script (default 8, troupe's
#                         default, about a minute of PyTorch on a 2-core machine)
#   --torch-threads LIST  torch.set_num_threads values, one PyTorch run each (default "2")
#   --build DIR           the build tree holding bin/troupe (default: build/ at the repository root)
#   --python PY           a Python that can import torch (default: /usr/bin/python3, where
#                         Debian's python3-torch lives)
#
# Runs, in this order: `troupe bench nn --json` (GEMM at the model's shapes and one epoch of
# training), `troupe train --json --epochs N`, then tests/bench/torch_mlp.py --epochs N for each
# thread count. The bar is troupe >= 3x PyTorch's samples/s (`troupe train` against PyTorch
# with 2 threads). The machine's load average is printed before and after: other work on the
# same cores slows PyTorch's thread pool far more than troupe's single-threaded loop.
#
# PyTorch is not a dependency of troupe; only this comparison needs it. Exits 0 whether or not
# troupe reaches the bar; 1 when a program is missing or fails; 2 on a bad argument or when
# PyTorch cannot be imported.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"

build_dir="$repo_root/build"
python=/usr/bin/python3
epochs=8
torch_threads="2"

usage() {
  echo "usage: tests/bench/nn_compare.sh [--epochs N] [--torch-threads \"N ...\"] [--build DIR] [--python PY]"
}
bad() {
  echo "nn_compare.sh: $1" >&2
  usage >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--epochs needs a positive count"
      epochs="$2"; shift 2 ;;
    --torch-threads)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*( [1-9][0-9]*)*$ ]] || bad "--torch-threads needs positive counts separated by spaces, e.g. \"2 1\""
      torch_threads="$2"; shift 2 ;;
    --build)
      [[ $# -ge 2 ]] || bad "--build needs a directory"
      build_dir="$2"; shift 2 ;;
    --python)
      [[ $# -ge 2 ]] || bad "--python needs an interpreter"
      python="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown argument: $1" ;;
  esac
done

troupe_bin="$build_dir/bin/troupe"
if [[ ! -x "$troupe_bin" ]]; then
  echo "nn_compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir)" >&2
  exit 1
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "nn_compare.sh: no Python at $python (pass --python)" >&2
  exit 1
fi
if ! torch_version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
  echo "nn_compare.sh: $python cannot import torch; install PyTorch for this comparison only (Debian: apt-get install python3-torch) or pass --python" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# run OUTFILE CMD... : runs a program, keeping its JSON lines (progress goes to stderr).
run() {
  local out="$1"
  shift
  echo "nn_compare.sh: running $*" >&2
  local rc=0
  "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "nn_compare.sh: failed (exit code $rc): $*" >&2
    exit 1
  fi
  grep '^[[:space:]]*{' "$work/raw" >"$out" || true
  if [[ ! -s "$out" ]]; then
    echo "nn_compare.sh: no JSON line from: $*" >&2
    exit 1
  fi
}

# field NAME FILE [MATCH]: the value of "NAME" in the first line of FILE that contains MATCH.
field() {
  awk -v name="$1" -v match_text="${3:-}" '
    index($0, match_text) {
      re = "\"" name "\"[[:space:]]*:[[:space:]]*"
      if (match($0, re "\"[^\"]*\"") || match($0, re "[-+0-9.eE]+")) {
        s = substr($0, RSTART, RLENGTH); sub(re, "", s); gsub(/"/, "", s); print s; exit
      }
    }' "$2"
}

load_before="$(loadavg)"
run "$work/bench" "$troupe_bin" bench nn --json
run "$work/train" "$troupe_bin" train --json --epochs "$epochs"
for t in $torch_threads; do
  run "$work/torch_$t" "$python" "$script_dir/torch_mlp.py" --epochs "$epochs" --threads "$t"
done
load_after="$(loadavg)"

bench_sps="$(field value "$work/bench" '"train_mlp_784_256_128_10"')"
train_sps="$(field samples_per_s "$work/train")"
[[ -n "$bench_sps" && -n "$train_sps" ]] || { echo "nn_compare.sh: could not read troupe's samples/s" >&2; exit 1; }

{
  printf '%s\t%s\t%s\t%s\t%s\n' "run" "epochs" "samples/s" "test acc" "seconds"
  printf '%s\t%s\t%s\t%s\t%s\n' "troupe bench nn (train)" 1 "$bench_sps" "-" "-"
  printf '%s\t%s\t%s\t%s\t%s\n' "troupe train" "$epochs" "$train_sps" \
    "$(field test_accuracy "$work/train")" "$(field seconds "$work/train")"
  for t in $torch_threads; do
    printf '%s\t%s\t%s\t%s\t%s\n' "pytorch $torch_version, $t thread(s)" "$epochs" \
      "$(field samples_per_s "$work/torch_$t")" "$(field test_accuracy "$work/torch_$t")" \
      "$(field seconds "$work/torch_$t")"
  done
} | awk -F'\t' '{ printf "%-30s %7s %12s %9s %9s\n", $1, $2, $3, $4, $5 }'

echo
for t in $torch_threads; do
  awk -v tr="$train_sps" -v be="$bench_sps" -v py="$(field samples_per_s "$work/torch_$t")" -v t="$t" 'BEGIN {
    if (py + 0 <= 0) { printf "pytorch (%s thread(s)): no samples/s\n", t; exit }
    r = tr / py
    printf "troupe train / pytorch (%s thread(s)): %.2fx samples/s (bench nn epoch: %.2fx); bar >= 3x: %s\n",
           t, r, be / py, (r >= 3 ? "met" : "not met")
  }'
done
echo "load average before: $load_before; after: $load_after ($(nproc) hardware threads)"
