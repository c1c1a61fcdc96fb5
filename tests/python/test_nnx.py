"""The Flax NNX GSPMD workflow with tessel in it (examples/python/nnx_gspmd.py), against the real
Flax NNX, optax, Orbax and JAX on 8 host CPU devices:

  - the spec Flax NNX gives every parameter and every nnx.Optimizer AdamW moment equals tessel's
    plan for the same model, rules file and mesh; where NNX's resolution differs from Linen's
    (rules repeating a name, as MaxText's base.yml does), tessel follows Linen;
  - tessel's eval_shape equals nnx.get_abstract_model's shapes, dtypes and shardings, and is
    Orbax's restore target as it is;
  - flax#5110: checkpoints written by Orbax from an NNX model on fsdp=8, and by `tessel train`,
    restore onto data=2,fsdp=4 through Orbax with tessel's abstract state and through tessel's own
    restore with each device holding its shard only (measured: live buffers per device, sampled
    throughout, and the restoring process's peak RSS);
  - a few nnx.jit steps from tessel's initial state give `tessel train`'s losses on its batches.
"""
import json
import os
import resource
import subprocess
import sys

import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as JP

import tessel
from conftest import SHARED, cli

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
import nnx_gspmd as ex  # noqa: E402

RULES = tessel.load_rules(ex.RULES)
BASE = os.path.join(SHARED, "testdata", "maxtext", "base.yml")
TINY = {"model": "transformer", "vocab": 256, "embed": 64, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 128,
        "scan_layers": True, "gated_mlp": False, "tied_embedding": False, "dtype": "f32"}


def random_mesh(r):
    sizes = r.choice([(1, 8, 1), (2, 4, 1), (2, 2, 2), (1, 4, 2), (4, 1, 2), (8, 1, 1), (1, 2, 4)])
    return tessel.Mesh(dict(zip(["data", "fsdp", "tensor"], sizes)))


def random_model(r, mesh):
    """DotReluDot or a small transformer whose sharded dimensions the mesh divides (JAX's rule:
    with kv heads fewer than the tensor axis, XLA would replicate what the spec shards)."""
    if r.random() < 0.4:
        return {"model": "dot_relu_dot", "depth": r.choice([16, 32]), "hidden": r.choice([32, 64])}
    t = mesh.shape["tensor"]
    heads = t * r.choice([1, 2])
    kv = r.choice([k for k in range(t, heads + 1, t) if heads % k == 0])
    return dict(TINY, embed=8 * heads * r.choice([1, 2]), heads=heads, kv_heads=kv, layers=r.randint(1, 3),
                mlp=r.choice([64, 96]))


def test_nnx_specs_of_parameters_and_adamw_state_equal_tessels_plan(rng):
    for _ in range(4):
        mesh = random_mesh(rng)
        config = random_model(rng, mesh)
        print(config, mesh)
        model = ex.create_sharded(config, ex.jax_mesh(mesh), RULES)
        ours = ex.tessel_specs(config, mesh, RULES)
        assert ex.nnx_specs(model, RULES) == ours
        # Every parameter lives where its spec says.
        jmesh = ex.jax_mesh(mesh)
        for path, value in ex.flat(nnx.state(model)).items():
            assert value.sharding.is_equivalent_to(jax.sharding.NamedSharding(jmesh, ours[path]), value.ndim), path
        with jax.set_mesh(ex.jax_mesh(mesh)), nnx.logical_axis_rules(RULES.rules):
            optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
            opt = ex.flat(nnx.get_partition_spec(nnx.state(optimizer)))
        moments = {p: s for p, s in opt.items() if "/mu/" in p or "/nu/" in p}
        assert len(moments) == 2 * len(ours)
        for path, spec in moments.items():
            param = path.split("/mu/" if "/mu/" in path else "/nu/", 1)[1]
            assert spec == ours[param], path  # tessel's plan: AdamW's moments on their parameter's sharding
        assert all(s == JP() for p, s in opt.items() if p not in moments)  # the counters: replicated


