"""The same logits as Hugging Face: tiny random Llama and Qwen3 models made by the real
`transformers` (PyTorch 2.13 CPU, from a config in the test, never downloaded) and saved with
`save_pretrained` convert through the shipped maps (`tessel ckpt convert --map`) into MaxText's
tree; MaxText's llama2 and qwen3 families, configured from MaxText's own model files with `--set`
to the same sizes, give HF's logits (f32, 1e-4 relative) through `tessel.forward` on 1 device and
on 8 with tensor and fsdp parallelism. Back through the same map, the weights are HF's again."""
import json
import os
import subprocess

import numpy as np
import torch
import transformers

import tessel
from conftest import SHARED, cli
from test_transformers_maps import run, tensors_of
from trees import leaves

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MAXTEXT = os.path.join(SHARED, "testdata", "maxtext")
FAMILIES = {  # HF class, the map, MaxText's model file
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, "llama_maxtext.yml", "llama2-7b.yml"),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, "qwen3.yml", "qwen3-0.6b.yml"),
}


def tiny_model(r, family):
    heads = r.choice([4, 8])
    config_class, model_class, _, _ = FAMILIES[family]
    config = config_class(vocab_size=r.choice([64, 96]), hidden_size=r.choice([32, 48]),
                          intermediate_size=r.choice([40, 64]), num_hidden_layers=r.randint(1, 3),
                          num_attention_heads=heads, num_key_value_heads=r.choice([2, 4]), head_dim=r.choice([8, 16]),
                          tie_word_embeddings=r.random() < 0.5, rope_theta=r.choice([10000.0, 1000000.0]),
                          rms_norm_eps=r.choice([1e-5, 1e-6]))
    torch.manual_seed(r.randrange(2**31))
    return config, model_class(config).eval()


def maxtext_sets(config):
    """MaxText's keys for the HF config's sizes (what a user passes with --set)."""
    return dict(base_emb_dim=config.hidden_size, base_num_query_heads=config.num_attention_heads,
                base_num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
                base_mlp_dim=config.intermediate_size, base_num_decoder_layers=config.num_hidden_layers,
                vocab_size=config.vocab_size, normalization_layer_epsilon=config.rms_norm_eps,
                rope_max_timescale=config.rope_parameters["rope_theta"], logits_via_embedding=config.tie_word_embeddings,
                normalize_embedding_logits=False, weight_dtype="float32", dtype="float32")


def maxtext_model(family, config, tensor=1, model_file=None, **more):
    """MaxText's model file for the family, sized as the HF config."""
    sets = dict(maxtext_sets(config), ici_fsdp_parallelism=-1, ici_tensor_parallelism=tensor, **more)
    return tessel.load_maxtext_model(os.path.join(MAXTEXT, "models", model_file or FAMILIES[family][3]),
                                     os.path.join(MAXTEXT, "base.yml"), set=sets)


