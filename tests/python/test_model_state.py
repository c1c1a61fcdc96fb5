"""tessel.eval_shape and tessel.plan against the real libraries and the CLI.

- Random transformer and DotReluDot configs on random meshes under MaxText's base.yml rules and the
  examples' rules: every variable's spec equals Flax Linen's `logical_to_mesh_axes` of its logical
  axes (then MaxText's size-1 removal where asked), and its jax.ShapeDtypeStruct carries the very
  NamedSharding Flax's `logical_to_mesh_sharding` builds.
- The plan's bytes per device equal the sum of each variable's block on that device, computed
  from JAX's own `devices_indices_map`; its JSON equals `tessel plan --json` for the same inputs.
- eval_shape(as_jax=True) is Orbax's restore target as it is: a tessel checkpoint of random
  values restores through Orbax onto it, bit-identical, each array on its planned sharding.
"""
import json
import os
import subprocess

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import yaml
from jax.sharding import Mesh as JaxMesh
from jax.sharding import PartitionSpec as JP

import tessel
from conftest import SHARED, cli
from test_rules_vs_flax import maxtext_remove_size_one, norm
from trees import assert_bit_identical, random_array

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BASE_YML = os.path.join(SHARED, "testdata", "maxtext", "base.yml")
EXAMPLE_RULES = os.path.join(ROOT, "examples", "models", "rules.yml")


