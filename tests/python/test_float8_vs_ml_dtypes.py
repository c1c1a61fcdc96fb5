"""float8_e4m3fn and float8_e5m2 against ml_dtypes (JAX's float8 types): every bit pattern decodes
to ml_dtypes' value, random and edge float32 values encode to ml_dtypes' bits (a cast in a
restore), and float8 arrays travel through tessel checkpoints, safetensors and Orbax unchanged."""
import json
import os
import struct

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import jax
import safetensors.numpy as stnp

import tessel
from trees import assert_bit_identical

TYPES = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}


def cast_by_restore(tmp, values, dtype_name, name):
    """tessel's conversion: save `values`, restore with another dtype (restore casts)."""
    item = os.path.join(tmp, name)
    tessel.checkpoint.save(item, {"x": values})

    class Target:  # what a jax.ShapeDtypeStruct gives a restore: a sharding and a dtype
        sharding = tessel.NamedSharding(tessel.Mesh({"d": 1}), tessel.P())
        dtype = tessel.checkpoint.numpy_dtype(dtype_name)

    return tessel.checkpoint.restore(item, shardings={"x": Target()})["x"].to_numpy()


def same_bits_or_both_nan(got, want, where):
    g, w = got.view(np.uint8), want.view(np.uint8)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan), where
    bad = np.nonzero((g != w) & ~nan)[0]
    assert bad.size == 0, f"{where}: first difference at {bad[:5]}: {g[bad[:5]]} vs {w[bad[:5]]}"


def test_every_pattern_decodes_and_values_encode_as_ml_dtypes(rng, tmp):
    g = np.random.default_rng(rng.randrange(2**32))
    for name, t in TYPES.items():
        patterns = np.arange(256, dtype=np.uint8).view(t)
        decoded = cast_by_restore(tmp, patterns, "float32", f"decode_{name}")
        want = patterns.astype(np.float32)
        assert_bit_identical(decoded[~np.isnan(want)], want[~np.isnan(want)], f"{name} decode")
        assert np.isnan(decoded[np.isnan(want)]).all()
        # Random values over the whole range and beyond, every exact value and every halfway point.
        exact = want[np.isfinite(want)]
        s = np.sort(np.unique(exact))
        halfway = ((s[1:].astype(np.float64) + s[:-1]) / 2).astype(np.float32)
        edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 57344, 61440, 65536, 1e-9, -1e-9],
                         np.float32)
        scale = np.float32(10.0) ** g.uniform(-9, 6, 20000).astype(np.float32)
        values = np.concatenate([exact, halfway, np.nextafter(halfway, np.float32(np.inf)),
                                 np.nextafter(halfway, np.float32(-np.inf)), edges,
                                 (g.standard_normal(20000).astype(np.float32) * scale)]).astype(np.float32)
        got = cast_by_restore(tmp, values, name, f"encode_{name}")
        same_bits_or_both_nan(got, values.astype(t), f"{name} encode")


def test_float8_arrays_travel_unchanged(rng, tmp):
    g = np.random.default_rng(rng.randrange(2**32))
    tree = {n: g.integers(0, 256, (16, 8), dtype=np.uint8).view(t) for n, t in TYPES.items()}
    # safetensors: the package writes F8_E4M3 / F8_E5M2 from ml_dtypes arrays (its NumPy loader cannot
    # read them back: NumPy has no float8), and tessel writes the same file, byte for byte, but for
    # the spaces that pad the header: the package pads it to 8 bytes, tessel to 64 (so a restore
    # can map the tensors).
    stnp.save_file(tree, os.path.join(tmp, "theirs.safetensors"))
    tessel.checkpoint.save_safetensors(os.path.join(tmp, "st"), tree)
    theirs = open(os.path.join(tmp, "theirs.safetensors"), "rb").read()
    ours = open(os.path.join(tmp, "st", "model.safetensors"), "rb").read()
    n_ours, n_theirs = struct.unpack("<Q", ours[:8])[0], struct.unpack("<Q", theirs[:8])[0]
    header = json.loads(ours[8:8 + n_ours])
    assert {n: header[n]["dtype"] for n in tree} == {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    assert (8 + n_ours) % 64 == 0 and (8 + n_theirs) % 8 == 0
    assert ours[8:8 + n_ours].rstrip(b" ") == theirs[8:8 + n_theirs].rstrip(b" "), "the same header"
    assert ours[8 + n_ours:] == theirs[8 + n_theirs:], "the same data section"
    back = tessel.checkpoint.restore(os.path.join(tmp, "theirs.safetensors"), mesh=tessel.Mesh({"x": 4}))
    for n, a in tree.items():
        assert back[n].to_numpy().view(np.uint8).tobytes() == a.view(np.uint8).tobytes(), n
    # Orbax reads tessel's float8 zarr arrays.
    item = os.path.join(tmp, "orbax")
    tessel.checkpoint.save(item, tree)
    target = {n: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
              for n, a in tree.items()}
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(item), target)
    for n, a in tree.items():
        assert np.asarray(restored[n]).view(np.uint8).tobytes() == a.view(np.uint8).tobytes(), n