def assert_back_to_hf(item, hf, mapfile, head_dim, back, exact=False):
    """Through the same map back to safetensors: HF's tensors (a query's scale undone in float32),
    bit for bit when `exact`."""
    run("ckpt", "convert", item, back, "--map", mapfile, "--map-var", f"head_dim={head_dim}", "--to", "safetensors")
    saved, again = tensors_of(hf), tensors_of(back)
    assert sorted(saved) == sorted(again)
    for name, value in saved.items():
        if exact:
            np.testing.assert_array_equal(again[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(again[name], value, rtol=1e-6, atol=0, err_msg=name)


def relative_error(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_maxtext_families_give_transformers_logits_on_any_mesh(rng, tmp):
    for family in FAMILIES:
        config, model = tiny_model(rng, family)
        print(family, config.to_dict())
        hf = os.path.join(tmp, family)
        model.save_pretrained(hf)
        mapfile = os.path.join(ROOT, "examples", "maps", FAMILIES[family][2])
        item = os.path.join(tmp, family + "_item")
        run("ckpt", "convert", hf, item, "--map", mapfile, "--map-var", f"head_dim={config.head_dim}")

        tokens = np.random.default_rng(rng.randrange(2**31)).integers(0, config.vocab_size, (8, rng.randint(3, 12)),
                                                                       dtype=np.int32)
        with torch.no_grad():
            want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        for devices, tensor in [(1, 1), (8, 2)]:
            m = maxtext_model(family, config, tensor)
            mesh = m.maxtext_mesh(devices)
            params = tessel.checkpoint.restore(item, mesh=mesh)  # each device reads its blocks
            got = tessel.forward(m, params, tokens, mesh)
            assert got.shape == want.shape and got.dtype == np.float32
            err = relative_error(got, want)
            print(f"{family} on {devices} device(s), tensor={tensor}: logits within {err:.2e} of transformers'")
            assert err <= 1e-4, (family, devices, err)

        if family == "llama":
            # MaxText's llama takes the attention's 1/sqrt(head_dim) in the query kernel: the map for
            # tessel's own transformer (which applies it in the attention) gives other logits here.
            plain = os.path.join(tmp, "llama_plain")
            run("ckpt", "convert", hf, plain, "--map", os.path.join(ROOT, "examples", "maps", "llama.yml"),
                "--map-var", f"head_dim={config.head_dim}")
            m = maxtext_model(family, config)
            mesh = m.maxtext_mesh(1)
            assert relative_error(tessel.forward(m, tessel.checkpoint.restore(plain, mesh=mesh), tokens, mesh),
                                  want) > 1e-3

        # Back to HF's names and layouts through the same map: HF's weights (the query's scale undone
        # in float32).
        assert_back_to_hf(item, hf, mapfile, config.head_dim, os.path.join(tmp, family + "_back"))


def test_llama31_through_its_map_gives_transformers_logits(rng, tmp):
    """MaxText's llama3.1 model files rotate neighbouring pairs of head_dim with Llama 3.1's scaled
    frequencies (LLaMARotaryEmbedding); HF keeps halves, so examples/maps/llama31_maxtext.yml
    interleaves the query and key kernels' head_dim (as MaxText's conversion does). Through it, HF's
    llama3 rope and tessel's give the same logits, at positions long enough for the scaling to
    matter, and the map takes the weights back to HF's."""
    config, _ = tiny_model(rng, "llama")
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    torch.manual_seed(rng.randrange(2**31))
    model = transformers.LlamaForCausalLM(config).eval()
    hf = os.path.join(tmp, "hf")
    model.save_pretrained(hf)
    mapfile = os.path.join(ROOT, "examples", "maps", "llama31_maxtext.yml")
    item = os.path.join(tmp, "item")
    run("ckpt", "convert", hf, item, "--map", mapfile, "--map-var", f"head_dim={config.head_dim}")
    tokens = np.random.default_rng(rng.randrange(2**31)).integers(0, config.vocab_size, (2, 128), dtype=np.int32)
    with torch.no_grad():
        want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    m = maxtext_model("llama", config, model_file="llama3.1-8b.yml")
    mesh = m.maxtext_mesh(1)
    weights = {p: a.to_numpy() for p, a in leaves(tessel.checkpoint.restore(item, mesh=mesh)).items()}
    err = relative_error(tessel.forward(m, weights, tokens, mesh), want)
    print(f"llama3.1: logits within {err:.2e} of transformers' llama3 rope")
    assert err <= 1e-4
    # Without the scaling (rope_use_scale=false), or through the map without the interleave, the
    # logits differ (small random weights attend weakly, so the scaling shows less).
    unscaled = maxtext_model("llama", config, model_file="llama3.1-8b.yml", rope_use_scale=False)
    off = relative_error(tessel.forward(unscaled, weights, tokens, mesh), want)
    print(f"llama3.1 without the scaling: {off:.2e}")
    assert off > 10 * max(err, 1e-7)
    plain = os.path.join(tmp, "plain")
    run("ckpt", "convert", hf, plain, "--map", os.path.join(ROOT, "examples", "maps", "llama_maxtext.yml"),
        "--map-var", f"head_dim={config.head_dim}")
    assert relative_error(tessel.forward(m, tessel.checkpoint.restore(plain, mesh=mesh), tokens, mesh), want) > 1e-3
    assert_back_to_hf(item, hf, mapfile, config.head_dim, os.path.join(tmp, "back"))


DATA = "/usr/share/common-licenses/GPL-3"


def test_a_hf_checkpoint_fine_tunes_sharded_and_goes_back_to_transformers(rng, tmp):
    """Hugging Face -> MaxText's tree -> `tessel train --init-from` on 8 devices -> safetensors that
    transformers loads: the first loss is HF's own on that batch, and the trained model's logits in
    transformers equal tessel's."""
    probe = os.environ.get("TESSEL_TRAIN_PROBE")
    assert probe and os.path.exists(probe), "TESSEL_TRAIN_PROBE names the train_probe helper (ctest sets it)"
    config, _ = tiny_model(rng, "qwen3")
    config.vocab_size = 256  # tessel train reads bytes
    torch.manual_seed(rng.randrange(2**31))
    model = transformers.Qwen3ForCausalLM(config).eval()
    hf = os.path.join(tmp, "hf")
    model.save_pretrained(hf)
    mapfile = os.path.join(ROOT, "examples", "maps", "qwen3.yml")
    run("ckpt", "convert", hf, os.path.join(tmp, "item"), "--map", mapfile, "--map-var", f"head_dim={config.head_dim}")
    m = maxtext_model("qwen3", config, tensor=2)
    sets = [f"{k}={json.dumps(v)}" for k, v in maxtext_sets(config).items()]  # JSON values are YAML
    seed, steps, batch, seq = rng.randrange(1000), 3, 8, 16
    metrics = os.path.join(tmp, "metrics.jsonl")
    out = run("train", "--model", os.path.join(MAXTEXT, "models", "qwen3-0.6b.yml"), "--base",
              os.path.join(MAXTEXT, "base.yml"), *[a for s in sets for a in ("--set", s)], "--mesh", "fsdp=4,tensor=2",
              "--init-from", os.path.join(tmp, "item"), "--steps", steps, "--batch", batch, "--seq", seq, "--seed", seed,
              "--data", DATA, "--checkpoint-dir", os.path.join(tmp, "run"), "--metrics", metrics)
    assert "initialized" in out, out
    losses = [json.loads(line)["loss"] for line in open(metrics)]

    subprocess.run([probe, "batches", DATA, str(seed), "1", str(batch), str(seq), os.path.join(tmp, "batches")],
                   check=True, capture_output=True)
    batches = tessel.checkpoint.restore(os.path.join(tmp, "batches"))
    inputs, targets = batches["inputs"].to_numpy()[0], batches["targets"].to_numpy()[0]
    with torch.no_grad():
        logits = model(torch.tensor(inputs, dtype=torch.long)).logits
        hf_loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), torch.tensor(targets).long().reshape(-1)))
    print(f"first loss: tessel {losses[0]:.6f}, transformers {hf_loss:.6f}; then {losses[1:]}")
    assert abs(losses[0] - hf_loss) <= 1e-5 * abs(hf_loss)

    # Back: the trained parameters (not the optimizer's moments) as HF's safetensors.
    back = os.path.join(tmp, "back")
    run("ckpt", "convert", os.path.join(tmp, "run", str(steps), "default"), back, "--select",
        "token_embedder.*,decoder.*", "--map", mapfile, "--map-var", f"head_dim={config.head_dim}", "--to", "safetensors")
    config.save_pretrained(back)
    trained = transformers.Qwen3ForCausalLM.from_pretrained(back).eval()
    assert not torch.equal(trained.model.norm.weight, model.model.norm.weight)  # it trained
    params = tessel.checkpoint.restore(os.path.join(tmp, "run", str(steps), "default"), mesh=m.maxtext_mesh(8),
                                       select=["token_embedder.*", "decoder.*"])
    with torch.no_grad():
        want = trained(torch.tensor(inputs, dtype=torch.long)).logits.numpy()
    assert relative_error(tessel.forward(m, params, inputs, m.maxtext_mesh(8)), want) <= 1e-4

    # A checkpoint without this model's parameters is named, with what it lacks.
    r = subprocess.run([cli(), "train", "--model", os.path.join(MAXTEXT, "models", "qwen3-0.6b.yml"), "--base",
                        os.path.join(MAXTEXT, "base.yml"), *[a for s in sets for a in ("--set", s)], "--mesh", "fsdp=8",
                        "--init-from", os.path.join(tmp, "batches"), "--steps", "1"], capture_output=True, text=True)
    assert r.returncode != 0 and "does not hold this model's parameters" in r.stderr and "it lacks 'decoder/" in r.stderr, \
        r.stderr


