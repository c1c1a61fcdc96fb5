"""Interop with Debian's python3-zarr, both ways.

1. python3-zarr opens every array of tessel checkpoints (uncompressed and zstd) and its values
   equal `tessel ckpt export`'s .npy files: the plain layout directly, the OCDBT layout after the
   independent reference reader (../shared/tools/ocdbt_dump.py) has unpacked its keys.
2. tessel restores arrays python3-zarr wrote with no compressor, zstd and blosc (multi-chunk, with
   edge chunks), inside an Orbax-style item directory.

Usage: zarr_interop.py TESSEL_CLI CKPT_HELPER [TOOLS_DIR]   (exit 77 = skipped: no python3-zarr)
"""
import importlib.util
import json
import os
import shutil
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
tools = sys.argv[3] if len(sys.argv) > 3 else ""


def load_reference_reader():
    """../shared/tools/ocdbt_dump.py (independent of tessel), or None where it is absent."""
    path = os.path.join(tools, "ocdbt_dump.py")
    if not tools or not os.path.exists(path) or not shutil.which("zstd"):
        return None
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
        if dump is None:
            print("no reference OCDBT reader (../shared/tools/ocdbt_dump.py) or zstd tool: OCDBT layout not cross-read")
            return
        arrays = os.path.join(tmp, f"unpacked-{compression}")
        keys = unpack_ocdbt(dump, item, arrays)
        print(f"the reference reader listed {keys} keys of the OCDBT database")
    for name in names:
        z = zarr.open(os.path.join(arrays, name), mode="r")
        path = name.replace(".", "/")
        out = os.path.join(tmp, "x.npy")
        run(cli, "ckpt", "export", item, "--path", path, "--out", out)
        exported = np.load(out)
        got = z[...]
        assert got.dtype == exported.dtype, (name, got.dtype, exported.dtype)
        assert got.shape == exported.shape, (name, got.shape, exported.shape)
        assert np.array_equal(got, exported), name
    print(f"python3-zarr read all {len(names)} arrays of a {compression} tessel checkpoint ({layout})")


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
    for layout in ("files", "ocdbt"):
        check_tessel_written(tmp, "none", layout)
        check_tessel_written(tmp, "zstd:1", layout)
    check_zarr_written(tmp)
print("ok")
