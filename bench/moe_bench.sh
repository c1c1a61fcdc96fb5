#!/usr/bin/env bash
# Mixture-of-experts figures, measured in this one run on this machine (medians of 5 runs): the
# train step of a tiny MaxText mixtral (bench/bench_moe.cpp) in tokens/s on 1 device and on 8
# virtual devices with expert parallelism, each as a ratio to the 1-device step; and the expert
# all_to_all on expert=8 (dropless top-2 of 8 experts, 16 x 128 tokens of 128 floats): the bytes it
# moves against the lower bound (only the rows of choices whose expert lives on another device).
# Usage: bench/moe_bench.sh [BUILD_DIR]   (BUILD_DIR default: build, with benchmarks on)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
"$build/bench/bench_moe" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_format=json > "$build/bench_moe.json"
python3 - "$build/bench_moe.json" <<'PY'
import json, sys
rows = [b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "median"]
steps = [b for b in rows if b["name"].startswith("BM_MoeTrainStep")]
one = next(b for b in steps if b["label"] == "data=1")
for b in steps:
    print(f"mixtral train step {b['label']:26s} {b['real_time']:8.1f} ms  {b['tokens']:8.0f} tokens/s  "
          f"{b['real_time'] / one['real_time']:.2f}x the 1-device step")
a = next(b for b in rows if b["name"].startswith("BM_MoeAllToAll"))
print(f"expert all_to_all (expert=8): {a['real_time']:.2f} ms, {a['bytes_moved'] / 2**20:.2f} MiB moved "
      f"({a['bytes_per_s'] / 2**30:.2f} GiB/s), lower bound {a['lower_bound'] / 2**20:.2f} MiB: "
      f"{a['bytes_moved'] / a['lower_bound']:.2f}x (capacity {a['capacity']:.0f} rows per expert and batch row, "
      f"{16 * 128 * 2 / 8 / 16:.0f} on average)")
PY
