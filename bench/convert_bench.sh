#!/usr/bin/env bash
# Conversions between safetensors and Orbax in bounded memory, measured in this one run: the raw
# write+fsync and cached read bandwidth of this disk (bench_checkpoint raw), then a BYTES
# safetensors set in Hugging Face's layout (4 files + index; f32 tensors of 128 MiB and one of
# 512 MiB, the largest) written by the real `safetensors` package, and three `tessel ckpt convert`
# runs, each under /usr/bin/time -v for its peak RSS:
#   1. set -> safetensors with a cast to bf16 (streams: a batch of tensors at a time)
#   2. set -> Orbax item (streams, through CheckpointWriter)
#   3. Orbax item -> safetensors (streams)
# Usage: bench/convert_bench.sh [BUILD_DIR] [SCRATCH_DIR] [BYTES]   (BYTES default 4.5 GiB; needs
# about 4x BYTES of disk)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
scratch=${2:-$(dirname "$root")/tessel-convert-scratch}
bytes=${3:-4831838208}
tessel=$build/src/tessel
rm -rf "$scratch" && mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT
bash "$root/scripts/venv.sh" test > /dev/null
py=$root/.venv/bin/python

echo "== raw disk (bench_checkpoint raw, 8 files)"
"$build/bench/bench_checkpoint" raw "$scratch/raw" "$bytes" | tee "$scratch/raw.json"
rm -rf "$scratch/raw"

echo "== writing the source set with the safetensors package"
"$py" - "$scratch/hf" "$bytes" <<'EOF'
import json, os, sys
import numpy as np
import safetensors.numpy as stnp
out, total = sys.argv[1], int(sys.argv[2])
os.makedirs(out)
big, small = 512 << 20, 128 << 20
sizes = [big] + [small] * max(1, (total - big) // small)
names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(len(sizes))]
files, weight_map, per_file = 4, {}, (len(sizes) + 3) // 4
for f in range(files):
    part = {}
    for i in range(f * per_file, min(len(sizes), (f + 1) * per_file)):
        n = sizes[i] // 4
        part[names[i]] = (np.arange(n, dtype=np.uint32) * np.uint32(2654435761) >> np.uint32(9) | np.uint32(0x3C000000)).view(np.float32).reshape(-1, 4096)
    name = f"model-{f + 1:05d}-of-{files:05d}.safetensors"
    stnp.save_file(part, os.path.join(out, name), metadata={"format": "pt"})
    weight_map.update({k: name for k in part})
    del part
json.dump({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
print(f"{len(sizes)} tensors, {sum(sizes) / 2**30:.2f} GiB, largest {big >> 20} MiB")
EOF
sync

measure() {  # name, then the command; prints seconds and peak RSS
  local name=$1; shift
  /usr/bin/time -v "$@" > "$scratch/out.txt" 2> "$scratch/time.txt" || { cat "$scratch/out.txt" "$scratch/time.txt"; exit 1; }
  local rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$scratch/time.txt")
  local wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$scratch/time.txt")
  echo "$name: wall $wall, peak RSS $((rss / 1024)) MiB"
  grep -E "Maximum resident set size|Elapsed \(wall clock\)" "$scratch/time.txt" | sed 's/^\t*/    \/usr\/bin\/time -v: /'
  cat "$scratch/out.txt"
}
measure "1. safetensors -> safetensors bf16 (streaming)" "$tessel" ckpt convert "$scratch/hf" "$scratch/bf16" --to safetensors --dtype bf16
rm -rf "$scratch/bf16"
measure "2. safetensors -> Orbax item (streaming)" "$tessel" ckpt convert "$scratch/hf" "$scratch/orbax"
measure "3. Orbax item -> safetensors (streaming)" "$tessel" ckpt convert "$scratch/orbax" "$scratch/back" --max-file-mb 2048
echo "largest tensor: 512 MiB; state: $((bytes >> 20)) MiB"