def test_where_nnx_resolves_rules_unlike_linen_tessel_follows_linen():
    """Flax NNX 0.12 maps each logical name through a dict of the rules: the last rule of a name
    wins, with no fallback when its mesh axes are taken. Linen (and MaxText, and tessel) try a
    name's rules in order and skip one whose axes another dimension already uses."""
    maxtext = tessel.load_rules(BASE)
    mesh = tessel.Mesh({a: {"fsdp": 4, "tensor": 2}.get(a, 1) for a in maxtext.mesh_axes})
    state = tessel.eval_shape(TINY, mesh, maxtext, flat=True)
    differing = []
    for path, leaf in state.items():
        logical = leaf.logical_axes
        linen_spec = linen.logical_to_mesh_axes(logical, maxtext.rules)
        assert tuple(leaf.sharding.spec) == tuple(linen_spec), path
        nnx_spec = JP(*nnx.spmd.core_spmd.from_sharding_rules(logical, maxtext.rules))
        if tuple(nnx_spec) != tuple(linen_spec):
            differing.append((path, logical, tuple(nnx_spec), tuple(linen_spec)))
    for case in differing:
        print("NNX %s %s -> %s; Linen and tessel -> %s" % case)
    assert differing, "base.yml repeats names: NNX's last-rule-wins must differ somewhere"
    # One such case: 'embed' has several rules in base.yml; NNX takes the last one whole.
    embed = [c for c in differing if "embed" in c[1]]
    assert embed


def test_tessels_abstract_state_equals_nnx_get_abstract_model_and_is_orbaxs_target(rng, tmp):
    mesh = random_mesh(rng)
    config = random_model(rng, mesh)
    print(config, mesh)
    jmesh = ex.jax_mesh(mesh)
    with nnx.logical_axis_rules(RULES.rules):
        _, abstract = nnx.get_abstract_model(lambda: ex.build(config, nnx.Rngs(0)), jmesh)
    ours = tessel.eval_shape(config, mesh, RULES, as_jax=True, flat=True)
    theirs = ex.flat(abstract)
    assert sorted(ours) == sorted(theirs)
    for path, leaf in ours.items():
        assert (leaf.shape, leaf.dtype, leaf.sharding) == (theirs[path].shape, theirs[path].dtype,
                                                          theirs[path].sharding), path
    # As Orbax's target, as it is: save a sharded model, restore through tessel's abstract state.
    model = ex.create_sharded(config, jmesh, RULES)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(tmp, "m"), nnx.state(model))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.join(tmp, "m"),
                                        ex.orbax_target(ex.abstract_model(config, jmesh, RULES),
                                                        tessel.eval_shape(config, mesh, RULES, as_jax=True)))
    saved = ex.flat(nnx.state(model))
    for path, value in ex.flat(restored).items():
        assert np.array_equal(np.asarray(value), np.asarray(saved[path])), path
        assert value.sharding.is_equivalent_to(ours[path].sharding, value.ndim), path


