#!/usr/bin/env bash
# Training figures, all measured in this one run on this machine: the SGEMM rate of tessel's f32
# products on the models' shapes with every core (oneDNN's kernels since 2026-11-27, split over the
# pool as a 1-device op splits them; the run again with OPENBLAS_CORETYPE=Haswell, which these
# machines may set, now only matters for OpenBLAS's small products), then one train step of
# DotReluDot and of the small LM on 1 device and on 8 virtual devices per parallelism, against the
# GEMM-only lower bound (FLOPs / measured rate), against the 1-device step (also within alternating
# rounds: bench_train_rounds), and against the peers on the same models, batches and meshes:
# jax.jit on 1 and on 8 host CPU devices (bench/jax_peer.py) and PyTorch 2.13 on 1 device
# (bench/torch_peer.py, every core; as installed and with OMP_NUM_THREADS set as a user would
# tune it); the peers again within rounds (bench/torch_rounds.py, jax_rounds.py).
# Usage: bench/train_bench.sh [BUILD_DIR]   (installs the peers into .venv: scripts/venv.sh bench)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
threads=$(nproc)
bash "$root/scripts/venv.sh" bench
py=$root/.venv/bin/python
# Repetitions in random order, medians: this machine's speed drifts within a run (shared host),
# and the ratios between benchmarks should not depend on which ran in a fast minute.
reps=(--benchmark_repetitions="${TESSEL_BENCH_REPETITIONS:-3}" --benchmark_enable_random_interleaving=true
      --benchmark_report_aggregates_only=true --benchmark_format=json)
"$build/bench/bench_train" "${reps[@]}" > "$build/bench_train.json"
OPENBLAS_CORETYPE=Haswell "$build/bench/bench_train" --benchmark_filter=BM_Sgemm/ "${reps[@]}" \
  > "$build/bench_train_haswell.json"
# The same ratios taken within rounds (the GEMM bound and every mesh's step one after another).
rounds=${TESSEL_BENCH_ROUNDS:-30}
{ "$build/bench/bench_train_rounds" mlp "$rounds" data=1 data=8 fsdp=8 tensor=8 data=2,fsdp=2,tensor=2
  "$build/bench/bench_train_rounds" lm "$rounds" data=1 data=8 fsdp=8 data=2,tensor=4 data=2,fsdp=2,tensor=2
} > "$build/train_rounds.jsonl"
"$py" "$here/torch_peer.py" "$threads" > "$build/torch_default.json"
OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads "$py" "$here/torch_peer.py" "$threads" > "$build/torch_tuned.json"
# PyTorch and tessel within rounds (a step of each per round), as installed and tuned.
{ "$py" "$here/torch_rounds.py" "$threads" "$rounds" "$build/bench/bench_train_rounds"
  OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads "$py" "$here/torch_rounds.py" "$threads" "$rounds" \
    "$build/bench/bench_train_rounds"
} > "$build/torch_rounds.jsonl"
"$py" "$here/jax_peer.py" 1 mlp:data=1 lm:data=1 > "$build/jax_peer.jsonl"
"$py" "$here/jax_peer.py" 8 mlp:data=8 mlp:fsdp=8 mlp:tensor=8 mlp:data=2,fsdp=2,tensor=2 \
  lm:data=8 lm:fsdp=8 lm:data=2,tensor=4 lm:data=2,fsdp=2,tensor=2 >> "$build/jax_peer.jsonl"
# jax.jit and tessel within rounds, on every mesh (fewer rounds: JAX's 8-device steps are slow).
jax_rounds=${TESSEL_BENCH_JAX_ROUNDS:-15}
{ "$py" "$here/jax_rounds.py" 1 "$jax_rounds" "$build/bench/bench_train_rounds" mlp:data=1 lm:data=1
  "$py" "$here/jax_rounds.py" 8 "$jax_rounds" "$build/bench/bench_train_rounds" mlp:data=8 mlp:fsdp=8 mlp:tensor=8 \
    mlp:data=2,fsdp=2,tensor=2 lm:data=8 lm:fsdp=8 lm:data=2,tensor=4 lm:data=2,fsdp=2,tensor=2
} > "$build/jax_rounds.jsonl"

