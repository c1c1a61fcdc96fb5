"""Orbax reads what tessel writes: the real orbax.checkpoint restores tessel checkpoints onto a JAX
mesh of 8 CPU devices with another sharding, bit-identical to what tessel saved; TensorStore opens
every array directly (its zarr/zarr3 driver over its OCDBT or file key-value store).

- Random trees (nested dicts and lists; f32, bf16, f16, f64, i8, i32, i64, u8, u32, bool; scalars
  and 0-sized arrays), saved by tessel.checkpoint.save from NumPy arrays with random shardings and
  from jax.Arrays, in every layout tessel writes: OCDBT and plain files, zarr v2 and zarr3, no
  compression and zstd. Orbax's StandardCheckpointer restores each onto a random other mesh.
- `tessel train` checkpoints, one written by one process and one by 2 MPI ranks: Orbax's
  CheckpointManager lists their steps, restores the state and the JSON data item, and reads the
  custom metadata tessel keeps.
"""
import json
import os
import shutil
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

import tessel
from conftest import cli
from trees import (assert_bit_identical, leaves, map_tree, np_dtype, random_array, random_jax_mesh,
                   random_tree, sharding)

LAYOUTS = [(ocdbt, zarr3, compression) for ocdbt in (True, False) for zarr3 in (False, True)
           for compression in ("none", "zstd")]


def tensorstore_read(item_dir, name, use_ocdbt, use_zarr3):
    """One array of an item, read by TensorStore itself (Orbax's storage layer)."""
    item_dir = os.path.abspath(item_dir)
    if use_ocdbt:
        kvstore = {"driver": "ocdbt", "base": f"file://{item_dir}", "path": f"{name}/"}
    else:
        kvstore = {"driver": "file", "path": os.path.join(item_dir, name) + "/"}
    return ts.open({"driver": "zarr3" if use_zarr3 else "zarr", "kvstore": kvstore}, open=True).result().read().result()


def orbax_restore_onto(rng, item_dir, desc, devices):
    """Orbax's restore of `item_dir` with a random target sharding per leaf; returns (restored, target)."""
    mesh = random_jax_mesh(rng, devices)
    target = map_tree(lambda p, d: jax.ShapeDtypeStruct(d[0], np_dtype(d[1]), sharding=sharding(rng, mesh, d[0])), desc)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(item_dir), target)
    return restored, target


@pytest.mark.parametrize("use_ocdbt,use_zarr3,compression", LAYOUTS)
def test_orbax_restores_random_trees_tessel_saved(rng, tmp, x64, use_ocdbt, use_zarr3, compression):
    devices = jax.devices()
    seen = {"leaves": 0, "jax": 0, "scalar": 0, "empty": 0, "dtypes": set()}
    for trial in range(3):
        desc = {"params": random_tree(rng), "extra": [random_tree(rng), ((), "float32")], "step": ((), "int64")}
        values = map_tree(lambda p, d: random_array(rng, *d), desc)
        save_mesh = random_jax_mesh(rng, devices)
        shardings = map_tree(lambda p, d: sharding(rng, save_mesh, d[0]), desc)
        # Half the leaves go in as jax.Arrays (their own shardings), half as NumPy arrays.
        tree = map_tree(lambda p, v: jax.device_put(v, leaves(shardings)[p]) if rng.random() < 0.5 else v, values)
        numpy_shardings = {p: s for p, s in leaves(shardings).items() if isinstance(leaves(tree)[p], np.ndarray)}
        item = os.path.join(tmp, f"item{trial}")
        tessel.checkpoint.save(item, tree, shardings=numpy_shardings, compression=compression,
                               use_ocdbt=use_ocdbt, use_zarr3=use_zarr3, max_chunk_bytes=rng.choice([256, 4096, 1 << 20]))
        meta = json.load(open(os.path.join(item, "_METADATA")))
        assert meta["use_ocdbt"] == use_ocdbt and meta["use_zarr3"] == use_zarr3
        restored, target = orbax_restore_onto(rng, item, desc, devices)
        assert isinstance(restored["extra"], list), "Orbax rebuilds the list from tessel's key types"
        for path, want in leaves(values).items():
            got = leaves(restored)[path]
            assert got.sharding == leaves(target)[path].sharding, path
            where = f"{path} ({compression}, ocdbt={use_ocdbt}, zarr3={use_zarr3})"
            assert_bit_identical(np.asarray(got), want, where)
            direct = tensorstore_read(item, path.replace("/", "."), use_ocdbt, use_zarr3)
            assert_bit_identical(direct, want, f"TensorStore: {where}")
            seen["leaves"] += 1
            seen["jax"] += not isinstance(leaves(tree)[path], np.ndarray)
            seen["scalar"] += want.shape == ()
            seen["empty"] += want.size == 0
            seen["dtypes"].add(want.dtype.name)
    print(seen)
    assert seen["leaves"] >= 9 and seen["jax"] >= 1 and seen["scalar"] >= 3 and len(seen["dtypes"]) >= 3


