#!/usr/bin/env bash
# Figures across MPI processes, all measured in this one run on this machine: tessel's all_reduce
# and all_gather between 2 ranks (one device and one thread each) against Open MPI's own
# MPI_Allreduce and MPI_Allgather on buffers of the same sizes, 1 MiB to 256 MiB; then the train
# step of the default LM on 2 ranks x 4 devices against 1 process x 8 devices (median step time).
# Usage: bench/mpi_bench.sh [BUILD_DIR] [MAX_MIB]   (needs 5x MAX_MIB of memory per rank)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
max_mib=${2:-256}
mpirun=(mpirun --allow-run-as-root)
[ "$(nproc)" -lt 2 ] && mpirun+=(--oversubscribe)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"${mpirun[@]}" -np 2 "$build/bench/bench_mpi" 1 "$max_mib" > "$work/collectives.jsonl"
steps=40
"$build/src/tessel" train --steps $steps --metrics "$work/one.jsonl" > /dev/null
"${mpirun[@]}" -np 2 "$build/src/tessel" train --devices-per-process 4 --steps $steps --metrics "$work/two.jsonl" > /dev/null

python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
print("collectives between 2 ranks (bandwidth = bytes / time of the slowest rank, median):")
print(f"{'op':<11}{'size':>9}{'tessel GB/s':>13}{'MPI GB/s':>10}{'tessel/MPI':>12}")
ratios = {}
for r in map(json.loads, open(f"{work}/collectives.jsonl")):
    ours, theirs = r["bytes"] / r["tessel_s"] / 1e9, r["bytes"] / r["mpi_s"] / 1e9
    ratios.setdefault(r["op"], []).append(ours / theirs)
    print(f"{r['op']:<11}{r['bytes'] >> 20:>6} MiB{ours:>13.2f}{theirs:>10.2f}{ours / theirs:>11.0%}")
for op, rs in ratios.items():
    print(f"{op}: tessel reaches {min(rs):.0%} to {max(rs):.0%} of MPI's bandwidth (target 90%)")
def median_step(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    return statistics.median(r["step_s"] for r in rows[5:])  # past the warm-up steps
one, two = median_step("one"), median_step("two")
print(f"train step, default LM, data=2,fsdp=2,tensor=2: 1 process x 8 devices {one * 1e3:.1f} ms, "
      f"2 ranks x 4 devices {two * 1e3:.1f} ms: {one / two:.2f}x the 1-process speed")
PY
