"""The real MaxText 0.2.5 (from PyPI, in .venv-maxtext: scripts/venv.sh maxtext) as a peer, on the
CPU: a tiny model of each family tessel builds trains a few steps with checkpoints, and tessel

- restores every array of MaxText's last checkpoint onto other meshes (one of uneven blocks), bit
  for bit what Orbax restores;
- describes the same TrainState with `tessel plan --dump-shardings`: every key (nnx_aux's RNG
  state and DeepSeek V3's routing bias included), shape and sharding (axes of size 1 aside, which
  shard nothing);
- resumes the run with `tessel train --resume` (MaxText's directory N holds step N + 1, and its
  nnx_aux state, which tessel does not train, is left out of the restore);
- starts a run with `tessel train --init-from` MaxText's parameter-only checkpoint (three families);

and MaxText

- loads tessel's parameter-only checkpoint (`ckpt convert --to maxtext-params`) with
  from_pretrained, as its inference and RL tools do: its logits and loss on its synthetic batch
  equal `tessel.forward`'s on the same parameters (1e-5; MaxText's bfloat16 rounding of a tied
  embedding table in the logits applied to tessel's, see as_maxtext_logits);
- continues the run from tessel's last step: its first loss equals tessel's on that batch (1e-5).

One ctest per family (tests/CMakeLists.txt), so they run in parallel; within one, MaxText's tools
run in one worker process (maxtext_session.py), which imports MaxText once.
"""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import tessel
from conftest import cli
from maxtext_session import MaxTextSession

TINY = {"base_emb_dim": 64, "base_num_query_heads": 4, "base_num_kv_heads": 2, "base_mlp_dim": 128,
        "base_num_decoder_layers": 2, "head_dim": 16, "vocab_size": 256}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "base_moe_mlp_dim": 128, "sparse_matmul": "false",
       "megablox": "false"}
MLA = {"first_num_dense_layers": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
       "v_head_dim": 16}
# family: (MaxText's model file, the overrides that make it tiny)
FAMILIES = {
    "llama2": ("llama2-7b", {**TINY, "base_num_kv_heads": 4}),
    "llama3": ("llama3-8b", TINY),
    "llama3.1": ("llama3.1-8b", TINY),
    "qwen3": ("qwen3-0.6b", TINY),
    "mixtral": ("mixtral-8x7b", {**TINY, **MOE}),
    "qwen3_moe": ("qwen3-30b-a3b", {**TINY, **MOE}),
    "deepseek2": ("deepseek2-16b", {**TINY, **MOE, **MLA, "base_num_kv_heads": 4, "shared_experts": 1,
                                    "n_routing_groups": -1, "topk_routing_group": -1}),
    "deepseek3": ("deepseek3-tiny", {**TINY, **MOE, **MLA, "base_num_kv_heads": 4, "q_lora_rank": 32,
                                     "base_mlp_dim": 64, "base_moe_mlp_dim": 64}),
    "gpt_oss": ("gpt-oss-20b", {**TINY, **MOE, "sliding_window_size": 8}),
}
# MaxText-only settings. DeepSeek V3's routing bias moves only by MaxText's loss-free balancing
# update (no gradient reaches it): a rate makes it non-zero, so that reading it is checked.
MAXTEXT_ONLY = {"deepseek3": ["routed_bias_update_rate=0.05"]}
STEPS, PERIOD = 5, 2


def overrides(family):
    model, tiny = FAMILIES[family]
    return model, [f"{k}={v}" for k, v in tiny.items()]


@pytest.fixture
def mt(tmp_path):
    with MaxTextSession(str(tmp_path)) as session:
        yield session


def maxtext_args(maxtext, family, out, run_name):
    model, sets = overrides(family)
    return [os.path.join(maxtext, "configs", "base.yml"), f"run_name={run_name}", f"base_output_directory={out}",
            "hardware=cpu", "skip_jax_distributed_system=true", "attention=dot_product", f"model_name={model}",
            "override_model_config=true", "max_target_length=32", "per_device_batch_size=1",
            f"jax_cache_dir={os.path.join(out, 'jax_cache')}"] + sets + MAXTEXT_ONLY.get(family, [])


def train_maxtext(mt, family, out):
    metrics = os.path.join(out, "train_metrics.jsonl")
    mt.run("train", maxtext_args(mt.maxtext_dir, family, out, family) + [
        "dataset_type=synthetic", f"steps={STEPS}", f"checkpoint_period={PERIOD}", "async_checkpointing=false",
        "enable_checkpointing=true", f"metrics_file={metrics}"], cwd=out, log=os.path.join(out, "train.log"))
    losses = [json.loads(line)["learning/loss"] for line in open(metrics)]
    assert len(losses) == STEPS, losses
    return os.path.join(out, family, "checkpoints"), losses


