#!/usr/bin/env bash
# Compares troupe's fused optimizer steps with torch.optim on the same workload (50 M float32
# parameters in 100 tensors; SGD with momentum, Adam, AdamW), in one run on one machine.
#
#   tests/bench/optim_compare.sh [--steps N] [--threads N] [--torch-impl foreach|single|both]
#                                [--build DIR] [--python PY]
#
#   --steps N        timed steps per row on both sides (default 7; the median is compared)
#   --threads N      threads on both sides (default 2)
#   --torch-impl I   torch.optim's multi-tensor path (foreach, default), single-tensor, or both
#   --build DIR      the build tree holding bin/troupe (default: build/ at the repository root)
#   --python PY      a Python that can import torch (default: /usr/bin/python3)
#
# Runs `troupe bench optim --json` (when this troupe has that subcommand; otherwise only the
# PyTorch side is shown), then tests/bench/torch_optim.py, and prints one row per optimizer and
# troupe state storage with the ratio of torch's fp32 seconds per step to troupe's.
#
# PyTorch is not a dependency of troupe; only this comparison needs it. Exits 0 whether or not
# troupe is faster; 1 when a program is missing or fails; 2 on a bad argument or when PyTorch
# cannot be imported.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"

build_dir="$repo_root/build"
python=/usr/bin/python3
steps=7
threads=2
torch_impl=foreach

usage() {
  echo "usage: tests/bench/optim_compare.sh [--steps N] [--threads N] [--torch-impl foreach|single|both] [--build DIR] [--python PY]"
}
bad() {
  echo "optim_compare.sh: $1" >&2
  usage >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--steps needs a positive count"
      steps="$2"; shift 2 ;;
    --threads)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--threads needs a positive count"
      threads="$2"; shift 2 ;;
    --torch-impl)
      [[ $# -ge 2 && "$2" =~ ^(foreach|single|both)$ ]] || bad "--torch-impl needs foreach, single or both"
      torch_impl="$2"; shift 2 ;;
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
  echo "optim_compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir)" >&2
  exit 1
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "optim_compare.sh: no Python at $python (pass --python)" >&2
  exit 1
fi
if ! torch_version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
  echo "optim_compare.sh: $python cannot import torch; install PyTorch for this comparison only (Debian: apt-get install python3-torch) or pass --python" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
: >"$work/troupe"

# run OUTFILE CMD... : runs a program, keeping its JSON lines.
run() {
  local out="$1"
  shift
  echo "optim_compare.sh: running $*" >&2
  local rc=0
  "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "optim_compare.sh: failed (exit code $rc): $*" >&2
    exit 1
  fi
  grep '^[[:space:]]*{' "$work/raw" >"$out" || true
  if [[ ! -s "$out" ]]; then
    echo "optim_compare.sh: no JSON line from: $*" >&2
    exit 1
  fi
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
if "$troupe_bin" bench optim --help >/dev/null 2>&1; then
  run "$work/troupe" "$troupe_bin" bench optim --json --steps "$steps" --threads "$threads"
else
  echo "optim_compare.sh: $troupe_bin has no 'bench optim'; showing PyTorch alone" >&2
fi
run "$work/torch" "$python" "$script_dir/torch_optim.py" --steps "$steps" --threads "$threads" --impl "$torch_impl"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# Rows "bench state device seconds bytes_per_param" from the seconds_per_step lines.
rows() {
  awk '
    function field(name,    re, s) {
      re = "\"" name "\"[[:space:]]*:[[:space:]]*"
      if (!match($0, re "\"[^\"]*\"") && !match($0, re "[-+0-9.eE]+")) return ""
      s = substr($0, RSTART, RLENGTH); sub(re, "", s); gsub(/"/, "", s); return s
    }
    field("metric") == "seconds_per_step" {
      print field("bench"), field("state"), field("device"), field("value"), field("bytes_per_param")
    }' "$@"
}

{
  rows "$work/troupe" | sed 's/^/troupe /'
  rows "$work/torch" | sed 's/^/torch /'
} | awk -v version="$torch_version" -v threads="$threads" '
  $1 == "torch" { torch[$2, $4] = $5; torch_bpp[$2, $4] = $6; devices[$4] = 1; order[$2] = 1; next }
  { troupe[++n] = $0; order[$3] = 1 }
  END {
    printf "%-6s %-22s %14s %15s\n", "bench", "implementation", "seconds/step", "bytes/param"
    split("sgd adam adamw", names, " ")
    for (i = 1; i <= 3; i++) {
      b = names[i]
      for (d in devices)
        if ((b, d) in torch)
          printf "%-6s %-22s %14.5f %15.2f\n", b, "torch " version " " (d == "cpu-torch" ? "foreach" : "single"),
                 torch[b, d], torch_bpp[b, d]
      for (k = 1; k <= n; k++) {
        split(troupe[k], f, " ")
        if (f[2] != b) continue
        line = sprintf("%-6s %-22s %14.5f %15.2f", b, "troupe " f[3], f[5], f[6])
        if ((b, "cpu-torch") in torch && f[5] > 0)
          line = line sprintf("   %.2fx faster than torch foreach fp32", torch[b, "cpu-torch"] / f[5])
        print line
      }
    }
    printf "\n%d thread(s) on both sides\n", threads
  }'
echo "load average before: $load_before; after: $load_after ($(nproc) hardware threads)"