def run(*args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def orbax_reads_train_checkpoint(rng, root, devices):
    """Orbax's CheckpointManager on a `tessel train` directory: steps, state, data item, metadata."""
    steps = tessel.checkpoint.steps(root)
    # A step holds the state as Orbax's `default` item beside the JSON item `data`: Orbax reads both
    # when told the item names (without them it is in single-item mode, restore(step) is the state).
    with ocp.CheckpointManager(os.path.abspath(root), item_names=("default", "data")) as manager:
        assert list(manager.all_steps()) == steps
        assert manager.latest_step() == steps[-1]
        step = steps[-1]
        restored = manager.restore(step, args=ocp.args.Composite(default=ocp.args.StandardRestore(),
                                                                 data=ocp.args.JsonRestore()))
        assert restored.data["step"] == step, restored.data  # the next batch to read
        ours = tessel.checkpoint.restore(root, step=step)
        for path, got in leaves(dict(restored.default)).items():
            want = leaves(ours)[path]
            assert tessel.from_jax(got.sharding).spec == want.sharding.spec, path
            assert_bit_identical(np.asarray(got), want.to_numpy(), path)
        # Onto another mesh: the same values.
        mesh = random_jax_mesh(rng, devices)
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding(rng, mesh, a.shape)),
                              dict(restored.default))
        again = manager.restore(step, args=ocp.args.Composite(default=ocp.args.StandardRestore(target)))
    with ocp.CheckpointManager(os.path.abspath(root)) as single:
        assert leaves(single.restore(step)).keys() == leaves(ours).keys()
        for path, got in leaves(dict(again.default)).items():
            assert got.sharding == leaves(target)[path].sharding, path
            assert_bit_identical(np.asarray(got), leaves(ours)[path].to_numpy(), path)
    # tessel's custom metadata (logical axes, mesh, rules, checksums) is the tree's custom metadata,
    # where Orbax keeps a PyTree's; the step's own is Orbax's (timestamps, handlers).
    with ocp.StandardCheckpointer() as checkpointer:
        meta = checkpointer.metadata(os.path.abspath(os.path.join(root, str(step), "default")))
    custom = meta.item_metadata.custom_metadata
    assert custom["tessel"]["mesh"]["axis_names"], custom
    assert custom["tessel"]["rules"] is not None, "tessel train records its rules"
    return len(leaves(ours))


def test_orbax_reads_tessel_train_checkpoints(rng, tmp):
    devices = jax.devices()
    root = os.path.join(tmp, "one")
    run(cli(), "train", "--steps", "3", "--batch", "8", "--seq", "32", "--checkpoint-dir", root,
        "--checkpoint-every", "2", "--keep", "2")
    assert tessel.checkpoint.steps(root) == [2, 3]
    assert orbax_reads_train_checkpoint(rng, root, devices) > 20


def test_orbax_reads_a_checkpoint_written_by_two_mpi_ranks(rng, tmp):
    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI's mpirun (scripts/install-deps.sh installs openmpi-bin)"
    root = os.path.join(tmp, "two")
    run(mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", cli(), "train", "--devices-per-process", "4",
        "--steps", "2", "--batch", "8", "--seq", "32", "--checkpoint-dir", root,
        env={**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    item = os.path.join(root, "2", "default")
    assert os.path.isdir(os.path.join(item, "ocdbt.process_1")), "each rank wrote its own database"
    assert orbax_reads_train_checkpoint(rng, root, jax.devices()) > 20