RESTORE = r'''
import json, os, resource, sys, threading, time
sys.path.insert(0, sys.argv[1])
import nnx_gspmd as ex
import jax, numpy as np, tessel, orbax.checkpoint as ocp
from flax import nnx
kind, path, config, way, sharded_shapes = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
rules = tessel.load_rules(ex.RULES)
mesh = tessel.Mesh({"data": 2, "fsdp": 4, "tensor": 1})
jmesh = ex.jax_mesh(mesh)
target = tessel.eval_shape(config, mesh, rules, as_jax=True)
sharded = {tuple(s) for s in sharded_shapes}
peak = {"per_device": 0, "whole": [], "rss": 0}
done = False
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
def watch():  # live buffers per device, sampled throughout the restore
    while not done:
        per, seen = {}, set()
        for a in jax.live_arrays():
            if len(a.sharding.device_set) == 1 and tuple(a.shape) in sharded:
                peak["whole"].append(list(a.shape))
            for s in a.addressable_shards:
                # A buffer once: a global array and the per-device arrays it was made from share
                # their buffers (make_array_from_single_device_arrays copies nothing).
                key = (s.device.id, s.data.unsafe_buffer_pointer())
                if key not in seen:
                    seen.add(key)
                    per[s.device.id] = per.get(s.device.id, 0) + s.data.nbytes
        peak["per_device"] = max([peak["per_device"]] + list(per.values()))
        peak["rss"] = max(peak["rss"], rss())
        time.sleep(0.002)
rss0 = rss()
t = threading.Thread(target=watch); t.start()
if kind == "nnx" and way == "orbax":
    with ocp.StandardCheckpointer() as c:
        state = c.restore(path, ex.orbax_target(ex.abstract_model(config, jmesh, rules), target))
    leaves = list(ex.flat(state).values())
elif kind == "nnx":  # tessel's own restore, the NNX checkpoint's names (".../value") and tessel's shardings
    flat = tessel.eval_shape(config, mesh, rules, as_jax=True, flat=True)
    state = tessel.checkpoint.restore(path, shardings={p + "/value": v for p, v in flat.items()}, as_jax=True)
    leaves = jax.tree.leaves(state)
elif way == "orbax":  # tessel train's state: params and AdamW's moments
    full = dict(target, opt_state={"mu": target, "nu": target})
    with ocp.StandardCheckpointer() as c:
        state = c.restore(path, full)
    leaves = jax.tree.leaves(state)
else:
    state = tessel.checkpoint.restore(path, mesh=mesh, as_jax=True)
    leaves = jax.tree.leaves(state)
jax.block_until_ready(leaves)
done = True; t.join()
peak["rss"] = max(peak["rss"], rss())
per = {}
for a in leaves:
    for s in a.addressable_shards:
        per[s.device.id] = per.get(s.device.id, 0) + s.data.nbytes
print(json.dumps({"held": per, "peak_per_device": peak["per_device"], "whole": peak["whole"],
                  "rss_growth": peak["rss"] - rss0, "rss_peak": peak["rss"],
                  "total": int(sum(a.nbytes for a in leaves))}))
'''


def restore_in_subprocess(kind, path, config, way, sharded_shapes):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", RESTORE, os.path.join(ROOT, "examples", "python"), kind, path,
                        json.dumps(config), way, json.dumps(sharded_shapes)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_flax_5110_restores_onto_another_mesh_with_each_device_holding_its_shard(tmp):
    config = dict(TINY, embed=256, layers=4, heads=8, kv_heads=4, mlp=1024)  # examples/models/transformer.yml
    save_mesh = tessel.Mesh({"data": 1, "fsdp": 8, "tensor": 1})
    model = ex.create_sharded(config, ex.jax_mesh(save_mesh), RULES)
    nnx_ckpt = os.path.join(tmp, "nnx")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(nnx_ckpt, nnx.state(model))
    yml = os.path.join(tmp, "model.yml")
    with open(yml, "w") as f:
        json.dump(config, f)  # JSON is YAML
    subprocess.run([cli(), "train", "--model", yml, "--rules", ex.RULES, "--mesh", "fsdp=8", "--steps", "0",
                    "--checkpoint-dir", os.path.join(tmp, "tessel")], check=True, capture_output=True)
    tessel_ckpt = os.path.join(tmp, "tessel", "0", "default")

    flat = tessel.eval_shape(config, tessel.Mesh({"data": 2, "fsdp": 4, "tensor": 1}), RULES, flat=True)
    sharded_shapes = [list(a.shape) for a in flat.values() if any(e is not None for e in a.sharding.spec)]
    params_bytes = sum(int(np.prod(a.shape)) * 4 for a in flat.values())
    replicated = sum(int(np.prod(a.shape)) * 4 for a in flat.values() if all(e is None for e in a.sharding.spec))
    for kind, path, state_factor in [("nnx", nnx_ckpt, 1), ("tessel", tessel_ckpt, 3)]:
        for way in ["orbax", "tessel"]:
            m = restore_in_subprocess(kind, path, config, way, sharded_shapes)
            total = m["total"]
            assert total == state_factor * params_bytes
            # fsdp=4: each device holds a quarter of every sharded array, and the small replicated norms.
            shard_bound = state_factor * ((params_bytes - replicated) / 4 + replicated)
            assert max(m["held"].values()) <= shard_bound + 1, (kind, way, m)
            assert m["whole"] == [], (kind, way, m["whole"][:4])  # no device ever held a whole sharded array
            # Live buffers per device (each buffer once) stay within its shard: tessel's as_jax hands
            # its own buffers to JAX (no second copy: 1.00x seen). Orbax's transient copies are
            # its own (1.00x seen with buffers counted once, 1.8 to 2.6x when a global array and
            # the per-device arrays it was made from were both counted): its bound is looser, as
            # this checks Orbax, not tessel.
            assert m["peak_per_device"] <= (3.5 if way == "orbax" else 1.1) * shard_bound, (kind, way, m)
            device_bytes = sum(m["held"].values())
            assert m["rss_growth"] <= 1.6 * device_bytes + (16 << 20), (kind, way, m)
            print(f"flax#5110, {kind} checkpoint through {way}: {total / 2**20:.2f} MiB restored onto data=2,fsdp=4; "
                  f"per device {max(m['held'].values()) / 2**20:.2f} MiB held, peak live "
                  f"{m['peak_per_device'] / 2**20:.2f} MiB ({m['peak_per_device'] / shard_bound:.2f}x); process RSS "
                  f"grew {m['rss_growth'] / 2**20:.1f} MiB ({m['rss_growth'] / total:.2f}x the restored bytes), "
                  f"peak {m['rss_peak'] / 2**20:.0f} MiB")


