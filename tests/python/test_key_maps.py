"""The shipped key maps (examples/maps/llama.yml, qwen3.yml) on random Hugging Face-named state
dicts written by the `safetensors` package, in HF's layouts ([out, in] Linear weights, one tensor
per layer): `tessel ckpt convert --map` gives exactly the tree of tessel's transformer (every path,
shape and dtype of tessel.eval_shape for the same config), with each tensor equal to a NumPy
re-statement of the mapping, and converts back to safetensors byte-identical to the original."""
import json
import os
import subprocess

import numpy as np
import pytest
import safetensors.numpy as stnp

import tessel
from conftest import cli
from trees import leaves, random_array

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def random_config(r, qwen3):
    heads = r.choice([2, 4])
    kv = r.choice([h for h in (1, 2, 4) if heads % h == 0])
    head_dim = r.choice([4, 8])
    return {"vocab": r.choice([32, 48]), "embed": r.choice([16, 24]), "layers": r.randint(1, 3), "heads": heads,
            "kv_heads": kv, "head_dim": head_dim, "mlp": r.choice([24, 40]), "tied": r.random() < 0.3, "qwen3": qwen3}


def hf_state_dict(r, c, dtype):
    """A random state dict with HF's names and layouts for Llama/Qwen3."""
    e, h, kv, d, m = c["embed"], c["heads"], c["kv_heads"], c["head_dim"], c["mlp"]
    shapes = {"model.embed_tokens.weight": (c["vocab"], e), "model.norm.weight": (e,)}
    if not c["tied"]:
        shapes["lm_head.weight"] = (c["vocab"], e)
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (e,), p + "post_attention_layernorm.weight": (e,),
                       p + "self_attn.q_proj.weight": (h * d, e), p + "self_attn.k_proj.weight": (kv * d, e),
                       p + "self_attn.v_proj.weight": (kv * d, e), p + "self_attn.o_proj.weight": (e, h * d),
                       p + "mlp.gate_proj.weight": (m, e), p + "mlp.up_proj.weight": (m, e),
                       p + "mlp.down_proj.weight": (e, m)})
        if c["qwen3"]:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return {n: np.asarray(random_array(r, s, dtype)) for n, s in shapes.items()}


