#!/usr/bin/env bash
# Runs `troupe bench remote` and the same call patterns on Ray actors
# (tests/bench/ray/remote_bench.py) in one run on one machine, interleaved, and prints the
# medians side by side with the ratio troupe / Ray per row and the issue's bar for troupe.
#
#   tests/bench/ray/compare.sh [--quick] [--repeat N] [--build DIR] [--python PY] [--with-caf]
#
#   --repeat N   runs per side, interleaved (default 3)
#   --build DIR  the build tree holding bin/troupe (default: build/ at the repository root)
#   --python PY  a Python that can import ray (default: /tmp/ray-venv/bin/python, made by:
#                python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray)
#   --with-caf   CAF's side too (bin/caf_remote_bench): all three in one table
#
# Ray is not a dependency of troupe; only this comparison needs it. The table and the exit
# codes are those of tests/bench/remote_compare.sh, which does the work.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
args=()
caf=(--no-caf)
for a in "$@"; do
  if [[ "$a" == --with-caf ]]; then caf=(); else args+=("$a"); fi
done
exec "$script_dir/../remote_compare.sh" --ray "${caf[@]}" "${args[@]}"
