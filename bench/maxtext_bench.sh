#!/usr/bin/env bash
# MaxText's largest models from MaxText's own files (deepseek3-671b, llama3.1-405b) on 8192 devices
# (base.yml's ici_fsdp_parallelism: -1), all measured in this one run on this machine:
#   - in process: reading the config (base.yml + model file) and eval_shape + the AdamW plan;
#   - the whole `tessel plan ... --optimizer adamw --dump-shardings` process: wall time (best and
#     median of 5) and peak RSS (the issue's bounds: < 1 s, < 50 MiB);
#   - the peer: JAX + flax + optax building the same abstract TrainState with its shardings
#     (bench/maxtext_peer.py: jax.eval_shape of TrainState.create, logical_to_mesh_sharding).
# Usage: bench/maxtext_bench.sh [BUILD_DIR]   (BUILD_DIR default: build, with benchmarks on; the
# peer needs the project's environment, scripts/venv.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
maxtext=$root/../shared/testdata/maxtext
python=${TESSEL_PYTHON:-$root/.venv/bin/python}

"$build/bench/bench_state" --benchmark_filter=MaxText --benchmark_format=json > "$build/bench_maxtext.json"
python3 - "$build/bench_maxtext.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    ms = b["real_time"] * {"us": 1e-3, "ns": 1e-6, "ms": 1}[b["time_unit"]]
    what = ("config (base.yml + model)" if "Config" in b["name"] else
            "eval_shape + AdamW plan, 8192 devices" if "Plan" in b["name"] else "eval_shape, 8192 devices")
    print(f"in process  {b['label']:15s} {what:40s} {ms:8.2f} ms")
PY

for model in deepseek3-671b llama3.1-405b; do
  dump=$(mktemp -d)
  times=()
  rss=0
  for _ in 1 2 3 4 5; do
    out=$( { /usr/bin/time -f "%e %M" "$build/src/tessel" plan --model "$maxtext/models/$model.yml" \
               --base "$maxtext/base.yml" --devices 8192 --optimizer adamw --dump-shardings "$dump" > /dev/null; } 2>&1 )
    times+=("${out% *}")
    kb=${out#* }
    (( kb > rss )) && rss=$kb
  done
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  best=$(echo "$sorted" | head -1)
  median=$(echo "$sorted" | sed -n 3p)
  printf 'tessel plan %-15s best %6.3f s, median %6.3f s, peak RSS %5.1f MiB   (bounds: 1 s, 50 MiB)\n' \
    "$model" "$best" "$median" "$(echo "$rss / 1024" | bc -l)"
  if [ -x "$python" ]; then
    peer=$("$python" "$here/maxtext_peer.py" "$dump" "$maxtext/base.yml")
    printf 'peer (JAX + flax + optax) %-15s abstract TrainState + shardings, in process: %s\n' "$model" "$peer"
  fi
  rm -rf "$dump"
done