def expected_tree(sd, c):
    """The mapping re-stated in NumPy: tessel path -> array."""
    d, L = c["head_dim"], c["layers"]

    def stack(fmt, fn, axis=1):
        return np.stack([fn(sd[fmt.format(i)]) for i in range(L)], axis=axis)

    def split(a, axis):  # heads * head_dim -> (heads, head_dim)
        shape = list(a.shape)
        shape[axis:axis + 1] = [shape[axis] // d, d]
        return a.reshape(shape)

    p = "model.layers.{}."
    out = {"token_embedder/embedding": sd["model.embed_tokens.weight"],
           "decoder/decoder_norm/scale": sd["model.norm.weight"],
           "decoder/layers/pre_self_attention_layer_norm/scale": stack(p + "input_layernorm.weight", lambda a: a),
           "decoder/layers/post_self_attention_layer_norm/scale": stack(p + "post_attention_layernorm.weight", lambda a: a),
           "decoder/layers/self_attention/query/kernel": stack(p + "self_attn.q_proj.weight", lambda a: split(a.T, 1)),
           "decoder/layers/self_attention/key/kernel": stack(p + "self_attn.k_proj.weight", lambda a: split(a.T, 1)),
           "decoder/layers/self_attention/value/kernel": stack(p + "self_attn.v_proj.weight", lambda a: split(a.T, 1)),
           "decoder/layers/self_attention/out/kernel": stack(p + "self_attn.o_proj.weight", lambda a: split(a.T, 0)),
           "decoder/layers/mlp/wi_0/kernel": stack(p + "mlp.gate_proj.weight", lambda a: a.T),
           "decoder/layers/mlp/wi_1/kernel": stack(p + "mlp.up_proj.weight", lambda a: a.T),
           "decoder/layers/mlp/wo/kernel": stack(p + "mlp.down_proj.weight", lambda a: a.T)}
    if not c["tied"]:
        out["decoder/logits_dense/kernel"] = sd["lm_head.weight"].T
    if c["qwen3"]:
        out["decoder/layers/self_attention/query_norm/scale"] = stack(p + "self_attn.q_norm.weight", lambda a: a)
        out["decoder/layers/self_attention/key_norm/scale"] = stack(p + "self_attn.k_norm.weight", lambda a: a)
    return out


def run(*args):
    r = subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"{args}:\n{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_shipped_maps_build_tessels_tree_and_back(rng, tmp, family):
    for trial in range(3):
        c = random_config(rng, family == "qwen3")
        dtype = rng.choice(["float32", "bfloat16"])
        sd = hf_state_dict(rng, c, dtype)
        src = os.path.join(tmp, f"hf{trial}")
        os.makedirs(src)
        stnp.save_file(sd, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
        item = os.path.join(tmp, f"item{trial}")
        mapfile = os.path.join(ROOT, "examples", "maps", f"{family}.yml")
        if trial == 0:  # the Python API runs the same tool
            assert tessel.checkpoint.convert(src, item, map=mapfile, map_vars={"head_dim": c["head_dim"]}) == "orbax"
        else:
            out = run("ckpt", "convert", src, item, "--map", mapfile, "--map-var", f"head_dim={c['head_dim']}")
            assert "forward" in out
        got = tessel.checkpoint.restore(item)
        flat = {p: a.to_numpy() for p, a in leaves(got).items()}
        # Exactly tessel's model tree for the same config.
        model = {"model": "transformer", "vocab": c["vocab"], "embed": c["embed"], "layers": c["layers"],
                 "heads": c["heads"], "kv_heads": c["kv_heads"], "head_dim": c["head_dim"], "mlp": c["mlp"],
                 "gated_mlp": True, "tied_embedding": c["tied"], "qk_norm": c["qwen3"],
                 "dtype": "bf16" if dtype == "bfloat16" else "f32"}
        abstract = tessel.eval_shape(model, tessel.Mesh({"x": 1}), tessel.LogicalRules([]), flat=True)
        assert sorted(flat) == sorted(abstract), (sorted(flat), sorted(abstract))
        for path, a in abstract.items():
            assert flat[path].shape == a.shape and flat[path].dtype == a.dtype, (path, flat[path].shape, a.shape)
        want = expected_tree(sd, c)
        for path, w in want.items():
            assert flat[path].tobytes() == np.ascontiguousarray(w).tobytes(), path
        # And back: the same HF tensors, byte for byte.
        back = os.path.join(tmp, f"back{trial}")
        out = run("ckpt", "convert", item, back, "--map", mapfile, "--map-var", f"head_dim={c['head_dim']}",
                  "--to", "safetensors")
        assert "backward" in out
        again = stnp.load_file(os.path.join(back, "model.safetensors"))
        assert sorted(again) == sorted(sd)
        for n, a in sd.items():
            assert again[n].dtype == a.dtype and again[n].tobytes() == a.tobytes(), n


def test_bad_maps_and_mismatches_are_clear_errors(rng, tmp):
    c = random_config(rng, False)
    sd = hf_state_dict(rng, c, "float32")
    sd["model.extra.weight"] = np.zeros(3, np.float32)
    src = os.path.join(tmp, "hf.safetensors")
    stnp.save_file(sd, src)
    mapfile = os.path.join(ROOT, "examples", "maps", "llama.yml")
    r = subprocess.run([cli(), "ckpt", "convert", src, os.path.join(tmp, "x"), "--map", mapfile, "--map-var",
                        f"head_dim={c['head_dim']}"], capture_output=True, text=True)
    assert r.returncode != 0 and "model/extra/weight" in r.stderr, r.stderr
    del sd["model.extra.weight"]
    stnp.save_file(sd, src)
    bad = os.path.join(tmp, "bad.yml")
    cases = {
        "rules:\n  - from: a.{i}.w\n    to: b.w\n": "stack",
        "rules:\n  - from: a.w\n    to: b.w\n    transpose: [0, 0]\n": "permutation",
        "rules:\n  - from: a.w\n    to: b.w\n    split: [0, [-1, -1]]\n": "-1",
        "rules:\n  - from: a.w\n    to: b.w\n    colour: red\n": "unknown rule key 'colour'",
        "rules:\n  - from: a.w\n    to: b.w\n    split: [0, [-1, '{nope}']]\n": "no value for {nope}",
        "rules: []\n": "non-empty",
    }
    for text, message in cases.items():
        with open(bad, "w") as f:
            f.write(text)
        r = subprocess.run([cli(), "ckpt", "convert", src, os.path.join(tmp, "y"), "--map", bad], capture_output=True,
                           text=True)
        assert r.returncode != 0 and message in r.stderr and "bad.yml" in r.stderr, (text, r.stderr)
    with pytest.raises(tessel.Error, match="does not split"):
        tessel.checkpoint.convert(src, os.path.join(tmp, "w"), map=mapfile, map_vars={"head_dim": 1000})
    # head_dim that does not divide: named with the tensor.
    r = subprocess.run([cli(), "ckpt", "convert", src, os.path.join(tmp, "z"), "--map", mapfile, "--map-var",
                        f"head_dim={c['head_dim'] * 1000}"], capture_output=True, text=True)
    assert r.returncode != 0 and "does not split" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmp, "z")) and not os.path.exists(os.path.join(tmp, "z.tmp"))
    # A destination that fills up (a file size limit: writes fail as on a full disk) is an error
    # naming the file, and leaves nothing behind, in either format.
    import resource
    import signal

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    for to, storage in (("orbax", ["--storage", "files"]), ("orbax", []), ("safetensors", [])):
        dst = os.path.join(tmp, "full_" + to)
        r = subprocess.run([cli(), "ckpt", "convert", src, dst, "--map", mapfile, "--map-var",
                            f"head_dim={c['head_dim']}", "--to", to] + storage,
                           capture_output=True, text=True, preexec_fn=small_files)
        assert r.returncode != 0 and r.stderr.startswith("tessel: error: ") and "File too large" in r.stderr, r.stderr
        assert not [f for f in os.listdir(tmp) if f.startswith("full_" + to)], os.listdir(tmp)


