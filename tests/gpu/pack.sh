#!/usr/bin/env bash
# Builds the CUDA checks here and packs them for a GPU machine that lacks troupe's build
# dependencies (spdlog, fmt, Cap'n Proto, OpenSSL, OpenBLAS, ...): tests/gpu/device_check.sh
# --bundle FILE then runs them there without configuring or building anything.
#
#   tests/gpu/pack.sh [build-dir] [bundle]     (defaults: build-gpu, BUILD-DIR/troupe-gpu-bundle.tar.gz)
#
# Needs nvcc and the build dependencies (cmake/install-deps.sh), no GPU. The bundle holds
# kernels_test, core_test, pipeline_test, federated_test and the troupe CLI built for sm_90 (stripped) and the
# shared libraries they load, OpenBLAS included, except the C library, the C++ runtime and the NVIDIA driver's,
# which the GPU machine has, and cuBLAS (over 500 MB with cuBLASLt), which device_check.sh finds
# in that machine's CUDA. The GPU machine needs a C library at least as new as this one's and the
# CUDA major version this build used (both are written to bundle/MANIFEST).
set -euo pipefail

build=${1:-build-gpu}
out=${2:-$build/troupe-gpu-bundle.tar.gz}
case $out in /*) ;; *) out=$PWD/$out ;; esac
case $build in /*) ;; *) build=$PWD/$build ;; esac
cd "$(dirname "$0")/../.."
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null 2>&1 || { echo "pack: nvcc not found (install CUDA's compiler)" >&2; exit 1; }

generator=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$build/CMakeCache.txt" ] && generator=(-G Ninja)
echo "== configure ($build)"
mkdir -p "$build"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$build/configure.log" 2>&1 ||
  { tail -n 30 "$build/configure.log"; echo "pack: configure failed" >&2; exit 1; }
echo "== build kernels_test core_test pipeline_test federated_test troupe"
cmake --build "$build" --target kernels_test core_test pipeline_test federated_test troupe -j "$(nproc)" >"$build/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$build/build.log" | head -n 40 || true; echo "pack: build failed" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bundle/bin" "$stage/bundle/lib"
binaries=(kernels_test core_test pipeline_test federated_test troupe)
for b in "${binaries[@]}"; do strip -o "$stage/bundle/bin/$b" "$build/bin/$b"; done

# The libraries a file loads, as ldd resolves them here, less those the GPU machine brings.
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia-)'
needed() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $system ]] || echo "$name $path"
  done
}
copy_needed() {
  local name path
  while read -r name path; do
    [ -e "$stage/bundle/lib/$name" ] || cp -L "$path" "$stage/bundle/lib/$name"
  done < <(needed "$1")
}
for b in "${binaries[@]}"; do copy_needed "$build/bin/$b"; done
# OpenBLAS is opened at run time (kernels/src/dynamic_library.hpp), so ldd does not list it.
# Its path is the compile definition TROUPE_OPENBLAS_LIBRARY (kernels/CMakeLists.txt).
openblas=$(grep -rhoE 'TROUPE_OPENBLAS_LIBRARY=[^ ]+' "$build/build.ninja" "$build/kernels" 2>/dev/null | head -n 1 |
  sed 's/^TROUPE_OPENBLAS_LIBRARY=//; s/[\\"]//g' || true)
if [ -z "$openblas" ] || [ ! -e "$openblas" ]; then
  echo "pack: cannot find the OpenBLAS this build uses" >&2
  exit 1
fi
cp -L "$openblas" "$stage/bundle/lib/libopenblas.so.0"
copy_needed "$openblas"

glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "cuda $cuda"
  echo "glibc $glibc"
  echo "arch sm_90"
} >"$stage/bundle/MANIFEST"
tar -czf "$out" -C "$stage" bundle
echo "pack: $out ($(du -h "$out" | cut -f1)): $(cd "$stage/bundle/lib" && echo *)"
cat "$stage/bundle/MANIFEST"