def flax_rules(path):
    with open(path) as f:
        config = yaml.safe_load(f)
    rules = [(name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in config["logical_axis_rules"]]
    return rules, config["mesh_axes"]


def random_model(r):
    if r.random() < 0.2:
        return {"model": "dot_relu_dot", "depth": r.choice([8, 16, 24]), "hidden": r.choice([0, 8, 32]),
                "dtype": r.choice(["f32", "bf16"])}
    heads = r.choice([1, 2, 4, 8])
    cfg = {"model": "transformer", "vocab": r.choice([16, 64, 96]), "embed": heads * r.choice([2, 4, 8]),
           "layers": r.randint(1, 3), "heads": heads, "kv_heads": r.choice([h for h in (1, 2, 4, 8) if heads % h == 0]),
           "mlp": r.choice([16, 32, 48]), "scan_layers": r.random() < 0.7, "gated_mlp": r.random() < 0.5,
           "tied_embedding": r.random() < 0.3, "qk_norm": r.random() < 0.3, "dtype": r.choice(["f32", "bf16"])}
    if cfg["scan_layers"]:
        cfg["scan_axis"] = r.randint(0, 1)
    return cfg


def random_mesh(r, axes, devices=8):
    """Sizes over `axes` (most 1) whose product divides `devices`, in a random device order."""
    sizes = {a: 1 for a in axes}
    left = devices
    for _ in range(r.randint(1, 3)):
        a = r.choice(axes)
        f = r.choice([f for f in (1, 2, 4, 8) if left % f == 0])
        sizes[a] *= f
        left //= f
    n = devices // left
    order = list(range(n))
    r.shuffle(order)
    return [(a, sizes[a]) for a in axes], order


def index_map(m, shape):
    """{device id: ((start, stop), ...)}: JAX writes a whole dimension as slice(None)."""
    return {d.id: tuple(sl.indices(n)[:2] for sl, n in zip(idx, shape)) for d, idx in m.items()}


def test_eval_shape_equals_flax_and_jax(rng):
    checked = {"variables": 0, "models": 0, "size_one": 0, "uneven": 0}
    for rules_file in (BASE_YML, EXAMPLE_RULES):
        rules, axes = flax_rules(rules_file)
        trules = tessel.load_rules(rules_file)
        for _ in range(12):
            cfg = random_model(rng)
            layout, order = random_mesh(rng, axes)
            mesh = tessel.Mesh(layout, order)
            jmesh = JaxMesh(np.array([jax.devices()[d] for d in order]).reshape([s for _, s in layout]),
                            [a for a, _ in layout])
            size_one = rng.random() < 0.5
            where = f"{cfg} on {layout} {order} ({os.path.basename(rules_file)}, remove_size_one={size_one})"
            flat = tessel.eval_shape(cfg, mesh, trules, remove_size_one_axes=size_one, flat=True)
            as_jax = tessel.eval_shape(cfg, mesh, trules, remove_size_one_axes=size_one, flat=True, as_jax=True)
            assert flat.keys() == as_jax.keys()
            for path, leaf in flat.items():
                logical = leaf.logical_axes
                assert isinstance(logical, tuple) and len(logical) == len(leaf.shape), (path, where)
                flax_spec = nn.logical_to_mesh_axes(logical, rules)
                if size_one:
                    flax_spec = maxtext_remove_size_one(flax_spec, dict(layout))
                assert norm(leaf.sharding.spec) == norm(flax_spec), (path, where)
                sds = as_jax[path]
                assert sds.shape == leaf.shape and sds.dtype == leaf.dtype, (path, where)
                if not size_one:
                    assert sds.sharding == nn.logical_to_mesh_sharding(JP(*logical), jmesh, rules), (path, where)
                ours = index_map({jax.devices()[d]: idx for d, idx in leaf.sharding.devices_indices_map(leaf.shape).items()},
                                 leaf.shape)
                try:
                    theirs = index_map(sds.sharding.devices_indices_map(sds.shape), sds.shape)
                except ValueError as e:  # JAX refuses blocks that do not divide a dimension; tessel has them
                    assert "Indivisible" in type(e).__name__, e
                    extents = [{blocks[d][1] - blocks[d][0] for blocks in ours.values()} for d in range(len(leaf.shape))]
                    assert any(len(e) > 1 for e in extents), (path, "JAX refused an even sharding")
                    checked["uneven"] += 1
                    continue
                assert theirs == ours, path
                checked["variables"] += 1
            # The nested form holds the same leaves.
            tree = tessel.eval_shape(cfg, mesh, trules, remove_size_one_axes=size_one)
            for path, leaf in flat.items():
                node = tree
                for k in path.split("/"):
                    node = node[k]
                assert node == leaf, path
            checked["models"] += 1
            checked["size_one"] += size_one
    print(checked)
    assert checked["models"] == 24 and checked["variables"] >= 100


def block_bytes_on(jax_sharding, shape, itemsize):
    """Bytes of each device's block, from JAX's own index map."""
    out = {}
    for device, index in jax_sharding.devices_indices_map(shape).items():
        n = 1
        for s, dim in zip(index, shape):
            start, stop, _ = s.indices(dim)
            n *= stop - start
        out[device.id] = n * itemsize
    return out


def test_plan_bytes_from_jax_and_equal_to_the_cli(rng, tmp):
    rules, axes = flax_rules(BASE_YML)
    trules = tessel.load_rules(BASE_YML)
    for trial in range(6):
        cfg = random_model(rng)
        layout, order = random_mesh(rng, axes)
        mesh = tessel.Mesh(layout, order)
        optimizer = rng.choice(["none", "sgd", "adamw"])
        # Indivisible axes dropped (MaxText's way), so that JAX accepts every sharding.
        p = tessel.plan(cfg, mesh, trules, optimizer=optimizer, remove_size_one_axes=True, drop_indivisible=True)
        abstract = tessel.eval_shape(cfg, mesh, trules, remove_size_one_axes=True, drop_indivisible=True, flat=True,
                                     as_jax=True)
        per_device = {d: 0 for d in order}
        for path, sds in abstract.items():
            for d, n in block_bytes_on(sds.sharding, sds.shape, sds.dtype.itemsize).items():
                per_device[d] += n
        assert p.params_by_device == [per_device[d] for d in order], (cfg, layout)
        moments = {"none": 0, "sgd": 1, "adamw": 2}[optimizer]
        grads = 1 if optimizer != "none" else 0
        assert p.total_per_device["max"] == max(per_device.values()) * (1 + grads + moments)
        assert p.param_count == sum(int(np.prod(s.shape)) for s in abstract.values())
        assert [q.path for q in p.params] == list(abstract)
        assert all(tessel.from_jax(abstract[q.path].sharding).spec == q.spec for q in p.params)
        # MaxText's check: a parameter not sharded on every weight axis counts against the tolerance.
        weight = [a for a, s in layout if s > 1 and a not in ("data", "diloco")]
        unsharded = sum(q.bytes for q in p.params if set(weight) - set(_axes(q.spec)))
        assert p.unsharded_bytes == unsharded
        assert p.sufficiently_sharded == (not weight or unsharded <= 0.02 * p.param_bytes)
        # The same plan as the CLI's.
        model_file = os.path.join(tmp, f"model{trial}.yml")
        with open(model_file, "w") as f:
            json.dump(cfg, f)
        mesh_text = ",".join(f"{a}={s}" for a, s in layout if s > 1) or f"{axes[0]}=1"
        if order == sorted(order):
            r = subprocess.run([cli(), "plan", "--model", model_file, "--mesh", mesh_text, "--rules", BASE_YML,
                                "--optimizer", optimizer, "--remove-size-one-axes", "--drop-indivisible", "--json"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            ours = json.loads(p.to_json())
            theirs = json.loads(r.stdout)
            assert theirs["per_device"] == ours["per_device"] and theirs["params"] == ours["params"], (cfg, layout)
        assert "memory plan on" in str(p)


def _axes(spec):
    out = []
    for e in spec:
        if isinstance(e, tuple):
            out.extend(e)
        elif e is not None:
            out.append(e)
    return out


def test_eval_shape_is_orbax_restore_target(rng, tmp):
    """A checkpoint of the model's state, restored by Orbax straight onto tessel's abstract state
    of another mesh: every array on its planned sharding, bit-identical."""
    trules = tessel.load_rules(EXAMPLE_RULES)
    # Sizes the meshes divide (JAX refuses uneven blocks); the rest random.
    heads = rng.choice([2, 4])
    cfg = {"model": "transformer", "vocab": rng.choice([32, 64]), "embed": 8 * rng.choice([1, 2, 4]),
           "layers": rng.randint(1, 3), "heads": heads, "kv_heads": 2, "head_dim": rng.choice([4, 8]),
           "mlp": rng.choice([16, 32]), "scan_layers": rng.random() < 0.5, "gated_mlp": rng.random() < 0.5,
           "dtype": rng.choice(["f32", "bf16"])}
    save_mesh = tessel.Mesh({"data": 2, "fsdp": 2, "tensor": 2})
    saved = tessel.eval_shape(cfg, save_mesh, trules)
    values = jax.tree.map(lambda a: random_array(rng, a.shape, a.dtype.name),
                          saved, is_leaf=lambda x: isinstance(x, tessel.AbstractArray))
    shardings = jax.tree.map(lambda a: a.sharding, saved, is_leaf=lambda x: isinstance(x, tessel.AbstractArray))
    item = os.path.join(tmp, "state")
    tessel.checkpoint.save(item, values, shardings=shardings, rules=trules)
    target_mesh = tessel.Mesh({"data": 1, "fsdp": 8, "tensor": 1})
    target = tessel.eval_shape(cfg, target_mesh, trules, as_jax=True)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(item), target)
    flat_target = tessel.eval_shape(cfg, target_mesh, trules, flat=True)
    for path, leaf in flat_target.items():
        node_r, node_v = restored, values
        for k in path.split("/"):
            node_r, node_v = node_r[k], node_v[k]
        assert tessel.from_jax(node_r.sharding) == leaf.sharding, path
        assert_bit_identical(np.asarray(node_r), node_v, path)
    # tessel's own restore takes the AbstractArrays as they are.
    ours = tessel.checkpoint.restore(item, shardings=flat_target)
    for path, leaf in flat_target.items():
        node = ours
        for k in path.split("/"):
            node = node[k]
        assert node.sharding == leaf.sharding, path


def test_bad_models_and_arguments_are_clear_errors(tmp):
    mesh = tessel.Mesh({"fsdp": 2})
    rules = tessel.LogicalRules([("embed", "fsdp")])
    with pytest.raises(tessel.ParseError, match="heads_count"):
        tessel.load_model({"model": "transformer", "heads_count": 4})
    with pytest.raises(ValueError, match="kv_heads"):
        tessel.eval_shape({"model": "transformer", "heads": 4, "kv_heads": 3, "embed": 16}, mesh, rules)
    with pytest.raises(tessel.IoError):
        tessel.load_model(os.path.join(tmp, "missing.yml"))
    with pytest.raises(ValueError, match="optimizer"):
        tessel.plan({"model": "dot_relu_dot", "depth": 8}, mesh, rules, optimizer="lion")
    with pytest.raises(ValueError, match="tolerance"):
        tessel.plan({"model": "dot_relu_dot", "depth": 8}, mesh, rules, tolerance=2)
    with pytest.raises(ValueError, match="top"):
        tessel.plan({"model": "dot_relu_dot", "depth": 8}, mesh, rules, top=-1)
    with pytest.raises(tessel.ShardingError):
        tessel.eval_shape({"model": "dot_relu_dot", "depth": 8}, mesh, rules, strict=True)  # "mlp" has no rule
    model = tessel.load_model(os.path.join(ROOT, "examples", "models", "transformer.yml"))
    assert model.family == "transformer" and tessel.load_model(model) is model
