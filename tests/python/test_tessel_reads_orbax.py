"""tessel reads what Orbax writes: random sharded pytrees saved by the real orbax.checkpoint, restored
by tessel onto meshes of more and fewer devices, bit-identical per device block.

Writers: Orbax's CheckpointManager with several items per step (`items` as MaxText saves,
`model_params`, a JSON item), max_to_keep, custom metadata, in its default layout (OCDBT + zarr v2),
with use_ocdbt=False, and with zarr3; and the v1 API (OCDBT + zarr3, item `state`). Leaves are
jax.Arrays sharded on random 8-device meshes: f32, bf16, f16, f64, int8, i32, i64, u8, u32, bool,
and scalars (Orbax refuses 0-sized arrays). tessel's `ckpt info`, `verify`, `restore` and `export` accept each; the
Python restore gives each device exactly its block of the original; bad requests are clear errors.
"""
import os
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding as JaxSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint.experimental import v1 as ocp_v1

import tessel
from conftest import cli
from trees import assert_bit_identical, leaves, map_tree, random_array, random_jax_mesh, random_tree, sharding


def run(*args, ok=True):
    r = subprocess.run([cli(), *args], capture_output=True, text=True)
    if ok:
        assert r.returncode == 0, f"tessel {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def random_jax_tree(rng, devices):
    # Orbax refuses to save 0-sized arrays ("Cannot save arrays with zero size").
    desc = {"params": random_tree(rng, empty=False), "opt_state": [random_tree(rng, empty=False)], "step": ((), "int32")}
    mesh = random_jax_mesh(rng, devices)
    values = map_tree(lambda p, d: random_array(rng, *d), desc)
    arrays = map_tree(lambda p, v: jax.device_put(v, sharding(rng, mesh, v.shape)), values)
    return values, arrays, mesh


def handlers(layout):
    if layout == "zarr3":
        return ocp.PyTreeCheckpointHandler(use_zarr3=True)
    if layout == "files":
        return ocp.StandardCheckpointHandler(use_ocdbt=False)
    return ocp.StandardCheckpointHandler()


def save_with_manager(root, layout, steps, trees):
    """Orbax's CheckpointManager: items `items` and `model_params` and a JSON item `meta` per step."""
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    item_handlers = {"items": handlers(layout), "model_params": handlers(layout), "meta": ocp.JsonCheckpointHandler()}
    save = ocp.args.PyTreeSave if layout == "zarr3" else ocp.args.StandardSave
    with ocp.CheckpointManager(root, options=options, item_handlers=item_handlers) as manager:
        for step in steps:
            items, params = trees[step]
            manager.save(step, args=ocp.args.Composite(items=save(items), model_params=save(params),
                                                       meta=ocp.args.JsonSave({"step": step, "layout": layout})),
                         custom_metadata={"run": "cross-check", "step": step})
        manager.wait_until_finished()
        return list(manager.all_steps())


def target_mesh(rng, saved_axes, devices):
    """A tessel mesh over `devices` devices with the saved axis names, so saved specs fit it."""
    sizes = [1] * len(saved_axes)
    n = devices
    while n > 1:  # spread the devices over random axes
        i = rng.randrange(len(sizes))
        sizes[i] *= 2
        n //= 2
    return tessel.Mesh(list(zip(saved_axes, sizes)))


def check_restore(rng, root, item, values, saved_mesh, devices):
    """tessel restores every leaf onto `devices` devices: by its saved spec on a mesh with the saved
    axis names, and by random target shardings; each device holds exactly its block."""
    mesh = target_mesh(rng, saved_mesh.axis_names, devices)
    got = tessel.checkpoint.restore(root, item=item, mesh=mesh)
    for path, want in leaves(values).items():
        array = leaves(got)[path]
        assert array.sharding.mesh == mesh
        assert len(array.shards) == devices
        for shard in array.shards:
            assert_bit_identical(shard.data, want[shard.index], f"{item}/{path} device {shard.device}")
    other = tessel.Mesh({"x": devices})
    shardings = {p: tessel.NamedSharding(other, tessel.P(*(["x"] if v.ndim and rng.random() < 0.7 else [])))
                 for p, v in leaves(values).items()}
    again = tessel.checkpoint.restore(root, item=item, shardings=shardings)
    for path, want in leaves(values).items():
        for shard in leaves(again)[path].shards:
            assert_bit_identical(shard.data, want[shard.index], f"{item}/{path} on {other} device {shard.device}")
    return len(leaves(values))


