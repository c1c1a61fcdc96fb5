"""tessel's key-map conversion against MaxText 0.2.5's own converter (to_maxtext), on one
synthetic Hugging Face checkpoint of about 1.5 GiB (bf16, a Qwen3-8B-style dense model: q/k norms,
untied head), both writing MaxText's parameter-only checkpoint in bfloat16:

  - MaxText: `python -m maxtext.checkpoint_conversion.to_maxtext` (through
    tests/python/maxtext_to_maxtext.py, which points its key tables at the model's config.json)
    with its defaults: lazy loading, 16 simulated CPU devices, OCDBT;
  - tessel: `tessel ckpt convert HF OUT --map examples/maps/qwen3.yml --to maxtext-params`.

Runs alternate (ROUNDS of each), medians of wall time and peak RSS (/usr/bin/time -v), and this
disk's own write+read rate (bench_checkpoint raw) beside them. The two checkpoints are compared
array by array once (bit for bit). Needs .venv-maxtext (scripts/venv.sh maxtext); about 6 GiB of
disk, removed at the end.

    .venv/bin/python bench/maxtext_convert_bench.py --build build-test [--rounds 3] [--layers 13]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_map_bench import BF16, dense_shapes, disk_rate, measure, write_source  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = dict(hidden=2048, mlp=6144, heads=16, kv_heads=8, head_dim=128, vocab=32768)


def write_config(hf, layers):
    import transformers
    c = transformers.Qwen3Config(vocab_size=SIZES["vocab"], hidden_size=SIZES["hidden"],
                                 intermediate_size=SIZES["mlp"], num_hidden_layers=layers,
                                 num_attention_heads=SIZES["heads"], num_key_value_heads=SIZES["kv_heads"],
                                 head_dim=SIZES["head_dim"], tie_word_embeddings=False, torch_dtype="bfloat16")
    c.to_json_file(os.path.join(hf, "config.json"))


def maxtext_args(python, hf, out, layers):
    maxtext = os.path.join(os.path.dirname(python), "..", "lib", "python3.12", "site-packages", "maxtext")
    sets = dict(base_emb_dim=SIZES["hidden"], base_num_query_heads=SIZES["heads"], base_num_kv_heads=SIZES["kv_heads"],
                head_dim=SIZES["head_dim"], base_mlp_dim=SIZES["mlp"], base_num_decoder_layers=layers,
                vocab_size=SIZES["vocab"], logits_via_embedding=False)
    return [python, os.path.join(ROOT, "tests", "python", "maxtext_to_maxtext.py"), "qwen3-8b", hf,
            os.path.join(maxtext, "configs", "base.yml"), "model_name=qwen3-8b", f"--hf_model_path={hf}",
            "override_model_config=true", f"base_output_directory={out}", "run_name=bench", "hardware=cpu",
            "skip_jax_distributed_system=true"] + [f"{k}={v}" for k, v in sets.items()]


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        p = f"{prefix}/{k}" if prefix else str(k)
        out.update(flat(v, p) if isinstance(v, dict) else {p: v})
    return out


def equal_parameters(a, b):
    import numpy as np
    import tessel
    mesh = tessel.Mesh({"x": 1})
    ours = {p: v for p, v in flat(tessel.checkpoint.restore(a, mesh=mesh)).items() if p.startswith("params/")}
    theirs = {p: v for p, v in flat(tessel.checkpoint.restore(b, mesh=mesh)).items() if p.startswith("params/")}
    if sorted(ours) != sorted(theirs):
        return f"different parameters: {sorted(set(ours) ^ set(theirs))}"
    for p in ours:
        x, y = ours[p].to_numpy(), theirs[p].to_numpy()
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
            return f"{p} differs"
    return f"all {len(ours)} parameters equal bit for bit"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-test"))
    ap.add_argument("--maxtext-python", default=os.path.join(ROOT, ".venv-maxtext", "bin", "python"))
    ap.add_argument("--layers", type=int, default=13)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scratch", default=None)
    args = ap.parse_args()
    cli = os.path.join(args.build, "src", "tessel")
    scratch = tempfile.mkdtemp(prefix="maxtext-convert-bench-", dir=args.scratch)
    try:
        hf = os.path.join(scratch, "hf")
        shapes = dense_shapes(args.layers, **SIZES)
        total = write_source(hf, shapes)
        write_config(hf, args.layers)
        print(f"source: {len(shapes)} tensors, {total / 2**30:.2f} GiB bf16, {args.layers} layers")
        disk_rate(args.build, scratch, min(total, 1 << 30))
        env = dict(os.environ, DECOUPLE_GCLOUD="TRUE", JAX_PLATFORMS="cpu")
        env.pop("PYTHONPATH", None)
        runs = {"maxtext": [], "tessel": []}
        for r in range(args.rounds):
            for name in ("maxtext", "tessel"):
                out = os.path.join(scratch, f"{name}{r}")
                if name == "maxtext":
                    cmd = maxtext_args(args.maxtext_python, hf, out, args.layers)
                else:
                    cmd = [cli, "ckpt", "convert", hf, out, "--map", os.path.join(ROOT, "examples", "maps", "qwen3.yml"),
                           "--map-var", f"head_dim={SIZES['head_dim']}", "--to", "maxtext-params"]
                runs[name].append(measure(f"{name} round {r}", cmd, total, env=env))
                if r > 0:
                    shutil.rmtree(out)
        print("compared:", equal_parameters(os.path.join(scratch, "tessel0", "0", "items"),
                                            os.path.join(scratch, "maxtext0", "0", "items")))
        med = {n: {k: statistics.median(x[k] for x in v) for k in ("seconds", "peak_rss_mib")} for n, v in runs.items()}
        for n, m in med.items():
            print(f"{n}: median {m['seconds']:.1f} s ({total / m['seconds'] / 1e9:.3f} GB/s), "
                  f"peak RSS {m['peak_rss_mib']:.0f} MiB")
        print(f"tessel / MaxText: {med['maxtext']['seconds'] / med['tessel']['seconds']:.1f}x faster, "
              f"{med['maxtext']['peak_rss_mib'] / med['tessel']['peak_rss_mib']:.1f}x less peak RSS")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
