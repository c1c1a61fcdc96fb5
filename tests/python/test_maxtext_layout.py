"""MaxText's models and checkpoint layout against the real JAX, flax, optax and Orbax.

`tessel plan --dump-shardings` names each TrainState leaf as MaxText's sharding_dump.py does: by
JAX's key path of the leaf in a flax TrainState whose opt_state optax.adamw built. The test builds
that TrainState here for a random small MaxText config and checks that the dump has exactly its
leaves, shapes and shardings; Orbax then restores `tessel train --layout maxtext`'s checkpoint into
it (as MaxText's load_full_state_path does), and tessel resumes from a TrainState Orbax wrote."""
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax.training import train_state
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding as JaxSharding
from jax.sharding import PartitionSpec as JP

import tessel
from conftest import SHARED, cli

MAXTEXT = os.path.join(SHARED, "testdata", "maxtext")
MESHES = ["fsdp=8", "data=2,fsdp=4", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"]


def random_config(r):
    """A small llama or qwen3 from MaxText's model files, shrunk with --set."""
    model = r.choice(["qwen3-0.6b", "llama3.1-8b", "llama2-7b"])
    kv = r.choice([2, 4])  # tensor=2 shards the kv heads: MaxText needs it to divide them
    sets = {"base_emb_dim": r.choice([16, 32]), "base_num_query_heads": 2 * kv, "base_num_kv_heads": kv,
            "head_dim": r.choice([4, 8]), "base_mlp_dim": r.choice([32, 48]),
            "base_num_decoder_layers": r.randint(1, 3), "vocab_size": 256,
            "scan_layers": r.choice(["true", "false"]), "param_scan_axis": r.choice([0, 1])}
    args = ["--model", os.path.join(MAXTEXT, "models", model + ".yml"), "--base", os.path.join(MAXTEXT, "base.yml")]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return model, args


def run(args):
    r = subprocess.run([cli()] + args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def nested(dump, prefix):
    """The dump's leaves under `prefix` (".params/['params']") as a nested dict of shapes."""
    out = {}
    for key, entry in dump.items():
        if not key.startswith(prefix + "/"):
            continue
        keys = [k[2:-2] for k in key[len(prefix) + 1:].split("/")]
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = jax.ShapeDtypeStruct(tuple(entry["shape"]), jnp.float32)
    return out


def jax_spec(entries):
    return JP(*[tuple(e) if isinstance(e, list) else e for e in entries])


def abstract_train_state(dump_dir):
    """MaxText's TrainState for the dumped model: flax's TrainState over {'params': ...} with
    optax.adamw's state, each leaf placed as named_shardings.json says (8 host devices)."""
    logical = json.load(open(os.path.join(dump_dir, "logical_shardings.json")))
    named = json.load(open(os.path.join(dump_dir, "named_shardings.json")))
    params = {"params": nested(logical, ".params/['params']")}
    tx = optax.adamw(optax.constant_schedule(1e-3))
    state = jax.eval_shape(lambda p: train_state.TrainState.create(apply_fn=None, params=p, tx=tx), params)
    mesh_info = next(iter(named.values()))["mesh"]
    jmesh = JaxMesh(np.array(jax.devices()[:8]).reshape([mesh_info["shape"][a] for a in mesh_info["axis_names"]]),
                    tuple(mesh_info["axis_names"]))
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    keys = ["/".join(str(p) for p in path) for path, _ in flat]
    # sharding_dump.py's keys are exactly these key paths, in this order.
    assert keys == list(named), (keys, list(named))
    assert keys == list(logical)
    placed = []
    for (path, leaf), key in zip(flat, keys):
        assert list(leaf.shape) == named[key]["shape"], key
        placed.append(jax.ShapeDtypeStruct(leaf.shape, jnp.int32 if leaf.shape == () else leaf.dtype,
                                           sharding=JaxSharding(jmesh, jax_spec(named[key]["partition_spec"]))))
    return jax.tree_util.tree_unflatten(treedef, placed)


def orbax_restore(root, step, target):
    with ocp.CheckpointManager(root, item_names=("items",)) as manager:
        args = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
        return manager.restore(step, args=ocp.args.Composite(items=args))["items"]


def planned(rng, tmp):
    """A random config and mesh, and MaxText's TrainState for them (through tessel's dump)."""
    model, args = random_config(rng)
    mesh = rng.choice(MESHES)
    print(model, " ".join(args[4:]), mesh)
    dump = os.path.join(tmp, "dump")
    run(["plan"] + args + ["--mesh", mesh, "--dump-shardings", dump])
    return args, mesh, abstract_train_state(dump)


def test_orbax_restores_tessels_checkpoint_into_maxtexts_train_state(rng, tmp):
    args, mesh, target = planned(rng, tmp)
    ckpt = os.path.join(tmp, "ckpt")
    run(["train"] + args + ["--mesh", mesh, "--steps", "2", "--batch", "8", "--seq", "8", "--checkpoint-dir", ckpt,
                           "--layout", "maxtext"])
    # MaxText's numbering: directory N holds the state after N + 1 updates.
    assert [d for d in sorted(os.listdir(ckpt)) if not d.startswith(".")] == ["1"]
    assert sorted(os.listdir(os.path.join(ckpt, "1"))) == ["_CHECKPOINT_METADATA", "commit_success.txt", "data", "items"]
    restored = orbax_restore(ckpt, 1, target)
    assert int(restored.step) == 2
    assert int(restored.opt_state[0].count) == 2 and int(restored.opt_state[2].count) == 2
    for got, want in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(target)):
        assert got.shape == want.shape and got.dtype == want.dtype and got.sharding == want.sharding
    # Trained, not initial: AdamW's moments moved and every value is finite.
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(restored.params))
    assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree_util.tree_leaves(restored.opt_state[0].mu))


