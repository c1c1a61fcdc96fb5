"""Numerics: the model `tessel train` trains (examples/models/transformer.yml), written in JAX here
with the same parameter tree, against tessel on the same weights and batches.

The weights move by checkpoint only: `tessel train --steps 0` saves the initial state and Orbax
restores it into JAX, on one device and on a data=2,fsdp=2,tensor=2 mesh whose shardings Flax's
logical_to_mesh_sharding derives from the logical axes and rules tessel saved. The batches are
tessel's own (tests/python/train_probe.cpp writes them out). Checked:
  - the loss of one step to 1e-5 relative and every gradient to 1e-4 relative (per parameter:
    |g_tessel - g_jax| / |g_jax|), tessel and JAX each on 1 device and on data=2,fsdp=2,tensor=2;
  - 20 AdamW steps (optax: clip_by_global_norm + adamw with warmup and cosine decay, MaxText's
    b1, b2, eps and weight decay) give `tessel train`'s loss curve within 1e-4 relative, both meshes.
"""
import json
import os
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import yaml
from jax.sharding import Mesh as JaxMesh
from jax.sharding import PartitionSpec as JP
from jax.sharding import SingleDeviceSharding

import tessel
from conftest import cli
from jax_lm import loss_fn

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "examples", "models", "transformer.yml")
DATA = "/usr/share/common-licenses/GPL-3"  # tessel train's default text (Debian's base-files)
SEED, BATCH, SEQ, STEPS, WARMUP, LR = 3, 8, 64, 20, 5, 3e-3
MESHES = {"one device": "data=1", "data=2,fsdp=2,tensor=2": "data=2,fsdp=2,tensor=2"}


def probe():
    exe = os.environ.get("TESSEL_TRAIN_PROBE")
    assert exe and os.path.exists(exe), "TESSEL_TRAIN_PROBE names the train_probe helper (ctest sets it)"
    return exe


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


# ---------------------------------------------------------------------------------------------


def nest(flat):
    tree = {}
    for path, value in flat.items():
        node = tree
        keys = path.split("/")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return tree


def jax_target(item, mesh_name):
    """Orbax's restore target for the state tessel saved: shapes and dtypes from the item, shardings
    on one device or from Flax's resolution of each leaf's saved logical axes under the saved rules."""
    info = tessel.checkpoint.info(item)
    devices = jax.devices()
    if mesh_name == "one device":
        place = lambda logical: SingleDeviceSharding(devices[0])  # noqa: E731
    else:
        rules = info["rules"]
        mesh = JaxMesh(np.array(devices).reshape(2, 2, 2), tuple(rules.mesh_axes))
        place = lambda logical: nn.logical_to_mesh_sharding(JP(*logical), mesh, rules.rules)  # noqa: E731
    flat = {a["path"]: jax.ShapeDtypeStruct(a["shape"], np.dtype(a["dtype"]), sharding=place(a["logical_axes"]))
            for a in info["arrays"]}
    return nest(flat)


def restore_into_jax(item, mesh_name):
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.abspath(item), jax_target(item, mesh_name))
    return state


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        path = f"{prefix}/{k}" if prefix else k
        out.update(flat(v, path) if isinstance(v, dict) else {path: v})
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The initial state (`tessel train --steps 0`) and tessel's batches for STEPS steps."""
    d = tmp_path_factory.mktemp("numerics")
    run(cli(), "train", "--model", MODEL, "--data", DATA, "--seed", SEED, "--steps", 0, "--checkpoint-dir", d / "init")
    run(probe(), "batches", DATA, SEED, STEPS, BATCH, SEQ, d / "batches")
    batches = tessel.checkpoint.restore(d / "batches")
    return d, batches["inputs"].to_numpy(), batches["targets"].to_numpy()


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_loss_and_gradients_equal_jax(run_dir, mesh_name):
    d, inputs, targets = run_dir
    cfg = yaml.safe_load(open(MODEL))
    state = restore_into_jax(os.path.join(d, "init", "0", "default"), mesh_name)
    params = {k: v for k, v in state.items() if k != "opt_state"}
    value_and_grad = jax.jit(jax.value_and_grad(lambda p, x, y: loss_fn(cfg, p, x, y)))
    loss, grads = value_and_grad(params, jnp.asarray(inputs[0]), jnp.asarray(targets[0]))

    for tessel_mesh in MESHES.values():
        out = d / f"grads-{mesh_name.replace(' ', '_').replace(',', '_')}-{tessel_mesh.replace(',', '_')}"
        run(probe(), "grads", MODEL, tessel_mesh, d / "init", DATA, SEED, 0, BATCH, SEQ, out)
        theirs = json.load(open(str(out) + ".json"))
        assert abs(theirs["loss"] - float(loss)) <= 1e-5 * abs(float(loss)), (tessel_mesh, theirs["loss"], float(loss))
        ours = tessel.checkpoint.restore(out)
        worst = 0.0
        for path, g in flat(grads).items():
            want = np.asarray(g, np.float64)
            got = flat(ours)[path].to_numpy().astype(np.float64)
            rel = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
            worst = max(worst, rel)
            assert rel <= 1e-4, (mesh_name, tessel_mesh, path, rel)
        assert len(flat(grads)) == len(flat(ours)) == 11
        print(f"JAX on {mesh_name}, tessel on {tessel_mesh}: loss {float(loss):.7f} vs {theirs['loss']:.7f}, "
              f"worst gradient relative error {worst:.2e}")


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_twenty_adamw_steps_follow_the_same_curve(run_dir, mesh_name):
    d, inputs, targets = run_dir
    cfg = yaml.safe_load(open(MODEL))
    tessel_mesh = MESHES[mesh_name]
    metrics = d / f"metrics-{tessel_mesh.replace(',', '_')}.jsonl"
    if not metrics.exists():
        run(cli(), "train", "--model", MODEL, "--data", DATA, "--seed", SEED, "--steps", STEPS, "--warmup", WARMUP,
            "--lr", LR, "--batch", BATCH, "--seq", SEQ, "--mesh", tessel_mesh, "--metrics", metrics)
    curve = [json.loads(line)["loss"] for line in open(metrics)]
    assert len(curve) == STEPS

    state = restore_into_jax(os.path.join(d, "init", "0", "default"), mesh_name)
    params = {k: v for k, v in state.items() if k != "opt_state"}
    schedule = optax.warmup_cosine_decay_schedule(0.0, LR, WARMUP, STEPS, end_value=0.1 * LR)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, x, y))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    worst = 0.0
    for t in range(STEPS):
        params, opt_state, loss = step(params, opt_state, jnp.asarray(inputs[t]), jnp.asarray(targets[t]))
        rel = abs(curve[t] - float(loss)) / abs(float(loss))
        worst = max(worst, rel)
        assert rel <= 1e-4, (mesh_name, t + 1, curve[t], float(loss))
    assert curve[-1] < curve[0] - 0.5, curve  # it learned something
    print(f"{mesh_name}: {STEPS} AdamW steps, loss {curve[0]:.4f} -> {curve[-1]:.4f}, worst relative difference {worst:.2e}")
