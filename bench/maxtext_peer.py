"""The peer of bench/maxtext_bench.sh: the abstract TrainState with shardings, built the way
MaxText builds it, by JAX, flax and optax (from the project's environment, scripts/venv.sh).

  maxtext_peer.py DUMP_DIR RULES   -> seconds for: jax.eval_shape of flax's TrainState.create with
                                      optax.adamw over the parameters, then flax's
                                      logical_to_mesh_sharding of every leaf on an abstract mesh
                                      (best of 5; imports and file reading excluded)

DUMP_DIR is `tessel plan --dump-shardings`'s output for the model (its logical axes and shapes, the
same as MaxText's dump); the mesh is read from its named_shardings.json.
"""
import json
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import yaml
from flax.training import train_state
from jax.sharding import AbstractMesh, PartitionSpec


def main():
    dump, rules_path = sys.argv[1:3]
    logical = json.load(open(f"{dump}/logical_shardings.json"))
    named = json.load(open(f"{dump}/named_shardings.json"))
    with open(rules_path) as f:
        rules = [(n, tuple(a) if isinstance(a, list) else a) for n, a in yaml.safe_load(f)["logical_axis_rules"]]
    mesh_info = next(iter(named.values()))["mesh"]
    mesh = AbstractMesh(tuple(mesh_info["shape"][a] for a in mesh_info["axis_names"]), tuple(mesh_info["axis_names"]))
    params = {}
    for key, e in logical.items():
        if not key.startswith(".params/['params']/"):
            continue
        node = params
        keys = [k[2:-2] for k in key[len(".params/['params']/"):].split("/")]
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = (tuple(e["shape"]), tuple(e["partition_spec"]))
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x[0], jnp.float32), params,
                                    is_leaf=lambda x: isinstance(x, tuple))
    specs = {"params": jax.tree_util.tree_map(lambda x: PartitionSpec(*x[1]), params,
                                              is_leaf=lambda x: isinstance(x, tuple))}
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        tx = optax.adamw(1e-3)
        state = jax.eval_shape(lambda p: train_state.TrainState.create(apply_fn=None, params=p, tx=tx),
                               {"params": shapes})
        # MaxText annotates the opt_state like the params (mu, nu) and replicates the counters.
        logical_state = state.replace(params=specs,
                                      opt_state=(optax.ScaleByAdamState(PartitionSpec(), specs, specs),
                                                 optax.EmptyState(), optax.ScaleByScheduleState(PartitionSpec())),
                                      step=PartitionSpec())
        shardings = nn.logical_to_mesh_sharding(logical_state, mesh, rules)
        n = len(jax.tree_util.tree_leaves(shardings))
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    print(json.dumps({"seconds": best, "leaves": n}))


if __name__ == "__main__":
    main()
