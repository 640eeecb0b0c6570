#!/usr/bin/env bash
# Installs the Debian packages troupe builds and runs with. Idempotent: only
# packages that are missing are installed, and nothing is done when all are present.
#
#   cmake/install-deps.sh            # the packages the build and tests need
#   cmake/install-deps.sh --bench    # also CAF, the anchor the benchmarks compare against
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config ccache
  libboost1.81-dev            # Boost.Asio (header-only) for the TCP transport
  capnproto libcapnp-dev      # the wire format
  libspdlog-dev libfmt-dev    # logging
  libcli11-dev                # the troupe command's argument parsing
  libgtest-dev libgmock-dev   # tests
  libbenchmark-dev            # micro-benchmarks
  libopenblas-dev zlib1g-dev  # GEMM, gzip'd datasets
  libzip-dev                  # NumPy .npz archives of users' own data (load_npz)
  libssl-dev                  # secure aggregation's cryptography (and TLS)
  libsodium-dev               # ristretto255: private set intersection (vertical federated learning)
  nlohmann-json3-dev          # reading JSON: DCAP attestation collateral, benchmark rows for reports
  swtpm swtpm-tools tpm2-tools  # --tee swtpm: a software TPM 2.0 and the tools that quote with it (tests skip without)
  openssl                     # the command, to make test certificates for TLS
  clang libclang-rt-14-dev    # the frame decoder's fuzzer (libFuzzer, `make fuzz`)
  dpkg-dev                    # dpkg-shlibdeps: the Depends of `make package`'s troupe package
  dataset-fashion-mnist       # real training data
  bible-kjv bible-kjv-text    # the King James Bible: the default text of troupe train --model gpt:...
  chromium python3            # tests of the HTML reports: a real browser loads them; their SVG is checked as XML
  firefox-esr                 # the dashboard in a second browser: 80 MB to fetch, 300 MB installed (as chromium); beside chromium it adds only libvpx7
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(libcaf-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "troupe: installing missing Debian packages: ${missing[*]}"
sudo=""
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "troupe: these packages are missing and installing them needs root:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may not know the packages until the lists are updated once.
if ! $sudo apt-get install -y --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
