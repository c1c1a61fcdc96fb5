#!/usr/bin/env bash
# Installs what is missing, builds and runs every test: the unit and CLI tests under
# ASan+UBSan, a short libFuzzer run over the parsers, then the release-mode suite with the
# installed-package consumer (its ctest summary is the last thing printed).
# Usage: scripts/test.sh   (FUZZ_SECONDS=N to change the fuzzing time, default 60)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
bash scripts/install-deps.sh test

echo "== ASan + UBSan build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTESSEL_SANITIZE=ON -DTESSEL_BUILD_TESTS=ON -DTESSEL_BUILD_BENCH=OFF > /dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure | tail -n 3

echo "== fuzzing the parsers for ${FUZZ_SECONDS:-60} s"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

echo "== release build and tests"
cmake -S . -B build -DTESSEL_BUILD_TESTS=ON -DTESSEL_BUILD_BENCH=ON -DTESSEL_SANITIZE=OFF > /dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -j"$jobs" --output-on-failure
