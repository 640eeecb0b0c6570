#!/usr/bin/env bash
# What --tee sim costs a federated run, in CPU time (user + system of fedsim and of the enclave's
# process it starts and waits for), over interleaved pairs of the same run without and with it
# (docs/federated/verifiable.md, docs/PERFORMANCE.md). Prints each pair, then the medians and the
# median of the pairs' ratios, and the load average before and after.
#
#   tests/bench/tee_overhead.sh PATH/TO/troupe [PAIRS (7)] [-- FEDSIM FLAGS (default: none, the default run)]
set -euo pipefail
troupe=${1:?usage: tee_overhead.sh PATH/TO/troupe [PAIRS] [-- FEDSIM FLAGS]}
shift
pairs=7
if [[ $# -gt 0 && $1 != -- ]]; then pairs=$1; shift; fi
[[ $# -gt 0 && $1 == -- ]] && shift
[[ -x $troupe ]] || { echo "tee_overhead.sh: $troupe is not an executable" >&2; exit 2; }
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "tee_overhead.sh: PAIRS must be a positive integer, not $pairs" >&2; exit 2; }
cpu() {  # CPU seconds of one run, and its model CRC
  local t out
  t=$(mktemp)
  out=$(/usr/bin/time -f '%U %S' -o "$t" "$troupe" fedsim --json "$@" | tail -1)
  awk '{printf "%.3f", $1 + $2}' "$t"
  rm -f "$t"
  printf ' %s\n' "$(sed -n 's/.*"model_crc32":"\([0-9a-f]*\)".*/\1/p' <<<"$out")"
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
plain=() tee=() ratio=()
for ((i = 1; i <= pairs; ++i)); do
  read -r p pc < <(cpu "$@")
  read -r t tc < <(cpu "$@" --tee sim --tee-root test)
  [[ $pc == "$tc" ]] || { echo "pair $i: the model CRCs differ ($pc plain, $tc --tee sim)" >&2; exit 1; }
  r=$(awk -v a="$t" -v b="$p" 'BEGIN{printf "%.3f", a / b}')
  echo "pair $i: plain $p s, --tee sim $t s, ratio $r, model CRC $pc"
  plain+=("$p") tee+=("$t") ratio+=("$r")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "median CPU s: plain $(median "${plain[@]}"), --tee sim $(median "${tee[@]}"); median ratio $(median "${ratio[@]}") over $pairs pairs"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
