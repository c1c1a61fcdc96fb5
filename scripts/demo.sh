#!/usr/bin/env bash
# The main job: install what is missing, build, and train the built-in byte-level transformer LM on
# 8 virtual CPU devices (data=2,fsdp=2,tensor=2) over the GPL-3 text every Debian system ships,
# stopping after step 250 with a checkpoint; then resume that checkpoint on another mesh
# (fsdp=4,tensor=2) and finish the run: the same losses an uninterrupted run gives.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh build
cmake -S . -B build > /dev/null
cmake --build build -j"$(nproc)" --target tessel_cli
ckpt=build/demo-checkpoints
rm -rf "$ckpt"
echo
echo "== tessel train: 250 of 300 steps on data=2,fsdp=2,tensor=2, checkpoint at the end"
./build/src/tessel train --steps 300 --stop-at 250 --checkpoint-dir "$ckpt" --metrics build/demo-metrics.jsonl
echo
echo "== resumed onto fsdp=4,tensor=2 (each device reads only its blocks), steps 251..300"
./build/src/tessel train --steps 300 --checkpoint-dir "$ckpt" --resume --mesh fsdp=4,tensor=2 \
  --metrics build/demo-metrics.jsonl
echo
echo "per-step metrics: build/demo-metrics.jsonl; checkpoints: $ckpt (tessel ckpt info $ckpt)"
