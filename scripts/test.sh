#!/usr/bin/env bash
# Installs what is missing, builds and runs every test: the C++ unit and CLI tests under
# ASan+UBSan (one clang build that also holds the libFuzzer targets), a short libFuzzer run over the
# parsers, then the release build, which also builds the Python package into the project's
# environment (.venv), and its suite: the C++ suites whose bits hang on the compiler's optimization
# (TESSEL_CPP_TESTS=numerics; the others ran under the sanitizers), the installed-package consumer,
# the pytest cross-checks against the real JAX, Flax, Orbax and TensorStore, and the real MaxText
# 0.2.5 (in .venv-maxtext). Its ctest summary is the last thing printed.
# Usage: scripts/test.sh   (FUZZ_SECONDS=N to change the fuzzing time per target, default 30)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
bash scripts/install-deps.sh test
python=$root/.venv/bin/python

# The Python environments install while the sanitizer build compiles: pip mostly waits on the
# network, the compiler on the cores.
mkdir -p build-logs
bash scripts/venv.sh test > build-logs/venv-test.log 2>&1 &
venv_test=$!
bash scripts/venv.sh maxtext > build-logs/venv-maxtext.log 2>&1 &
venv_maxtext=$!
wait_for() {  # pid, what, log
  if ! wait "$1"; then
    cat "$3"
    echo "$2 failed; its log is $3"
    exit 1
  fi
}

echo "== ASan + UBSan build (clang, with the fuzzers) and tests"
# The library at -O1, as ASan advises (the tests run several times faster than at -O0), the test code
# at -O0 (tests/CMakeLists.txt); line tables only: stack traces keep their files and lines, and it
# compiles faster than with full debug information.
CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -O1" \
  -DTESSEL_SANITIZE=ON -DTESSEL_BUILD_TESTS=ON -DTESSEL_BUILD_FUZZ=ON -DTESSEL_BUILD_BENCH=OFF \
  -DTESSEL_PYTHON="$python" > /dev/null
cmake --build build-san -j"$jobs"
wait_for $venv_test "scripts/venv.sh test" build-logs/venv-test.log
# Only the summary unless a test fails: then what the failing tests printed, from the whole log.
san_log=build-san/ctest.log
if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --test-dir build-san -j"$jobs" --output-on-failure > "$san_log" 2>&1; then
  grep -B 3 -A 25 -E "Failure$|\[  FAILED  \]|ERROR: AddressSanitizer|runtime error:" "$san_log" | head -n 300
  tail -n 20 "$san_log"
  echo "the ASan + UBSan tests failed; the whole log is $san_log"
  exit 1
fi
tail -n 3 "$san_log"

echo "== fuzzing the parsers for ${FUZZ_SECONDS:-30} s each"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}" "$root/build-san"

echo "== release build: the Python package into .venv (pip install .), then the tests"
# One build directory serves both: pip builds the extension and the CLI there (no build
# isolation: nanobind and scikit-build-core come from requirements/test.txt), then the tests.
mkdir -p build-test
log=build-test/pip-install.log
if ! "$python" -m pip install --disable-pip-version-check --no-build-isolation -Cbuild-dir=build-test \
     -Ccmake.define.TESSEL_BUILD_TESTS=ON -Ccmake.define.TESSEL_CPP_TESTS=numerics -Ccmake.define.TESSEL_BUILD_BENCH=ON \
     -Ccmake.define.TESSEL_PYTHON="$python" . > "$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" | tail -n 40
  echo "pip install . failed; the whole log is $log"
  exit 1
fi
cmake --build build-test -j"$jobs"
wait_for $venv_maxtext "scripts/venv.sh maxtext" build-logs/venv-maxtext.log
ctest --test-dir build-test -j"$jobs" --output-on-failure
