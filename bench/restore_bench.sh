#!/usr/bin/env bash
# Same-mesh restore and save against the peers and the disk, warm and cold page cache, in rounds
# whose ratios are taken per round (the machine's speed drifts between rounds) and reported as
# medians: tessel (bench_checkpoint, the C++ API into its own devices; plain zarr files and OCDBT,
# uncompressed) restoring a 2 GiB f32 state saved on fsdp=8 onto fsdp=8, python zarr reading the
# same arrays whole into NumPy, and TensorStore reading every device's block (bench/ckpt_peers.py);
# tessel's save against this disk's raw write + fsync of the same bytes (bench_checkpoint raw: the
# best of buffered and direct writes).
# Cold: the page cache dropped before the run (needs root; skipped otherwise), with the disk's own
# rate beside it (the same files read by 8 concurrent `cat`s). Each figure is one process, fresh
# memory included.
# Usage: bench/restore_bench.sh [BUILD_DIR] [ROUNDS] [SCRATCH_DIR] [BYTES]   (defaults: build 5)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
rounds=${2:-5}
scratch=${3:-$(dirname "$root")/tessel-bench-scratch}
bytes=${4:-2147483648}
bench=$build/bench/bench_checkpoint
bash "$root/scripts/venv.sh" test
py=$root/.venv/bin/python
peers=$here/ckpt_peers.py
rm -rf "$scratch" && mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
out=$scratch/results.jsonl
can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then can_drop=1; else echo "not root: cold page cache runs skipped" >&2; fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# This VM's balloon hands memory that stayed free for a few seconds back to the host, and the next
# first touch of it pays a host fault (2-5x slower): whichever process ran first after a pause
# lost. Every measured process (tessel's and the peers') touches and frees 3 GiB right before its
# timed work, so each runs on memory the host backs, as in a running job.
export TESSEL_BENCH_PRIME_BYTES=$((3 << 30))
row() { echo "{\"round\": $1, \"name\": \"$2\", \"result\": $3}" >> "$out"; }
peer_result() { "$py" -c 'import json, sys; print(json.dumps(json.loads(sys.stdin.read())["result"]))'; }

"$bench" save "$scratch/files" "$bytes" none files > /dev/null
"$py" "$peers" zarr write "$scratch/zarr" "$bytes" none > /dev/null
"$py" "$peers" tensorstore save "$scratch/ts" "$bytes" none > /dev/null
for round in $(seq 1 "$rounds"); do
  row "$round" raw "$("$bench" raw "$scratch/raw" "$bytes")"
  row "$round" "tessel save ocdbt" "$("$bench" save "$scratch/ocdbt" "$bytes" none ocdbt)"
  for cache in warm cold; do
    [ "$cache" = cold ] && [ "$can_drop" = 0 ] && continue
    # Warm: every checkpoint read once first (the last round's cold runs dropped them).
    [ "$cache" = warm ] && find "$scratch/files" "$scratch/ocdbt" "$scratch/zarr" "$scratch/ts" -type f -exec cat {} + > /dev/null
    for layout in files ocdbt; do
      [ "$cache" = cold ] && drop
          row "$round" "tessel $layout $cache" "$("$bench" restore "$scratch/$layout" fsdp=8)"
    done
    if [ "$cache" = cold ]; then  # the disk itself: the same files read by 8 concurrent readers
      drop
      t0=$(date +%s.%N)
      find "$scratch/files" -type f -size +1M -print0 | xargs -0 -P 8 -n 4 cat > /dev/null
      row "$round" "disk cold" "{\"gbps\": $("$py" -c "import sys; print($bytes / ($(date +%s.%N) - $t0) / 1e9)")}"
      drop
    fi
      row "$round" "zarr $cache" "$("$py" "$peers" zarr read "$scratch/zarr" "$bytes" none | peer_result)"
    [ "$cache" = cold ] && drop
      row "$round" "tensorstore $cache" "$("$py" "$peers" tensorstore restore "$scratch/ts" "$bytes" fsdp=8 | peer_result)"
  done
done

"$py" - "$out" <<'PY'
import json, statistics, sys
def best_write(raw):
    """The disk's best write + fsync rate: buffered (1 or 2 threads) or direct (1, 2 or 4 threads)."""
    return max(v for k, v in raw.items() if k.startswith(("write_fsync_gbps_", "write_direct_fsync_gbps_")))
rows = {}
for j in map(json.loads, open(sys.argv[1])):
    rows.setdefault(j["round"], {})[j["name"]] = j["result"]
def med(xs):
    return statistics.median(xs) if xs else float("nan")
def series(f):
    out = []
    for r in rows.values():
        try:
            out.append(f(r))
        except KeyError:
            pass
    return out
print(f"{len(rows)} rounds; each figure GB/s of the 2 GiB state, ratios taken within a round, then the median")
for cache in ("warm", "cold"):
    if not series(lambda r: r[f"zarr {cache}"]):
        continue
    print(f"\n{cache} page cache")
    for name in ("tessel files", "tessel ocdbt", "zarr", "tensorstore") + (("disk",) if cache == "cold" else ()):
        g = series(lambda r: r[f"{name} {cache}"]["gbps"])
        print(f"  {name:14s} {med(g):6.2f} GB/s   runs: {' '.join(f'{x:.2f}' for x in g)}")
    for layout in ("files", "ocdbt"):
        for peer in ("zarr", "tensorstore"):
            q = series(lambda r: r[f"tessel {layout} {cache}"]["gbps"] / r[f"{peer} {cache}"]["gbps"])
            print(f"  tessel {layout} / {peer:11s}: {med(q):5.2f}x   runs: {' '.join(f'{x:.2f}' for x in q)}")
w = series(lambda r: best_write(r["raw"]))
s = series(lambda r: r["tessel save ocdbt"]["gbps"])
q = series(lambda r: r["tessel save ocdbt"]["gbps"] / best_write(r["raw"]))
print(f"\nsave (OCDBT, uncompressed) {med(s):.2f} GB/s; raw write + fsync (best of buffered 1, 2 and direct 1, 2, 4 threads) {med(w):.2f} GB/s")
print(f"  save / raw write: {med(q) * 100:.0f}%   runs: {' '.join(f'{x * 100:.0f}%' for x in q)}")
PY