def peak_rss_of(args):
    """Runs the CLI in a child of a child and returns (its stdout, its peak RSS in bytes): the
    grandchild's high-water mark alone, not this process's other children's."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stderr.write(r.stderr); sys.stdout.write(r.stdout)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
             "sys.exit(r.returncode)\n")
    import sys
    r = subprocess.run([sys.executable, "-c", probe, cli(), *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{args}:\n{r.stderr[-3000:]}"
    lines = r.stdout.strip().splitlines()
    return "\n".join(lines[:-1]), int(lines[-1])


def test_a_map_conversion_streams_in_a_memory_budget(rng, tmp):
    """A model several times larger than the conversion's memory budget (--memory-mb 16), through
    the Qwen3-MoE map both ways: peak RSS stays within the process's own baseline plus the budget
    and a few of the largest tensors' worth (a stacked tensor is written a slab at a time, never
    whole), and the way back gives every tensor of the source bit for bit."""
    import ml_dtypes
    layers, experts, e, m, heads, d = rng.randint(6, 8), rng.choice([24, 32]), 512, 384, 4, 64
    shapes = {"model.embed_tokens.weight": (512, e), "model.norm.weight": (e,), "lm_head.weight": (512, e)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (e,), p + "post_attention_layernorm.weight": (e,),
                       p + "self_attn.q_proj.weight": (heads * d, e), p + "self_attn.k_proj.weight": (2 * d, e),
                       p + "self_attn.v_proj.weight": (2 * d, e), p + "self_attn.o_proj.weight": (e, heads * d),
                       p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                       p + "mlp.gate.weight": (experts, e)})
        for x in range(experts):
            q = f"{p}mlp.experts.{x}."
            shapes.update({q + "gate_proj.weight": (m, e), q + "up_proj.weight": (m, e), q + "down_proj.weight": (e, m)})
    gen = np.random.default_rng(rng.randrange(2**31))
    hf = os.path.join(tmp, "hf")
    os.makedirs(hf)
    sd = {n: gen.standard_normal(s, dtype=np.float32).astype(ml_dtypes.bfloat16) for n, s in shapes.items()}
    names = sorted(sd)
    files = [names[k::4] for k in range(4)]
    weight_map = {}
    for k, part in enumerate(files):
        file = f"model-{k + 1:05d}-of-00004.safetensors"
        stnp.save_file({n: sd[n] for n in part}, os.path.join(hf, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(hf, "model.safetensors.index.json"), "w"))
    total = sum(a.nbytes for a in sd.values())
    largest = max(a.nbytes for a in sd.values())
    mapfile = os.path.join(ROOT, "examples", "maps", "qwen3_moe_maxtext.yml")
    mib = 2**20
    # The process's own baseline: the same CLI converting a tiny set with the same map.
    _, baseline = peak_rss_of(["ckpt", "info", hf])
    maxtext = os.path.join(tmp, "maxtext")
    out, forward = peak_rss_of(["ckpt", "convert", hf, maxtext, "--map", mapfile, "--map-var", f"head_dim={d}",
                                "--memory-mb", 16])
    stacked = tessel.checkpoint.info(maxtext)["arrays"]
    wi_0 = next(a for a in stacked if a["path"].endswith("moe_block/wi_0"))
    assert tuple(wi_0["shape"]) == (experts, layers, e, m), wi_0
    back = os.path.join(tmp, "back")
    _, backward = peak_rss_of(["ckpt", "convert", maxtext, back, "--map", mapfile, "--map-var", f"head_dim={d}",
                               "--to", "safetensors", "--memory-mb", 16])
    # Without a map too, a stacked tensor (here wi_0, several times the budget) goes a slab at a time.
    plain = os.path.join(tmp, "plain")
    _, unmapped = peak_rss_of(["ckpt", "convert", maxtext, plain, "--to", "safetensors", "--memory-mb", 16])
    bound = baseline + 16 * mib + 4 * largest + 16 * mib
    print(f"\n{len(sd)} tensors, {total / mib:.0f} MiB ({total / (16 * mib):.1f}x the 16 MiB budget), largest "
          f"{largest / mib:.2f} MiB; peak RSS: baseline {baseline / mib:.0f} MiB, forward {forward / mib:.0f}, "
          f"backward {backward / mib:.0f}, the stacked item without a map {unmapped / mib:.0f} (bound {bound / mib:.0f})")
    assert total > 8 * 16 * mib
    assert forward <= bound and backward <= bound and unmapped <= bound, \
        (forward / mib, backward / mib, unmapped / mib, bound / mib)
    flat = {}
    for f in os.listdir(plain):
        if f.endswith(".safetensors"):
            flat.update(stnp.load_file(os.path.join(plain, f)))
    got = next(a for k, a in flat.items() if k.replace("/", ".").endswith("moe_block.wi_0"))
    assert got.nbytes > 3 * 16 * mib  # at least 54 MiB
    want = np.stack([np.stack([sd[f"model.layers.{i}.mlp.experts.{x}.gate_proj.weight"].T for i in range(layers)])
                     for x in range(experts)])
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    again = {}
    for f in os.listdir(back):
        if f.endswith(".safetensors"):
            again.update(stnp.load_file(os.path.join(back, f)))
    assert sorted(again) == names
    for n in names:
        assert again[n].dtype == sd[n].dtype and np.array_equal(again[n].view(np.uint16), sd[n].view(np.uint16)), n


def test_a_map_places_its_targets_on_a_mesh(rng, tmp):
    """`--map` with `--mesh` and `--shardings` (specs by the map's target paths): the item records
    each target's sharding on that mesh (the others a full copy there), restores onto the mesh as
    saved, every tensor equal to the one-device conversion's; the same into MaxText's
    parameter-only checkpoint with the specs keyed params/params/...; a sharded safetensors target
    is refused."""
    c = random_config(rng, qwen3=True)
    sd = hf_state_dict(rng, c, rng.choice(["float32", "bfloat16"]))
    src = os.path.join(tmp, "hf")
    os.makedirs(src)
    stnp.save_file(sd, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    mapfile = os.path.join(ROOT, "examples", "maps", "qwen3.yml")
    specs = {"token_embedder/embedding": ["tensor", None], "decoder/layers/mlp/wi_0/kernel": ["fsdp", None, "tensor"],
             "decoder/layers/self_attention/query/kernel": [None, None, "tensor", None]}
    shardings = os.path.join(tmp, "shardings.json")
    json.dump(specs, open(shardings, "w"))
    placed, plain = os.path.join(tmp, "placed"), os.path.join(tmp, "plain")
    head_dim = f"head_dim={c['head_dim']}"
    run("ckpt", "convert", src, placed, "--map", mapfile, "--map-var", head_dim, "--mesh", "fsdp=2,tensor=2",
        "--shardings", shardings, "--memory-mb", 1)
    run("ckpt", "convert", src, plain, "--map", mapfile, "--map-var", head_dim)
    mesh = tessel.Mesh({"fsdp": 2, "tensor": 2})
    got = leaves(tessel.checkpoint.restore(placed, mesh=mesh))
    want = leaves(tessel.checkpoint.restore(plain))
    assert sorted(got) == sorted(want)
    for path, a in got.items():
        saved = "PartitionSpec(" + ", ".join("None" if s is None else repr(s) for s in specs.get(path, [])) + ")"
        assert str(a.sharding) == f"NamedSharding(mesh=Mesh(fsdp=2, tensor=2), spec={saved})", (path, a.sharding)
        assert a.to_numpy().tobytes() == want[path].to_numpy().tobytes(), path
    # Logical axes (MaxText's logical_shardings.json format) with rules: resolved there, and
    # recorded, so that a restore onto another mesh places the tensors by them.
    logical = os.path.join(tmp, "logical.json")
    json.dump({"token_embedder/embedding": {"partition_spec": ["vocab", "embed"], "shape": [c["vocab"], c["embed"]]},
               "decoder/layers/mlp/wi_0/kernel": {"partition_spec": ["embed", "layers", "mlp"],
                                                  "shape": [c["embed"], c["layers"], c["mlp"]]}}, open(logical, "w"))
    rules_file = os.path.join(ROOT, "examples", "models", "rules.yml")
    by_names = os.path.join(tmp, "by_names")
    run("ckpt", "convert", src, by_names, "--map", mapfile, "--map-var", head_dim, "--mesh", "fsdp=2",
        "--logical-axes", logical, "--rules", rules_file)
    other = tessel.Mesh({"data": 1, "fsdp": 2, "tensor": 2})
    again = leaves(tessel.checkpoint.restore(by_names, mesh=other, rules=tessel.load_rules(rules_file)))
    assert str(again["token_embedder/embedding"].sharding.spec) == "PartitionSpec('tensor', 'fsdp')"
    assert str(again["decoder/layers/mlp/wi_0/kernel"].sharding.spec) == "PartitionSpec('fsdp', None, 'tensor')"
    assert again["token_embedder/embedding"].to_numpy().tobytes() == want["token_embedder/embedding"].to_numpy().tobytes()
    # Into MaxText's parameter-only checkpoint, the specs keyed as MaxText's dumps key them.
    json.dump({"params/params/" + p: spec for p, spec in specs.items()}, open(shardings, "w"))
    params = os.path.join(tmp, "params")
    run("ckpt", "convert", src, params, "--map", mapfile, "--map-var", head_dim, "--mesh", "fsdp=2,tensor=2",
        "--shardings", shardings, "--to", "maxtext-params", "--dtype", "float32")
    restored = leaves(tessel.checkpoint.restore(os.path.join(params, "0", "items"), mesh=mesh))
    embedding = restored["params/params/token_embedder/embedding"]
    assert str(embedding.sharding.spec) == "PartitionSpec('tensor', None)", embedding.sharding
    assert embedding.to_numpy().tobytes() == want["token_embedder/embedding"].to_numpy().astype(np.float32).tobytes()
    r = subprocess.run([cli(), "ckpt", "convert", src, os.path.join(tmp, "st"), "--map", mapfile, "--map-var", head_dim,
                        "--mesh", "fsdp=2,tensor=2", "--to", "safetensors"], capture_output=True, text=True)
    assert r.returncode != 0 and "safetensors records no sharding" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmp, "st"))
