#!/usr/bin/env bash
# Checks the CUDA paths on a machine with an NVIDIA GPU, in one go (within 8 minutes):
#   1. configures a build with TROUPE_WITH_CUDA=ON for sm_90 (examples off) and builds only
#      kernels_test, core_test, pipeline_test, federated_test and the troupe CLI, or, with --bundle, unpacks those
#      programs as tests/gpu/pack.sh built them on another machine (for a GPU machine without
#      troupe's build dependencies; its own cuBLAS is found and used);
#   2. runs the CUDA tests (kernels_test --gtest_filter='Cuda*', pipeline_test's stages on CUDA
#      devices, and core_test's device memory and device count tests): a skipped test is a
#      failure here;
#   3. runs `troupe bench optim --json --device cuda` (50 M parameters in 100 tensors per optimizer
#      and state storage, against a device-to-device copy) and prints a table.
# With DEVICE_CHECK_PROFILE=1 it then profiles the benchmark's kernels with Nsight Compute (ncu,
# clocks left as they are) and prints each kernel's time, DRAM bytes and bandwidth, occupancy and
# instructions.
# A failing test binary does not stop the others or the benchmark: every part runs, and the check
# exits non-zero at the end when any failed (2, with a message, when no GPU is present). With
# DEVICE_CHECK_LOGS=DIR each step's whole output is also written to DIR.
#
# Usage: tests/gpu/device_check.sh [build-dir]        (default: build-gpu)
#        tests/gpu/device_check.sh --bundle FILE      (FILE from tests/gpu/pack.sh)
# BENCH_STEPS=7 sets the benchmark's steps; TROUPE_CUBLAS_LIBRARY names the cuBLAS to use.
set -euo pipefail

bundle=
if [ "${1:-}" = --bundle ]; then
  bundle=${2:?device_check: --bundle needs the file tests/gpu/pack.sh wrote}
  [ -f "$bundle" ] || { echo "device_check: no bundle at $bundle" >&2; exit 1; }
  bundle=$(realpath "$bundle")