def test_a_target_without_shardings_does_not_reach_the_new_mesh(tmp):
    """For contrast, flax#5110's abstract state: nnx.eval_shape without shardings (Flax's eager
    sharding off) as Orbax's target. Orbax 0.12 then falls back to the layout saved in the
    checkpoint (older versions put everything on one device): never the mesh the user asked for."""
    config = TINY
    saved = tessel.Mesh({"data": 1, "fsdp": 8, "tensor": 1})
    model = ex.create_sharded(config, ex.jax_mesh(saved), RULES)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.join(tmp, "m"), nnx.state(model))
    with nnx.use_eager_sharding(False):
        abstract = nnx.state(nnx.eval_shape(lambda: ex.build(config, nnx.Rngs(0))))
    target = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), abstract)
    assert all(getattr(t, "sharding", None) is None for t in jax.tree.leaves(target))  # the shardings are lost
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.join(tmp, "m"), target)
    wanted = tessel.eval_shape(config, tessel.Mesh({"data": 2, "fsdp": 4, "tensor": 1}), RULES, as_jax=True, flat=True)
    moved = [p for p, v in ex.flat(restored).items() if v.sharding.is_equivalent_to(wanted[p].sharding, v.ndim)]
    sharded = [p for p, v in wanted.items() if any(e is not None for e in v.sharding.spec)]
    assert not [p for p in moved if p in sharded]  # no sharded array reached data=2,fsdp=4


DATA = "/usr/share/common-licenses/GPL-3"
SEED, BATCH, SEQ, STEPS, WARMUP, LR = 5, 8, 32, 5, 2, 3e-3


