#!/usr/bin/env bash
# Rule resolution on the MaxText qwen3-0.6b state, all figures measured in this one run:
#   1. tessel per entry (Google Benchmark) vs Flax Linen's logical_to_mesh_axes per entry;
#   2. `tessel shardings` whole-process time vs a bare process start (/bin/true) and vs a Python
#      process importing Flax and doing the same resolution.
# Usage: bench/sharding_bench.sh [BUILD_DIR]   (BUILD_DIR default: build, with benchmarks on;
#   Flax comes from the project's environment, scripts/venv.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
data=$root/../shared/testdata/maxtext
rules=$data/base.yml
logical=$data/qwen3-0.6b_tpu7x-16_default/logical_shardings.json
bash "$root/scripts/venv.sh" test
py=$root/.venv/bin/python

"$build/bench/bench_sharding" --benchmark_filter='Qwen3' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$build/bench_sharding.json"
flax_ns=$("$py" "$here/flax_peer.py" time "$rules" "$logical")

"$py" - "$build" "$flax_ns" "$rules" "$logical" "$here/flax_peer.py" <<'PY'
import json, subprocess, sys, time
build, flax_ns, rules, logical, peer = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
doc = json.load(open(f"{build}/bench_sharding.json"))
print(f"machine: {doc['context'].get('num_cpus')} cpus, {doc['context'].get('mhz_per_cpu')} MHz")
per = {}
for b in doc["benchmarks"]:
    if b.get("aggregate_name") == "median":
        per[b["run_name"]] = b["per_entry"] * 1e9
for name, ns in per.items():
    print(f"{name:45s} {ns:8.0f} ns/entry")
base = per["BM_ResolveQwen3State/remove_size_one:0"]
print(f"{'Flax Linen logical_to_mesh_axes (peer)':45s} {flax_ns:8.0f} ns/entry")
print(f"ratio Flax / tessel resolve: {flax_ns / base:.1f}x")

def best_ms(cmd, n=30):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3

cli = best_ms([f"{build}/src/tessel", "shardings", "--rules", rules, "--logical", logical, "--mesh", "fsdp=16"])
true = best_ms(["/bin/true"])
py = best_ms([sys.executable, peer, "once", rules, logical], n=10)
print(f"tessel shardings whole process (best of 30): {cli:.2f} ms")
print(f"/bin/true process start (best of 30):        {true:.2f} ms   ratio tessel/true: {cli / true:.1f}x")
print(f"python + Flax, same resolution (best of 10):  {py:.2f} ms   ratio python/tessel: {py / cli:.1f}x")
PY
