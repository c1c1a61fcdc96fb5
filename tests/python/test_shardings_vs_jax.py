"""NamedSharding box math: tessel against the real JAX on 8 host CPU devices.

For random meshes over 1..8 devices (random axis names and sizes, 1 included, and any device
order JAX accepts), random specs (None, single axes, tuples of axes; UNCONSTRAINED, which JAX
places like None) and random shapes (0-sized dimensions included), each case checks that JAX's
devices_indices_map, shard_shape, is_fully_replicated and each shard's replica_id (from a real
jax.device_put) equal tessel's, and that where JAX refuses a shape (a dimension its blocks do not
divide) tessel's check_divisible refuses it too. tessel's own uneven layout (ceil-sized blocks,
the zarr chunk grid) has no JAX counterpart and is covered by the C++ tests.
"""
import os

import jax
import numpy as np
import pytest
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxSharding
from jax.sharding import PartitionSpec as JP

import tessel

CASES = int(os.environ.get("TESSEL_SHARDING_CASES", "1500"))
NAMES = ["data", "fsdp", "tensor", "expert", "x", "y", "z"]


def ranges(index, shape):
    """A tuple of slices as (start, stop) pairs, resolved against the shape."""
    return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))


def random_case(r, devices):
    while True:
        axes = r.sample(NAMES, r.randint(1, 4))
        sizes = [r.choice([1, 1, 2, 2, 4, 3]) for _ in axes]
        if int(np.prod(sizes)) <= len(devices):
            break
    chosen = r.sample(devices, int(np.prod(sizes)))  # any subset, in any order
    rank = r.randint(0, 4)
    free = list(axes)
    r.shuffle(free)
    spec = []
    for _ in range(r.randint(0, rank)):
        kind = r.random()
        if kind < 0.3 or not free:
            spec.append(None)
        elif kind < 0.35:
            spec.append(JP.UNCONSTRAINED)
        elif kind < 0.75:
            spec.append(free.pop())
        else:
            n = r.randint(1, min(3, len(free)))
            spec.append(tuple(free.pop() for _ in range(n)))
    return axes, sizes, chosen, rank, spec


def random_shape(r, blocks, divisible):
    shape = []
    for k in blocks:
        if r.random() < 0.08:
            shape.append(0)
        elif divisible:
            shape.append(k * r.randint(1, 3))
        else:
            shape.append(r.randint(1, 9))
    return tuple(shape)


def test_devices_indices_map_equals_jax(rng):
    devices = jax.devices()
    assert len(devices) == 8
    counts = dict.fromkeys(["cases", "indivisible", "permuted", "replicated_dims", "zero_size", "unconstrained"], 0)
    for i in range(CASES):
        axes, sizes, chosen, rank, spec = random_case(rng, devices)
        jmesh = JaxMesh(np.array(chosen, dtype=object).reshape(sizes), axes)
        jsharding = JaxSharding(jmesh, JP(*spec))
        tspec = tessel.PartitionSpec(*[None if e is JP.UNCONSTRAINED else e for e in spec])
        tmesh = tessel.Mesh(list(zip(axes, sizes)), [d.id for d in chosen])
        ours = tessel.NamedSharding(tmesh, tspec)
        blocks = [ours.num_blocks(d) for d in range(rank)]
        shape = random_shape(rng, blocks, divisible=rng.random() < 0.6)
        where = f"case {i}: mesh {dict(zip(axes, sizes))} over {tmesh.device_ids}, spec {spec}, shape {shape}"
        counts["cases"] += 1
        counts["permuted"] += list(tmesh.device_ids) != sorted(tmesh.device_ids)
        counts["unconstrained"] += any(e is JP.UNCONSTRAINED for e in spec)
        try:
            theirs = jsharding.devices_indices_map(shape)
        except ValueError:  # JAX's IndivisibleError
            counts["indivisible"] += 1
            with pytest.raises(tessel.ArgumentError, match="divis"):
                ours.check_divisible(shape)
            continue
        ours.check_divisible(shape)
        mine = ours.devices_indices_map(shape)
        assert sorted(mine) == sorted(d.id for d in theirs), where
        for device, index in theirs.items():
            assert ranges(mine[device.id], shape) == ranges(index, shape), (where, device.id)
        assert ours.shard_shape(shape) == jsharding.shard_shape(shape), where
        assert ours.is_fully_replicated == jsharding.is_fully_replicated, where
        counts["replicated_dims"] += any(b == 1 for b in blocks)
        counts["zero_size"] += 0 in shape
        # Replica ids come from the shards of a real array (device_put fails on UNCONSTRAINED, a
        # jit-only hint whose placement devices_indices_map above showed to be None's).
        placed = JaxSharding(jmesh, JP(*[None if e is JP.UNCONSTRAINED else e for e in spec]))
        array = jax.device_put(np.zeros(shape, np.int8), placed)
        for s in array.addressable_shards:
            assert ours.replica_id(s.device.id, shape) == s.replica_id, (where, s.device.id)
            if 0 not in shape:
                assert ours.replica_id(s.device.id) == s.replica_id, (where, s.device.id)
    print(counts)
    assert counts["cases"] >= 1000 * CASES // 1500
    for key, minimum in [("indivisible", 60), ("permuted", 500), ("zero_size", 100), ("unconstrained", 30)]:
        assert counts[key] >= minimum * CASES // 1500, (key, counts)


def test_conversions_round_trip_through_jax(rng):
    devices = jax.devices()
    for _ in range(200):
        axes, sizes, chosen, rank, spec = random_case(rng, devices)
        spec = [None if e is JP.UNCONSTRAINED else e for e in spec]
        jsharding = JaxSharding(JaxMesh(np.array(chosen, dtype=object).reshape(sizes), axes), JP(*spec))
        ours = tessel.from_jax(jsharding)
        assert tessel.to_jax(ours) == jsharding
        assert ours.mesh.device_ids == tuple(d.id for d in chosen)
        assert tessel.from_jax(tessel.to_jax(ours)) == ours
    with pytest.raises(tessel.ArgumentError, match="UNCONSTRAINED"):
        tessel.from_jax(JP(JP.UNCONSTRAINED))
