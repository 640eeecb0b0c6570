#!/usr/bin/env bash
# Compares troupe's training of nanoGPT's CPU configuration (gpt:layers=4,heads=4,embd=128,ctx=64,
# batch 12, AdamW lr 1e-3 betas (0.9, 0.99) weight decay 0.1, warmup 100 + cosine to 1e-4, clip
# 1.0, dropout 0) with PyTorch eager training of the same model on the same text, side by side on
# the same cores, and prints the ratio of training tokens per second; with --pipeline, troupe's
# pipeline runtime against torch.distributed.pipelining with the same schedule.
#
#   tests/bench/gpt_compare.sh --python PY [--text FILE] [--steps N] [--rounds R] [--build DIR]
#                              [--model SPEC] [--pipeline SCHEDULE --ranks P --microbatches M]
#
#   --python PY   a Python that can import torch >= 2.8 (a virtual environment's; PyTorch is never a
#                 dependency of troupe)
#   --text FILE   the corpus (default: ../shared/data/tinyshakespeare.txt beside the repository)
#   --steps N     training steps of each run (default 200; the issue's figure is over 2000)
#   --rounds R    runs of each program, alternated troupe, PyTorch, troupe, ... (default 3): the
#                 medians are compared
#   --build DIR   the build tree holding bin/troupe (default: build/ at the repository root)
#   --model SPEC  the GPT (default gpt:layers=4,heads=4,embd=128,ctx=64; the issue's pipelined
#                 comparison also uses layers=8)
#   --pipeline SCHEDULE --ranks P --microbatches M
#                 troupe runs `troupe train ... --pipeline SCHEDULE --ranks P --microbatches M`
#                 (its rank actors in one process), PyTorch runs tests/bench/torch_gpt_pipe.py:
#                 P processes of one thread each over gloo, the same schedule (gpipe, 1f1b,
#                 interleaved-1f1b, looped-bfs, interleaved-zb, zb-v, dualpipe-v: the generators
#                 PyTorch has). Its summary has the last 10 steps' train loss instead of a
#                 validation loss.
#
# troupe runs `troupe train --model gpt:... --text FILE --steps N --json` (one thread: OpenBLAS
# on one thread, as always in troupe); PyTorch runs tests/bench/torch_gpt.py with the same
# arguments and torch.set_num_threads(1). Both count training tokens over training time
# (evaluation excluded). Each run's CPU seconds (user + system, from /usr/bin/time when
# installed) are printed beside its wall clock: on a shared machine tokens per CPU second says
# more than tokens per second. The bar is troupe >= 2x PyTorch's tokens/s.
#
# Exits 0 whether or not troupe reaches the bar; 1 when a program is missing or fails; 2 on a
# bad argument or when PyTorch cannot be imported.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/../.." && pwd)"

build_dir="$repo_root/build"
python=""
text="$repo_root/../shared/data/tinyshakespeare.txt"
steps=200
rounds=3
model="gpt:layers=4,heads=4,embd=128,ctx=64"
pipeline=""
ranks=2
microbatches=4

