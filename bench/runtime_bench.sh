#!/usr/bin/env bash
# Runtime figures, all measured in this one run on this machine: memcpy bandwidth with 1 and 2
# threads and a 2-thread streaming-store copy (the physical limit: the faster 2-thread copy),
# then reshard and collectives of a 1 GiB f32 array on 8 virtual
# devices as a ratio of it, the bytes that crossed devices against the lower bound, and the
# per-operation overhead on an 8x8 array.
# Usage: bench/runtime_bench.sh [BUILD_DIR]   (BUILD_DIR default: build, with benchmarks on)
# Needs about 10 GiB of free memory (the replicated cases hold 8 copies of 1 GiB).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$(dirname "$here")/build}
"$build/bench/bench_runtime" --benchmark_format=json > "$build/bench_runtime.json"

python3 - "$build/bench_runtime.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
ctx = doc["context"]
print(f"machine: {ctx.get('num_cpus')} cpus, {ctx.get('mhz_per_cpu')} MHz; host: {ctx.get('host_name')}")
runs = {b["name"].split("/iterations")[0].replace("/real_time", ""): b for b in doc["benchmarks"]}
gbs = lambda b: b["bytes_per_second"] / 1e9
m1, m2, st = gbs(runs["BM_Memcpy/1"]), gbs(runs["BM_Memcpy/2"]), gbs(runs["BM_StreamCopy"])
ref = max(m2, st)
print(f"memcpy 1 GiB, 1 thread : {m1:6.2f} GB/s")
print(f"memcpy 1 GiB, 2 threads: {m2:6.2f} GB/s")
print(f"streaming-store copy 1 GiB, 2 threads: {st:6.2f} GB/s   (the reference below: the faster 2-thread copy)")
print()
print(f"{'operation (1 GiB f32, 8 devices)':38s} {'GB/s':>7s} {'vs copy(2)':>13s} {'crossed/op':>12s} {'lower bound':>12s}")
for name, label in [("BM_ReshardRowsToColumns", "reshard rows -> columns"),
                    ("BM_ReshardReplicatedToSharded", "reshard replicated -> sharded"),
                    ("BM_ReshardShardedToReplicated", "reshard sharded -> replicated"),
                    ("BM_AllGather", "all_gather over fsdp=8"),
                    ("BM_ReduceScatter/0", "reduce_scatter over fsdp=8 (sum)"),
                    ("BM_ReduceScatter/1", "the same, strips of 32-float rows"),
                    ("BM_AllReduce", "all_reduce over fsdp=8 (sum)")]:
    b = runs[name]
    crossed, lb = b["crossed_per_op"], b["lower_bound"]
    ok = "=" if abs(crossed - lb) < 1 else "!="
    print(f"{label:38s} {gbs(b):7.2f} {gbs(b) / ref:12.0%} {crossed / 2**20:10.0f}Mi {ok} {lb / 2**20:8.0f}Mi")
print()
for name in ["BM_TinyReshard", "BM_TinyAllGather", "BM_TinyAllReduce", "BM_TinyDevicePut"]:
    b = runs[name]
    us = b["real_time"] * {"us": 1, "ns": 1e-3, "ms": 1e3}[b["time_unit"]]
    print(f"{name[3:]:18s} 8x8 f32 on 8 devices: {us:6.1f} us per operation (target < 50)")
PY