@pytest.mark.parametrize("layout", ["default", "files", "zarr3"])
def test_tessel_restores_orbax_manager_checkpoints(rng, tmp, x64, layout):
    devices = jax.devices()
    root = os.path.join(tmp, "ckpt")
    trees = {step: (random_jax_tree(rng, devices), random_jax_tree(rng, devices)) for step in (10, 20, 30)}
    steps = save_with_manager(root, layout, sorted(trees), {s: (a[1], b[1]) for s, (a, b) in trees.items()})
    assert steps == [20, 30]
    assert tessel.checkpoint.steps(root) == steps

    # The step's items, with Orbax's handlers; several PyTree items need --item.
    names = {i["name"]: i for i in tessel.checkpoint.items(os.path.join(root, "30"))}
    assert set(names) == {"items", "model_params", "meta"}
    assert names["items"]["holds_arrays"] and not names["meta"]["holds_arrays"]
    assert "Handler" in names["items"]["handler"]
    r = run("ckpt", "info", root, ok=False)
    assert r.returncode == 1 and "several PyTree items" in r.stderr and "'items'" in r.stderr, r.stderr
    r = run("ckpt", "info", root, "--item", "meta", ok=False)
    assert r.returncode == 1 and "holds no arrays" in r.stderr, r.stderr
    info = run("ckpt", "info", root, "--item", "items").stdout
    assert "model_params (arrays" in info and "meta (json" in info, info
    assert ("zarr3" in info) == (layout == "zarr3"), info
    for item in ("items", "model_params"):
        run("ckpt", "verify", root, "--item", item)
        run("ckpt", "verify", root, "--step", "20", "--item", item)

    checked = 0
    for step in steps:
        for item, (values, _, mesh) in zip(("items", "model_params"), trees[step]):
            for devices_now in (2, 16):  # fewer and more devices than Orbax saved with
                path = os.path.join(root, str(step))
                checked += check_restore(rng, path, item, values, mesh, devices_now)
    assert checked >= 8

    # export writes one leaf as .npy (bfloat16 as float32, exactly).
    values = trees[30][0][0]
    for path, want in list(leaves(values).items())[:4]:
        out = os.path.join(tmp, "leaf.npy")
        run("ckpt", "export", root, "--item", "items", "--path", path, "--out", out)
        exported = np.load(out)
        expected = want.astype(np.float32) if want.dtype.name == "bfloat16" else want
        assert_bit_identical(exported, expected, path)
    # The CLI's restore onto a mesh of 4 devices with the saved axis names.
    axes = trees[30][1][2].axis_names
    mesh_text = ",".join(f"{a}={s}" for a, s in zip(axes, target_mesh(rng, axes, 4).shape.values()))
    assert "restored" in run("ckpt", "restore", root, "--item", "model_params", "--mesh", mesh_text).stdout


def test_tessel_restores_orbax_v1_pytrees(rng, tmp, x64):
    devices = jax.devices()
    values, arrays, mesh = random_jax_tree(rng, devices)
    path = os.path.join(tmp, "7")
    ocp_v1.save_pytree(path, arrays)
    assert [i["name"] for i in tessel.checkpoint.items(path)] == ["state"]
    assert "zarr3" in tessel.checkpoint.info(path)["storage"]
    run("ckpt", "verify", path)
    assert check_restore(rng, path, None, values, mesh, 4) >= 3


