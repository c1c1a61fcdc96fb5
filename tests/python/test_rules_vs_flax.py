"""Logical axis rules: tessel against the real Flax Linen (and JAX / MaxText for size-1 removal).

For random meshes (axis names and sizes, 1 included), random ordered rule lists (repeated logical
names, single axes, tuples, None, empty tuples, axes the mesh lacks) and random logical names per
dimension, each case checks:
  1. tessel's logical_to_mesh_axes equals flax.linen.logical_to_mesh_axes (both fail on a logical
     name used twice);
  2. tessel's resolve on the mesh equals flax.linen.logical_to_mesh_sharding (both fail when the
     result names an axis the mesh lacks);
  3. resolve(remove_size_one_axes=True) equals MaxText's remove_size_one_mesh_axis applied to
     Flax's spec (MaxText is not on PyPI: its 12-line function is re-stated below from
     maxtext/utils/sharding.py, where an axis the mesh lacks counts as size 1), and equals JAX's own
     jax._src.named_sharding.remove_size_one_mesh_axis whenever every axis is in the mesh;
  4. resolve(strict=True) fails exactly where Flax leaves a named dimension unassigned (no rule for
     its name applied: none exists, or every one was blocked by an axis another dimension holds),
     read from flax.linen.spmd._logical_to_mesh_axes.
"""
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax.linen import spmd as flax_spmd
from jax._src.named_sharding import remove_size_one_mesh_axis as jax_remove_size_one
from jax.sharding import Mesh as JaxMesh
from jax.sharding import PartitionSpec as JP

import tessel
from conftest import SHARED

CASES = int(os.environ.get("TESSEL_RULES_CASES", "2500"))
MESH_AXES = ["data", "fsdp", "fsdp_transpose", "tensor", "expert", "stage", "sequence", "x"]
ABSENT_AXES = ["absent", "context"]  # named by rules, never in a mesh
LOGICAL = ["embed", "mlp", "heads", "kv", "vocab", "batch", "norm", "layers", "exp", "q_lora", "length"]


def norm_entry(e):
    """JAX-normalized spec entry: () and None are unsharded, a 1-tuple is its axis."""
    if e is None or e == ():
        return None
    if isinstance(e, tuple):
        return e[0] if len(e) == 1 else e
    return e


def norm(spec):
    out = [norm_entry(e) for e in spec]
    while out and out[-1] is None:
        out.pop()
    return tuple(out)


def maxtext_remove_size_one(spec, mesh_shape):
    """MaxText's remove_size_one_mesh_axis (maxtext/utils/sharding.py), re-stated."""
    new = []
    for s in spec:
        if s is None or s is JP.UNCONSTRAINED:
            new.append(s)
        elif isinstance(s, tuple):
            new.append(tuple(i for i in s if mesh_shape.get(i, 1) != 1))
        else:
            new.append(None if mesh_shape.get(s, 1) == 1 else s)
    return JP(*new)


def random_case(r):
    while True:
        names = r.sample(MESH_AXES, r.randint(1, 4))
        sizes = [r.choice([1, 1, 2, 2, 3, 4]) for _ in names]
        if int(np.prod(sizes)) <= 8:
            break
    pool = names + ABSENT_AXES[: r.randint(0, 2)]
    vocabulary = LOGICAL[: r.randint(3, len(LOGICAL))]
    rules = []
    for _ in range(r.randint(0, 12)):
        kind = r.random()
        if kind < 0.12:
            axes = None
        elif kind < 0.45:
            axes = r.choice(pool)
        elif kind < 0.5:
            axes = ()
        else:
            axes = tuple(r.sample(pool, r.randint(1, min(3, len(pool)))))
        rules.append((r.choice(vocabulary), axes))
    rank = r.randint(0, 4)
    if r.random() < 0.05 and rank >= 2:
        dims = [r.choice(vocabulary) for _ in range(rank)]  # maybe a name used twice
    else:
        dims = r.sample(vocabulary + [None] * rank, rank)
    return names, sizes, rules, tuple(dims)


def flax_unassigned(dims, rules):
    """True when Flax leaves some named dimension without an applied rule."""
    raw = flax_spmd._logical_to_mesh_axes(dims, rules)
    return any(isinstance(n, str) and x is flax_spmd._unassigned_axis for n, x in zip(dims, raw))


