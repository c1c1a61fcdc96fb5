#!/usr/bin/env bash
# The main job: install what is missing, build, and train the built-in byte-level transformer LM on
# 8 virtual CPU devices (data=2,fsdp=2,tensor=2) over the GPL-3 text every Debian system ships,
# stopping after step 200 with a checkpoint; then continue it to step 250 as 2 MPI processes of 4
# devices each (same mesh, the same losses as one process), and finish the run from that
# checkpoint on another mesh (fsdp=4,tensor=2): the losses an uninterrupted run gives.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh build
cmake -S . -B build > /dev/null
cmake --build build -j"$(nproc)" --target tessel_cli
ckpt=build/demo-checkpoints
rm -rf "$ckpt"
echo
echo "== tessel train: 200 of 300 steps on data=2,fsdp=2,tensor=2, checkpoint at the end"
./build/src/tessel train --steps 300 --stop-at 200 --checkpoint-dir "$ckpt" --metrics build/demo-metrics.jsonl
echo
echo "== resumed as 2 MPI processes x 4 devices (each writes its own blocks), steps 201..250"
mpirun=(mpirun -np 2)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
[ "$(nproc)" -lt 2 ] && mpirun+=(--oversubscribe)
"${mpirun[@]}" ./build/src/tessel train --devices-per-process 4 --steps 300 --stop-at 250 \
  --checkpoint-dir "$ckpt" --resume --metrics build/demo-metrics.jsonl
echo
echo "== resumed onto fsdp=4,tensor=2 in one process (each device reads only its blocks), steps 251..300"
./build/src/tessel train --steps 300 --checkpoint-dir "$ckpt" --resume --mesh fsdp=4,tensor=2 \
  --metrics build/demo-metrics.jsonl
echo
echo "per-step metrics: build/demo-metrics.jsonl; checkpoints: $ckpt (tessel ckpt info $ckpt)"
