#!/usr/bin/env bash
# The ring all-reduce beside torch.distributed's all_reduce with the gloo backend, side by side
# in one run: the two programs alternate, RUNS times each, and the medians over all their calls
# are compared, with the load average before each run.
#
#   tests/bench/allreduce_compare.sh [--runs N] [--repeat N] [--processes P] [--megabytes M]
#                                    [--build DIR] [--python PY]
#
#   --runs N        runs of each program, alternating (default 3)
#   --repeat N      timed calls per run (default 3)
#   --processes P   processes on this host (default 4)
#   --megabytes M   float32 megabytes each process reduces (default 100)
#   --build DIR     the build tree holding bin/allreduce_bench (default: build/)
#   --python PY     a Python that can import torch (default: /usr/bin/python3)
#
# PyTorch is not a dependency of troupe; only this comparison needs it. Exits 0 whether or not
# troupe is faster; 1 when a program fails or a result is wrong; 2 on a bad argument.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"
build_dir="$repo_root/build"
python=/usr/bin/python3
runs=3
repeat=3
processes=4
megabytes=100

usage() {
  echo "usage: tests/bench/allreduce_compare.sh [--runs N] [--repeat N] [--processes P] [--megabytes M] [--build DIR] [--python PY]"
}
bad() {
  echo "allreduce_compare.sh: $1" >&2
  usage >&2
  exit 2
}
count() { [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "$1 needs a positive count"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) count "$@"; runs="$2"; shift 2 ;;
    --repeat) count "$@"; repeat="$2"; shift 2 ;;
    --processes) count "$@"; processes="$2"; shift 2 ;;
    --megabytes) count "$@"; megabytes="$2"; shift 2 ;;
    --build) [[ $# -ge 2 ]] || bad "--build needs a directory"; build_dir="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || bad "--python needs an interpreter"; python="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown argument: $1" ;;
  esac
done
[[ "$processes" -ge 2 ]] || bad "--processes needs at least 2"
bench="$build_dir/bin/allreduce_bench"
[[ -x "$bench" ]] || { echo "allreduce_compare.sh: $bench is missing (build the allreduce_bench target)" >&2; exit 1; }
"$python" -c "import torch.distributed" 2>/dev/null || bad "$python cannot import torch.distributed (give --python)"

rows="$(mktemp)"
trap 'rm -f "$rows"' EXIT
for ((i = 1; i <= runs; i++)); do
  echo "run $i: load $(cut -d' ' -f1-3 /proc/loadavg) troupe" >&2
  TROUPE_LOG_LEVEL=warn "$bench" --processes "$processes" --megabytes "$megabytes" --repeat "$repeat" | tee -a "$rows"
  echo "run $i: load $(cut -d' ' -f1-3 /proc/loadavg) torch gloo" >&2
  "$python" "$script_dir/torch_allreduce.py" --processes "$processes" --megabytes "$megabytes" --repeat "$repeat" | tee -a "$rows"
done
python3 - "$rows" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not all(r["correct"] for r in rows):
    print("allreduce_compare.sh: a result was wrong", file=sys.stderr)
    sys.exit(1)
t = statistics.median(r["seconds"] for r in rows if r["impl"] == "troupe")
g = statistics.median(r["seconds"] for r in rows if r["impl"] == "torch-gloo")
n = sum(r["impl"] == "troupe" for r in rows)
print(json.dumps({"troupe_s": round(t, 4), "gloo_s": round(g, 4), "calls_each": n,
                  "troupe_over_gloo_time": round(t / g, 3)}))
EOF