MOE_FAMILIES = {  # HF classes, the map, MaxText's model file and --set for the family
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, "mixtral_maxtext.yml", "llama2-7b.yml",
                {"decoder_block": "mixtral"}),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, "qwen3_moe_maxtext.yml",
                  "qwen3-0.6b.yml", {"decoder_block": "qwen3_moe", "norm_topk_prob": True}),
}


def tiny_moe_model(r, family):
    config_class, model_class = MOE_FAMILIES[family][:2]
    experts = r.choice([4, 8])
    sizes = dict(vocab_size=r.choice([64, 96]), hidden_size=r.choice([32, 48]), intermediate_size=r.choice([24, 40]),
                 num_hidden_layers=r.randint(1, 3), num_attention_heads=4, num_key_value_heads=r.choice([2, 4]),
                 head_dim=8, tie_word_embeddings=r.random() < 0.5, rope_theta=r.choice([10000.0, 1000000.0]),
                 rms_norm_eps=r.choice([1e-5, 1e-6]), num_experts_per_tok=r.choice([1, 2, 3]))
    if family == "mixtral":
        config = config_class(num_local_experts=experts, **sizes)
    else:
        config = config_class(num_experts=experts, moe_intermediate_size=sizes["intermediate_size"], norm_topk_prob=True,
                              **sizes)
    torch.manual_seed(r.randrange(2**31))
    return config, model_class(config).eval()


