#!/usr/bin/env bash
# The main job for now: install what is missing, build, resolve the bundled example model's
# logical axes onto a data x fsdp x tensor mesh of 8 devices, plan and initialize a transformer
# sharded from birth, and plan Llama 3.1 405B on 8192 devices (the training issue will swap in
# `tessel train`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh build
cmake -S . -B build > /dev/null
cmake --build build -j"$(nproc)" --target tessel_cli
ex=examples/shardings
mesh=data=2,fsdp=2,tensor=2
echo
echo "== tessel shardings: the example LM's logical axes resolved onto mesh $mesh"
./build/src/tessel shardings --rules $ex/rules.yml --logical $ex/tiny_lm_logical.json --mesh $mesh \
  --out build/named_shardings.json
echo "   wrote build/named_shardings.json (MaxText's named_shardings.json format)"
echo
echo "== why: every rule tried, per dimension"
./build/src/tessel shardings --rules $ex/rules.yml --logical $ex/tiny_lm_logical.json --mesh $mesh --explain
echo "== how the token embedding is split over the 8 devices"
./build/src/tessel shardings --mesh $mesh --spec '["tensor", "fsdp"]' --shape 1024,256 --show
echo
echo "== the embedding on 8 virtual devices: FSDP layout -> tensor-parallel layout, bytes moved per device"
./build/src/tessel reshard --devices 8 --mesh $mesh --shape 1024,256 \
  --from '[["data", "fsdp"], null]' --to '["tensor", "fsdp"]'
echo
echo "== tessel plan: a small transformer on $mesh, AdamW, then initialized on 8 virtual devices"
./build/src/tessel plan --model examples/models/transformer.yml --rules examples/models/rules.yml --mesh $mesh \
  --optimizer adamw --init 0 --devices 8
echo
echo "== tessel plan: Llama 3.1 405B's shapes on an abstract 8192-device mesh (nothing is allocated)"
./build/src/tessel plan --model examples/models/llama3.1-405b.yml --rules examples/models/rules.yml \
  --mesh data=16,fsdp=64,tensor=8 --optimizer adamw
