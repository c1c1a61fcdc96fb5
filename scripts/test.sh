#!/usr/bin/env bash
# Installs what is missing, builds and runs every test: the C++ unit and CLI tests under
# ASan+UBSan, a short libFuzzer run over the parsers, then the release build, which also builds the
# Python package into the project's environment (.venv), and its suite: the C++ tests, the
# installed-package consumer and the pytest cross-checks against the real JAX, Flax, Orbax and
# TensorStore (its ctest summary is the last thing printed).
# Usage: scripts/test.sh   (FUZZ_SECONDS=N to change the fuzzing time, default 60)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
bash scripts/install-deps.sh test
bash scripts/venv.sh test
python=$root/.venv/bin/python

echo "== ASan + UBSan build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTESSEL_SANITIZE=ON -DTESSEL_BUILD_TESTS=ON -DTESSEL_BUILD_BENCH=OFF \
  -DTESSEL_PYTHON="$python" > /dev/null
cmake --build build-asan -j"$jobs"
# Only the summary unless a test fails: then what the failing tests printed, from the whole log.
asan_log=build-asan/ctest.log
if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --test-dir build-asan -j"$jobs" --output-on-failure > "$asan_log" 2>&1; then
  grep -B 3 -A 25 -E "Failure$|\[  FAILED  \]|ERROR: AddressSanitizer|runtime error:" "$asan_log" | head -n 300
  tail -n 20 "$asan_log"
  echo "the ASan + UBSan tests failed; the whole log is $asan_log"
  exit 1
fi
tail -n 3 "$asan_log"

echo "== fuzzing the parsers for ${FUZZ_SECONDS:-60} s"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

echo "== release build: the Python package into .venv (pip install .), then the tests"
# One build directory serves both: pip builds the extension and the CLI there (no build
# isolation: nanobind and scikit-build-core come from requirements/test.txt), then the tests.
mkdir -p build-test
log=build-test/pip-install.log
if ! "$python" -m pip install --disable-pip-version-check --no-build-isolation -Cbuild-dir=build-test \
     -Ccmake.define.TESSEL_BUILD_TESTS=ON -Ccmake.define.TESSEL_BUILD_BENCH=ON \
     -Ccmake.define.TESSEL_PYTHON="$python" . > "$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" | tail -n 40
  echo "pip install . failed; the whole log is $log"
  exit 1
fi
cmake --build build-test -j"$jobs"
ctest --test-dir build-test -j"$jobs" --output-on-failure