def test_rules_equal_flax_linen(rng):
    devices = jax.devices()
    assert len(devices) >= 8, "the suite runs with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    counts = dict.fromkeys(["cases", "sharded", "tuple", "duplicate_names", "missing_axis", "strict_errors",
                            "size_one_removed", "jax_removal_checked"], 0)
    for i in range(CASES):
        axis_names, sizes, rules, dims = random_case(rng)
        where = f"case {i}: mesh {dict(zip(axis_names, sizes))}, rules {rules}, logical {dims}"
        counts["cases"] += 1
        trules = tessel.LogicalRules(rules)
        tmesh = tessel.Mesh(list(zip(axis_names, sizes)))
        jmesh = JaxMesh(np.array(devices[: int(np.prod(sizes))]).reshape(sizes), axis_names)

        # 1. Without a mesh.
        try:
            flax_spec = nn.logical_to_mesh_axes(dims, rules)
        except ValueError:
            counts["duplicate_names"] += 1
            with pytest.raises(tessel.ShardingError, match="appear only once"):
                trules.logical_to_mesh_axes(dims)
            with pytest.raises(tessel.ShardingError):
                trules.resolve(dims, tmesh)
            continue
        assert norm(trules.logical_to_mesh_axes(dims)) == norm(flax_spec), where
        counts["sharded"] += any(norm(flax_spec))
        counts["tuple"] += any(isinstance(e, tuple) for e in norm(flax_spec))

        # 2. On the mesh: a NamedSharding, or an error for an axis the mesh lacks.
        try:
            flax_sharding = nn.logical_to_mesh_sharding(JP(*dims), jmesh, rules)
        except ValueError:
            flax_sharding = None
        if flax_sharding is None:
            counts["missing_axis"] += 1
            with pytest.raises(tessel.ShardingError, match="mesh"):
                trules.resolve(dims, tmesh)
        else:
            ours = tessel.NamedSharding(tmesh, trules.resolve(dims, tmesh))
            assert tessel.to_jax(ours, devices) == flax_sharding, where
            assert norm(ours.spec) == norm(flax_sharding.spec), where

        # 3. MaxText's size-1 removal (an absent axis counts as size 1: never an error).
        mesh_shape = dict(zip(axis_names, sizes))
        expected = norm(maxtext_remove_size_one(flax_spec, mesh_shape))
        got = trules.resolve(dims, tmesh, remove_size_one_axes=True)
        assert norm(got) == expected, where
        counts["size_one_removed"] += expected != norm(flax_spec)
        if flax_sharding is not None:
            assert norm(jax_remove_size_one(flax_spec, jmesh)) == expected, where
            counts["jax_removal_checked"] += 1

        # 4. Strict mode fails exactly where Flax leaves a named dimension unassigned.
        if flax_unassigned(dims, rules) or flax_sharding is None:
            counts["strict_errors"] += flax_sharding is not None
            with pytest.raises(tessel.ShardingError):
                trules.resolve(dims, tmesh, strict=True)
        else:
            assert trules.resolve(dims, tmesh, strict=True) == ours.spec, where
        assert "dim" in trules.explain(dims, tmesh, remove_size_one_axes=True) or not dims
    print(counts)
    # The random cases must have covered every branch, many times.
    assert counts["cases"] >= 2000
    for key, minimum in [("sharded", 500), ("tuple", 100), ("duplicate_names", 10), ("missing_axis", 50),
                         ("strict_errors", 100), ("size_one_removed", 100), ("jax_removal_checked", 1000)]:
        assert counts[key] >= minimum * CASES // 2500, (key, counts)


def test_rules_naming_an_axis_twice_are_refused_up_front():
    # Flax takes ('x', 'x') and fails later, when JAX builds the NamedSharding; tessel refuses the
    # rule list itself, naming the rule.
    with pytest.raises(tessel.ArgumentError, match="twice"):
        tessel.LogicalRules([("embed", ("x", "x"))])
    jmesh = JaxMesh(np.array(jax.devices()[:2]), ("x",))
    with pytest.raises(Exception):
        nn.logical_to_mesh_sharding(JP("embed"), jmesh, [("embed", ("x", "x"))])


def test_maxtext_base_yml_equals_flax_on_the_golden_model():
    """MaxText's own rules (base.yml) through Flax and through tessel, for every parameter of the
    qwen3-0.6b golden dump, on meshes of 8 devices over MaxText's 12 axes."""
    import json

    import yaml

    base = os.path.join(SHARED, "testdata", "maxtext")
    with open(os.path.join(base, "base.yml")) as f:
        config = yaml.safe_load(f)
    rules = [(name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in config["logical_axis_rules"]]
    with open(os.path.join(base, "qwen3-0.6b_tpu7x-16_default", "logical_shardings.json")) as f:
        logical = json.load(f)
    trules = tessel.load_rules(os.path.join(base, "base.yml"))
    axes = config["mesh_axes"]
    checked = 0
    for layout in [{"fsdp": 8}, {"data": 2, "fsdp": 4}, {"fsdp": 2, "tensor": 4}, {"data": 2, "fsdp": 2, "expert": 2}]:
        sizes = [layout.get(a, 1) for a in axes]
        jmesh = JaxMesh(np.array(jax.devices()[:8]).reshape(sizes), axes)
        tmesh = tessel.Mesh(list(zip(axes, sizes)))
        for path, entry in logical.items():
            dims = tuple(entry["partition_spec"])
            flax_spec = nn.logical_to_mesh_axes(dims, rules)
            expected = norm(maxtext_remove_size_one(flax_spec, dict(zip(axes, sizes))))
            assert norm(trules.resolve(dims, tmesh, remove_size_one_axes=True)) == expected, (layout, path)
            flax_sharding = nn.logical_to_mesh_sharding(JP(*dims), jmesh, rules)
            assert tessel.to_jax(tessel.NamedSharding(tmesh, trules.resolve(dims, tmesh))) == flax_sharding, path
            checked += 1
    assert checked >= 4 * 20
