"""The Python package itself: the examples of docs/python.md run as written, errors are Python
exceptions of the right classes, and the CLI runs from the package."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tessel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCS = os.path.join(ROOT, "docs", "python.md")
TESTDATA = os.path.join(os.environ.get("TESSEL_SHARED", os.path.join(ROOT, "..", "shared")), "testdata")


def doc_examples():
    text = open(DOCS).read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_every_python_example_in_the_docs_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    examples = doc_examples()
    assert len(examples) >= 3
    shared = {}
    for code in examples:
        code = code.replace('"/tmp/', '"' + str(tmp_path) + "/")
        code = code.replace('"examples/', '"' + os.path.join(ROOT, "examples") + "/")
        code = code.replace('"base.yml"', '"maxtext/base.yml"')
        code = code.replace('"maxtext/', '"' + os.path.join(TESTDATA, "maxtext") + "/")
        exec(compile(code, DOCS, "exec"), shared)
    assert shared["w"].to_numpy().shape == (16, 8)
    assert shared["w"].shards[3].data.shape == (8, 8) and shared["w"].shards[3].index[0] == slice(8, 16)
    assert shared["s"].devices_indices_map((16, 8))[5] == (slice(4, 8, None), slice(0, 8, None))
    k = shared["k"]
    assert k.shape == (256, 4, 1024) and k.logical_axes == ("embed", "layers", "mlp")
    assert k.sharding.spec == tessel.P("fsdp", None, "tensor")
    assert shared["p"].total_per_device["max"] > 0 and str(shared["p"]).startswith("memory plan on")
    assert shared["logits"].shape == (4, 16, 256) and shared["logits"].dtype == np.float32
    one = tessel.Mesh({"data": 1, "fsdp": 1, "tensor": 1})
    np.testing.assert_allclose(tessel.forward(shared["lm"], shared["weights"], shared["tokens"], one, shared["lm_rules"]),
                               shared["logits"], rtol=1e-5, atol=1e-5)  # the same logits on one device
    params = shared["params"]["model"]["embed_tokens"]["weight"]
    assert params.to_numpy().shape == (32, 8) and len(params.shards) == 4


def test_load_rules_takes_files_text_and_flax_lists(tmp_path):
    flax_style = [("embed", "fsdp"), ("mlp", ("fsdp", "tensor")), ("kv", None)]
    mesh = tessel.Mesh({"fsdp": 2, "tensor": 2})
    text = "logical_axis_rules: [['embed', 'fsdp'], ['mlp', ['fsdp', 'tensor']], ['kv', []]]"
    (tmp_path / "r.yml").write_text(text)
    for rules in (tessel.load_rules(flax_style), tessel.load_rules(text), tessel.load_rules(tmp_path / "r.yml")):
        assert rules.resolve(("embed", "kv"), mesh) == tessel.P("fsdp", None)
        assert rules.resolve(("mlp", "kv"), mesh) == tessel.P(("fsdp", "tensor"), None)
    with pytest.raises(tessel.ArgumentError):
        tessel.load_rules(42)


def test_errors_are_python_exceptions_with_tessels_messages(tmp_path):
    with pytest.raises(tessel.ArgumentError, match="size 0") as e:
        tessel.Mesh({"data": 0})
    assert isinstance(e.value, ValueError) and isinstance(e.value, tessel.Error)
    with pytest.raises(tessel.ShardingError, match="mesh"):
        tessel.LogicalRules([("embed", "nope")]).resolve(("embed",), tessel.Mesh({"x": 2}))
    with pytest.raises(tessel.ParseError):
        tessel.load_rules("logical_axis_rules: [[")
    with pytest.raises(tessel.IoError) as io:
        tessel.load_rules(str(tmp_path / "missing.yml"))
    assert isinstance(io.value, OSError)
    with pytest.raises(tessel.IoError, match="does not exist"):
        tessel.checkpoint.restore(str(tmp_path / "nothing"))
    with pytest.raises(tessel.ArgumentError, match="not None, a mesh axis name"):
        tessel.PartitionSpec(3)
    with pytest.raises(tessel.ArgumentError, match="key 'a/b' is empty or contains '/'"):
        tessel.checkpoint.save(str(tmp_path / "x"), {"a/b": np.zeros(2)})
    with pytest.raises(tessel.ArgumentError, match="not one of the blocks|is missing"):
        mesh = tessel.Mesh({"x": 2})
        leaf = {"path": "w", "dtype": "float32", "shape": (4,), "sharding": tessel.NamedSharding(mesh, tessel.P("x")),
                "blocks": [((0,), (2,), np.zeros(8, np.uint8))], "logical_axes": None}
        tessel._tessel.save_leaves(str(tmp_path / "y"), [leaf], "none", True, False, 1 << 20, None, [])
    assert not os.path.exists(tmp_path / "y")


def test_a_jax_array_keeps_its_own_sharding(tmp_path):
    import jax

    a = jax.device_put(np.arange(8.0), jax.devices()[0])
    with pytest.raises(tessel.ArgumentError, match="jax.Array: it is saved with its own sharding"):
        tessel.checkpoint.save(str(tmp_path / "j"), {"a": a}, shardings={"a": tessel.NamedSharding(tessel.Mesh({"x": 2}), tessel.P("x"))})
    tessel.checkpoint.save(str(tmp_path / "j"), {"a": a})
    got = tessel.checkpoint.restore(str(tmp_path / "j"))["a"]
    assert got.sharding.mesh.device_ids == (a.devices().pop().id,) and np.array_equal(got.to_numpy(), np.arange(8.0))


def test_saving_over_an_existing_checkpoint_is_refused(tmp_path):
    tessel.checkpoint.save(str(tmp_path / "c"), {"a": np.arange(3)})
    with pytest.raises(tessel.IoError, match="already exists"):
        tessel.checkpoint.save(str(tmp_path / "c"), {"a": np.arange(3)})


def test_the_cli_runs_from_the_package():
    for cmd in ([sys.executable, "-m", "tessel", "--version"], [os.path.join(os.path.dirname(sys.executable), "tessel"), "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0 and "tessel 0.1.0" in out.stdout, (cmd, out.stdout, out.stderr)
    bad = subprocess.run([sys.executable, "-m", "tessel", "shardings", "--mesh", "x=0", "--spec", "[]", "--shape", "2"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "tessel: error:" in bad.stderr
