#!/usr/bin/env bash
# A guided tour: runs every example in reading order and stops at the first failure.
#
#   examples/tour.sh BIN_DIR      (BIN_DIR holds example_hello, ...; `make tour` does this)
#
# Each example prints what it shows and checks its own results; its source,
# examples/<name>/main.cpp, is written to be read alongside its output.

set -u

bin_dir=${1:-}
if [[ -z $bin_dir ]]; then
  echo "usage: $0 BIN_DIR   (for example: $0 build/bin)" >&2
  exit 2
fi

examples=(hello ping_pong supervision fork_join bounded fedsim_custom pipeline cluster)
about=(
  "spawn, tell, ask, exceptions and timeouts"
  "coroutine methods that await replies without blocking a thread; reentrancy"
  "on_start/on_stop, restarts after a crash, monitors and down notices"
  "a parallel sum: fork asks to workers, join their replies"
  "bounded mailboxes: back-pressure (wait) and refusal (reject)"
  "federated simulation with your own client model and server strategy"
  "a model cut into stages, one actor per rank, trained with a 1F1B schedule"
  "a head, two worker nodes and a driver as separate processes: remote spawn, calls, names"
)
here=$(cd "$(dirname "$0")" && pwd)

# A hang is a failure too: give each example a generous limit when `timeout` exists. Its
# output is line-buffered (when `stdbuf` exists) so that printed lines and the log lines on
# stderr keep their order in a pipe or a file.
run_limited() {
  local run=("$@")
  if command -v stdbuf >/dev/null 2>&1; then run=(stdbuf -oL "${run[@]}"); fi
  if command -v timeout >/dev/null 2>&1; then timeout 60 "${run[@]}"; else "${run[@]}"; fi
}

total=${#examples[@]}
for i in "${!examples[@]}"; do
  name=${examples[$i]}
  exe="$bin_dir/example_$name"
  echo
  echo "=== [$((i + 1))/$total] $name: ${about[$i]}"
  echo "=== source: examples/$name/main.cpp"
  if [[ ! -x $exe ]]; then
    echo "tour: $exe not found; build the examples first (cmake --build build)" >&2
    exit 1
  fi
  # An example made of several processes has a script that starts them.
  if [[ -x $here/$name/run.sh ]]; then
    run_limited "$here/$name/run.sh" "$bin_dir"
  else
    run_limited "$exe"
  fi
  rc=$?
  if [[ $rc -ne 0 ]]; then
    if [[ $rc -eq 124 ]]; then
      echo "tour: example '$name' did not finish within 60 s; stopping here" >&2
    else
      echo "tour: example '$name' failed (exit code $rc); stopping here" >&2
    fi
    exit 1
  fi
done

echo
echo "=== tour complete: all $total examples passed"
echo "What to read next:"
echo "  README.md   what troupe is, how to build it, the rest of the project"
echo "  docs/       the guides, for everything the examples only touch on"
echo "  examples/   the sources of what you just ran, meant to be read"
