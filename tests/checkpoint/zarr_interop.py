"""Interop with Debian's python3-zarr, both ways.

1. python3-zarr opens every array of tessel checkpoints (uncompressed and zstd) and its values
   equal `tessel ckpt export`'s .npy files.
2. tessel restores arrays python3-zarr wrote with no compressor, zstd and blosc (multi-chunk, with
   edge chunks), inside an Orbax-style item directory.

Usage: zarr_interop.py TESSEL_CLI CKPT_HELPER   (exit 77 = skipped: no python3-zarr)
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import zarr
    from numcodecs import Blosc, Zstd
except ImportError as e:  # the test command installs python3-zarr; a bare machine may not have it
    print(f"skipped: {e}")
    sys.exit(77)

cli, helper = sys.argv[1], sys.argv[2]


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r.stdout


def check_tessel_written(tmp, compression):
    item = os.path.join(tmp, f"tessel-{compression}")
    run(helper, "item", item, compression)
    meta = json.load(open(os.path.join(item, "_METADATA")))
    names = [".".join(k["key"] for k in e["key_metadata"]) for e in meta["tree_metadata"].values()]
    assert len(names) > 10, names
    for name in names:
        z = zarr.open(os.path.join(item, name), mode="r")
        path = name.replace(".", "/")
        out = os.path.join(tmp, "x.npy")
        run(cli, "ckpt", "export", item, "--path", path, "--out", out)
        exported = np.load(out)
        got = z[...]
        assert got.dtype == exported.dtype, (name, got.dtype, exported.dtype)
        assert got.shape == exported.shape, (name, got.shape, exported.shape)
        assert np.array_equal(got, exported), name
    print(f"python3-zarr read all {len(names)} arrays of a {compression} tessel checkpoint")


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
        z = zarr.open(os.path.join(item, name), mode="w", shape=value.shape, chunks=chunks, dtype=value.dtype,
                      compressor=compressor)
        z[...] = value
    json.dump(orbax_metadata(arrays), open(os.path.join(item, "_METADATA"), "w"))
    run(cli, "ckpt", "verify", item)
    for name, (value, _, _) in arrays.items():
        out = os.path.join(tmp, "y.npy")
        run(cli, "ckpt", "export", item, "--path", name.replace(".", "/"), "--out", out)
        assert np.array_equal(np.load(out), value), name
    # Onto a sharded mesh, every leaf placed by its saved spec (none: replicated).
    print(run(cli, "ckpt", "restore", item, "--mesh", "x=4").splitlines()[-1])
    print(f"tessel restored {len(arrays)} arrays python3-zarr wrote (none, zstd, blosc lz4, blosc zstd)")


with tempfile.TemporaryDirectory() as tmp:
    check_tessel_written(tmp, "none")
    check_tessel_written(tmp, "zstd:1")
    check_zarr_written(tmp)
print("ok")
