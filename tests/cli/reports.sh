#!/usr/bin/env bash
# The HTML reports of `--report FILE.html`: troupe fedsim (one run and clients of different
# architectures), troupe train (with a pipeline's schedule) and troupe bench (its rows beside an
# anchor's, as bar charts) write one self-contained page —
# inline SVG charts with a point per evaluation, no script, nothing fetched — that parses as
# XML-clean SVG inside HTML; a report path that cannot be written is refused before the run.
# When Chromium is installed, it loads each page headless and takes a screenshot (kept in
# $TROUPE_REPORT_SHOTS when set); otherwise that part says it is skipped.
#
#   tests/cli/reports.sh PATH/TO/troupe
set -euo pipefail

troupe="$(realpath "$1")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

check_page() {  # FILE, expected <svg> count at least, expected points in the first chart
  local file=$1 svgs=$2
  [[ -s $file ]] || fail "$file was not written"
  head -c 15 "$file" | grep -q '<!DOCTYPE html>' || fail "$file is not an HTML page"
  if grep -qi '<script\|javascript:\|<link \|src=\"http' "$file"; then fail "$file holds script or fetches something"; fi
  [[ $(grep -o '<svg' "$file" | wc -l) -ge $svgs ]] || fail "$file has fewer than $svgs charts"
  # Every SVG element is well-formed XML.
  python3 - "$file" <<'PY' || fail "$file has an SVG that is not well-formed"
import re, sys, xml.dom.minidom
page = open(sys.argv[1]).read()
for svg in re.findall(r'<svg.*?</svg>', page, flags=re.S):
    xml.dom.minidom.parseString(svg)
PY
}

"$troupe" fedsim --clients 20 --per-round 4 --rounds 8 --eval-every 2 --compress topk:0.1 --report fedsim.html >/dev/null
check_page fedsim.html 4
grep -q '>uplink_ratio per round<' fedsim.html || fail "the fedsim report has no chart of its mechanism's figure"
# Four evaluations: four marked points on the accuracy chart.
python3 - fedsim.html <<'PY' || fail "the accuracy chart does not have one point per evaluation"
import re, sys
page = open(sys.argv[1]).read()
first = re.search(r'<svg.*?</svg>', page, flags=re.S).group(0)
assert 'test accuracy per round' in first
assert first.count('<circle') == 4, first.count('<circle')
PY

"$troupe" fedsim --client-models mlp:784-16-10,mlp:784-8-10 --strategy feddf --clients 6 --per-round 4 --rounds 2 \
  --public 1000 --distill-steps 2 --eval-every 1 --report hetero.html >/dev/null
check_page hetero.html 3
grep -q 'mlp:784-8-10' hetero.html || fail "the heterogeneous report does not name its models"

"$troupe" train --epochs 1 --pipeline 1f1b --ranks 2 --microbatches 4 --report train.html >/dev/null 2>&1
check_page train.html 5
grep -q 'Pipeline schedule 1f1b' train.html || fail "the train report has no schedule"
grep -q '1f1b, step [0-9]* as measured' train.html || fail "the train report has no measured step"

# A benchmark's rows beside an anchor's (here an earlier run of the same workloads): every row
# finds its anchor row, and each ratio is printed.
"$troupe" bench nn --quick --only gemm --json > before.jsonl
"$troupe" bench nn --quick --only gemm --report bench.html --anchor earlier=before.jsonl > bench.txt
check_page bench.html 1
[[ $(grep -c '{' before.jsonl) -ge 2 ]] || fail "the anchor run wrote fewer than two rows"
[[ $(wc -l < bench.txt) -eq $(grep -c '{' before.jsonl) ]] || fail "without --json the rows are not printed as a table: $(cat bench.txt)"
python3 - bench.html "$(grep -c '{' before.jsonl)" <<'PY' || fail "the bench report does not put each row beside its anchor"
import re, sys
page, n = open(sys.argv[1]).read(), int(sys.argv[2])
assert '<th>troupe / earlier</th>' in page
rows = re.findall(r'<tr><td>.*?</tr>', page, flags=re.S)
assert len(rows) == n, (len(rows), n)
for r in rows:
    cells = re.findall(r'<td>(.*?)</td>', r)
    assert float(cells[-1]) > 0, cells
PY
printf '{"suite":"nn","bench":"gemm"}\n' > broken.jsonl
if "$troupe" bench nn --quick --only gemm --report b.html --anchor broken.jsonl 2>err >/dev/null; then fail "accepted an anchor row without a value"; fi
grep -q 'broken.jsonl line 1' err || fail "the refusal of a bad anchor says: $(cat err)"

if "$troupe" fedsim --rounds 1 --report "$work/missing/dir/r.html" 2>err >/dev/null; then fail "accepted an unwritable report path"; fi
grep -q -- "--report $work/missing/dir/r.html" err || fail "the refusal says: $(cat err)"
if "$troupe" fedsim --vertical 2 --report r.html 2>err >/dev/null; then fail "accepted --report with --vertical"; fi

browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  echo "reports.sh: Chromium is not installed: the pages were not loaded in a browser (skipped)"
else
  for page in fedsim hetero train bench; do
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1600 \
      --screenshot="$work/$page.png" "file://$work/$page.html" >/dev/null 2>&1 || fail "Chromium could not load $page.html"
    [[ -s $page.png ]] || fail "Chromium took no screenshot of $page.html"
    if [[ -n ${TROUPE_REPORT_SHOTS:-} ]]; then cp "$page.png" "$TROUPE_REPORT_SHOTS/"; fi
  done
fi
echo "reports.sh: ok"