fi
build=${1:-build-gpu}
cd "$(dirname "$0")/../.."
steps=${BENCH_STEPS:-7}
deadline=$((SECONDS + 480))
# The seconds left for the next step; fails (the caller exits) when fewer than 10 are left.
left() { local l=$((deadline - SECONDS)); [ "$l" -gt 10 ] || { echo "device_check: out of time (8 minutes)" >&2; return 1; }; echo "$l"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! gpus=$(nvidia-smi -L 2>/dev/null) || [ -z "$gpus" ]; then
  echo "device_check: no NVIDIA GPU present (nvidia-smi finds none): nothing to check on this machine" >&2
  exit 2
fi
echo "== GPUs"
echo "$gpus"
if [ -n "$bundle" ]; then
  echo "== unpack $bundle"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -xzf "$bundle" -C "$work"
  bindir=$work/bundle/bin
  cat "$work/bundle/MANIFEST"
  need_glibc=$(sed -n 's/^glibc //p' "$work/bundle/MANIFEST")
  have_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  if [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -n 1)" != "$need_glibc" ]; then
    echo "device_check: the bundle needs glibc $need_glibc, this machine has $have_glibc" >&2
    exit 1
  fi
  export LD_LIBRARY_PATH=$work/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export TROUPE_OPENBLAS_LIBRARY=$work/bundle/lib/libopenblas.so.0
  if [ -z "${TROUPE_CUBLAS_LIBRARY:-}" ]; then
    major=$(sed -n 's/^cuda \([0-9]*\).*/\1/p' "$work/bundle/MANIFEST")
    # The toolkit's own copy first, then what the loader knows, then any copy on disk.
    for f in /usr/local/cuda/lib64/libcublas.so."$major" /usr/local/cuda/targets/*/lib/libcublas.so."$major"; do
      if [ -z "${TROUPE_CUBLAS_LIBRARY:-}" ] && [ -e "$f" ]; then TROUPE_CUBLAS_LIBRARY=$f; fi
    done
    [ -n "${TROUPE_CUBLAS_LIBRARY:-}" ] ||
      TROUPE_CUBLAS_LIBRARY=$(ldconfig -p 2>/dev/null | awk -v n="libcublas.so.$major" '$1 == n && !found {print $NF; found = 1}')
    if [ -z "$TROUPE_CUBLAS_LIBRARY" ]; then
      roots=(/usr/local /usr/lib /usr/lib64 /opt)
      sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
      # shellcheck disable=SC2206
      roots+=($sites)
      TROUPE_CUBLAS_LIBRARY=$(timeout 60 find "${roots[@]}" -name "libcublas.so.$major*" \( -type f -o -type l \) \
        2>/dev/null | head -n 1 || true)
    fi
    [ -n "$TROUPE_CUBLAS_LIBRARY" ] || { echo "device_check: no libcublas.so.$major on this machine (set TROUPE_CUBLAS_LIBRARY)" >&2; exit 1; }
    export TROUPE_CUBLAS_LIBRARY
  fi
  # cuBLAS loads cuBLASLt from its own folder.
  cublas_dir=$(dirname "$TROUPE_CUBLAS_LIBRARY")
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cublas_dir
  echo "cuBLAS: $TROUPE_CUBLAS_LIBRARY"
else
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || { echo "device_check: nvcc not found" >&2; exit 1; }
  command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH

  echo "== configure ($build)"
  mkdir -p "$build"
  generator=()
  command -v ninja >/dev/null 2>&1 && [ ! -f "$build/CMakeCache.txt" ] && generator=(-G Ninja)
  limit=$(left) || exit 1
  timeout "$limit" cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTROUPE_BUILD_EXAMPLES=OFF >"$build/configure.log" 2>&1 ||
    { tail -n 30 "$build/configure.log"
      echo "device_check: configure failed (without troupe's build dependencies here, build with tests/gpu/pack.sh elsewhere and pass --bundle)" >&2
      exit 1; }

  echo "== build kernels_test core_test pipeline_test troupe"
  limit=$(left) || exit 1
  timeout "$limit" cmake --build "$build" --target kernels_test core_test pipeline_test federated_test troupe -j "$(nproc)" >"$build/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$build/build.log" | head -n 40 || true; echo "device_check: build failed" >&2; exit 1; }
  bindir=$build/bin
fi

failures=()
logs=${DEVICE_CHECK_LOGS:-}
[ -z "$logs" ] || mkdir -p "$logs"
# Runs one test binary with a filter; a failure, a skip or no test at all is recorded as a failure.
# Here-strings, not `echo | grep -q`: with pipefail, grep -q leaving early can fail the echo.
run_tests() {
  local binary=$1 filter=$2 out rc limit
  limit=$(left) || exit 1
  [ "$limit" -le 180 ] || limit=180  # a hung binary leaves time for the rest
  out=$(timeout "$limit" "$bindir/$binary" --gtest_filter="$filter" 2>&1) && rc=0 || rc=$?
  [ -z "$logs" ] || printf '%s\n' "$out" >"$logs/$binary.log"
  grep -E "^\[ *(RUN|OK|FAILED|SKIPPED|PASSED) *\]|Failure|error" <<<"$out" | head -n 200 || true
  if [ "$rc" -ne 0 ]; then
    tail -n 20 <<<"$out"
    failures+=("$binary failed (exit $rc)")
  elif grep -q "^\[  SKIPPED \]" <<<"$out"; then
    failures+=("$binary skipped tests on a GPU machine")
  elif ! grep -q "^\[  PASSED  \] [1-9]" <<<"$out"; then
    failures+=("no test of $binary ran")
  fi
}

echo "== CUDA tests"
run_tests kernels_test 'Cuda*'
run_tests pipeline_test 'Runtime.StagesOnCudaDevices*'
run_tests federated_test 'ClientsOnCuda.*'
# Device.CountsNoCudaDeviceWhenBuiltWithoutCuda skips in a CUDA build by design: not listed.
run_tests core_test 'Device.ReportsADeviceOnlyWhenBuiltWithCuda:Device.CountsTheSameFromManyThreads:Device.CountsNoDeviceWhenCudaVisibleDevicesIsEmpty:Tensor.Device*'

echo "== troupe bench optim --device cuda"
limit=$(left) || exit 1
json=$(timeout "$limit" "$bindir/troupe" bench optim --json --device cuda --steps "$steps") || {
  failures+=("the optimizer benchmark failed")
  json=
}
[ -z "$logs" ] || printf '%s\n' "$json" >"$logs/bench_optim.jsonl"
python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for r in rows:
    if r["metric"] == "bandwidth":
        print("%s bandwidth on %s: %.1f GB/s" % (r["bench"], r["device"], r["value"]))
print("%-9s %-5s %9s %12s %11s" % ("optimizer", "state", "ms/step", "bytes/param", "of copy bw"))
steps = [r for r in rows if r["metric"] == "seconds_per_step"]
for r in steps:
    print("%-9s %-5s %9.3f %12.2f %10.0f%%" % (r["bench"], r["state"], 1000 * r["value"], r["bytes_per_param"],
                                             100 * r["fraction_of_bandwidth"]))
if len(steps) != 9:
    sys.exit("device_check: expected 9 optimizer rows, got %d" % len(steps))
' <<<"$json" || failures+=("the optimizer benchmark's table")
if [ "${DEVICE_CHECK_PROFILE:-0}" = 1 ]; then
  echo "== ncu: troupe bench optim --device cuda --steps 2"
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true)
  metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread
  metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size
  limit=$(left) || exit 1
  if [ -z "$ncu" ]; then
    failures+=("no ncu to profile with")
  elif timeout "$limit" "$ncu" --clock-control none --metrics "$metrics" --csv "$bindir/troupe" bench optim --json \
    --device cuda --steps 2 >"${logs:-/tmp}/ncu.csv" 2>"${logs:-/tmp}/ncu.err"; then
    python3 -c '
import csv, sys
rows = csv.DictReader(l for l in open(sys.argv[1]) if l.startswith("\""))
kernels = {}
for r in rows:
    kernels.setdefault(int(r["ID"]), {"name": r["Kernel Name"].split("(")[0].split("::")[-1]})[r["Metric Name"]] = \
        float(r["Metric Value"].replace(",", ""))
print("%-4s %-24s %9s %9s %8s %5s %6s %10s" % ("id", "kernel", "us", "MB", "GB/s", "regs", "occ%", "inst"))
for i, k in sorted(kernels.items()):
    us = k["gpu__time_duration.sum"] / 1e3
    mb = (k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]) / 1e6
    print("%-4d %-24s %9.1f %9.1f %8.0f %5d %6.1f %10d" % (i, k["name"][:24], us, mb, mb / us * 1e3,
          k["launch__registers_per_thread"], k["sm__warps_active.avg.pct_of_peak_sustained_active"],
          k["smsp__inst_executed.sum"]))
' "${logs:-/tmp}/ncu.csv" || failures+=("the profile's table")
  else
    tail -n 5 "${logs:-/tmp}/ncu.err"
    failures+=("ncu failed")
  fi
fi
if [ "${#failures[@]}" -gt 0 ]; then
  printf 'device_check: %s\n' "${failures[@]}" >&2
  echo "device_check: ${#failures[@]} failure(s) in ${SECONDS}s" >&2
  exit 1
fi
echo "device_check: all passed in ${SECONDS}s"
