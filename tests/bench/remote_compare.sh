#!/usr/bin/env bash
# Compares `troupe bench remote` with its anchors in one run on one machine: CAF's BASP
# (caf_remote_bench, built from tests/bench/caf/ where CAF is installed) and, with --ray, Ray
# actors (tests/bench/ray/remote_bench.py). Prints one row per metric with the medians of each
# side, the ratios and the issue's bar for troupe.
#
#   tests/bench/remote_compare.sh [--quick] [--repeat N] [--build DIR] [--no-caf] [--ray]
#                                 [--python PY] [--policy stealing|sharing] [--rows FILE]
#
#   --quick      smaller sizes (passed to every program)
#   --repeat N   run the programs N times, interleaved, and compare medians (default 3)
#   --build DIR  the build tree holding bin/troupe and bin/caf_remote_bench
#                (default: build/ at the repository root)
#   --no-caf     leave CAF out (tests/bench/ray/compare.sh uses this)
#   --ray        run Ray's side too
#   --python PY  a Python that can import ray (default: /tmp/ray-venv/bin/python, made by:
#                python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray)
#   --policy P   CAF's scheduler policy (default stealing, CAF's default)
#   --rows FILE  also write every run's results there, one tab-separated
#                "side run bench metric value unit" line each
#
# Every program prints one JSON object per result line:
#   {"suite":...,"bench":NAME,"metric":METRIC,"value":X,"unit":U}
# The anchors' call_sync ratio_to_raw is computed here: their round trip over troupe's raw Asio
# ping-pong of the same repetition. Ratios are given so that above 1 means troupe is better.
#
# Needs only bash, awk, sed and grep (and Ray's Python with --ray). Exits 0 whether or not
# troupe wins every row; 1 when a program is missing or fails, 2 on a bad argument.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"

build_dir="$repo_root/build"
quick=()
repeat=3
with_caf=1
with_ray=0
python=/tmp/ray-venv/bin/python
policy=stealing
rows_file=""