def test_moe_families_give_transformers_logits_with_expert_parallelism(rng, tmp):
    """Mixtral and Qwen3-MoE from transformers (random, tiny; save_pretrained writes one tensor per
    expert) through the shipped maps (examples/maps/mixtral_maxtext.yml, qwen3_moe_maxtext.yml:
    the experts stack into MaxText's [experts, layers, in, out]) and MaxText's mixtral and qwen3_moe
    decoder blocks sized by --set: the same logits (f32, 1e-4 relative) on 1 device and on 8 with
    expert and tensor parallelism (tokens dispatched to their experts' devices by all_to_all), and
    back through the maps to HF's tensors."""
    for family in MOE_FAMILIES:
        config, model = tiny_moe_model(rng, family)
        print(family, config.to_dict())
        hf = os.path.join(tmp, family)
        model.save_pretrained(hf)
        _, _, mapname, model_file, family_sets = MOE_FAMILIES[family]
        mapfile = os.path.join(ROOT, "examples", "maps", mapname)
        item = os.path.join(tmp, family + "_item")
        run("ckpt", "convert", hf, item, "--map", mapfile, "--map-var", f"head_dim={config.head_dim}")
        tokens = np.random.default_rng(rng.randrange(2**31)).integers(0, config.vocab_size, (8, rng.randint(3, 12)),
                                                                       dtype=np.int32)
        with torch.no_grad():
            want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        experts = config.num_local_experts if family == "mixtral" else config.num_experts
        sets = dict(family_sets, num_experts=experts, num_experts_per_tok=config.num_experts_per_tok,
                    base_moe_mlp_dim=config.intermediate_size)
        for devices, tensor, expert in [(1, 1, 1), (8, 2, 4), (8, 1, 8)]:
            m = maxtext_model(family, config, tensor, model_file=model_file, ici_expert_parallelism=expert, **sets)
            mesh = m.maxtext_mesh(devices)
            got = tessel.forward(m, tessel.checkpoint.restore(item, mesh=mesh), tokens, mesh)
            err = relative_error(got, want)
            print(f"{family} on {devices} device(s), tensor={tensor}, expert={expert}: logits within {err:.2e} "
                  "of transformers'")
            assert err <= 1e-4, (family, devices, err)
        assert_back_to_hf(item, hf, mapfile, config.head_dim, os.path.join(tmp, family + "_back"))


