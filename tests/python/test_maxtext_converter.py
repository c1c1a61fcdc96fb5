"""The same bytes as MaxText's own converter: a tiny random Hugging Face model of each family
(made by transformers, saved with save_pretrained) converts with MaxText 0.2.5's
`maxtext.checkpoint_conversion.to_maxtext` (the real one, in .venv-maxtext; maxtext_to_maxtext.py)
and with `tessel ckpt convert --map <the family's map> --to maxtext-params` from the same
directory. Both write MaxText's parameter-only checkpoint (step 0, item "items", params/params/...):
every parameter equal bit for bit, in the same dtype and shape, none missing on either side.

Source and output dtypes as users meet them: a bfloat16 checkpoint (as published) to MaxText's
default bfloat16, and a float32 one to float32 (to_maxtext's --save_dtype, tessel's --dtype). One
case differs by MaxText's own doing and is checked as such: a float32 source with --save_dtype
bfloat16. to_maxtext's NumPy path (the one it takes without torch, as installed here) casts a
tensor only when float32 is asked for, so it writes float32 anyway; tessel writes what --dtype
asks. There MaxText's tensors equal tessel's float32 conversion bit for bit, and tessel's bfloat16
ones are those rounded once (to nearest even).

One ctest per family (tests/CMakeLists.txt), so that they run in parallel; within one, MaxText's
converter runs in one worker process (maxtext_session.py), which imports MaxText once.
"""
import os
import re

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

import tessel
from test_hf_logits import tiny_deepseek
from maxtext_session import MaxTextSession
from test_transformers_maps import run
from trees import leaves
from safetensors.numpy import load_file

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MAPS = os.path.join(ROOT, "examples", "maps")
DEVICES = 4  # to_maxtext's --simulated_cpu_devices_count: the worker's backend has as many


def dense_sizes(r):
    heads = r.choice([4, 8])
    return dict(vocab_size=r.choice([64, 96]), hidden_size=r.choice([32, 64]), intermediate_size=r.choice([48, 64]),
                num_hidden_layers=r.randint(1, 3), num_attention_heads=heads, num_key_value_heads=r.choice([2, 4]),
                head_dim=r.choice([8, 32]), rms_norm_eps=1e-6)


def sets_of(c, **more):
    """MaxText's --set for the HF config's sizes."""
    return dict(base_emb_dim=c.hidden_size, base_num_query_heads=c.num_attention_heads,
                base_num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, base_mlp_dim=c.intermediate_size,
                base_num_decoder_layers=c.num_hidden_layers, vocab_size=c.vocab_size, **more)


def llama31(r):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    c = transformers.LlamaConfig(tie_word_embeddings=False, rope_parameters=rope, max_position_embeddings=131072,
                                 **dense_sizes(r))
    return c, transformers.LlamaForCausalLM(c), sets_of(c), {"head_dim": c.head_dim}


def qwen3(r):
    # MaxText's qwen3-0.6b ties the embedding (logits_via_embedding), as Qwen3-0.6B does.
    c = transformers.Qwen3Config(tie_word_embeddings=True, **dense_sizes(r))
    return c, transformers.Qwen3ForCausalLM(c), sets_of(c), {"head_dim": c.head_dim}


def moe(r, family):
    sizes = dict(dense_sizes(r), num_experts_per_tok=r.choice([1, 2]))
    experts = r.choice([4, 8])
    if family == "mixtral":
        c = transformers.MixtralConfig(num_local_experts=experts, tie_word_embeddings=False, **sizes)
        model = transformers.MixtralForCausalLM(c)
    else:
        c = transformers.Qwen3MoeConfig(num_experts=experts, moe_intermediate_size=sizes["intermediate_size"],
                                        norm_topk_prob=True, tie_word_embeddings=False, **sizes)
        model = transformers.Qwen3MoeForCausalLM(c)
    sets = sets_of(c, num_experts=experts, num_experts_per_tok=c.num_experts_per_tok,
                   base_moe_mlp_dim=c.intermediate_size)
    return c, model, sets, {"head_dim": c.head_dim}


def deepseek3(r):
    c, model, _, sets = tiny_deepseek(r, "v3")
    nope, v = c.qk_nope_head_dim, c.v_head_dim
    map_vars = {"first_dense": c.first_k_dense_replace, "qk_head_dim": nope + c.qk_rope_head_dim,
                "kv_head_dim": nope + v, "v_head_dim": v}
    sets = {k: v for k, v in sets.items() if k not in ("weight_dtype", "dtype", "ici_fsdp_parallelism")}
    return c, model, sets, map_vars