def test_restored_jax_arrays_equal_orbax_restore(rng, tmp, x64):
    """as_jax=True gives jax.Arrays with the target sharding, equal to Orbax's own restore."""
    devices = jax.devices()
    values, arrays, _ = random_jax_tree(rng, devices)
    path = os.path.join(tmp, "item")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, arrays)
    mesh = random_jax_mesh(rng, devices)
    target = map_tree(lambda p, v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding(rng, mesh, v.shape)), values)
    ours = tessel.checkpoint.restore(path, shardings=target, as_jax=True)
    with ocp.StandardCheckpointer() as checkpointer:
        theirs = checkpointer.restore(path, target)
    for p, want in leaves(values).items():
        got = leaves(ours)[p]
        assert isinstance(got, jax.Array) and got.sharding == leaves(target)[p].sharding, p
        assert_bit_identical(np.asarray(got), want, p)
        assert_bit_identical(np.asarray(got), np.asarray(leaves(theirs)[p]), p)


def test_numpy_arrays_and_scalars_orbax_saved(rng, tmp, x64):
    """Orbax's np.ndarray and scalar leaves (no sharding saved): on device 0, or onto a mesh."""
    values = {"lr": 3.5, "count": 7, "table": random_array(rng, (6, 4), "float32"), "mask": random_array(rng, (5,), "bool")}
    path = os.path.join(tmp, "item")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, values)
    meta = tessel.checkpoint.info(path)
    assert {a["path"] for a in meta["arrays"]} == set(values)
    for restored in (tessel.checkpoint.restore(path), tessel.checkpoint.restore(path, mesh=tessel.Mesh({"x": 4}))):
        for name, want in values.items():
            assert_bit_identical(restored[name].to_numpy(), np.asarray(want), name)


def test_bad_requests_are_clear_errors(rng, tmp):
    devices = jax.devices()
    values, arrays, mesh = random_jax_tree(rng, devices)
    # The random specs may all be replicated: one leaf is surely sharded, for the foreign-axes check.
    probe = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    arrays["sharded_probe"] = jax.device_put(probe, JaxSharding(mesh, P(mesh.axis_names[0])))
    root = os.path.join(tmp, "ckpt")
    save_with_manager(root, "default", [1], {1: (arrays, arrays)})
    with pytest.raises(tessel.ArgumentError, match="several PyTree items"):
        tessel.checkpoint.restore(root, mesh=tessel.Mesh({"x": 2}))
    with pytest.raises(tessel.ArgumentError, match="no item 'nope'.*items"):
        tessel.checkpoint.restore(root, item="nope", mesh=tessel.Mesh({"x": 2}))
    with pytest.raises(tessel.ArgumentError, match="no step 5"):
        tessel.checkpoint.restore(root, step=5, item="items")
    with pytest.raises(tessel.ArgumentError, match="matches none"):
        tessel.checkpoint.restore(root, item="items", select="nothing.*")
    # A saved spec naming axes the target mesh lacks: the leaf and the ways out are named.
    with pytest.raises(tessel.ArgumentError, match="(?s)sharded_probe .*lacks .*axis_map="):
        tessel.checkpoint.restore(root, item="items", mesh=tessel.Mesh({"other": 2}), select="sharded_probe")
    # Data files cut short: a clear error, no value comes back.
    item_dir = os.path.join(root, "1", "items")
    for d, _, files in os.walk(item_dir):
        for f in files:
            if os.path.basename(d) == "d":
                victim = os.path.join(d, f)
                with open(victim, "r+b") as fh:
                    fh.truncate(os.path.getsize(victim) // 2)
    r = run("ckpt", "verify", root, "--item", "items", ok=False)
    assert r.returncode == 1 and "tessel: error:" in r.stderr and "truncated" in r.stderr, (r.stdout, r.stderr)
    with pytest.raises(tessel.Error, match="truncated"):
        tessel.checkpoint.restore(root, item="items")
