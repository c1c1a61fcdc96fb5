#!/usr/bin/env bash
# Checkpoint figures, all measured in this one run on this machine and filesystem: raw write
# (fsync) and cached read bandwidth of 8 files, then tessel saving a 2 GiB f32 state from 8 virtual
# devices (fsdp=8), restoring it onto the same mesh and onto data=2,tensor=4, uncompressed and
# with zstd level 1, each in its own process (peak RSS per run); and Debian's python3-zarr writing
# and reading the same arrays as the peer.
# Usage: bench/checkpoint_bench.sh [BUILD_DIR] [SCRATCH_DIR] [BYTES]
#   BUILD_DIR default build; SCRATCH_DIR default a directory under the repo's parent (disk, not
#   tmpfs); BYTES default 2147483648. Needs about 3x BYTES of disk and 3x BYTES of memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
scratch=${2:-$(dirname "$root")/tessel-bench-scratch}
bytes=${3:-2147483648}
bench=$build/bench/bench_checkpoint
rm -rf "$scratch" && mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
out=$scratch/results.jsonl
run() { echo "{\"name\": \"$1\", \"result\": $("${@:2}")}" >> "$out"; }

run raw "$bench" raw "$scratch/raw" "$bytes"
for codec in none zstd:1; do
  run "save $codec" "$bench" save "$scratch/$codec" "$bytes" "$codec"
  run "restore $codec fsdp=8" "$bench" restore "$scratch/$codec" fsdp=8
  run "restore $codec data=2,tensor=4" "$bench" restore "$scratch/$codec" data=2,tensor=4
  rm -rf "$scratch/$codec"
done
/usr/bin/python3 - "$scratch/zarr" "$bytes" >> "$out" <<'PY'
# The peer: python3-zarr writing and reading the same arrays (8192 x 4096 f32, 8 row chunks each).
import json, os, shutil, sys, time
import numpy as np, zarr
from numcodecs import Zstd
dest, total = sys.argv[1], int(sys.argv[2])
n = max(1, total // (8192 * 4096 * 4))
rng = np.random.default_rng(0)
bits = (rng.integers(0, 1 << 25, size=(8192, 4096), dtype=np.uint32) | np.uint32(0x3c000000))
value = bits.view(np.float32)
for name, comp in [("none", None), ("zstd:1", Zstd(level=1))]:
    t0 = time.perf_counter()
    for i in range(n):
        z = zarr.open(f"{dest}/{name}/{i}", mode="w", shape=value.shape, chunks=(1024, 4096), dtype="<f4", compressor=comp)
        z[...] = value
    os.sync()
    w = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        zarr.open(f"{dest}/{name}/{i}", mode="r")[...]
    r = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        zarr.open(f"{dest}/{name}/{i}", mode="r")[:, 0:1024]
    c = time.perf_counter() - t0
    b = n * value.nbytes
    print(json.dumps({"name": f"python3-zarr {name}", "result": {"write_gbps": b / w / 1e9, "read_gbps": b / r / 1e9,
                                                                  "column_block_gbps": b / 4 / c / 1e9}}))
    shutil.rmtree(f"{dest}/{name}")
PY

python3 - "$out" <<'PY'
import json, sys
rows = {j["name"]: j["result"] for j in map(json.loads, open(sys.argv[1]))}
raw = rows["raw"]
wr = max(raw["write_fsync_gbps_1"], raw["write_fsync_gbps_2"])
rd = max(raw["read_cached_gbps_1"], raw["read_cached_gbps_2"])
rf = max(raw["read_fresh_gbps_1"], raw["read_fresh_gbps_2"])
print(f"raw write + fsync, 8 files        : {wr:6.2f} GB/s   (best of 1 and 2 threads)")
print(f"raw cached read, reused buffer    : {rd:6.2f} GB/s")
print(f"raw cached read, fresh memory     : {rf:6.2f} GB/s   (what a restore must do: new pages)")
mib = 1 << 20
for codec in ["none", "zstd:1"]:
    s = rows[f"save {codec}"]
    print(f"\nsave {codec:7s} fsdp=8                 : {s['gbps']:6.2f} GB/s = {s['gbps'] / wr:6.1%} of raw write")
    for mesh in ["fsdp=8", "data=2,tensor=4"]:
        r = rows[f"restore {codec} {mesh}"]
        over = (r["peak_rss"] - r["target_bytes"]) / mib
        print(f"restore {codec:7s} -> {mesh:16s}: {r['gbps']:6.2f} GB/s = {r['gbps'] / rd:6.1%} of cached read, "
              f"{r['gbps'] / rf:6.1%} of fresh read; peak RSS - target bytes = {over:7.1f} MiB "
              f"(staging peak {r['staging_peak'] / mib:.0f} MiB)")
for codec in ["none", "zstd:1"]:
    z = rows[f"python3-zarr {codec}"]
    s, r = rows[f"save {codec}"], rows[f"restore {codec} fsdp=8"]
    rc = rows[f"restore {codec} data=2,tensor=4"]
    print(f"\npython3-zarr {codec:7s}: write {z['write_gbps']:5.2f} GB/s (tessel {s['gbps'] / z['write_gbps']:4.1f}x), "
          f"read {z['read_gbps']:5.2f} GB/s (tessel {r['gbps'] / z['read_gbps']:4.1f}x), "
          f"column block {z['column_block_gbps']:5.2f} GB/s (tessel onto columns {rc['gbps'] / z['column_block_gbps']:4.1f}x)")
PY
