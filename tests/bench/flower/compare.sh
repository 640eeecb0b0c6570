#!/usr/bin/env bash
# Runs `troupe fedsim` and the same configuration on Flower's simulation engine
# (tests/bench/flower/fedsim_flower.py) in one run on one machine, and prints rounds/s, peak
# memory and the accuracy at the last round of both, with the ratios.
#
#   tests/bench/flower/compare.sh [--rounds N] [--big-rounds N] [--partition P] [--build DIR] [--python PY]
#
#   --rounds N       rounds of the first configuration, 100 clients and 10 per round (default 20)
#   --big-rounds N   rounds of the second, 1000 clients and 100 per round (default 5)
#   --partition P    iid or dirichlet:A (default dirichlet:0.5, troupe fedsim's default)
#   --build DIR      the build tree holding bin/troupe (default: build/ at the repository root)
#   --python PY      a Python that can import flwr and Ray (default: /tmp/flwr-venv/bin/python,
#                    made by: python3 -m venv /tmp/flwr-venv &&
#                    /tmp/flwr-venv/bin/pip install "flwr[simulation]")
#
# Both sides evaluate on the test set only after the last round, use every core (troupe: one
# worker thread per core; Flower: one Ray CPU per core and one CPU per client) and report
# rounds/s over the rounds' time alone. Flower's first round also starts its Ray actors and
# loads the data in each, so its rounds/s is given over all rounds and over the rounds after
# the first; the ratio uses the latter. Peak memory: troupe's is its process's peak RSS;
# Flower's is the largest sum of RSS over its driver and all Ray processes. The machine's load
# average is printed before and after.
#
# Flower is not a dependency of troupe; only this comparison needs it. Exits 0 after printing
# the table; 1 when a program is missing or fails; 2 on a bad argument or when flwr cannot be
# imported.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../../.." && pwd)"

build_dir="$repo_root/build"
python=/tmp/flwr-venv/bin/python
rounds=20
big_rounds=5
partition="dirichlet:0.5"

usage() {
  echo "usage: tests/bench/flower/compare.sh [--rounds N] [--big-rounds N] [--partition P] [--build DIR] [--python PY]"
}
bad() {
  echo "compare.sh: $1" >&2
  usage >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--rounds needs a positive count"
      rounds="$2"; shift 2 ;;
    --big-rounds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--big-rounds needs a positive count"
      big_rounds="$2"; shift 2 ;;
    --partition)
      [[ $# -ge 2 && ( "$2" == iid || "$2" =~ ^dirichlet:[0-9]*\.?[0-9]+$ ) ]] || bad "--partition needs iid or dirichlet:A, e.g. dirichlet:0.5"
      partition="$2"; shift 2 ;;
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
  echo "compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir --target troupe)" >&2
  exit 1
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "compare.sh: no Python at $python; make one with python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install \"flwr[simulation]\", or pass --python" >&2
  exit 1
fi
if ! flwr_version="$("$python" -c 'import flwr, ray; print(flwr.__version__, "with Ray", ray.__version__)' 2>/dev/null)"; then
  echo "compare.sh: $python cannot import flwr and ray; install them for this comparison only (pip install \"flwr[simulation]\" in a virtual environment) or pass --python" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# run OUTFILE CMD... : runs a program, keeping its JSON lines (logs go to stderr).
run() {
  local out="$1"
  shift
  echo "compare.sh: running $*" >&2
  local rc=0
  "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "compare.sh: failed (exit code $rc): $*" >&2
    exit 1
  fi
  grep '^[[:space:]]*{' "$work/raw" >"$out" || true
  if [[ ! -s "$out" ]]; then
    echo "compare.sh: no JSON line from: $*" >&2
    exit 1
  fi
}

# field NAME FILE: the value of "NAME" in the last line of FILE that has it.
field() {
  awk -v name="$1" '
    {
      re = "\"" name "\"[[:space:]]*:[[:space:]]*"
      if (match($0, re "\"[^\"]*\"") || match($0, re "[-+0-9.eE]+")) {
        s = substr($0, RSTART, RLENGTH); sub(re, "", s); gsub(/"/, "", s); v = s
      }
    }
    END { print v }' "$2"
}

configs=("100 10 $rounds" "1000 100 $big_rounds")
load_before="$(loadavg)"
for c in "${configs[@]}"; do
  read -r clients per_round r <<<"$c"
  common=(--clients "$clients" --per-round "$per_round" --rounds "$r" --eval-every "$r" --partition "$partition")
  run "$work/troupe_$clients" "$troupe_bin" fedsim "${common[@]}" --json
  run "$work/flower_$clients" "$python" "$script_dir/fedsim_flower.py" "${common[@]}"
done
load_after="$(loadavg)"

{
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "configuration" "framework" "rounds" "rounds/s" "peak MB" "accuracy"
  for c in "${configs[@]}"; do
    read -r clients per_round r <<<"$c"
    name="$clients clients, $per_round/round"
    t="$work/troupe_$clients"
    f="$work/flower_$clients"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "troupe" "$(field rounds "$t")" "$(field rounds_per_s "$t")" \
      "$(field peak_rss_mb "$t")" "$(field final_accuracy "$t")"
    after="$(field rounds_per_s_after_first "$f")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "flower" "$(field rounds "$f")" \
      "$(field rounds_per_s "$f") (${after:-n/a} after the 1st)" "$(field peak_rss_mb "$f")" "$(field final_accuracy "$f")"
  done
} | awk -F'\t' '{ printf "%-26s %-9s %6s %-28s %9s %9s\n", $1, $2, $3, $4, $5, $6 }'

echo
for c in "${configs[@]}"; do
  read -r clients per_round r <<<"$c"
  t="$work/troupe_$clients"
  f="$work/flower_$clients"
  awk -v name="$clients clients, $per_round/round" -v tr="$(field rounds_per_s "$t")" \
      -v fa="$(field rounds_per_s "$f")" -v fs="$(field rounds_per_s_after_first "$f")" \
      -v tm="$(field peak_rss_mb "$t")" -v fm="$(field peak_rss_mb "$f")" 'BEGIN {
    if (fs + 0 <= 0) fs = fa
    if (fa + 0 <= 0 || tm + 0 <= 0) { printf "%s: no rounds/s or memory to compare\n", name; exit }
    printf "%s: troupe/flower rounds/s %.1fx (%.1fx counting Flower'\''s first round); flower/troupe peak memory %.1fx\n",
           name, tr / fs, tr / fa, fm / tm
  }'
done
echo "flwr $flwr_version, $("$python" -c 'import numpy; print("NumPy", numpy.__version__)'); partition $partition"
echo "load average before: $load_before; after: $load_after ($(nproc) hardware threads)"