def tiny_deepseek(r, version):
    """A random tiny DeepSeek-V2 or V3 from transformers, with MaxText's --set for the same sizes."""
    first_dense = r.randint(1, 2)
    layers = first_dense + r.randint(1, 2)
    nope, rope, v = r.choice([8, 16]), r.choice([4, 8]), r.choice([8, 16])
    experts, mscale = r.choice([4, 8]), r.choice([0.707, 1.0])
    # V2 as DeepSeek-V2-Lite and MaxText's deepseek2-16b: no query LoRA (q_proj); V3 with one.
    q_lora = 16 if version == "v3" else None
    yarn = {"rope_type": "yarn", "rope_theta": r.choice([10000.0, 50000.0]), "factor": 40.0,
            "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale,
            "mscale_all_dim": mscale}
    sizes = dict(vocab_size=r.choice([64, 96]), hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                 num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=experts,
                 num_experts_per_tok=r.choice([1, 2, 3]), n_shared_experts=1, first_k_dense_replace=first_dense,
                 q_lora_rank=q_lora, kv_lora_rank=8, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
                 routed_scaling_factor=r.choice([1.0, 2.5]), rms_norm_eps=1e-6, max_position_embeddings=163840,
                 rope_parameters=yarn, tie_word_embeddings=False)
    sets = dict(base_emb_dim=32, base_num_query_heads=4, base_num_kv_heads=4, base_mlp_dim=48, base_moe_mlp_dim=16,
                base_num_decoder_layers=layers, first_num_dense_layers=first_dense, vocab_size=sizes["vocab_size"],
                q_lora_rank=q_lora or 0, kv_lora_rank=8, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
                num_experts=experts, num_experts_per_tok=sizes["num_experts_per_tok"], shared_experts=1,
                routed_scaling_factor=sizes["routed_scaling_factor"], normalization_layer_epsilon=1e-6,
                rope_max_timescale=yarn["rope_theta"], rope_factor=40, mscale=mscale, max_position_embeddings=163840,
                original_max_position_embeddings=4096, weight_dtype="float32", dtype="float32", ici_fsdp_parallelism=-1)
    if version == "v3":
        # Group-limited routing: the best topk_group of 2 groups (MaxText's n_routing_groups).
        groups, topk_groups = 2, r.randint(1, 2)
        if sizes["num_experts_per_tok"] > topk_groups * experts // groups:
            topk_groups = groups  # enough experts in the chosen groups for the top-k
        config = transformers.DeepseekV3Config(n_group=groups, topk_group=topk_groups, rope_interleave=True, **sizes)
        sets.update(n_routing_groups=groups, topk_routing_group=topk_groups)
        model_class, model_file = transformers.DeepseekV3ForCausalLM, "deepseek3-tiny.yml"
    else:
        # V2: softmax scores, the greedy top-k weighted by them (deepseek2-16b.yml's routing).
        config = transformers.DeepseekV2Config(topk_method="greedy", **sizes)
        model_class, model_file = transformers.DeepseekV2ForCausalLM, "deepseek2-16b.yml"
    torch.manual_seed(r.randrange(2**31))
    model = model_class(config).eval()
    if version == "v3":
        # A bias that changes which experts are chosen. Non-negative, as trained ones are in effect:
        # transformers gives the experts outside the chosen groups a score of 0 where MaxText gives
        # them -inf, which differ once a chosen expert's biased score falls below 0.
        with torch.no_grad():
            for layer in model.model.layers[first_dense:]:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.rand(experts) * 0.5)
    return config, model, model_file, sets