"$py" - "$build" "$threads" <<'PY'
import json, os, sys
build, threads = sys.argv[1], int(sys.argv[2])
def medians(path):  # each benchmark's median over the repetitions
    doc = json.load(open(path))
    doc["benchmarks"] = [b for b in doc["benchmarks"] if b.get("aggregate_name", "median") == "median"]
    return doc
doc = medians(f"{build}/bench_train.json")
has = medians(f"{build}/bench_train_haswell.json")
print(f"machine: {doc['context'].get('num_cpus')} cpus; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
def rates(d, name="BM_Sgemm/"):
    return [b["flops"] / 1e9 for b in d["benchmarks"] if b["name"].startswith(name)]
r, rh, ro = rates(doc), rates(has), rates(doc, "BM_SgemmOpenBlas/")
core = next(b["label"] for b in doc["benchmarks"] if b["name"].startswith("BM_Sgemm/"))
# The bound uses the best GEMM available: the faster of the two kernel families.
mlp_rate, lm_rate = max(sum(r[:3]), sum(rh[:3])) / 3, max(sum(r[3:]), sum(rh[3:])) / 4
print(f"SGEMM, {threads} threads, kernels {core}: MLP shapes {sum(r[:3]) / 3:.0f} GFLOP/s, LM shapes "
      f"{sum(r[3:]) / 4:.0f} GFLOP/s; with OPENBLAS_CORETYPE=Haswell: {sum(rh[:3]) / 3:.0f} and {sum(rh[3:]) / 4:.0f}; "
      f"bounds below use the faster: {mlp_rate:.0f} and {lm_rate:.0f}")
print(f"OpenBLAS on its own {threads} threads on the same shapes: MLP {sum(ro[:3]) / 3:.0f} GFLOP/s, LM "
      f"{sum(ro[3:]) / 4:.0f} GFLOP/s (tessel's products {mlp_rate / (sum(ro[:3]) / 3):.2f}x and "
      f"{lm_rate / (sum(ro[3:]) / 4):.2f}x its rate)")
# FLOPs of one step: forward GEMMs x 3 (the backward pass needs two products per forward one).
# DotReluDot: two forward products, and backward dW2, dH, dW1 (the batch needs no gradient).
mlp_flops = 5 * 2 * 512 * 1024 * 4096
B, S, E, L, H, M, V = 16, 128, 256, 4, 4, 1024, 256
T = B * S
lm_flops = 3 * (L * (2 * T * (4 * E * E + 2 * E * M) + 2 * 2 * B * S * S * E) + 2 * T * E * V)
steps = {}
for b in doc["benchmarks"]:
    if b["name"].startswith("BM_TrainStep"):
        steps[b["label"]] = b["real_time"] / 1e3 if b["time_unit"] == "ms" else b["real_time"]
print(f"\n{'step':34s} {'time':>9s} {'GEMM bound':>11s} {'/ bound':>8s} {'/ 1 device':>10s}")
for model, flops, rate in [("mlp", mlp_flops, mlp_rate), ("lm", lm_flops, lm_rate)]:
    bound = flops / (rate * 1e9)
    one = steps[f"{model} data=1"]
    for label, t in steps.items():
        if label.startswith(model + " "):
            print(f"{label:34s} {t * 1e3:7.1f} ms {bound * 1e3:8.1f} ms {t / bound:7.2f}x {t / one:9.2f}x")
print("\nThe same within rounds (bench_train_rounds: each round times the GEMMs, then one step per mesh; "
      "medians over the rounds of the ratios taken in each)")
for line in open(f"{build}/train_rounds.jsonl"):
    r = json.loads(line)
    print(f"{r['model'] + ' ' + r['mesh']:34s} {r['step_s'] * 1e3:7.1f} ms {r['bound_s'] * 1e3:8.1f} ms {r['to_bound']:7.2f}x "
          f"{r['to_first']:9.2f}x (quartiles {r['to_first_q1']:.2f} to {r['to_first_q3']:.2f}, {r['rounds']} rounds)")
default = json.load(open(f"{build}/torch_default.json"))
tuned = json.load(open(f"{build}/torch_tuned.json"))
best = {k: min(default[k], tuned[k]) for k in ("mlp_s", "lm_s")}
print(f"\nPyTorch {default['torch']}, {threads} threads: as installed MLP {default['mlp_s'] * 1e3:.1f} ms, "
      f"LM {default['lm_s'] * 1e3:.1f} ms; OMP_NUM_THREADS set MLP {tuned['mlp_s'] * 1e3:.1f} ms, LM {tuned['lm_s'] * 1e3:.1f} ms")
g = [max(a, b) for a, b in zip(default["gemm_gflops"], tuned["gemm_gflops"])]
print(f"PyTorch's SGEMM ({default['blas']}) on the same shapes: MLP {sum(g[:3]) / 3:.0f} GFLOP/s, LM {sum(g[3:]) / 4:.0f} "
      f"GFLOP/s = {sum(g[:3]) / 3 / mlp_rate:.2f}x and {sum(g[3:]) / 4 / lm_rate:.2f}x the rate of the bounds above")
for model, key in [("mlp", "mlp_s"), ("lm", "lm_s")]:
    ours = steps[f"{model} data=1"]
    print(f"{model}: tessel 1 device {ours * 1e3:.1f} ms = {best[key] / ours:.2f}x the speed of PyTorch's best "
          f"(above 1: tessel is faster)")
# Within rounds, PyTorch's better setting per model: the run where its speed against tessel was higher.
peer_rounds = {}
for line in open(f"{build}/torch_rounds.jsonl"):
    r = json.loads(line)
    if r["model"] not in peer_rounds or r["speed"] < peer_rounds[r["model"]]["speed"]:
        peer_rounds[r["model"]] = r
for model, r in peer_rounds.items():
    print(f"{model}: within {r['rounds']} rounds, tessel {r['tessel_s'] * 1e3:.1f} ms, PyTorch {r['peer_s'] * 1e3:.1f} ms: "
          f"{r['speed']:.2f}x the speed of PyTorch (quartiles {r['speed_q1']:.2f} to {r['speed_q3']:.2f})")
jax_rows = [json.loads(line) for line in open(f"{build}/jax_peer.jsonl")]
print(f"\njax.jit (JAX {jax_rows[0]['jax']}) on the same model, batch and mesh (ratio above 1: tessel is faster)")
for r in jax_rows:
    ours = steps[f"{r['model']} {r['mesh']}"]
    print(f"  {r['model']} {r['mesh']:24s} ({r['devices']} host devices) jax {r['step_s'] * 1e3:7.1f} ms, "
          f"tessel {ours * 1e3:7.1f} ms: {r['step_s'] / ours:5.2f}x")
print("within rounds (jax_rounds.py: a jax.jit step and a tessel step per round)")
for line in open(f"{build}/jax_rounds.jsonl"):
    r = json.loads(line)
    print(f"  {r['model']} {r['mesh']:24s} ({r['devices']} host devices) jax {r['peer_s'] * 1e3:7.1f} ms, "
          f"tessel {r['tessel_s'] * 1e3:7.1f} ms: {r['speed']:5.2f}x (quartiles {r['speed_q1']:.2f} to "
          f"{r['speed_q3']:.2f}, {r['rounds']} rounds)")
tokens = B * S
print(f"LM tokens/s: tessel {tokens / steps['lm data=1']:.0f} (1 device), "
      f"{tokens / steps['lm data=2,fsdp=2,tensor=2']:.0f} (data=2,fsdp=2,tensor=2); PyTorch {tokens / best['lm_s']:.0f}")
PY
