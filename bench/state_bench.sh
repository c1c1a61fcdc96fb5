#!/usr/bin/env bash
# State-layer figures, all measured in this one run on this machine: memset bandwidth with 1 and 2
# threads (the physical limit) and of fresh memory, sharded init of a 1 GiB f32 model on 8 virtual devices as a ratio
# of it, the sampling kernel alone on one thread in cache, eval_shape + plan of a 1003-parameter model, and `tessel plan` of a Llama-3.1-405B-shaped
# model on an abstract 8192-device mesh with MaxText's base.yml (time and peak memory).
# Usage: bench/state_bench.sh [BUILD_DIR]   (BUILD_DIR default: build, with benchmarks on)
# Needs about 3 GiB of free memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
"$build/bench/bench_state" --benchmark_format=json > "$build/bench_state.json"

python3 - "$build/bench_state.json" "$build/src/tessel" "$root" <<'PY'
import json, resource, subprocess, sys, time
doc = json.load(open(sys.argv[1]))
cli, root = sys.argv[2], sys.argv[3]
ctx = doc["context"]
print(f"machine: {ctx.get('num_cpus')} cpus, {ctx.get('mhz_per_cpu')} MHz; host: {ctx.get('host_name')}")
runs = {b["name"].split("/iterations")[0].replace("/real_time", ""): b for b in doc["benchmarks"]}
gbs = lambda b: b["bytes_per_second"] / 1e9
m1, m2 = gbs(runs["BM_Memset/1"]), gbs(runs["BM_Memset/2"])
ref = max(m1, m2)
print(f"memset 1 GiB, 1 thread : {m1:6.2f} GB/s")
print(f"memset 1 GiB, 2 threads: {m2:6.2f} GB/s   (the reference below: the faster of the two)")
fresh = gbs(runs["BM_MemsetFresh"])
print(f"memset 1 GiB of fresh memory, 2 threads: {fresh:6.2f} GB/s   (the limit of an init into fresh memory)")
b = runs["BM_Init1GiBWarm"]
print(f"{'init 1 GiB f32 on 8 devices, cached blocks':44s} {gbs(b):6.2f} GB/s = {gbs(b) / ref:6.1%} of memset (target 25%)")
b = runs["BM_Init1GiB"]
print(f"{'init 1 GiB f32 on 8 devices, fresh memory':44s} {gbs(b):6.2f} GB/s = {gbs(b) / ref:6.1%} of memset, "
      f"{gbs(b) / fresh:6.1%} of memset into fresh memory")
for k, label in enumerate(["uniform", "normal", "truncated_normal"]):
    b = runs[f"BM_SampleF32/{k}/repeats:5_median"]
    ns = 1e9 / b["items_per_second"]
    print(f"sampling kernel, one thread, in cache, {label:16s}: {ns:5.2f} ns/element "
          f"({ns * float(ctx.get('mhz_per_cpu', 0)) / 1e3:4.2f} cycles at the nominal clock)")
b = runs["BM_EvalShapePlan1000"]
ms = b["real_time"] * {"us": 1e-3, "ns": 1e-6, "ms": 1}[b["time_unit"]]
print(f"eval_shape + plan, {int(b['params'])} parameters, 8 devices: {ms:6.2f} ms (target < 10 ms)")

cmd = [cli, "plan", "--model", f"{root}/examples/models/llama3.1-405b.yml", "--mesh", "data=16,fsdp=64,tensor=8",
       "--rules", f"{root}/../shared/testdata/maxtext/base.yml", "--remove-size-one-axes", "--optimizer", "adamw"]
best = None
for _ in range(5):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t = time.perf_counter() - t0
    best = t if best is None else min(best, t)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
t0 = time.perf_counter()
subprocess.run(["/bin/true"], check=True)
true_ms = (time.perf_counter() - t0) * 1e3
print(f"tessel plan, 405B shapes on data=16,fsdp=64,tensor=8 (8192 devices), base.yml: "
      f"{best * 1e3:6.1f} ms (best of 5; /bin/true {true_ms:.1f} ms), peak RSS {rss:.1f} MiB "
      f"(targets < 1 s, < 1 GiB)")
PY