def test_deepseek_gives_transformers_logits_with_expert_parallelism(rng, tmp):
    """DeepSeek-V2 and V3 from transformers (random, tiny: MLA (V2 without a query LoRA, as V2-Lite;
    V3 with low-rank queries), YaRN rope with
    neighbouring pairs and mscale, dense then MoE layers, a shared expert; V2 with softmax routing,
    V3 with sigmoid routing, a random e_score_correction_bias choosing the experts and group-limited
    routing) through examples/maps/deepseek_maxtext.yml into MaxText's deepseek2-16b / deepseek3-tiny
    files sized by --set: the same logits (f32, 1e-4 relative) on 1 device and on 8 with expert and
    tensor parallelism, and back to HF's tensors bit for bit."""
    for version in ("v2", "v3"):
        config, model, model_file, sets = tiny_deepseek(rng, version)
        print(version, config.to_dict())
        hf = os.path.join(tmp, version)
        model.save_pretrained(hf)
        mapfile = os.path.join(ROOT, "examples", "maps", "deepseek_maxtext.yml")
        nope, v = config.qk_nope_head_dim, config.v_head_dim
        map_vars = ["--map-var", f"first_dense={config.first_k_dense_replace},qk_head_dim={nope + config.qk_rope_head_dim},"
                    f"kv_head_dim={nope + v},v_head_dim={v}"]
        item = os.path.join(tmp, version + "_item")
        run("ckpt", "convert", hf, item, "--map", mapfile, *map_vars)
        tokens = np.random.default_rng(rng.randrange(2**31)).integers(0, config.vocab_size, (8, rng.randint(3, 12)),
                                                                       dtype=np.int32)
        with torch.no_grad():
            want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        expect_logits(model_file, sets, lambda mesh: tessel.checkpoint.restore(item, mesh=mesh), tokens, want,
                      [(1, 1, 1), (8, 2, 4), (8, 1, 8)])
        back = os.path.join(tmp, version + "_back")
        run("ckpt", "convert", item, back, "--map", mapfile, *map_vars, "--to", "safetensors")
        saved, again = tensors_of(hf), tensors_of(back)
        assert sorted(saved) == sorted(again)
        for name, value in saved.items():
            np.testing.assert_array_equal(again[name], value, err_msg=name)


def expect_logits(model_file, sets, weights_on, tokens, want, meshes):
    """MaxText's model file sized by `sets` gives `want` (1e-4 relative) on each (devices, tensor,
    expert) mesh, with the weights `weights_on(mesh)` gives."""
    for devices, tensor, expert in meshes:
        m = tessel.load_maxtext_model(os.path.join(MAXTEXT, "models", model_file), os.path.join(MAXTEXT, "base.yml"),
                                      set=dict(sets, ici_tensor_parallelism=tensor, ici_expert_parallelism=expert))
        mesh = m.maxtext_mesh(devices)
        err = relative_error(tessel.forward(m, weights_on(mesh), tokens, mesh), want)
        print(f"{model_file} on {devices} device(s), tensor={tensor}, expert={expert}: logits within {err:.2e} "
              "of transformers'")
        assert err <= 1e-4, (model_file, devices, err)


