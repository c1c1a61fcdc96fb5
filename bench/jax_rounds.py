"""jax.jit against tessel within rounds (bench/rounds.py), for bench/train_bench.sh: the models and
steps of bench/jax_peer.py against bench_train's, on the same meshes.
Usage: jax_rounds.py DEVICES ROUNDS BENCH_TRAIN_ROUNDS MODEL:MESH...  -> one JSON object per mesh.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tessel process's OpenMP threads (oneDNN's libgomp) would spin after each of its steps on the
# cores JAX's step is about to use (bench/torch_rounds.py): they wait passively instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402

import jax_peer  # noqa: E402
import rounds  # noqa: E402


def main():
    devices, count, binary = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    for arg in sys.argv[4:]:
        model, mesh = arg.split(":")
        result = rounds.alternate(jax_peer.step_fn(model, mesh), binary, model, mesh, count)
        print(json.dumps({**result, "devices": devices, "jax": jax.__version__}), flush=True)


if __name__ == "__main__":
    main()