usage() {
  echo "usage: tests/bench/remote_compare.sh [--quick] [--repeat N] [--build DIR] [--no-caf] [--ray] [--python PY] [--policy stealing|sharing] [--rows FILE]"
}
bad() {
  echo "remote_compare.sh: $1" >&2
  usage >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=(--quick); shift ;;
    --repeat)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--repeat needs a positive count"
      repeat="$2"; shift 2 ;;
    --build)
      [[ $# -ge 2 ]] || bad "--build needs a directory"
      build_dir="$2"; shift 2 ;;
    --build=*) build_dir="${1#--build=}"; shift ;;
    --no-caf) with_caf=0; shift ;;
    --ray) with_ray=1; shift ;;
    --python)
      [[ $# -ge 2 ]] || bad "--python needs an interpreter"
      python="$2"; shift 2 ;;
    --policy)
      [[ $# -ge 2 && ( "$2" == stealing || "$2" == sharing ) ]] || bad "--policy needs stealing or sharing"
      policy="$2"; shift 2 ;;
    --rows)
      [[ $# -ge 2 ]] || bad "--rows needs a file"
      rows_file="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown argument: $1" ;;
  esac
done
[[ $with_caf -eq 1 || $with_ray -eq 1 ]] || bad "--no-caf without --ray leaves nothing to compare"

troupe_bin="$build_dir/bin/troupe"
caf_bin="$build_dir/bin/caf_remote_bench"
ray_script="$script_dir/ray/remote_bench.py"

missing=0
if [[ ! -x "$troupe_bin" ]]; then
  echo "remote_compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir --target troupe)" >&2
  missing=1
fi
if [[ $with_caf -eq 1 && ! -x "$caf_bin" ]]; then
  echo "remote_compare.sh: $caf_bin is missing or not executable; it is built only where CAF with libcaf_io is installed (cmake/install-deps.sh --bench, then re-run cmake)" >&2
  missing=1
fi
if [[ $with_ray -eq 1 ]]; then
  if ! command -v "$python" >/dev/null 2>&1; then
    echo "remote_compare.sh: no Python at $python; make one with python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray, or pass --python" >&2
    missing=1
  elif ! ray_version="$("$python" -c 'import ray; print(ray.__version__)' 2>/dev/null)"; then
    echo "remote_compare.sh: $python cannot import ray; install it for this comparison only (pip install ray in a virtual environment) or pass --python" >&2
    missing=1
  fi
fi
[[ $missing -eq 0 ]] || exit 1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# run SIDE ITERATION CMD... : runs a benchmark program and keeps its JSON lines as
# tab-separated "side iteration bench metric value unit" rows.
run() {
  local side="$1" iter="$2"
  shift 2
  echo "remote_compare.sh: running $*" >&2
  local rc=0
  "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "remote_compare.sh: $side failed (exit code $rc): $*" >&2
    exit 1
  fi
  awk -v side="$side" -v iter="$iter" '
    function field(name,    re, s) {
      re = "\"" name "\"[[:space:]]*:[[:space:]]*"
      if (!match($0, re "\"[^\"]*\"")) {
        if (!match($0, re "[-+0-9.eE]+")) return ""
      }
      s = substr($0, RSTART, RLENGTH)
      sub(re, "", s)
      gsub(/"/, "", s)
      return s
    }
    /^[[:space:]]*\{/ {
      bench = field("bench"); metric = field("metric")
      value = field("value"); unit = field("unit")
      if (bench == "" || metric == "" || value == "") next
      if (unit == "") unit = "-"
      print side "\t" iter "\t" bench "\t" metric "\t" value "\t" unit
    }' "$work/raw" >"$work/rows.$side.$iter"
  if [[ ! -s "$work/rows.$side.$iter" ]]; then
    echo "remote_compare.sh: no results parsed from $side: $*" >&2
    exit 1
  fi
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

sides="troupe"
[[ $with_caf -eq 1 ]] && sides="$sides caf"
[[ $with_ray -eq 1 ]] && sides="$sides ray"

# The programs alternate so that every side sees the same machine conditions.
load_before="$(loadavg)"
for ((i = 1; i <= repeat; i++)); do
  run troupe "$i" "$troupe_bin" bench remote --json "${quick[@]}"
  [[ $with_caf -eq 1 ]] && run caf "$i" "$caf_bin" --json --policy "$policy" "${quick[@]}"
  [[ $with_ray -eq 1 ]] && run ray "$i" "$python" "$ray_script" --json "${quick[@]}"
done
load_after="$(loadavg)"
if [[ -n "$rows_file" ]]; then
  cat "$work"/rows.* >"$rows_file" || { echo "remote_compare.sh: cannot write $rows_file" >&2; exit 1; }
fi

cat "$work"/rows.* | awk -F'\t' -v sides="$sides" -v runs="$repeat" -v quick="${quick[*]:-}" '
  BEGIN {
    n_sides = split(sides, side_list, " ")
    for (s = 1; s <= n_sides; s++)
      label[side_list[s]] = (side_list[s] == "troupe") ? "troupe" : (side_list[s] == "caf" ? "CAF" : "Ray")
    n_order = split("raw_pingpong:round_trips_per_s raw_pingpong:round_trip_us " \
                    "call_sync:calls_per_s call_sync:round_trip_us call_sync:ratio_to_raw " \
                    "call_async:calls_per_s bulk:MB_per_s remote_spawn:actors_per_s remote_spawn:actors_per_s_blocking " \
                    "failover:ms_until_asks_fail failover:ms_until_down", order, " ")
    split("round_trip_us ratio_to_raw ms_until_asks_fail ms_until_down", lo, " ")
    for (i in lo) lower_better[lo[i]] = 1
    bar["call_sync:calls_per_s"] = ">= 20,000";   bar_v["call_sync:calls_per_s"] = 20000
    bar["call_sync:ratio_to_raw"] = "<= 2";       bar_v["call_sync:ratio_to_raw"] = 2
    bar["call_async:calls_per_s"] = ">= 150,000"; bar_v["call_async:calls_per_s"] = 150000
    bar["bulk:MB_per_s"] = ">= 1,000";            bar_v["bulk:MB_per_s"] = 1000
    bar["remote_spawn:actors_per_s"] = ">= 5,000"; bar_v["remote_spawn:actors_per_s"] = 5000
    bar["failover:ms_until_asks_fail"] = "<= 1,000"; bar_v["failover:ms_until_asks_fail"] = 1000
  }
  {
    key = $3 ":" $4
    add($1, key, $5)
    unit[key] = $6
    v[$1, $2, key] = $5
    iters[$2] = 1
  }
  function add(side, key, value,    n) {
    n = ++count[side, key]
    vals[side, key, n] = value + 0
    if (!(key in seen)) { seen[key] = 1; extra[++n_extra] = key }
  }
  # The median of the values of (side, key), or "" when there are none.
  function median(side, key,    n, i, j, t, a) {
    n = count[side, key]
    if (n == 0) return ""
    for (i = 1; i <= n; i++) a[i] = vals[side, key, i]
    for (i = 2; i <= n; i++)
      for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function fmt(x) {
    if (x == "") return "-"
    if (x + 0 >= 1000) return sprintf("%.0f", x)
    if (x + 0 >= 10) return sprintf("%.1f", x)
    return sprintf("%.3f", x)
  }
  # How many times better troupe is than the other side (above 1: troupe is better).
  function ratio(metric, t, o) {
    if (t == "" || o == "" || t + 0 <= 0 || o + 0 <= 0) return "-"
    return sprintf("%.2fx", (metric in lower_better) ? o / t : t / o)
  }
  END {
    # The anchors round trip against troupe raw ping-pong of the same repetition.
    for (it in iters)
      for (s = 2; s <= n_sides; s++) {
        side = side_list[s]
        a = v[side, it, "call_sync:round_trip_us"]; r = v["troupe", it, "raw_pingpong:round_trip_us"]
        if (a != "" && r != "" && r + 0 > 0) { add(side, "call_sync:ratio_to_raw", a / r); unit["call_sync:ratio_to_raw"] = "x" }
      }
    printf "troupe vs %s, remote actors on loopback%s, medians of %d interleaved runs\n", \
      (n_sides == 3 ? "CAF and Ray" : label[side_list[2]]), (quick != "" ? " (quick sizes)" : ""), runs
    printf "ratios: how many times better troupe is (above 1: troupe better); bar: the target for troupe\n\n"
    hdr = sprintf("%-13s %-19s %12s", "bench", "metric", "troupe")
    for (s = 2; s <= n_sides; s++) hdr = hdr sprintf(" %12s", label[side_list[s]])
    hdr = hdr sprintf("  %-14s %-11s %-4s", "unit", "bar", "met")
    for (s = 2; s <= n_sides; s++) hdr = hdr sprintf(" %10s", "vs " label[side_list[s]])
    print hdr
    for (i = 1; i <= n_order; i++) keys[++n_keys] = order[i]
    for (i = 1; i <= n_extra; i++) keys[++n_keys] = extra[i]
    for (k = 1; k <= n_keys; k++) {
      key = keys[k]
      if (!(key in seen) || (key in done_key)) continue
      done_key[key] = 1
      split(key, parts, ":")
      t = median("troupe", key)
      line = sprintf("%-13s %-19s %12s", parts[1], parts[2], fmt(t))
      for (s = 2; s <= n_sides; s++) line = line sprintf(" %12s", fmt(median(side_list[s], key)))
      met = "-"
      if ((key in bar) && t != "") {
        if (parts[2] in lower_better) met = (t + 0 <= bar_v[key]) ? "yes" : "NO"
        else met = (t + 0 >= bar_v[key]) ? "yes" : "NO"
      }
      line = line sprintf("  %-14s %-11s %-4s", unit[key], (key in bar) ? bar[key] : "-", met)
      for (s = 2; s <= n_sides; s++) line = line sprintf(" %10s", ratio(parts[2], t, median(side_list[s], key)))
      print line
    }
  }'

echo
[[ $with_caf -eq 1 ]] && echo "CAF: caf_remote_bench, $policy scheduler policy, 2 threads per process"
[[ $with_ray -eq 1 ]] && echo "Ray: $ray_version ($python), smaller counts (see tests/bench/ray/remote_bench.py)"
echo "load average before: $load_before; after: $load_after ($(nproc) hardware threads)"
