#!/usr/bin/env bash
# Fuzzes each libFuzzer target for SECONDS (default 60): the sharding parsers (rules, dumps, specs,
# meshes), the model config parser and the checkpoint metadata parsers, chunk decoders, OCDBT
# manifests and nodes, zarr3 shard indexes, safetensors headers, key maps and MaxText model files
# (over MaxText's base.yml), and what an S3 server answers (listings).
# Usage: scripts/fuzz.sh [SECONDS [BUILD_DIR]]. BUILD_DIR: a clang build configured with
# -DTESSEL_BUILD_FUZZ=ON and the sanitizers (scripts/test.sh's build-san); without it the script
# configures build-fuzz (clang, ASan + UBSan) itself. Findings land in BUILD_DIR/findings/; the
# script fails on one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build=${2:-$root/build-fuzz}
targets=(fuzz_sharding_parsers fuzz_model_config fuzz_checkpoint fuzz_safetensors fuzz_key_map fuzz_maxtext_config
         fuzz_object_store)
mkdir -p "$build"
if [ $# -lt 2 ]; then
  CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSEL_BUILD_FUZZ=ON \
    -DTESSEL_BUILD_TESTS=OFF -DTESSEL_BUILD_BENCH=OFF \
    -DTESSEL_SANITIZE=ON > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
mkdir -p "$build/findings" "$build/fuzz-logs"
# As many fuzzers at a time as there are cores, each on one; their reports in order afterwards.
parallel=$(nproc)
# target:seed corpus. 4 KB inputs at most; 10 s per input at most (a hang is a finding); 2 GB RSS.
for pair in fuzz_sharding_parsers:corpus fuzz_model_config:corpus_model fuzz_checkpoint:corpus_checkpoint \
    fuzz_safetensors:corpus_safetensors fuzz_key_map:corpus_key_map fuzz_maxtext_config:corpus_maxtext \
    fuzz_object_store:corpus_object_store; do
  target=${pair%%:*} corpus=${pair##*:}
  mkdir -p "$build/$corpus"
  cp -n "$root/fuzz/$corpus"/* "$build/$corpus/" 2>/dev/null || true
  # MaxText's own model files seed the MaxText reader (read from the shared test data, not copied in).
  [ "$corpus" = corpus_maxtext ] && cp -n "$root/../shared/testdata/maxtext/models/"*.yml "$build/$corpus/" 2>/dev/null || true
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  (
    status=0
    ASAN_OPTIONS=detect_leaks=1 "$build/fuzz/$target" "$build/$corpus" -max_total_time="$seconds" -max_len=4096 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build/findings/$target-" -print_final_stats=1 \
      > "$build/fuzz-logs/$target.log" 2>&1 || status=$?
    echo "$status" > "$build/fuzz-logs/$target.status"
  ) &
done
wait
failed=0
for target in "${targets[@]}"; do
  echo "== $target, $seconds s"
  tail -n 15 "$build/fuzz-logs/$target.log"
  if [ "$(cat "$build/fuzz-logs/$target.status")" != 0 ]; then
    echo "$target found a failure (exit $(cat "$build/fuzz-logs/$target.status")); its log is $build/fuzz-logs/$target.log"
    failed=1
  fi
done
exit $failed
