"""Models made by the real `transformers` (PyTorch 2.13 CPU, from a config in the test, never
downloaded): tiny random Llama and Qwen3 models saved with `save_pretrained` (safetensors, sharded
with an index) convert through the shipped maps into tessel's transformer tree (equal to
tessel.eval_shape of the same config, every tensor equal to the model's own state_dict mapped in
NumPy), and back into safetensors whose every tensor is byte-identical to what transformers saved."""
import os
import subprocess

import numpy as np
import safetensors.numpy as stnp
import torch
import transformers

import tessel
from conftest import cli
from trees import leaves

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def tiny_model(r, family):
    heads = r.choice([2, 4])
    kv = r.choice([h for h in (1, 2) if heads % h == 0])
    head_dim = r.choice([8, 16])
    common = dict(vocab_size=r.choice([64, 96]), hidden_size=r.choice([32, 48]), intermediate_size=r.choice([40, 64]),
                  num_hidden_layers=r.randint(1, 3), num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                  tie_word_embeddings=r.random() < 0.3)
    torch.manual_seed(r.randrange(2**31))
    if family == "llama":
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**common)
        model = transformers.Qwen3ForCausalLM(config)
    return config, model


def tensors_of(directory):
    out = {}
    for f in sorted(os.listdir(directory)):
        if f.endswith(".safetensors"):
            out.update(stnp.load_file(os.path.join(directory, f)))
    return out


def run(*args):
    r = subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"{args}:\n{r.stderr}"
    return r.stdout


def test_transformers_models_convert_to_tessels_tree_and_back(rng, tmp):
    checked = 0
    for family in ("llama", "qwen3"):
        for trial in range(2):
            config, model = tiny_model(rng, family)
            hf = os.path.join(tmp, f"{family}{trial}")
            model.save_pretrained(hf, max_shard_size="20KB" if trial else "1GB")  # a sharded set, then one file
            saved = tensors_of(hf)
            assert trial == 0 or os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
            mapfile = os.path.join(ROOT, "examples", "maps", f"{family}.yml")
            var = f"head_dim={config.head_dim}"
            item = os.path.join(tmp, f"{family}{trial}_item")
            run("ckpt", "convert", hf, item, "--map", mapfile, "--map-var", var)
            got = {p: a.to_numpy() for p, a in leaves(tessel.checkpoint.restore(item)).items()}
            model_yaml = {"model": "transformer", "vocab": config.vocab_size, "embed": config.hidden_size,
                          "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
                          "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim,
                          "mlp": config.intermediate_size, "gated_mlp": True,
                          "tied_embedding": config.tie_word_embeddings, "qk_norm": family == "qwen3"}
            abstract = tessel.eval_shape(model_yaml, tessel.Mesh({"x": 1}), tessel.LogicalRules([]), flat=True)
            assert sorted(got) == sorted(abstract)
            for path, a in abstract.items():
                assert got[path].shape == a.shape, (path, got[path].shape, a.shape)
            # The model's own weights, mapped in NumPy: a few landmarks of each kind.
            sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
            d, L = config.head_dim, config.num_hidden_layers
            q = np.stack([sd[f"model.layers.{i}.self_attn.q_proj.weight"].T.reshape(config.hidden_size, -1, d)
                          for i in range(L)], axis=1)
            assert np.array_equal(got["decoder/layers/self_attention/query/kernel"], q)
            o = np.stack([sd[f"model.layers.{i}.self_attn.o_proj.weight"].T.reshape(-1, d, config.hidden_size)
                          for i in range(L)], axis=1)
            assert np.array_equal(got["decoder/layers/self_attention/out/kernel"], o)
            wo = np.stack([sd[f"model.layers.{i}.mlp.down_proj.weight"].T for i in range(L)], axis=1)
            assert np.array_equal(got["decoder/layers/mlp/wo/kernel"], wo)
            assert np.array_equal(got["token_embedder/embedding"], sd["model.embed_tokens.weight"])
            if family == "qwen3":
                kn = np.stack([sd[f"model.layers.{i}.self_attn.k_norm.weight"] for i in range(L)], axis=1)
                assert np.array_equal(got["decoder/layers/self_attention/key_norm/scale"], kn)
            # Back to safetensors: every tensor byte-identical to what transformers saved.
            back = os.path.join(tmp, f"{family}{trial}_back")
            run("ckpt", "convert", item, back, "--map", mapfile, "--map-var", var, "--to", "safetensors")
            again = tensors_of(back)
            assert sorted(again) == sorted(saved)
            for name, a in saved.items():
                assert again[name].dtype == a.dtype and again[name].tobytes() == a.tobytes(), name
                checked += 1
    assert checked >= 4 * 10
