#!/usr/bin/env bash
# What an open dashboard costs what it watches, in CPU time over interleaved pairs of runs
# (docs/PERFORMANCE.md): tests/bench/dashboard_overhead.py says how.
#
#   tests/bench/dashboard_overhead.sh PATH/TO/troupe [--repeat 11] [--rounds 20] [--only WORKLOAD] [--json FILE]
exec python3 "$(dirname "$0")/dashboard_overhead.py" "$@"