def gpt_oss(r):
    layers, experts = 2 * r.randint(1, 2), r.choice([4, 8])
    c = transformers.GptOssConfig(vocab_size=r.choice([64, 96]), hidden_size=32, intermediate_size=16,
                                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  num_local_experts=experts, num_experts_per_tok=r.choice([1, 2]))
    model = transformers.GptOssForCausalLM(c)
    with torch.no_grad():  # biases and sinks start at zero: random, so that a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.copy_(torch.randn(p.shape) * 0.5)
    sets = dict(sets_of(c, num_experts=experts, num_experts_per_tok=c.num_experts_per_tok, base_moe_mlp_dim=16),
                scan_layers=False)  # examples/maps/gpt_oss_maxtext.yml writes MaxText's unscanned tree
    return c, model, sets, {"head_dim": c.head_dim}


# family: (MaxText's model name, the map, the maker of (config, model, --set, map variables))
FAMILIES = {
    "llama3.1": ("llama3.1-8b", "llama31_maxtext.yml", llama31),
    "qwen3": ("qwen3-0.6b", "qwen3.yml", qwen3),
    "mixtral": ("mixtral-8x7b", "mixtral_maxtext.yml", lambda r: moe(r, "mixtral")),
    "qwen3_moe": ("qwen3-30b-a3b", "qwen3_moe_maxtext.yml", lambda r: moe(r, "qwen3_moe")),
    "deepseek3": ("deepseek3-671b", "deepseek_maxtext.yml", deepseek3),
    "gpt_oss": ("gpt-oss-20b", "gpt_oss_maxtext.yml", gpt_oss),
}
# Where MaxText 0.2.5's converter fails on the layout tessel's map writes, it runs on another one
# and the test compares across:
# - scanned Mixtral and DeepSeek: to_maxtext stacks the router's kernel (and DeepSeek's experts) on
#   axis 0 (its test for an unscanned MoE, "MoeBlock" in the name, matches the scanned names too)
#   and stops on the shape; run unscanned, its layers are stacked on MaxText's param_scan_axis (1)
#   here to compare;
# - DeepSeek V3 with routed_bias: to_maxtext's key table has no entry for NNX's MoEBiasVar
#   collection and it stops ("must be a subset of flattened param_map"); run without the routing
#   bias, tessel's checkpoint holds it besides (check_routing_bias), where MaxText's loader reads it.
MAXTEXT_WORKAROUND = {"mixtral": {"scan_layers": False}, "deepseek3": {"scan_layers": False, "routed_bias": False}}
# (source dtype, output dtype) per family: bfloat16 as published, float32 where a map scales or
# the family has float32-only steps worth checking exactly.
CASES = {"llama3.1": [("bfloat16", "bfloat16"), ("float32", "float32"), ("float32", "bfloat16")],
         "deepseek3": [("bfloat16", "bfloat16"), ("float32", "float32")]}


@pytest.fixture
def mt(tmp):
    with MaxTextSession(tmp, devices=DEVICES) as session:
        yield session


def to_maxtext(mt, model_name, hf, sets, save_dtype, out):
    """MaxText's converter on `hf` (maxtext_to_maxtext.py); its checkpoint's parameters."""
    args = [model_name, hf, os.path.join(mt.maxtext_dir, "configs", "base.yml"), f"model_name={model_name}",
            f"--hf_model_path={hf}", "override_model_config=true", f"base_output_directory={out}", "run_name=convert",
            "hardware=cpu", "skip_jax_distributed_system=true", f"--save_dtype={save_dtype}",
            f"--simulated_cpu_devices_count={DEVICES}"] + [f"{k}={v}" for k, v in sets.items()]
    os.makedirs(out)
    mt.run("to_maxtext", args, cwd=out, log=os.path.join(out, "to_maxtext.log"))
    return parameters(os.path.join(out, "0", "items"))


