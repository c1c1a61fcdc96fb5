"""Interop with python zarr (zarr-python 3, from the project's environment), both ways.

1. zarr opens every array of tessel checkpoints (uncompressed and zstd) and its values
   equal `tessel ckpt export`'s .npy files: the plain layout directly, the OCDBT layout after the
   independent reference reader (../shared/tools/ocdbt_dump.py) has unpacked its keys.
2. tessel restores arrays zarr wrote with no compressor, zstd and blosc (multi-chunk, with
   edge chunks), inside an Orbax-style item directory.

Usage: zarr_interop.py TESSEL_CLI CKPT_HELPER TOOLS_DIR   (run with the environment of scripts/venv.sh)
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import zarr
from numcodecs import Blosc, Zstd

cli, helper, tools = sys.argv[1], sys.argv[2], sys.argv[3]


def load_reference_reader():
    """../shared/tools/ocdbt_dump.py (independent of tessel; decodes zstd with the `zstd` tool)."""
    path = os.path.join(tools, "ocdbt_dump.py")
    assert os.path.exists(path), f"the reference OCDBT reader {path} is missing"
    assert shutil.which("zstd"), "the zstd tool is missing (scripts/install-deps.sh test installs it)"
    spec = importlib.util.spec_from_file_location("ocdbt_dump", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unpack_ocdbt(dump, item, out):
    """Every key of the item's root OCDBT database as a file below `out` (a plain zarr layout)."""
    with open(os.path.join(item, "manifest.ocdbt"), "rb") as f:
        v = dump.decode_manifest(f.read())["versions"][-1]
    entries = dump.walk(item, v, v["root_height"], out=[], verbose=False)
    assert len(entries) == v["num_keys"], (len(entries), v["num_keys"])
    for key, e in entries:
        if e["kind"] == 0:
            value = e["value"]
        else:
            # Orbax's merged root: large values stay in the per-process database.
            assert e["file"][0].startswith(b"ocdbt.process_"), e["file"]
            value = dump.read_range(item, e["file"], e["offset"], e["length"])
        path = os.path.join(out, key.decode())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(value)
    return len(entries)


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r.stdout


def check_tessel_written(tmp, compression, layout):
    item = os.path.join(tmp, f"tessel-{compression}-{layout}")
    run(helper, "item", item, compression, layout)
    meta = json.load(open(os.path.join(item, "_METADATA")))
    assert meta["use_ocdbt"] == (layout == "ocdbt"), meta["use_ocdbt"]
    names = [".".join(k["key"] for k in e["key_metadata"]) for e in meta["tree_metadata"].values()]
    assert len(names) > 10, names
    arrays = item
    if layout == "ocdbt":
        dump = load_reference_reader()
        arrays = os.path.join(tmp, f"unpacked-{compression}")
        keys = unpack_ocdbt(dump, item, arrays)
        print(f"the reference reader listed {keys} keys of the OCDBT database")
    for name in names:
        z = zarr.open_array(os.path.join(arrays, name), mode="r", zarr_format=2)
        path = name.replace(".", "/")
        out = os.path.join(tmp, "x.npy")
        run(cli, "ckpt", "export", item, "--path", path, "--out", out)
        exported = np.load(out)
        got = z[...]
        assert got.dtype == exported.dtype, (name, got.dtype, exported.dtype)
        assert got.shape == exported.shape, (name, got.shape, exported.shape)
        assert np.array_equal(got, exported), name
    print(f"zarr {zarr.__version__} read all {len(names)} arrays of a {compression} tessel checkpoint ({layout})")


def orbax_metadata(names):
    tree = {}
    for name in names:
        keys = name.split(".")
        tree[str(tuple(keys))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in keys],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False},
        }
    return {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False}


def check_zarr_written(tmp):
    item = os.path.join(tmp, "zarr-written")
    os.makedirs(item)
    rng = np.random.default_rng(5)
    arrays = {
        "raw.w": (rng.standard_normal((37, 20)).astype("<f4"), None, (8, 6)),
        "zstd.w": (rng.integers(-1000, 1000, (50, 3, 4)).astype("<i4"), Zstd(level=3), (16, 3, 3)),
        "blosc.w": (rng.standard_normal((64, 33)).astype("<f8"), Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE), (16, 16)),
        "blosc_zstd.w": (rng.standard_normal((1000,)).astype("<f4"), Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE), (300,)),
    }
    for name, (value, compressor, chunks) in arrays.items():
        z = zarr.create_array(os.path.join(item, name), shape=value.shape, chunks=chunks, dtype=value.dtype,
                              zarr_format=2, compressors=compressor, fill_value=0)
        z[...] = value
    json.dump(orbax_metadata(arrays), open(os.path.join(item, "_METADATA"), "w"))
    run(cli, "ckpt", "verify", item)
    for name, (value, _, _) in arrays.items():
        out = os.path.join(tmp, "y.npy")
        run(cli, "ckpt", "export", item, "--path", name.replace(".", "/"), "--out", out)
        assert np.array_equal(np.load(out), value), name
    # Onto a sharded mesh, every leaf placed by its saved spec (none: replicated).
    print(run(cli, "ckpt", "restore", item, "--mesh", "x=4").splitlines()[-1])
    print(f"tessel restored {len(arrays)} arrays zarr {zarr.__version__} wrote (none, zstd, blosc lz4, blosc zstd)")


with tempfile.TemporaryDirectory() as tmp:
    for layout in ("files", "ocdbt"):
        check_tessel_written(tmp, "none", layout)
        check_tessel_written(tmp, "zstd:1", layout)
    check_zarr_written(tmp)
print("ok")
