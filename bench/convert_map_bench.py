"""Key-map conversions of a synthetic Hugging Face checkpoint, possibly larger than the machine's
memory, measured in one run beside this disk's own rate:

  1. the disk: `bench_checkpoint raw` (write + fsync, then read, 8 files) on a sample;
  2. the source: a bf16 safetensors set in HF's layout, written by the `safetensors` package
     (files of at most 2 GiB with an index): a dense Llama/Qwen3-style model (qwen3 map) or a
     Qwen3-MoE-style one with EXPERTS experts per layer (qwen3_moe_maxtext map);
  3. `tessel ckpt convert` without a map (safetensors -> Orbax item), the streaming baseline;
  4. through the map: HF -> MaxText's scanned layout (an Orbax item);
  5. the baseline the other way: that item -> safetensors without a map;
  6. back through the map: MaxText's layout -> safetensors, compared with the source tensor by
     tensor (BLAKE2 of each tensor's bytes, taken before the source is deleted to make room).

Each conversion runs under /usr/bin/time -v (peak RSS, wall). Disk: about 2.1x the model's size
at the peak (checked first); everything is removed at the end.

    .venv/bin/python bench/convert_map_bench.py --build build-test --kind dense --gib 30
    .venv/bin/python bench/convert_map_bench.py --build build-test --kind moe --gib 30 --experts 64
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = 2


def layer_shapes(i, hidden, heads, kv_heads, head_dim):
    """A Qwen3-style layer's norms and attention (q/k norms), HF's names and [out, in] layouts."""
    p = f"model.layers.{i}."
    return {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,)}


def dense_shapes(layers, hidden=4096, mlp=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256):
    out = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
           "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update(layer_shapes(i, hidden, heads, kv_heads, head_dim))
        out.update({p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
                    p + "mlp.down_proj.weight": (hidden, mlp)})
    return out


def moe_shapes(layers, experts, hidden=2048, moe=768, heads=32, kv_heads=4, head_dim=128, vocab=151936):
    out = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
           "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update(layer_shapes(i, hidden, heads, kv_heads, head_dim))
        out[p + "mlp.gate.weight"] = (experts, hidden)
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            out.update({q + "gate_proj.weight": (moe, hidden), q + "up_proj.weight": (moe, hidden),
                        q + "down_proj.weight": (hidden, moe)})
    return out


def model_of(kind, gib, experts):
    """The layer count that makes the model about `gib` GiB, and its tensors' shapes."""
    make = (lambda n: dense_shapes(n)) if kind == "dense" else (lambda n: moe_shapes(n, experts))
    size = lambda shapes: sum(int(np.prod(s)) for s in shapes.values()) * BF16
    one, two = size(make(1)), size(make(2))
    layers = max(1, round((gib * 2**30 - (2 * one - two)) / (two - one)))
    return layers, make(layers)


def write_source(out, shapes, file_bytes=2 << 30):
    """The set with the safetensors package, a file of at most `file_bytes` at a time; finite bf16
    values whose bits vary with each tensor (a fixed random block, xor-ed per tensor)."""
    import ml_dtypes
    import safetensors.numpy as stnp
    os.makedirs(out)
    rng = np.random.default_rng(0)
    block = ((rng.integers(0, 1 << 16, 1 << 25, dtype=np.uint32).astype(np.uint16) & 0x83FF) | 0x3C00)
    groups, current, size = [], [], 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * BF16
        if current and size + n > file_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    groups.append(current)
    weight_map = {}
    for f, names in enumerate(groups):
        part = {}
        for k, name in enumerate(names):
            n = int(np.prod(shapes[name]))
            reps = -(-n // block.size)
            bits = np.tile(block, reps)[:n] if reps > 1 else block[:n].copy()
            bits ^= np.uint16(zlib.crc32(name.encode()) & 0x1F)  # the low mantissa bits differ per tensor
            part[name] = bits.view(ml_dtypes.bfloat16).reshape(shapes[name])
        file = f"model-{f + 1:05d}-of-{len(groups):05d}.safetensors"
        stnp.save_file(part, os.path.join(out, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in names})
        del part
    total = sum(int(np.prod(s)) for s in shapes.values()) * BF16
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"))
    return total


def tensor_digests(directory):
    """BLAKE2 of each tensor's bytes in a safetensors set, read through safe_open."""
    from safetensors import safe_open
    out = {}
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(directory, file), framework="numpy") as f:
            for name in f.keys():
                out[name] = hashlib.blake2b(np.ascontiguousarray(f.get_tensor(name)).view(np.uint8)).hexdigest()
    return out