def orbax_arrays(item_dir):
    """Every array of an item as Orbax restores it, as NumPy arrays, by '/'-joined path."""
    import orbax.checkpoint as ocp
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(item_dir)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    import jax
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = ckptr.restore(item_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}" if prefix else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}/{i}" if prefix else str(i))
        elif node is not None:
            flat[prefix] = np.asarray(node)

    walk(restored, "")
    return flat


def flat(tree, prefix=""):
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat(v, f"{prefix}/{i}" if prefix else str(i)))
    else:
        out[prefix] = tree
    return out


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def effective(spec, sizes):
    """A spec without the mesh axes of size 1 (they shard nothing) and without trailing Nones."""
    out = []
    for d in spec:
        axes = [d] if isinstance(d, str) else list(d or [])
        axes = [a for a in axes if sizes.get(a, 1) > 1]
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while out and out[-1] is None:
        out.pop()
    return tuple(out)


def check_restore(family, root):
    item = os.path.join(root, str(STEPS - 1), "items")
    want = orbax_arrays(item)
    for mesh, axis_map in [({"fsdp": 4, "tensor": 2}, None), ({"x": 3}, {"fsdp": "x"})]:
        got = flat(tessel.checkpoint.restore(root, item="items", mesh=tessel.Mesh(mesh), axis_map=axis_map))
        assert set(got) == set(want), (family, sorted(set(got) ^ set(want))[:10])
        for path, array in got.items():
            assert same_bits(array.to_numpy(), want[path]), (family, mesh, path)
    return len(want)


