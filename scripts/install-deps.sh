#!/usr/bin/env bash
# Installs the Debian 12 packages tessel needs, if any is missing (run as root).
# Usage: scripts/install-deps.sh [build|test]
#   test adds clang for the fuzzers and the zstd tool for the reference OCDBT reader. Python tools
#   (JAX, Flax, Orbax, zarr, PyTorch) come from PyPI into .venv: scripts/venv.sh.
set -euo pipefail
packages=(cmake make g++ pkg-config nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev
          libgtest-dev libgmock-dev libbenchmark-dev libzstd-dev libblosc-dev libopenblas-dev libdnnl-dev
          ocl-icd-opencl-dev libcurl4-openssl-dev libssl-dev libpugixml-dev
          libopenmpi-dev openmpi-bin)
if [ "${1:-build}" = test ]; then
  packages+=(clang libclang-rt-14-dev zstd)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