def hf_gpt_oss_to_maxtext(sd, config):
    """MaxText's unscanned gpt-oss tree (layers_0, layers_1, ...) of a HF GPT-OSS state dict, as
    MaxText's gpt-oss conversion lays it out: kernels [in, out], heads split, and HF's fused
    gate_up_proj (gate and up interleaved by column) split into wi_0 and wi_1."""
    d, e = config.head_dim, config.hidden_size
    out = {"token_embedder/embedding": sd["model.embed_tokens.weight"],
           "decoder/decoder_norm/scale": sd["model.norm.weight"],
           "decoder/logits_dense/kernel": sd["lm_head.weight"].T}
    for i in range(config.num_hidden_layers):
        hf, mt = f"model.layers.{i}.", f"decoder/layers_{i}/"
        out[mt + "pre_self_attention_layer_norm/scale"] = sd[hf + "input_layernorm.weight"]
        out[mt + "post_self_attention_layer_norm/scale"] = sd[hf + "post_attention_layernorm.weight"]
        a = mt + "GptOssAttention/"
        for ours, theirs in [("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")]:
            out[a + ours + "/kernel"] = sd[hf + f"self_attn.{theirs}.weight"].T.reshape(e, -1, d)
            out[a + ours + "/bias"] = sd[hf + f"self_attn.{theirs}.bias"].reshape(-1, d)
        out[a + "out/kernel"] = sd[hf + "self_attn.o_proj.weight"].T.reshape(-1, d, e)
        out[a + "out/bias"] = sd[hf + "self_attn.o_proj.bias"]
        out[a + "sinks"] = sd[hf + "self_attn.sinks"]
        m = mt + "GptOssMlp/"
        out[m + "gate/kernel"] = sd[hf + "mlp.router.weight"].T
        out[m + "gate/bias"] = sd[hf + "mlp.router.bias"]
        gate_up, gate_up_bias = sd[hf + "mlp.experts.gate_up_proj"], sd[hf + "mlp.experts.gate_up_proj_bias"]
        out[m + "wi_0"], out[m + "wi_1"] = gate_up[..., ::2], gate_up[..., 1::2]
        out[m + "wi_0_bias"], out[m + "wi_1_bias"] = gate_up_bias[..., ::2], gate_up_bias[..., 1::2]
        out[m + "wo"] = sd[hf + "mlp.experts.down_proj"]
        out[m + "wo_bias"] = sd[hf + "mlp.experts.down_proj_bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def test_gpt_oss_gives_transformers_logits_with_expert_parallelism(rng, tmp):
    """GPT-OSS from transformers (random, tiny; biases and sinks set random so they matter): attention
    with biases and sinks, sliding and full layers alternating, YaRN rope (halves, untruncated, with
    its attention scaling), routed experts with biases and the clipped GLU. Through MaxText's
    gpt-oss-20b file sized by --set (unscanned), the same logits (f32, 1e-4 relative) on 1 device and
    on 8 with expert and tensor parallelism. The weights go through examples/maps/gpt_oss_maxtext.yml
    (HF fuses gate and up by alternating columns: two take rules split them), each tensor equal to
    MaxText's gpt-oss conversion re-stated in NumPy (hf_gpt_oss_to_maxtext), and back to HF's
    tensors bit for bit."""
    from safetensors.numpy import load_file
    layers, experts, window = 2 * rng.randint(1, 2), rng.choice([4, 8]), rng.randint(2, 6)
    config = transformers.GptOssConfig(
        vocab_size=rng.choice([64, 96]), hidden_size=32, intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=experts,
        num_experts_per_tok=rng.choice([1, 2, 3]), sliding_window=window, swiglu_limit=rng.choice([0.5, 7.0]))
    torch.manual_seed(rng.randrange(2**31))
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.copy_(torch.randn(p.shape) * 0.5)
    print(config.to_dict())
    hf = os.path.join(tmp, "hf")
    model.save_pretrained(hf)
    mapfile = os.path.join(ROOT, "examples", "maps", "gpt_oss_maxtext.yml")
    item = os.path.join(tmp, "item")
    run("ckpt", "convert", hf, item, "--map", mapfile, "--map-var", f"head_dim={config.head_dim}")
    restated = hf_gpt_oss_to_maxtext(load_file(os.path.join(hf, "model.safetensors")), config)
    converted = {p: a.to_numpy() for p, a in leaves(tessel.checkpoint.restore(item, mesh=tessel.Mesh({"x": 1}))).items()}
    assert sorted(converted) == sorted(restated)
    for p, a in restated.items():
        np.testing.assert_array_equal(converted[p], a, err_msg=p)
    tokens = np.random.default_rng(rng.randrange(2**31)).integers(0, config.vocab_size, (8, rng.randint(6, 14)),
                                                                   dtype=np.int32)
    with torch.no_grad():
        want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    yarn = config.rope_parameters
    sets = dict(base_emb_dim=32, base_num_query_heads=4, base_num_kv_heads=2, head_dim=8, base_mlp_dim=16,
                base_moe_mlp_dim=16, base_num_decoder_layers=layers, vocab_size=config.vocab_size, num_experts=experts,
                num_experts_per_tok=config.num_experts_per_tok, sliding_window_size=window,
                mlp_activations_limit=config.swiglu_limit, normalization_layer_epsilon=config.rms_norm_eps,
                rope_max_timescale=yarn["rope_theta"], rope_factor=yarn["factor"],
                original_max_position_embeddings=yarn["original_max_position_embeddings"],
                max_position_embeddings=config.max_position_embeddings, scan_layers=False,
                weight_dtype="float32", dtype="float32", ici_fsdp_parallelism=-1)
    expect_logits("gpt-oss-20b.yml", sets, lambda mesh: tessel.checkpoint.restore(item, mesh=mesh), tokens, want,
                  [(1, 1, 1), (8, 2, 2), (8, 1, 4)])
    assert_back_to_hf(item, hf, mapfile, config.head_dim, os.path.join(tmp, "back"), exact=True)