def check_dump(family, maxtext, root, tmp):
    model, sets = overrides(family)
    dump = os.path.join(tmp, "dump")
    args = [cli(), "plan", "--model", os.path.join(maxtext, "configs", "models", model + ".yml"), "--base",
            os.path.join(maxtext, "configs", "base.yml"), "--devices", "8", "--optimizer", "adamw",
            "--dump-shardings", dump, "--nnx-aux"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    named = json.load(open(os.path.join(dump, "named_shardings.json")))
    mine = {}
    for key, v in named.items():
        path = "/".join(re.sub(r"^\[\'?|\'?\]$", "", part.lstrip(".")) for part in key.split("/"))
        sizes = dict(v["mesh"]["shape"])
        mine[path] = (tuple(v["shape"]), effective(v["partition_spec"], sizes))
    info = tessel.checkpoint.info(root, item="items")
    saved = {}
    for a in info["arrays"]:
        s = a["saved_sharding"]
        sizes = dict(zip(s.mesh.axis_names, s.mesh.shape.values()))
        saved[a["path"]] = (tuple(a["shape"]), effective(tuple(s.spec), sizes))
    assert set(mine) == set(saved), (family, "only tessel's:", sorted(set(mine) - set(saved))[:10],
                                     "only MaxText's:", sorted(set(saved) - set(mine))[:10])
    differ = [(p, mine[p], saved[p]) for p in sorted(saved) if mine[p] != saved[p]]
    assert not differ, (family, differ[:10])
    return len(saved)


def check_resume(family, maxtext, root, tmp):
    """Returns where tessel's checkpoints went: <out>/<family>/checkpoints, MaxText's run layout."""
    model, sets = overrides(family)
    run = os.path.join(tmp, "resumed", family, "checkpoints")
    shutil.copytree(root, run)
    args = [cli(), "train", "--model", os.path.join(maxtext, "configs", "models", model + ".yml"), "--base",
            os.path.join(maxtext, "configs", "base.yml"), "--layout", "maxtext", "--checkpoint-dir", run, "--resume",
            "--mesh", "fsdp=4,tensor=2", "--steps", str(STEPS + 2), "--batch", "8", "--seq", "32",
            "--checkpoint-every", "1", "--log-every", "1"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (family, r.stderr[-3000:])
    assert f"resumed step {STEPS} from" in r.stdout, r.stdout
    # MaxText's numbering: directory N holds step N + 1.
    assert tessel.checkpoint.steps(run)[-1] == STEPS + 1
    assert int(tessel.checkpoint.restore(run, item="items", select="step")["step"].to_numpy()) == STEPS + 2
    # tessel's own steps in MaxText's layout hold MaxText's TrainState but for the RNG state, which
    # tessel does not keep (MaxText starts it afresh): DeepSeek V3's routing bias under nnx_aux.
    maxtext_paths = {a["path"] for a in tessel.checkpoint.info(root, item="items")["arrays"]}
    tessel_paths = {a["path"] for a in tessel.checkpoint.info(run, item="items")["arrays"]}
    assert tessel_paths == {p for p in maxtext_paths if "/rngs/" not in p}, sorted(tessel_paths ^ maxtext_paths)[:10]
    return run


ROUTING_BIAS = "/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"


def tessel_params(tree):
    """tessel's parameters from MaxText's layouts: params/params/..., and DeepSeek V3's stacked
    routing bias, [layers, experts] in MaxText 0.2.5 (under nnx_aux in a TrainState), [experts,
    layers] in tessel's model."""
    out = {p[len("params/params/"):]: v for p, v in flat(tree).items() if p.startswith("params/params/")}
    out.update({p[len("nnx_aux/model/"):]: v for p, v in flat(tree).items()
                if p.startswith("nnx_aux/model/") and p.endswith(ROUTING_BIAS)})
    return {p: (np.asarray(v.to_numpy()).T if p.endswith(ROUTING_BIAS) and len(v.shape) == 2 else v)
            for p, v in out.items()}


def cross_entropy(logits, targets):
    """MaxText's loss: the mean over the targets of -log softmax(logits)[target], in float64 here."""
    x = np.asarray(logits, np.float64)
    top = x.max(-1, keepdims=True)
    lse = np.log(np.exp(x - top).sum(-1)) + top[..., 0]
    return float(np.mean(lse - np.take_along_axis(x, targets[..., None].astype(np.int64), -1)[..., 0]))


def as_maxtext_logits(logits, params):
    """tessel's logits as MaxText 0.2.5 computes them. With a tied embedding table E (no
    logits_dense), MaxText rounds E to bfloat16 for the logits whatever its dtype
    (layers/embeddings.py, attend_on_embedding); tessel does not. The same rounding here: tessel's
    final hidden states h come back from its logits h E^T by least squares (E, vocab x embed, has
    full column rank) and meet the rounded table."""
    if any(p.endswith("logits_dense/kernel") for p in params):
        return np.asarray(logits, np.float64)
    import ml_dtypes
    table = next(v for p, v in params.items() if p.endswith("token_embedder/embedding"))
    table = np.asarray(table.to_numpy() if hasattr(table, "to_numpy") else table, np.float32)
    x = np.asarray(logits, np.float64).reshape(-1, table.shape[0])
    hidden = np.linalg.lstsq(table.astype(np.float64), x.T, rcond=None)[0].T
    rounded = table.astype(ml_dtypes.bfloat16).astype(np.float64)
    return (hidden @ rounded.T).reshape(np.shape(logits))


def relative_error(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def check_maxtext_loads_tessel(family, mt, run, tmp):
    """`run` (<out>/<family>/checkpoints) holds tessel's steps in MaxText's layout. Returns MaxText's
    and tessel's figures: the logits' relative error and the losses' differences."""
    maxtext = mt.maxtext_dir
    model_file, sets = overrides(family)
    base = os.path.join(maxtext, "configs", "base.yml")
    m = tessel.load_maxtext_model(os.path.join(maxtext, "configs", "models", model_file + ".yml"), base, set=sets)
    mesh = m.maxtext_mesh(8)
    # MaxText computes in bfloat16 by default, tessel in float32.
    f32 = ["dtype=float32"]

    # tessel's parameter-only checkpoint, loaded by MaxText's from_pretrained.
    params_dir = os.path.join(tmp, "tessel_params")
    r = subprocess.run([cli(), "ckpt", "convert", run, params_dir, "--item", "items", "--to", "maxtext-params",
                        "--dtype", "float32"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    npz = os.path.join(tmp, "maxtext_forward.npz")
    mt.run("forward", [npz] + maxtext_args(maxtext, family, tmp, "forward") + f32 + [
        f"load_parameters_path={os.path.join(params_dir, '0', 'items')}"], cwd=tmp, log=os.path.join(tmp, "forward.log"))
    z = np.load(npz)
    params = tessel_params(tessel.checkpoint.restore(params_dir, item="items", mesh=mesh))
    logits = as_maxtext_logits(tessel.forward(m, params, z["inputs"], mesh), params)
    logits_error = relative_error(logits, z["logits"])
    assert logits_error <= 1e-5, (family, logits_error)
    forward_loss = abs(cross_entropy(logits, z["targets"]) - float(z["loss"]))
    assert forward_loss <= 1e-5, (family, forward_loss)
    bias = [p for p in params if p.endswith(ROUTING_BIAS)]
    if bias:  # the bias was read: without it the logits differ
        assert any(np.abs(np.asarray(params[p])).max() > 0 for p in bias), "the routing bias stayed zero"
        unbiased = {p: (np.zeros(v.shape, np.float32) if p in bias else v) for p, v in params.items()}
        unbiased_logits = as_maxtext_logits(tessel.forward(m, unbiased, z["inputs"], mesh), unbiased)
        assert relative_error(unbiased_logits, z["logits"]) > 1e-4

    # MaxText continues tessel's run from its last step (its full TrainState).
    last = tessel.checkpoint.steps(run)[-1]
    metrics = os.path.join(tmp, "metrics.jsonl")
    out = os.path.dirname(os.path.dirname(run))
    log = mt.run("train", maxtext_args(maxtext, family, out, family) + f32 + [
        "dataset_type=synthetic", f"steps={last + 3}", "checkpoint_period=1000", "async_checkpointing=false",
        "enable_checkpointing=true", f"metrics_file={metrics}"], cwd=out, log=os.path.join(tmp, "continued.log"))
    assert f"restoring from this run's directory step {last}" in log, log[-3000:]
    first = json.loads(open(metrics).readline())
    state = tessel.checkpoint.restore(run, step=last, item="items", mesh=mesh)
    assert first["step"] == int(state["step"].to_numpy()), (first["step"], last)
    params = tessel_params(state)
    mine = cross_entropy(as_maxtext_logits(tessel.forward(m, params, z["inputs"], mesh), params), z["targets"])
    continued_loss = abs(first["learning/lm_loss"] - mine)
    assert continued_loss <= 1e-5, (family, first["learning/lm_loss"], mine)
    return logits_error, forward_loss, continued_loss


def check_init_from(family, mt, root, tmp):
    """MaxText 0.2.5's parameter-only checkpoint (generate_param_only_checkpoint: each parameter an
    NNX variable's value, bfloat16) starts a tessel run."""
    maxtext = mt.maxtext_dir
    model, sets = overrides(family)
    mt.run("param_only", maxtext_args(maxtext, family, tmp, "params_only") + [
        f"load_full_state_path={os.path.join(root, str(STEPS - 1), 'items')}"], cwd=tmp,
        log=os.path.join(tmp, "param_only.log"))
    args = [cli(), "train", "--model", os.path.join(maxtext, "configs", "models", model + ".yml"), "--base",
            os.path.join(maxtext, "configs", "base.yml"), "--init-from",
            os.path.join(tmp, "params_only", "checkpoints"), "--mesh", "fsdp=4,tensor=2", "--steps", "1",
            "--batch", "8", "--seq", "32"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (family, r.stderr[-3000:])
    assert "(MaxText 0.2.5's parameter-only layout" in r.stdout, r.stdout
    # It holds nnx.Params alone: DeepSeek V3's routing bias starts at zero, as in MaxText's own load.
    assert ("routing bias not in it starts at zero" in r.stdout) == (family == "deepseek3"), r.stdout


# Families whose parameter-only checkpoint is checked too (it takes MaxText another run).
INIT_FROM = {"llama3.1", "qwen3_moe", "deepseek3"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_maxtext_run_read_described_and_resumed_by_tessel(family, mt, tmp_path, capsys):
    maxtext = mt.maxtext_dir
    root, losses = train_maxtext(mt, family, str(tmp_path))
    assert all(np.isfinite(losses)), losses
    restored = check_restore(family, root)
    described = check_dump(family, maxtext, root, str(tmp_path))
    run = check_resume(family, maxtext, root, str(tmp_path))
    if family in INIT_FROM:
        check_init_from(family, mt, root, str(tmp_path))
    logits_error, forward_loss, continued_loss = check_maxtext_loads_tessel(family, mt, run, str(tmp_path))
    with capsys.disabled():
        print(f"\n{family}: MaxText's losses {[round(x, 4) for x in losses]}; {restored} arrays restored onto 2 meshes bit for bit, "
              f"{described} TrainState entries described alike, resumed by tessel"
              + (", its parameter-only checkpoint started tessel" if family in INIT_FROM else "")
              + f"; MaxText on tessel's checkpoints: logits {logits_error:.1e} (relative), loss {forward_loss:.1e}, "
              f"continued run's first loss {continued_loss:.1e}")