def measure(name, args, total, env=None):
    t0 = time.monotonic()
    r = subprocess.run(["/usr/bin/time", "-v"] + args, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    print(f"{name}: {wall:.1f} s, {total / wall / 1e9:.3f} GB/s, peak RSS {rss / 2**20:.0f} MiB")
    print("   ", r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    return {"seconds": wall, "gb_per_s": total / wall / 1e9, "peak_rss_mib": rss / 2**20}


def disk_rate(build, scratch, sample):
    r = subprocess.run([os.path.join(build, "bench", "bench_checkpoint"), "raw", os.path.join(scratch, "raw"),
                        str(sample)], capture_output=True, text=True, check=True)
    shutil.rmtree(os.path.join(scratch, "raw"), ignore_errors=True)
    print("disk:", r.stdout.strip().splitlines()[-1])
    return r.stdout


def settle(cold):
    """Written data on the disk; with `cold`, the page cache emptied too."""
    subprocess.run(["sync"], check=True)
    if cold:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--scratch", default=os.path.join(os.path.dirname(ROOT), "tessel-map-scratch"))
    ap.add_argument("--kind", choices=["dense", "moe"], default="dense")
    ap.add_argument("--gib", type=float, default=3)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before each conversion (root), so that a set smaller than the "
                         "machine's memory is read from the disk as a larger one is")
    a = ap.parse_args()
    tessel = os.path.join(a.build, "src", "tessel")
    layers, shapes = model_of(a.kind, a.gib, a.experts)
    total = sum(int(np.prod(s)) for s in shapes.values()) * BF16
    largest = max(int(np.prod(s)) for s in shapes.values()) * BF16
    shutil.rmtree(a.scratch, ignore_errors=True)
    os.makedirs(a.scratch)
    free = shutil.disk_usage(a.scratch).free
    if free < 2.1 * total + (4 << 30):
        sys.exit(f"{a.scratch}: {free / 2**30:.1f} GiB free, the run needs {(2.1 * total + (4 << 30)) / 2**30:.1f}")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"{a.kind}: {layers} layers{f', {a.experts} experts each' if a.kind == 'moe' else ''}, {len(shapes)} tensors, "
          f"{total / 2**30:.2f} GiB bf16 (largest tensor {largest / 2**20:.0f} MiB); machine memory "
          f"{mem / 2**30:.1f} GiB, {os.cpu_count()} cores")
    figures = {"kind": a.kind, "layers": layers, "tensors": len(shapes), "bytes": total, "largest": largest,
               "memory": mem}
    try:
        disk_rate(a.build, a.scratch, min(total, 4 << 30))
        hf = os.path.join(a.scratch, "hf")
        t0 = time.monotonic()
        write_source(hf, shapes)
        print(f"source written in {time.monotonic() - t0:.0f} s")
        settle(a.cold)
        figures["no_map"] = measure("safetensors -> Orbax, no map", [tessel, "ckpt", "convert", hf,
                                                                      os.path.join(a.scratch, "plain")], total)
        shutil.rmtree(os.path.join(a.scratch, "plain"))
        mapfile = os.path.join(ROOT, "examples", "maps", "qwen3.yml" if a.kind == "dense" else "qwen3_moe_maxtext.yml")
        maxtext = os.path.join(a.scratch, "maxtext")
        settle(a.cold)
        figures["forward"] = measure("HF -> MaxText through the map", [tessel, "ckpt", "convert", hf, maxtext,
                                                                        "--map", mapfile], total)
        digests = tensor_digests(hf)
        shutil.rmtree(hf)
        settle(a.cold)
        plain_back = os.path.join(a.scratch, "plain_back")
        figures["no_map_back"] = measure("Orbax -> safetensors, no map", [tessel, "ckpt", "convert", maxtext, plain_back],
                                         total)
        shutil.rmtree(plain_back)
        settle(a.cold)
        back = os.path.join(a.scratch, "back")
        figures["backward"] = measure("MaxText -> HF through the map", [tessel, "ckpt", "convert", maxtext, back,
                                                                         "--map", mapfile, "--to", "safetensors"], total)
        again = tensor_digests(back)
        differ = sorted(n for n in digests if again.get(n) != digests[n])
        assert set(again) == set(digests), sorted(set(again) ^ set(digests))[:10]
        print(f"back: {len(again)} tensors, {len(differ)} differ from the source {differ[:5]}")
        figures["bit_identical"] = not differ
        for d, plain in (("forward", "no_map"), ("backward", "no_map_back")):
            f = figures[d]
            print(f"{d}: {f['gb_per_s'] / figures[plain]['gb_per_s']:.2f}x the no-map conversion's rate (same "
                  f"direction), {f['gb_per_s'] / figures['no_map']['gb_per_s']:.2f}x safetensors -> Orbax's, "
                  f"peak RSS {f['peak_rss_mib']:.0f} MiB = {f['peak_rss_mib'] / (256 + largest / 2**20):.2f}x "
                  f"(256 MiB + the largest tensor)")
    finally:
        shutil.rmtree(a.scratch, ignore_errors=True)
    if a.json:
        json.dump(figures, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
