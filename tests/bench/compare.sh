#!/usr/bin/env bash
# Compares `troupe bench actors` with its CAF anchor (caf_bench, built from
# tests/bench/caf/ where CAF is installed) and prints one row per metric.
#
#   tests/bench/compare.sh [--quick] [--repeat N] [--build DIR]
#
#   --quick      smaller sizes, for CI (passed to both programs)
#   --repeat N   run each program N times, alternating, and compare medians (default 1)
#   --build DIR  the build tree holding bin/troupe and bin/caf_bench
#                (default: build/ at the repository root)
#
# Both programs print one JSON object per result line:
#   {"suite":...,"bench":NAME,"metric":METRIC,"value":X,"unit":U}
# fan_in's memory_growth_mb reads the process-wide peak RSS, so fan_in is run
# again on its own (--only fan_in) and its rows come from that run.
#
# Needs only bash, awk, sed and grep. Exits 0 whether or not troupe wins every
# row; exits 1 when a program is missing or fails, 2 on a bad argument.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"

build_dir="$repo_root/build"
quick=()
repeat=1

usage() {
  echo "usage: tests/bench/compare.sh [--quick] [--repeat N] [--build DIR]"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=(--quick); shift ;;
    --repeat)
      if [[ $# -lt 2 || ! "$2" =~ ^[1-9][0-9]*$ ]]; then
        echo "compare.sh: --repeat needs a positive count" >&2
        usage >&2
        exit 2
      fi
      repeat="$2"; shift 2 ;;
    --build)
      if [[ $# -lt 2 ]]; then
        echo "compare.sh: --build needs a directory" >&2
        usage >&2
        exit 2
      fi
      build_dir="$2"; shift 2 ;;
    --build=*) build_dir="${1#--build=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *)
      echo "compare.sh: unknown argument: $1" >&2
      usage >&2
      exit 2 ;;
  esac
done

troupe_bin="$build_dir/bin/troupe"
caf_bin="$build_dir/bin/caf_bench"

missing=0
if [[ ! -x "$troupe_bin" ]]; then
  echo "compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir)" >&2
  missing=1
fi
if [[ ! -x "$caf_bin" ]]; then
  echo "compare.sh: $caf_bin is missing or not executable; it is built only where CAF is installed (cmake/install-deps.sh --bench, then re-run cmake)" >&2
  missing=1
fi
[[ $missing -eq 0 ]] || exit 1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# run NAME OUTFILE CMD... : runs a benchmark program, keeping the JSON lines.
run() {
  local name="$1" out="$2"
  shift 2
  echo "compare.sh: running $*" >&2
  local rc=0
  "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "compare.sh: $name failed (exit code $rc): $*" >&2
    exit 1
  fi
  grep '^[[:space:]]*{' "$work/raw" >>"$out" || true
}

# All workloads, then fan_in alone for an exact memory_growth_mb; the two programs
# alternate so that both see the same machine conditions.
for ((i = 1; i <= repeat; i++)); do
  run troupe "$work/troupe_all" "$troupe_bin" bench actors --json "${quick[@]}"
  run caf_bench "$work/caf_all" "$caf_bin" --json "${quick[@]}"
  run troupe "$work/troupe_fan_in" "$troupe_bin" bench actors --json "${quick[@]}" --only fan_in
  run caf_bench "$work/caf_fan_in" "$caf_bin" --json "${quick[@]}" --only fan_in
done

# Flattens JSON lines into "bench metric value unit" rows; fan_in rows come
# from the run of fan_in alone.
flatten() {
  awk '
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
    {
      bench = field("bench"); metric = field("metric")
      value = field("value"); unit = field("unit")
      if (bench == "" || metric == "" || value == "") next
      if (unit == "") unit = "-"
      print bench, metric, value, unit
    }' "$@"
}

# Reduces repeated rows to one per (bench, metric): the median of its values.
median() {
  sort -k1,1 -k2,2 -k3,3g | awk '
    function emit(    m) {
      if (n == 0) return
      m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      print key_b, key_m, m, key_u
    }
    {
      if ($1 != key_b || $2 != key_m) { emit(); n = 0; key_b = $1; key_m = $2; key_u = $4 }
      v[++n] = $3
    }
    END { emit() }'
}

for side in troupe caf; do
  {
    flatten "$work/${side}_all" | awk '$1 != "fan_in"'
    flatten "$work/${side}_fan_in" | awk '$1 == "fan_in"'
  } | median >"$work/$side.rows"
  if [[ ! -s "$work/$side.rows" ]]; then
    echo "compare.sh: no results parsed from $side" >&2
    exit 1
  fi
done

awk -v quick="${quick[*]:-}" -v runs="$repeat" '
  BEGIN {
    # Canonical row order; anything else either side reports follows it.
    n_order = split("pingpong:round_trip_us blocking_call:round_trip_us " \
                    "in_flight:calls_per_s fan_in:msgs_per_s " \
                    "fan_in:memory_growth_mb spawn:actors_per_s " \
                    "idle_actor:bytes_per_actor fork_join:rounds_per_s " \
                    "thread_ring:ns_per_hop", order, " ")
    split("round_trip_us ns_per_hop bytes_per_actor memory_growth_mb", lo, " ")
    for (i in lo) lower_better[lo[i]] = 1
    split("calls_per_s msgs_per_s actors_per_s rounds_per_s", hi, " ")
    for (i in hi) higher_better[hi[i]] = 1
  }
  FNR == 1 { side++ }
  {
    key = $1 ":" $2
    if (!(key in seen)) { seen[key] = 1; extra[++n_extra] = key }
    if (side == 1) troupe[key] = $3; else caf[key] = $3
    unit[key] = $4
  }
  function fmt(v) {
    if (v == "") return "missing"
    if (v + 0 >= 1000 || v + 0 <= -1000) return sprintf("%.0f", v)
    return sprintf("%.3f", v)
  }
  # Sets verdict_text and returns 1 (troupe better), 0 (not better) or
  # -1 (cannot be compared).
  function verdict(metric, t, c,    r) {
    if (t == "" || c == "") { verdict_text = "n/a (missing)"; return -1 }
    t += 0; c += 0
    if (metric in lower_better) {
      if (t == c) { verdict_text = "equal"; return 0 }
      if (t <= 0 && c > 0) { verdict_text = "troupe better (" fmt(t) " vs " fmt(c) ")"; return 1 }
      if (c <= 0 && t > 0) { verdict_text = "CAF better (" fmt(c) " vs " fmt(t) ")"; return 0 }
      if (t <= 0 || c <= 0) { verdict_text = "n/a (non-positive values)"; return -1 }
      r = c / t
    } else if (metric in higher_better) {
      if (t == c) { verdict_text = "equal"; return 0 }
      if (t <= 0 || c <= 0) {
        verdict_text = (t > c) ? "troupe better" : "CAF better"
        return (t > c) ? 1 : 0
      }
      r = t / c
    } else {
      verdict_text = "n/a (unknown metric direction)"
      return -1
    }
    if (r >= 1) { verdict_text = sprintf("troupe better by %.2fx", r); return 1 }
    verdict_text = sprintf("CAF better by %.2fx", 1 / r)
    return 0
  }
  function row(key,    parts, b, m, v) {
    if (key in printed) return
    printed[key] = 1
    split(key, parts, ":")
    b = parts[1]; m = parts[2]
    v = verdict(m, troupe[key], caf[key])
    printf "%-14s %-17s %14s %14s  %-9s %s\n", b, m, fmt(troupe[key]), fmt(caf[key]), unit[key], verdict_text
    if (!(b in bench_seen)) { bench_seen[b] = 1; benches[++n_benches] = b; bench_ok[b] = 1 }
    if (v != 1) bench_ok[b] = 0
    n_metrics++
    if (v == 1) n_metrics_won++
  }
  END {
    printf "troupe vs CAF, actor workloads%s%s\n\n", (quick != "" ? " (quick sizes)" : ""), (runs > 1 ? ", medians of " runs " runs" : "")
    printf "%-14s %-17s %14s %14s  %-9s %s\n", "bench", "metric", "troupe", "caf", "unit", "ratio"
    printf "%-14s %-17s %14s %14s  %-9s %s\n", "-----", "------", "------", "---", "----", "-----"
    for (i = 1; i <= n_order; i++) if (order[i] in seen) row(order[i])
    for (i = 1; i <= n_extra; i++) row(extra[i])
    won = 0
    for (i = 1; i <= n_benches; i++) if (bench_ok[benches[i]]) won++
    printf "\ntroupe beats CAF on %d of %d workloads (%d of %d metrics; a workload counts when troupe is better on every one of its metrics)\n", won, n_benches, n_metrics_won, n_metrics
  }
' "$work/troupe.rows" "$work/caf.rows"
