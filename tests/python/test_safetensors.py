"""safetensors against the real `safetensors` package (numpy API), Orbax and JAX.

- tessel writes random sharded trees (one file, and Hugging Face sharded sets with an index);
  safetensors.numpy loads every tensor bit-identically, with the metadata.
- safetensors.numpy writes random tensors (one file, and a set with a hand-made index as
  transformers writes it); tessel restores them onto random meshes of 8 devices, as NumPy blocks
  and as jax.Arrays, bit-identically.
- convert: safetensors -> Orbax (read back by Orbax itself) -> safetensors (read back by the
  package), through the Python API and the CLI; every tensor's bytes survive.
"""
import json
import os
import subprocess

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy as stnp
from safetensors import safe_open

import tessel
from conftest import cli
from trees import assert_bit_identical, random_array, random_jax_mesh, sharding

DTYPES = ["float32", "bfloat16", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool"]


def random_tensors(r, n):
    """{dotted name: array} as a model's state dict: nested names, scalars and 0-size included."""
    out = {}
    for i in range(n):
        rank = r.choice([0, 1, 2, 2, 3])
        shape = tuple(r.choice([0, 1, 3, 4, 8]) if r.random() < 0.1 else r.choice([1, 2, 4, 6, 8, 16]) for _ in range(rank))
        name = ".".join(["model", "layers", str(r.randrange(4)), r.choice(["mlp", "attn"]), f"w{i}"])
        out[name] = np.asarray(random_array(r, shape, r.choice(DTYPES)))
    return out


def nested(flat):
    tree = {}
    for name, value in flat.items():
        node = tree
        keys = name.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return tree


def leaf(tree, name):
    for k in name.split("."):
        tree = tree[k]
    return tree


def test_safetensors_reads_what_tessel_writes(rng, tmp):
    files = 0
    for trial in range(6):
        flat = random_tensors(rng, rng.randint(1, 8) if trial % 2 == 0 else rng.randint(3, 8))
        mesh = tessel.Mesh({"x": 2, "y": 4})
        shardings = {}
        for name, a in flat.items():
            spec = [None] * a.ndim
            for axis, size in (("x", 2), ("y", 4)):
                dims = [d for d in range(a.ndim) if spec[d] is None and a.shape[d] % size == 0 and a.shape[d] > 0]
                if dims and rng.random() < 0.6:
                    spec[rng.choice(dims)] = axis
            shardings[name.replace(".", "/")] = tessel.NamedSharding(mesh, tessel.P(*spec))
        out = os.path.join(tmp, f"out{trial}")
        limit = [0, 1, 0, 64, 0, 300][trial]  # 1: a file per tensor
        tessel.checkpoint.save_safetensors(out, nested(flat), shardings=shardings, max_file_bytes=limit,
                                           metadata={"format": "pt", "trial": str(trial)})
        names = sorted(os.listdir(out))
        if "model.safetensors.index.json" in names:
            index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
            assert sorted(index["weight_map"]) == sorted(flat)
            assert index["metadata"]["total_size"] == sum(a.nbytes for a in flat.values())
            files += len(names) - 1
            loaded = {}
            for name, f in index["weight_map"].items():
                loaded[name] = stnp.load_file(os.path.join(out, f))[name]
        else:
            assert names == ["model.safetensors"], names
            loaded = stnp.load_file(os.path.join(out, "model.safetensors"))
            with safe_open(os.path.join(out, "model.safetensors"), framework="numpy") as f:
                assert f.metadata() == {"format": "pt", "trial": str(trial)}
        assert sorted(loaded) == sorted(flat)
        for name, want in flat.items():
            assert_bit_identical(loaded[name], want, f"{name} (trial {trial}, limit {limit})")
    assert files >= 2, "some trials wrote sharded sets"


def write_hf_set(r, directory, flat, pieces):
    """What transformers writes for a large model: several files and model.safetensors.index.json."""
    os.makedirs(directory)
    names = sorted(flat)
    groups = [names[i::pieces] for i in range(pieces)]
    weight_map = {}
    for i, group in enumerate(groups):
        f = f"model-{i + 1:05d}-of-{pieces:05d}.safetensors"
        stnp.save_file({n: flat[n] for n in group}, os.path.join(directory, f), metadata={"format": "pt"})
        weight_map.update({n: f for n in group})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(a.nbytes for a in flat.values())}, "weight_map": weight_map}, f)


def test_tessel_restores_what_safetensors_writes_onto_any_mesh(rng, tmp, x64):
    checked = 0
    for trial in range(6):
        flat = random_tensors(rng, rng.randint(2, 9))
        if trial % 2:
            src = os.path.join(tmp, f"set{trial}")
            write_hf_set(rng, src, flat, min(len(flat), rng.randint(2, 4)))
        else:
            src = os.path.join(tmp, f"one{trial}.safetensors")
            stnp.save_file(flat, src, metadata={"format": "pt"})
        info = tessel.checkpoint.info(src)
        assert info["storage"] == "safetensors" and info["metadata"]["format"] == "pt"
        assert tessel.checkpoint.verify(src)["faults"] == []
        # Onto a random JAX mesh of 8 devices with a random sharding per tensor, as jax.Arrays.
        jmesh = random_jax_mesh(rng, jax.devices())
        target = {n.replace(".", "/"): jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding(rng, jmesh, a.shape))
                  for n, a in flat.items()}
        got = tessel.checkpoint.restore(src, shardings=target, as_jax=True)
        for name, want in flat.items():
            arr = leaf(got, name)
            assert arr.sharding == target[name.replace(".", "/")].sharding, name
            assert_bit_identical(np.asarray(arr), want, f"{name} from {os.path.basename(src)}")
            checked += 1
        # And as NumPy blocks on a tessel mesh of 16 devices: each block is its slice.
        mesh16 = tessel.Mesh({"a": 4, "b": 4})
        blocks = tessel.checkpoint.restore(src, mesh=mesh16)
        for name, want in flat.items():
            for s in leaf(blocks, name).shards:
                assert_bit_identical(s.data, want[s.index], name)
    assert checked >= 20