def test_nnx_jit_steps_from_tessels_state_give_tessel_trains_losses(tmp):
    probe = os.environ.get("TESSEL_TRAIN_PROBE")
    assert probe and os.path.exists(probe), "TESSEL_TRAIN_PROBE names the train_probe helper (ctest sets it)"
    yml = os.path.join(tmp, "model.yml")
    with open(yml, "w") as f:
        json.dump(TINY, f)
    mesh = tessel.Mesh({"data": 2, "fsdp": 2, "tensor": 2})
    common = ["--model", yml, "--rules", ex.RULES, "--data", DATA, "--seed", str(SEED)]
    subprocess.run([cli(), "train"] + common + ["--steps", "0", "--checkpoint-dir", os.path.join(tmp, "init")],
                   check=True, capture_output=True)
    metrics = os.path.join(tmp, "metrics.jsonl")
    subprocess.run([cli(), "train"] + common + ["--steps", str(STEPS), "--warmup", str(WARMUP), "--lr", str(LR),
                                                "--batch", str(BATCH), "--seq", str(SEQ), "--mesh", "data=2,fsdp=2,tensor=2",
                                                "--metrics", metrics], check=True, capture_output=True)
    curve = [json.loads(line)["loss"] for line in open(metrics)]
    subprocess.run([probe, "batches", DATA, str(SEED), str(STEPS), str(BATCH), str(SEQ), os.path.join(tmp, "batches")],
                   check=True, capture_output=True)
    batches = tessel.checkpoint.restore(os.path.join(tmp, "batches"))
    inputs, targets = batches["inputs"].to_numpy(), batches["targets"].to_numpy()

    # The NNX model on the same mesh, its parameters restored by tessel from tessel's checkpoint.
    jmesh = ex.jax_mesh(mesh)
    abstract = ex.abstract_model(TINY, jmesh, RULES)
    params = tessel.checkpoint.restore(os.path.join(tmp, "init", "0", "default"), mesh=mesh, as_jax=True)
    state = nnx.state(abstract)
    nnx.replace_by_pure_dict(state, {k: v for k, v in params.items() if k != "opt_state"})
    model = nnx.merge(nnx.graphdef(abstract), state)
    schedule = optax.warmup_cosine_decay_schedule(0.0, LR, WARMUP, STEPS, end_value=0.1 * LR)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
    batch = jax.sharding.NamedSharding(jmesh, JP(("data", "fsdp")))
    with jax.set_mesh(jmesh), nnx.logical_axis_rules(RULES.rules):
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, x, y):
            loss, grads = nnx.value_and_grad(lambda m: m.loss(x, y))(model)
            optimizer.update(model, grads)
            return loss

        for t in range(STEPS):
            loss = float(step(model, optimizer, jax.device_put(inputs[t], batch), jax.device_put(targets[t], batch)))
            assert abs(loss - curve[t]) <= 1e-5 * abs(curve[t]), (t + 1, loss, curve[t])
    print(f"{STEPS} nnx.jit steps: {curve[0]:.6f} -> {curve[-1]:.6f}, equal to tessel train's within 1e-5")


@pytest.mark.parametrize("model", ["dot_relu_dot", "transformer"])
def test_the_example_runs_as_a_user_runs_it(model):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "nnx_gspmd.py"), "--model", model,
                        "--steps", "2"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NNX's specs equal tessel's plan" in r.stdout and "per device at most" in r.stdout
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("3. step")]
    assert len(losses) == 2 and all(np.isfinite(losses)), r.stdout[-2000:]


def test_the_docs_code_runs_in_order(tmp_path, monkeypatch):
    """docs/nnx.md's code blocks, run one after another as a reader would."""
    import re
    monkeypatch.chdir(tmp_path)
    docs = os.path.join(ROOT, "docs", "nnx.md")
    blocks = re.findall(r"```python\n(.*?)```", open(docs).read(), re.S)
    assert len(blocks) >= 5
    scope = {}
    for code in blocks:
        exec(compile(code.replace('"examples/', '"' + os.path.join(ROOT, "examples") + "/"), docs, "exec"), scope)
    check_docs_scope(scope)
    scope.clear()  # JAX's caches keep the jitted functions, and through them this scope, until exit


def check_docs_scope(scope):
    held = scope["ex"].per_device_bytes(nnx.state(scope["loaded"]))
    total = sum(a.nbytes for a in jax.tree.leaves(nnx.state(scope["model"])))
    assert len(held) == 8 and max(held.values()) < 0.3 * total  # fsdp=4: a quarter, and the norms
    assert np.isfinite(float(scope["loss"]))
    kernel = scope["kernel"]
    assert [s.data.shape for s in kernel.addressable_shards] == [(8, 2, 128)] * 8


class Encoder(nnx.Module):
    """A user's own NNX module, not one of tessel's: an embedding, vmap-stacked layers (their
    axis named "layers" by nnx.vmap's metadata) of nnx.LinearGeneral attention projections with
    3-D kernels and an MLP, norms without names, and its RNG state."""

    def __init__(self, vocab, embed, heads, head_dim, mlp, depth, rngs):
        init = nnx.initializers.lecun_normal()
        self.embed = nnx.Embed(vocab, embed, rngs=rngs,
                               embedding_init=nnx.with_partitioning(nnx.initializers.normal(), ("vocab", "embed")))

        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def layers(rngs):
            return EncoderLayer(embed, heads, head_dim, mlp, init, rngs)

        self.layers = layers(rngs)
        self.norm = nnx.RMSNorm(embed, rngs=rngs)
        self.rngs = rngs