def test_tessel_resumes_from_a_train_state_orbax_wrote(rng, tmp):
    model, args = random_config(rng)
    first, second = rng.choice(MESHES), rng.choice(MESHES)
    print(model, " ".join(args[4:]), first, second)
    dump = os.path.join(tmp, "dump")
    run(["plan"] + args + ["--mesh", first, "--dump-shardings", dump])
    train = ["train"] + args + ["--steps", "4", "--batch", "8", "--seq", "8", "--layout", "maxtext"]
    ours = os.path.join(tmp, "ours")
    run(train + ["--mesh", first, "--stop-at", "2", "--checkpoint-dir", ours])
    # Orbax reads tessel's step 2 and writes it again, as a MaxText run's own checkpoint (no data item).
    state = orbax_restore(ours, 1, abstract_train_state(dump))
    assert int(state.step) == 2
    theirs = os.path.join(tmp, "theirs")
    with ocp.CheckpointManager(theirs, item_names=("items",)) as manager:
        manager.save(1, args=ocp.args.Composite(items=ocp.args.PyTreeSave(state)))
        manager.wait_until_finished()
    losses = []
    for extra in (["--checkpoint-dir", theirs, "--resume"], []):
        metrics = os.path.join(tmp, f"metrics{len(losses)}.jsonl")
        run(train + ["--mesh", second, "--metrics", metrics] + extra)
        losses.append({m["step"]: m["loss"] for m in map(json.loads, open(metrics))})
    assert sorted(losses[0]) == [3, 4]
    for step in (3, 4):
        assert abs(losses[0][step] - losses[1][step]) <= 1e-5 * abs(losses[1][step]), (step, losses)


def test_parameter_only_checkpoint_restores_into_maxtexts_decode_state(rng, tmp):
    """`tessel ckpt convert --to maxtext-params` writes what generate_param_only_checkpoint writes:
    TrainState(step=0, params in bfloat16, opt_state={}) as step 0, item 'items'."""
    args, mesh, full = planned(rng, tmp)
    ckpt = os.path.join(tmp, "ckpt")
    layout = rng.choice(["tessel", "maxtext"])
    run(["train"] + args + ["--mesh", mesh, "--steps", "1", "--batch", "8", "--seq", "8", "--checkpoint-dir", ckpt,
                           "--layout", layout])
    decode = os.path.join(tmp, "decode")
    run(["ckpt", "convert", ckpt, decode, "--to", "maxtext-params"])
    assert os.listdir(decode) == ["0"]
    params = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=x.sharding), full.params)
    target = train_state.TrainState(step=0, apply_fn=None, params=params, tx=None, opt_state={})
    got = orbax_restore(decode, 0, target)
    # The trained parameters, rounded to bfloat16: compare with tessel's own restore of them.
    saved = os.path.join(ckpt, "0", "items") if layout == "maxtext" else os.path.join(ckpt, "1", "default")
    want = tessel.checkpoint.restore(saved)
    flat_got = {"/".join(str(k.key) for k in path): leaf
                for path, leaf in jax.tree_util.tree_flatten_with_path(got.params["params"])[0]}
    prefix = "params/params/" if layout == "maxtext" else ""
    for path, leaf in flat_got.items():
        ref = np.asarray(_at(want, prefix + path))
        assert leaf.dtype == jnp.bfloat16 and leaf.shape == ref.shape, path
        assert np.array_equal(np.asarray(leaf), ref.astype(jnp.bfloat16)), path
    assert len(flat_got) == len([p for p in _paths(want) if p.startswith(prefix) and not p.startswith("opt_state")
                                 and p != "step"])


def _at(tree, path):
    for k in path.split("/"):
        tree = tree[k]
    return tree


def _paths(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, prefix + k + "/")
    else:
        yield prefix[:-1]


def test_python_loads_maxtexts_models_with_their_rules_and_mesh():
    m = tessel.load_maxtext_model(os.path.join(MAXTEXT, "models", "qwen3-0.6b.yml"), os.path.join(MAXTEXT, "base.yml"))
    assert m.family == "maxtext:qwen3"
    state = tessel.eval_shape(m, m.maxtext_mesh(16), flat=True)
    golden = json.load(open(os.path.join(MAXTEXT, "qwen3-0.6b_tpu7x-16_default", "named_shardings.json")))
    params = {k[len(".params/['params']/"):].replace("']/['", "/").strip("[]'"): v for k, v in golden.items()
              if k.startswith(".params/")}
    assert sorted(params) == sorted(state)
    for path, leaf in state.items():
        assert list(leaf.shape) == params[path]["shape"], path
        want = [tuple(e) if isinstance(e, list) else e for e in params[path]["partition_spec"]]
        assert leaf.sharding.spec == tessel.PartitionSpec(*want), path
    assert tessel.plan(m, m.maxtext_mesh(16), optimizer="adamw").param_count == 596_049_920
    unscanned = tessel.load_maxtext_model(os.path.join(MAXTEXT, "models", "qwen3-0.6b.yml"),
                                          os.path.join(MAXTEXT, "base.yml"), set={"scan_layers": False})
    assert "decoder/layers_27/mlp/wo/kernel" in tessel.eval_shape(unscanned, unscanned.maxtext_mesh(8), flat=True)
    try:
        tessel.load_maxtext_model(os.path.join(MAXTEXT, "models", "qwen3-0.6b.yml"), os.path.join(MAXTEXT, "base.yml"),
                                  set=["fused_qkv=true"])
        raise AssertionError("fused_qkv accepted")
    except tessel.ParseError as e:
        assert "fused_qkv" in str(e)