def parameters(item):
    restored = leaves(tessel.checkpoint.restore(item, mesh=tessel.Mesh({"x": 1})))
    return {p: a.to_numpy() for p, a in restored.items() if p.startswith("params/params/")}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tessel_writes_what_maxtexts_converter_writes(family, mt, rng, tmp):
    model_name, mapname, make = FAMILIES[family]
    for source_dtype, save_dtype in CASES.get(family, [("bfloat16", "bfloat16")]):
        torch.manual_seed(rng.randrange(2**31))
        config, model, sets, map_vars = make(rng)
        case = f"{family}, {source_dtype} source, {save_dtype} out"
        print(case, config.to_dict())
        hf = os.path.join(tmp, f"hf_{source_dtype}_{save_dtype}")
        model.to(getattr(torch, source_dtype)).save_pretrained(hf)
        theirs = to_maxtext(mt, model_name, hf, dict(sets, **MAXTEXT_WORKAROUND.get(family, {})), save_dtype,
                            os.path.join(tmp, f"maxtext_{source_dtype}_{save_dtype}"))
        if MAXTEXT_WORKAROUND.get(family, {}).get("scan_layers") is False:
            theirs = stacked(theirs)
        ours_dir = os.path.join(tmp, f"tessel_{source_dtype}_{save_dtype}")
        run("ckpt", "convert", hf, ours_dir, "--map", os.path.join(MAPS, mapname), "--map-var",
            ",".join(f"{k}={v}" for k, v in map_vars.items()), "--to", "maxtext-params", "--dtype", save_dtype)
        ours = parameters(os.path.join(ours_dir, "0", "items"))
        if family == "deepseek3":
            check_routing_bias(ours, theirs, config, hf, save_dtype)
        assert sorted(ours) == sorted(theirs), (case, sorted(set(ours) ^ set(theirs)))
        if source_dtype == "float32" and save_dtype == "bfloat16":
            # MaxText's NumPy path keeps the float32 source (see the module's doc): tessel's float32
            # conversion is its bytes, and tessel's bfloat16 those rounded once.
            wide_dir = os.path.join(tmp, "tessel_wide")
            # From Python this time: the same library call.
            tessel.checkpoint.convert(hf, wide_dir, map=os.path.join(MAPS, mapname), map_vars=map_vars,
                                      to="maxtext-params", dtype="float32")
            wide = parameters(os.path.join(wide_dir, "0", "items"))
            for path, want in theirs.items():
                assert want.dtype == np.float32, (case, path, want.dtype)
                assert_same(wide[path], want, case, path)
                assert_same(ours[path], want.astype(ml_dtypes.bfloat16), case, path)
            print(f"{case}: MaxText wrote float32; tessel's float32 equal bit for bit, its bfloat16 rounded once")
            continue
        for path, want in theirs.items():
            assert_same(ours[path], want, case, path)
        print(f"{case}: {len(theirs)} parameters equal bit for bit")


def assert_same(got, want, case, path):
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (case, path, got.dtype, got.shape, want.dtype, want.shape)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (case, path, int(np.sum(got != want)))


def stacked(params):
    """MaxText's unscanned tree (decoder/layers_<i>/...) scanned: each layer's tensors stacked on
    param_scan_axis 1, as MaxText's scanned layers hold them."""
    out, layers = {}, {}
    for path, a in params.items():
        m = re.fullmatch(r"(params/params/decoder/\w*layers)_(\d+)/(.*)", path)
        if m:
            layers.setdefault(f"{m[1]}/{m[3]}", {})[int(m[2])] = a
        else:
            out[path] = a
    for path, by_layer in layers.items():
        out[path] = np.stack([by_layer[i] for i in sorted(by_layer)], axis=1)
    return out


def check_routing_bias(ours, theirs, config, hf, save_dtype):
    """tessel's checkpoint holds DeepSeek V3's routing bias besides MaxText's: HF's
    e_score_correction_bias of each MoE layer, stacked [experts, layers] (tessel's order)."""
    path = "params/params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias"
    assert set(ours) - set(theirs) == {path}, sorted(set(ours) ^ set(theirs))
    sd = load_file(os.path.join(hf, "model.safetensors"))
    want = np.stack([sd[f"model.layers.{i}.mlp.gate.e_score_correction_bias"]
                     for i in range(config.first_k_dense_replace, config.num_hidden_layers)], axis=-1)
    assert_same(ours.pop(path), want.astype(np.dtype(ml_dtypes.bfloat16 if save_dtype == "bfloat16" else np.float32)),
                "deepseek3 routing bias", path)