class EncoderLayer(nnx.Module):
    def __init__(self, embed, heads, head_dim, mlp, init, rngs):
        self.query = nnx.LinearGeneral(embed, (heads, head_dim), use_bias=False, rngs=rngs,
                                       kernel_init=nnx.with_partitioning(init, ("embed", "heads", "kv")))
        self.out = nnx.LinearGeneral((heads, head_dim), embed, axis=(-2, -1), use_bias=False, rngs=rngs,
                                     kernel_init=nnx.with_partitioning(init, ("heads", "kv", "embed")))
        self.wi = nnx.Linear(embed, mlp, rngs=rngs, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                             bias_init=nnx.with_partitioning(nnx.initializers.zeros, ("mlp",)))
        self.wo = nnx.Linear(mlp, embed, use_bias=False, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))
        self.norm = nnx.LayerNorm(embed, rngs=rngs)


def test_any_nnx_module_gets_its_abstract_state_and_orbax_restores_into_it(rng, tmp):
    """tessel.nnx_abstract_state of a user's own module (Encoder): NNX's own state structure, each
    variable's sharding its logical names through the rules as Linen's logical_to_mesh_axes gives
    them (unnamed ones replicated), from the module, its state or a function alike; Orbax restores
    a checkpoint of the module saved on one mesh into it on another, each leaf placed so, values
    equal, and nnx.merge gives the module back."""
    mesh = random_mesh(rng)
    t, f = mesh.shape["tensor"], mesh.shape["fsdp"]
    sizes = dict(vocab=8 * t * rng.choice([1, 2]), embed=8 * f * rng.choice([1, 2]), heads=t * rng.choice([1, 2]),
                 head_dim=rng.choice([4, 8]), mlp=8 * t * rng.choice([1, 2]), depth=rng.randint(1, 3))
    print(mesh, sizes)
    build = lambda: Encoder(**sizes, rngs=nnx.Rngs(rng.randrange(2**31)))  # noqa: E731
    target = tessel.nnx_abstract_state(build, mesh, RULES)
    with nnx.use_eager_sharding(False):
        model = build()
    assert jax.tree.structure(target) == jax.tree.structure(nnx.state(model))
    jmesh = tessel.to_jax(mesh)
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    names = nnx.get_partition_spec(nnx.state(model))
    flat_target = jax.tree_util.tree_flatten_with_path(target, is_leaf=is_variable)[0]
    flat_names = jax.tree_util.tree_leaves(names, is_leaf=is_variable)
    sharded = 0
    for (path, v), n in zip(flat_target, flat_names):
        axes = tuple(n.get_value()) if isinstance(n, nnx.Variable) else ()
        want = linen.logical_to_mesh_axes(axes, RULES.rules) if axes else JP()
        assert v.get_value().sharding == jax.sharding.NamedSharding(jmesh, want), (path, axes, v.get_value().sharding)
        sharded += any(want)
    assert sharded >= 5
    # From the module and from its state: the same.
    for given in (model, nnx.state(model)):
        assert jax.tree.map(lambda v: v.sharding, tessel.nnx_abstract_state(given, mesh, RULES)) == \
            jax.tree.map(lambda v: v.sharding, target)
    # Orbax: saved from one device, restored into the target on the mesh.
    path = os.path.join(tmp, "encoder")
    params = nnx.state(model, nnx.Param)
    with ocp.StandardCheckpointer() as c:
        c.save(path, params)
    with ocp.StandardCheckpointer() as c:
        restored = c.restore(path, nnx.state(nnx.merge(nnx.graphdef(model), target), nnx.Param))
    for (p, got), want, placed in zip(jax.tree_util.tree_flatten_with_path(restored)[0], jax.tree.leaves(params),
                                     jax.tree.leaves(nnx.state(nnx.merge(nnx.graphdef(model), target), nnx.Param))):
        assert got.sharding == placed.sharding, p
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(p))
    loaded = nnx.merge(nnx.graphdef(model), restored, nnx.state(model, nnx.Not(nnx.Param)))
    assert isinstance(loaded, Encoder)
    with pytest.raises(tessel.ArgumentError, match="rules must be tessel LogicalRules"):
        tessel.nnx_abstract_state(model, mesh, RULES.rules)
    with pytest.raises(tessel.ArgumentError, match="model must be an NNX module"):
        tessel.nnx_abstract_state(3, mesh, RULES)
