"""Every Python function that takes a path refuses a URL before anything is written, naming the
argument (an `s3://bucket/run` once became the local folder `./s3:/bucket/run`); file:///path is
taken as the path. A checkpoint to read may be in a bucket: without credentials that is an
error naming what is missing (test_s3.py and test_gcs.py read from local servers)."""
import os

import numpy as np
import pytest

import tessel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TESTDATA = os.path.join(os.environ.get("TESSEL_SHARED", os.path.join(ROOT, "..", "shared")), "testdata")
MODEL = os.path.join(ROOT, "examples", "models", "transformer.yml")
RULES = os.path.join(ROOT, "examples", "models", "rules.yml")
MAXTEXT_MODEL = os.path.join(TESTDATA, "maxtext", "models", "qwen3-0.6b.yml")
BASE = os.path.join(TESTDATA, "maxtext", "base.yml")
URLS = ["s3://my-bucket/run", "gs://bucket/ckpt/7", "https://example.com/x", "hf://org/model", "file://otherhost/x"]


@pytest.fixture
def item(tmp_path):
    path = str(tmp_path / "item")
    tessel.checkpoint.save(path, {"w": np.arange(16, dtype=np.float32).reshape(4, 4)})
    return path


def calls(item):
    """(argument name, function of the URL, whether it reads a checkpoint that may be in a bucket)
    for every path argument of the package."""
    ckpt = tessel.checkpoint
    tree = {"w": np.zeros(4, np.float32)}
    return [
        ("path", lambda u: ckpt.save(u, tree), True),
        ("path", lambda u: ckpt.save_safetensors(u, tree), True),
        ("path", lambda u: ckpt.restore(u), True),
        ("logical_axes", lambda u: ckpt.restore(item, mesh=tessel.Mesh({"data": 1}), logical_axes=u), False),
        ("src", lambda u: ckpt.convert(u, "out"), True),
        ("dst", lambda u: ckpt.convert(item, u), True),
        ("rules", lambda u: ckpt.convert(item, "out", rules=u), False),
        ("map", lambda u: ckpt.convert(item, "out", map=u), False),
        ("root", lambda u: ckpt.steps(u), True),
        ("step_dir", lambda u: ckpt.items(u), True),
        ("path", lambda u: ckpt.info(u), True),
        ("path", lambda u: ckpt.verify(u), True),
        ("model", lambda u: tessel.load_model(u), False),
        ("model", lambda u: tessel.load_maxtext_model(u, BASE), False),
        ("base", lambda u: tessel.load_maxtext_model(MAXTEXT_MODEL, u), False),
        ("rules", lambda u: tessel.load_maxtext_model(MAXTEXT_MODEL, BASE, rules=u), False),
        ("rules", lambda u: tessel.load_rules(u), False),
        ("rules", lambda u: tessel.eval_shape(MODEL, tessel.Mesh({"data": 1}), u), False),
    ]


def test_every_path_argument_refuses_a_url_or_takes_a_bucket_and_writes_nothing(item, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    for name in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # on an EC2 machine too
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    for i, (name, call, bucket) in enumerate(calls(item)):
        for url in (URLS[i % len(URLS)], URLS[(i + 1) % len(URLS)]):
            if bucket and url.startswith(("s3://", "gs://")):
                with pytest.raises(tessel.Error) as e:
                    call(url)
                expected = "no AWS credentials" if url.startswith("s3://") else "GOOGLE_APPLICATION_CREDENTIALS names"
                assert url in str(e.value) and expected in str(e.value), (name, str(e.value))
            else:
                with pytest.raises(tessel.ArgumentError) as e:
                    call(url)
                message = str(e.value)
                assert message.startswith(f"{name}: '{url}'"), (name, message)
                other = bucket and not url.startswith("file://")
                assert ("checkpoints are local paths" if other else "not supported yet") in message, message
            assert os.listdir(cwd) == [], f"{name}={url} wrote {os.listdir(cwd)}"


def test_a_file_url_is_the_local_path(tmp_path):
    target = tmp_path / "ckpt" / "7"
    tessel.checkpoint.save("file://" + str(target), {"w": np.ones((4, 2), np.float32)})
    assert (target / "_METADATA").exists()
    again = tessel.checkpoint.restore("file://localhost" + str(target))
    np.testing.assert_array_equal(again["w"].to_numpy(), np.ones((4, 2), np.float32))
    assert tessel.checkpoint.steps("file://" + str(tmp_path / "ckpt")) == [7]
    assert tessel.load_rules("file://" + RULES).rules == tessel.load_rules(RULES).rules
