"""Checkpoints from elsewhere: a MaxText-like TrainState written by the real Orbax on a JAX mesh
whose axis names the target mesh lacks, restored by tessel through an axis map, logical axes with
rules, or specs by path; subtrees selected and moved (MaxText's params/params/... -> decoder/...),
in Python and on the command line. Every array bit-identical to what Orbax saved."""
import json
import os
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxSharding
from jax.sharding import PartitionSpec as JP

import tessel
from conftest import cli
from trees import assert_bit_identical, leaves, random_array

LOGICAL = {  # MaxText's logical axes of each parameter
    "decoder/layers/mlp/wi/kernel": ("embed", "layers", "mlp"),
    "decoder/layers/mlp/wo/kernel": ("mlp", "layers", "embed"),
    "token_embedder/embedding": ("vocab", "embed"),
    "decoder/decoder_norm/scale": ("norm",),
}


def train_state(rng, jmesh, sizes):
    """A TrainState as MaxText's checkpointer saves it: params/params/..., opt_state/0/{mu,nu}/params/..., step."""
    e, l, m, v = sizes
    shapes = {"decoder/layers/mlp/wi/kernel": (e, l, m), "decoder/layers/mlp/wo/kernel": (m, l, e),
              "token_embedder/embedding": (v, e), "decoder/decoder_norm/scale": (e,)}
    specs = {"decoder/layers/mlp/wi/kernel": JP("fsdp", None, "model"), "decoder/layers/mlp/wo/kernel": JP("model", None, "fsdp"),
             "token_embedder/embedding": JP("model", "fsdp"), "decoder/decoder_norm/scale": JP()}

    def tree(prefix):
        out = {}
        for p, shape in shapes.items():
            node = out
            keys = p.split("/")
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            value = random_array(rng, shape, rng.choice(["float32", "bfloat16"]))
            node[keys[-1]] = jax.device_put(value, JaxSharding(jmesh, specs[p]))
        return out

    return {"params": {"params": tree("params")},
            "opt_state": [{"count": np.int32(3), "mu": {"params": tree("mu")}, "nu": {"params": tree("nu")}}],
            "step": np.int32(7)}


@pytest.fixture
def maxtext_run(rng, tmp):
    jmesh = JaxMesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "model"))
    state = train_state(rng, jmesh, (8, 2, 16, 32))
    root = os.path.join(tmp, "run")
    with ocp.CheckpointManager(root, item_names=("items",)) as manager:
        manager.save(7, args=ocp.args.Composite(items=ocp.args.StandardSave(state)))
        manager.wait_until_finished()
    return root, state


def test_axis_map_logical_axes_and_specs_place_a_foreign_train_state(maxtext_run):
    root, state = maxtext_run
    want = {p: np.asarray(v) for p, v in leaves(state).items() if not p.startswith("opt_state/0/count") and p != "step"}
    mesh = tessel.Mesh({"data": 2, "tensor": 4})
    with pytest.raises(tessel.Error, match="--axis-map"):
        tessel.checkpoint.restore(root, mesh=mesh, select="params.*")
    # (c) an axis map: fsdp -> data, model -> tensor.
    got = tessel.checkpoint.restore(root, mesh=mesh, select="params.*", axis_map={"fsdp": "data", "model": "tensor"})
    for p, a in leaves(got).items():
        assert_bit_identical(a.to_numpy(), want[p], p)
        assert set(a.sharding.spec) <= {None, "data", "tensor"}, (p, a.sharding.spec)
    # (a) logical axes by path, with rules; the prefix stripped as a model's tree wants it.
    rules = tessel.LogicalRules([("embed", "data"), ("mlp", "tensor"), ("vocab", "tensor")])
    logical = {"params/params/" + p: names for p, names in LOGICAL.items()}
    got = tessel.checkpoint.restore(root, mesh=mesh, rules=rules, logical_axes=logical, select="params.params.*",
                                    rename={"params.params": ""})
    assert sorted(leaves(got)) == sorted(LOGICAL)
    for p, names in LOGICAL.items():
        a = leaves(got)[p]
        assert a.sharding.spec == rules.resolve(names, mesh), p
        assert_bit_identical(a.to_numpy(), want["params/params/" + p], p)
    # (b) specs by path, as jax.ShapeDtypeStructs on a JAX mesh with other names: Orbax's own way.
    jmesh = JaxMesh(np.array(jax.devices()[:8]).reshape(8), ("x",))
    target = {"params/params/" + p: jax.ShapeDtypeStruct(want["params/params/" + p].shape, want["params/params/" + p].dtype,
                                                         sharding=JaxSharding(jmesh, JP("x") if len(n) > 1 else JP()))
              for p, n in LOGICAL.items()}
    got = tessel.checkpoint.restore(root, shardings=target, select="params.*", as_jax=True)
    for p, a in leaves(got).items():
        assert a.sharding == target[p].sharding
        assert_bit_identical(np.asarray(a), want[p], p)


def test_the_cli_restores_and_converts_a_foreign_train_state(maxtext_run, tmp):
    root, state = maxtext_run
    r = subprocess.run([cli(), "ckpt", "restore", root, "--mesh", "data=2,tensor=4", "--select", "params.*"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--axis-map" in r.stderr and "params/params/decoder" in r.stderr, r.stderr
    r = subprocess.run([cli(), "ckpt", "restore", root, "--mesh", "data=2,tensor=4", "--axis-map", "fsdp=data,model=tensor",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["params"] == len(leaves(state))
    # MaxText's named_shardings.json format as the target, then the params alone into a model's tree.
    named = {}
    for p in LOGICAL:
        key = ".params/['params']/" + "/".join(f"['{k}']" for k in p.split("/"))
        shape = list(np.asarray(leaves(state)["params/params/" + p]).shape)
        named[key] = {"mesh": {"axis_names": ["tensor"], "shape": {"tensor": 8}},
                      "partition_spec": ["tensor"] if len(shape) > 1 else [], "shape": shape}
    with open(os.path.join(tmp, "named_shardings.json"), "w") as f:
        json.dump(named, f)
    out = os.path.join(tmp, "model")
    r = subprocess.run([cli(), "ckpt", "convert", root, out, "--to", "orbax", "--mesh", "tensor=8", "--shardings",
                        os.path.join(tmp, "named_shardings.json"), "--select", "params.params.*", "--rename",
                        "params.params="], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = tessel.checkpoint.restore(out)
    assert sorted(leaves(got)) == sorted(LOGICAL)
    for p in LOGICAL:
        assert_bit_identical(leaves(got)[p].to_numpy(), np.asarray(leaves(state)["params/params/" + p]), p)
    # To one device, every saved axis dropped: the whole TrainState as safetensors.
    flat = os.path.join(tmp, "flat")
    r = subprocess.run([cli(), "ckpt", "convert", root, flat, "--to", "safetensors", "--axis-map", "*="],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    back = tessel.checkpoint.restore(flat)
    for p, v in leaves(state).items():
        assert_bit_identical(leaves(back)[p].to_numpy(), np.asarray(v), p)
    r = subprocess.run([cli(), "ckpt", "restore", root, "--mesh", "tensor=8", "--axis-map", "fsdp"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not old=new" in r.stderr