usage() {
  echo "usage: tests/bench/gpt_compare.sh --python PY [--text FILE] [--steps N] [--rounds R] [--build DIR]"
  echo "                                    [--model SPEC] [--pipeline SCHEDULE --ranks P --microbatches M]"
}
bad() {
  echo "gpt_compare.sh: $1" >&2
  usage >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --python)
      [[ $# -ge 2 ]] || bad "--python needs an interpreter"
      python="$2"; shift 2 ;;
    --text)
      [[ $# -ge 2 ]] || bad "--text needs a file"
      text="$2"; shift 2 ;;
    --steps)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--steps needs a positive count"
      steps="$2"; shift 2 ;;
    --rounds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--rounds needs a positive count"
      rounds="$2"; shift 2 ;;
    --build)
      [[ $# -ge 2 ]] || bad "--build needs a directory"
      build_dir="$2"; shift 2 ;;
    --model)
      [[ $# -ge 2 && "$2" == gpt:* ]] || bad "--model needs a gpt:... spec"
      model="$2"; shift 2 ;;
    --pipeline)
      [[ $# -ge 2 ]] || bad "--pipeline needs a schedule"
      case "$2" in gpipe|1f1b|interleaved-1f1b|looped-bfs|interleaved-zb|zb-v|dualpipe-v) ;;
        *) bad "--pipeline $2: PyTorch has gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zb-v and dualpipe-v" ;;
      esac
      pipeline="$2"; shift 2 ;;
    --ranks)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--ranks needs a positive count"
      ranks="$2"; shift 2 ;;
    --microbatches)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || bad "--microbatches needs a positive count"
      microbatches="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown argument: $1" ;;
  esac
done

[[ -n "$python" ]] || bad "--python is required: a Python with torch >= 2.8 (e.g. a virtual environment's bin/python)"
[[ -r "$text" && -f "$text" ]] || bad "--text $text is not a readable file"
troupe_bin="$build_dir/bin/troupe"
if [[ ! -x "$troupe_bin" ]]; then
  echo "gpt_compare.sh: $troupe_bin is missing or not executable; build troupe first (cmake --build $build_dir --target troupe)" >&2
  exit 1
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "gpt_compare.sh: no Python at $python" >&2
  exit 1
fi
if ! torch_version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
  echo "gpt_compare.sh: $python cannot import torch; make a virtual environment with it (python3 -m venv DIR && DIR/bin/pip install torch) and pass --python DIR/bin/python" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
timer=()
[[ -x /usr/bin/time ]] && timer=(/usr/bin/time -f '%U %S' -o "$work/cpu")

# run NAME CMD...: runs a program, keeping its last JSON line (progress goes to stderr) and its CPU seconds.
run() {
  local name="$1"
  shift
  echo "gpt_compare.sh: running $*" >&2
  rm -f "$work/cpu"
  local rc=0
  "${timer[@]}" "$@" >"$work/raw" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "gpt_compare.sh: failed (exit code $rc): $*" >&2
    exit 1
  fi
  grep '"tokens_per_s"' "$work/raw" | tail -n 1 >"$work/$name" || true
  if [[ ! -s "$work/$name" ]]; then
    echo "gpt_compare.sh: no summary line from: $*" >&2
    exit 1
  fi
  if [[ -s "$work/cpu" ]]; then awk '{ printf "%.1f\n", $1 + $2 }' "$work/cpu" >"$work/$name.cpu"; else echo "-" >"$work/$name.cpu"; fi
}

# field NAME FILE: the value of "NAME" in FILE's line.
field() {
  awk -v name="$1" '{
      re = "\"" name "\"[[:space:]]*:[[:space:]]*"
      if (match($0, re "[-+0-9.eE]+")) { s = substr($0, RSTART, RLENGTH); sub(re, "", s); print s; exit }
    }' "$2"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

troupe_cmd=("$troupe_bin" train --model "$model" --text "$text" --steps "$steps" --json)
torch_cmd=("$python" "$script_dir/torch_gpt.py" --model "$model" --text "$text" --steps "$steps" --threads 1)
if [[ -n "$pipeline" ]]; then
  # torch's schedules with two stages per rank place them as troupe's default does.
  troupe_cmd+=(--pipeline "$pipeline" --ranks "$ranks" --microbatches "$microbatches")
  torch_cmd=("$python" "$script_dir/torch_gpt_pipe.py" --model "$model" --text "$text" --steps "$steps"
             --schedule "$pipeline" --ranks "$ranks" --microbatches "$microbatches")
fi
load_before="$(loadavg)"
for r in $(seq 1 "$rounds"); do
  run "troupe_$r" "${troupe_cmd[@]}"
  run "torch_$r" "${torch_cmd[@]}"
done
load_after="$(loadavg)"

{
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "run" "steps" "tokens/s" "val loss" "seconds" "CPU s"
  for r in $(seq 1 "$rounds"); do
    for impl in troupe torch; do
      f="$work/${impl}_$r"
      label="troupe $r"
      [[ $impl == torch ]] && label="pytorch $torch_version $r"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$steps" "$(field tokens_per_s "$f")" "$(field val_loss "$f")" \
        "$(field seconds "$f")" "$(cat "$f.cpu")"
    done
  done
} | awk -F'\t' '{ printf "%-28s %6s %10s %9s %9s %7s\n", $1, $2, $3, $4, $5, $6 }'

troupe_med="$(for r in $(seq 1 "$rounds"); do field tokens_per_s "$work/troupe_$r"; done | median)"
torch_med="$(for r in $(seq 1 "$rounds"); do field tokens_per_s "$work/torch_$r"; done | median)"
echo
awk -v t="$troupe_med" -v p="$torch_med" -v n="$rounds" 'BEGIN {
  r = t / p
  printf "median tokens/s of %d runs: troupe %.0f, pytorch %.0f: %.2fx; bar >= 2x: %s\n", n, t, p, r, (r >= 2 ? "met" : "not met")
}'
echo "load average before: $load_before; after: $load_after ($(nproc) hardware threads)"