def test_convert_safetensors_to_orbax_and_back(rng, tmp, x64):
    flat = random_tensors(rng, 8)
    src = os.path.join(tmp, "hf")
    write_hf_set(rng, src, flat, 3)
    # Python API: safetensors -> Orbax item, read by Orbax itself.
    item = os.path.join(tmp, "orbax_item")
    assert tessel.checkpoint.convert(src, item, mesh=tessel.Mesh({"x": 2})) == "orbax"
    jmesh = random_jax_mesh(rng, jax.devices())
    target = nested({n: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding(rng, jmesh, a.shape))
                     for n, a in flat.items()})
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(item), target)
    for name, want in flat.items():
        assert_bit_identical(np.asarray(leaf(restored, name)), want, f"Orbax reads {name}")
    # Orbax -> safetensors again, by the CLI: the package reads the very bytes.
    back = os.path.join(tmp, "back")
    r = subprocess.run([cli(), "ckpt", "convert", item, back, "--max-file-mb", "0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    loaded = stnp.load_file(os.path.join(back, "model.safetensors"))
    assert sorted(loaded) == sorted(flat)
    for name, want in flat.items():
        assert_bit_identical(loaded[name], want, f"round trip {name}")
    # With a cast: every floating tensor to bf16, as the package would store it.
    cast = os.path.join(tmp, "cast")
    r = subprocess.run([cli(), "ckpt", "convert", src, cast, "--to", "safetensors", "--dtype", "bf16"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    loaded = stnp.load_file(os.path.join(cast, "model.safetensors"))
    for name, want in flat.items():
        assert loaded[name].dtype == ml_dtypes.bfloat16
        if want.dtype.kind == "f":
            assert_bit_identical(loaded[name], want.astype(ml_dtypes.bfloat16), f"cast {name}")
    # info and verify on the CLI.
    r = subprocess.run([cli(), "ckpt", "info", src, "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["storage"] == "safetensors", r.stderr
    r = subprocess.run([cli(), "ckpt", "verify", os.path.join(src, "model.safetensors.index.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "0 faults" in r.stdout, r.stdout + r.stderr


def test_convert_streams_tensors_larger_than_the_budget_to_safetensors(rng, tmp):
    """Orbax items whose tensors are several times `memory_mb`, chunked along any axes, stored
    uncompressed (read in ranges of whole rows) or zstd (rows of whole chunks, or the chunks'
    slabs where such a row does not fit), convert to safetensors bit for bit."""
    mesh = tessel.Mesh({"x": 2, "y": 4})
    # The first: zstd chunks of 256 KiB along axis 0, so that rows of whole chunks fit the budget.
    cases = [((4096, 2, 64), tessel.P("x"), "zstd", 256 << 10)]
    for _ in range(3):
        cases.append(((rng.choice([128, 256, 512]), rng.choice([4, 8]), rng.choice([1024, 2048])),  # 2 to 32 MiB
                      rng.choice([tessel.P("x", None, "y"), tessel.P(None, "y", "x"), tessel.P("x"), tessel.P(None, None, "y")]),
                      rng.choice(["none", "zstd"]), rng.choice([256 << 10, 1 << 20, 4 << 20])))
    for case, (shape, spec, compression, chunk_bytes) in enumerate(cases):
        w = np.random.default_rng(rng.randrange(2**31)).standard_normal(shape).astype(np.float32)
        item = os.path.join(tmp, f"item{case}")
        tessel.checkpoint.save(item, {"w": w, "b": w[0, 0]}, mesh=mesh, shardings={"w": tessel.NamedSharding(mesh, spec)},
                               compression=compression, max_chunk_bytes=chunk_bytes)
        out = os.path.join(tmp, f"out{case}")
        tessel.checkpoint.convert(item, out, to="safetensors", memory_mb=1)
        got = stnp.load_file(os.path.join(out, "model.safetensors"))
        print(case, shape, spec, compression, f"{w.nbytes / 2**20:.0f} MiB")
        assert got["w"].tobytes() == w.tobytes() and got["b"].tobytes() == w[0, 0].tobytes()


def test_bad_safetensors_are_clear_errors(tmp):
    path = os.path.join(tmp, "w.safetensors")
    stnp.save_file({"w": np.arange(16, dtype=np.float32)}, path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    with pytest.raises(tessel.Error, match="w.safetensors"):
        tessel.checkpoint.restore(path)
    with pytest.raises(tessel.Error, match="step"):
        tessel.checkpoint.restore(path, step=3)
    with pytest.raises(tessel.ArgumentError, match="max_file_bytes"):
        tessel.checkpoint.save_safetensors(os.path.join(tmp, "x"), {"w": np.zeros(2)}, max_file_bytes=-1)
    with pytest.raises(tessel.Error, match="holds a '.'"):
        tessel.checkpoint.save_safetensors(os.path.join(tmp, "y"), {"a.b": {"c": np.zeros(2)}})
