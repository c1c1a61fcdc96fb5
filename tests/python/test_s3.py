"""Checkpoints in an S3 bucket (moto's server on 127.0.0.1): what Orbax wrote (OCDBT + zarr v2,
plain files, zarr3) and safetensors sets, restored by tessel straight from the bucket onto other
meshes, bit for bit per device block and reading the bytes a local restore reads; steps and items
listed by prefix; the CLI too. Faults a store gives (throttling, 5xx, dropped connections) are
retried; a truncated object, a missing bucket or key, and exhausted retries are clear errors."""
import os
import subprocess

import jax
import numpy as np
import pytest
import tensorstore as ts

import tessel
from conftest import cli
from object_store import CREDENTIALS, FaultProxy, moto_server, s3_client, upload_tree
from test_tessel_reads_orbax import random_jax_tree, save_with_manager, target_mesh
from trees import assert_bit_identical, leaves, random_array

BUCKET = "tessel-test"


@pytest.fixture(scope="module")
def server():
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


@pytest.fixture
def s3(server, monkeypatch):
    """tessel pointed at the server: credentials and the endpoint from the environment."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_client(server)


def check_shards(restored, values, where):
    for path, want in leaves(values).items():
        for shard in leaves(restored)[path].shards:
            assert_bit_identical(shard.data, want[shard.index], f"{where} {path} device {shard.device}")


@pytest.mark.parametrize("layout", ["default", "files", "zarr3"])
def test_tessel_restores_orbax_checkpoints_from_a_bucket(rng, tmp, x64, s3, layout):
    devices = jax.devices()
    root = os.path.join(tmp, "ckpt")
    trees = {step: (random_jax_tree(rng, devices), random_jax_tree(rng, devices)) for step in (1, 2)}
    steps = save_with_manager(root, layout, sorted(trees), {s: (a[1], b[1]) for s, (a, b) in trees.items()})
    url = f"s3://{BUCKET}/runs/{layout}-{rng.randrange(10**9)}"
    upload_tree(s3, root, BUCKET, url.removeprefix(f"s3://{BUCKET}/"))

    assert tessel.checkpoint.steps(url) == steps
    assert {i["name"] for i in tessel.checkpoint.items(url + "/2")} == {"items", "model_params", "meta"}
    info = tessel.checkpoint.info(url, item="items")
    assert info["item"] == f"{url}/{steps[-1]}/items"
    assert info == tessel.checkpoint.info(root, item="items") | {"item": info["item"]}
    for step in steps:
        for item, (values, _, mesh) in zip(("items", "model_params"), trees[step]):
            devices_now = rng.choice([2, 4, 16])
            target = target_mesh(rng, mesh.axis_names, devices_now)
            remote, local = {}, {}
            got = tessel.checkpoint.restore(f"{url}/{step}", item=item, mesh=target, stats=remote)
            tessel.checkpoint.restore(os.path.join(root, str(step)), item=item, mesh=target, stats=local)
            check_shards(got, values, f"{url}/{step}/{item} on {target}")
            remote.pop("seconds"), local.pop("seconds")
            assert remote == local, (remote, local)
    assert tessel.checkpoint.verify(url, item="model_params")["faults"] == []

    env = dict(os.environ)
    r = subprocess.run([cli(), "ckpt", "info", url, "--item", "items"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert f"item {url}/{steps[-1]}/items (" in r.stdout, r.stdout
    r = subprocess.run([cli(), "ckpt", "verify", url, "--item", "items"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "0 faults" in r.stdout, r.stdout + r.stderr


def test_safetensors_sets_from_a_bucket(rng, tmp, s3):
    layers = {str(i): {"w": random_array(rng, (rng.randrange(64, 300), rng.randrange(8, 64)), "float32")}
              for i in range(rng.randrange(3, 7))}
    tree = {"model": {"layers": layers, "embed": random_array(rng, (128, 24), "bfloat16")}}
    local = os.path.join(tmp, "hf")
    tessel.checkpoint.save_safetensors(local, tree, max_file_bytes=1 << 20)
    assert len([f for f in os.listdir(local) if f.endswith(".safetensors")]) >= 1
    url = f"s3://{BUCKET}/hf-{rng.randrange(10**9)}"
    upload_tree(s3, local, BUCKET, url.removeprefix(f"s3://{BUCKET}/"))
    mesh = tessel.Mesh({"x": 4})
    want = leaves(tree)
    shardings = {p: tessel.NamedSharding(mesh, tessel.P("x")) for p in want}
    got = tessel.checkpoint.restore(url, shardings=shardings)
    flat = leaves(got)
    for path, value in want.items():
        for shard in flat[path].shards:
            assert_bit_identical(shard.data, value[shard.index], f"{path} device {shard.device}")
    # From the bucket to a local Orbax item, and back to the same values.
    out = os.path.join(tmp, "orbax")
    assert tessel.checkpoint.convert(url, out, to="orbax") == "orbax"
    again = tessel.checkpoint.restore(out)
    for path, value in want.items():
        assert_bit_identical(leaves(again)[path].to_numpy(), value, path)


def test_convert_between_a_disk_and_buckets(rng, tmp, s3):
    """convert from a local item into the bucket, from the bucket into the bucket (another format),
    and back to a disk: the same values at each hop."""
    tree = {"model": {"embed": random_array(rng, (64, 24), "float32"),
                      "layers": {str(i): {"w": random_array(rng, (rng.randrange(8, 40), 16), "float32")} for i in range(3)}}}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, tree)
    base = f"s3://{BUCKET}/convert-{rng.randrange(10**9)}"
    assert tessel.checkpoint.convert(local, base + "/hf", to="safetensors") == "safetensors"
    assert tessel.checkpoint.convert(base + "/hf", base + "/orbax", to="orbax") == "orbax"
    back = os.path.join(tmp, "back")
    r = subprocess.run([cli(), "ckpt", "convert", base + "/orbax", back], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    for where in (base + "/hf", base + "/orbax", back):
        got = leaves(tessel.checkpoint.restore(where))
        for path, want in leaves(tree).items():
            assert_bit_identical(got[path].to_numpy(), want, f"{where} {path}")


def test_faults_are_retried_and_failures_are_clear(rng, tmp, s3, server, monkeypatch):
    values = {"w": random_array(rng, (64, 48), "float32"), "b": random_array(rng, (48,), "float32")}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, use_ocdbt=False)
    prefix = f"faults-{rng.randrange(10**9)}"
    upload_tree(s3, local, BUCKET, prefix)
    url = f"s3://{BUCKET}/{prefix}"

    # A third of the requests answered with 503 SlowDown, 500, 429 or a dropped connection.
    with FaultProxy(server, rate=0.3, seed=rng.randrange(2**32)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        for _ in range(3):
            got = tessel.checkpoint.restore(url, mesh=tessel.Mesh({"x": 4}))
            for name, want in values.items():
                assert_bit_identical(got[name].to_numpy(), want, name)
        assert sum(proxy.faults.values()) > 0 and proxy.forwarded > 0, proxy.faults
        print("faults injected and retried:", proxy.faults, "forwarded:", proxy.forwarded)
    # Every request failing, with few attempts: the error names the object and the answer.
    with FaultProxy(server, rate=1.0, seed=1) as proxy:
        proxy.FAULTS = ("503",)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("TESSEL_S3_MAX_ATTEMPTS", "2")
        with pytest.raises(tessel.IoError, match=rf"{proxy.endpoint}/{BUCKET}/{prefix}\S* answered HTTP 503"):
            tessel.checkpoint.restore(url)
        assert proxy.faults["503"] >= 2
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server)
    monkeypatch.delenv("TESSEL_S3_MAX_ATTEMPTS")

    # A chunk object cut short.
    chunks = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/w/")["Contents"]
              if not o["Key"].endswith(".zarray")]
    body = s3.get_object(Bucket=BUCKET, Key=chunks[0])["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=chunks[0], Body=body[: len(body) // 2])
    with pytest.raises(tessel.Error, match=rf"\(s3://{BUCKET}/{chunks[0]}\): {len(body) // 2} bytes, an uncompressed "
                                           rf"chunk of \[\d+, \d+\] float32 has {len(body)}"):
        tessel.checkpoint.restore(url)

    with pytest.raises(tessel.IoError, match="does not exist"):
        tessel.checkpoint.restore(f"s3://{BUCKET}/no/such/prefix")
    with pytest.raises(tessel.IoError, match="NoSuchBucket"):
        tessel.checkpoint.restore("s3://no-such-bucket-here/x")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(tmp, "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.path.join(tmp, "none"))
    with pytest.raises(tessel.IoError, match="no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        tessel.checkpoint.restore(url)
    with pytest.raises(tessel.ArgumentError, match="bucket name"):
        tessel.checkpoint.restore("s3://Bad_Bucket/x")


def test_bytes_damaged_in_transit_are_read_again_or_refused(rng, tmp, s3, server, monkeypatch):
    """A metadata object whose bytes do not match its MD5 ETag is read again, and refused when it
    stays damaged; a chunk damaged on its way fails its CRC-32C, naming the chunk."""
    values = {"w": random_array(rng, (32, 16), "float32")}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, use_ocdbt=False)
    prefix = f"damaged-{rng.randrange(10**9)}"
    upload_tree(s3, local, BUCKET, prefix)
    url = f"s3://{BUCKET}/{prefix}"
    metadata = lambda method, path: method == "GET" and path.split("?")[0].endswith("/_METADATA")  # noqa: E731
    with FaultProxy(server, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        left = [2]

        def twice(method, path):
            if metadata(method, path) and left[0] > 0:
                left[0] -= 1
                return True
            return False

        proxy.corrupt = twice
        assert_bit_identical(tessel.checkpoint.restore(url)["w"].to_numpy(), values["w"], "read again")
        assert proxy.corrupted == 2
        proxy.corrupt = metadata
        monkeypatch.setenv("TESSEL_S3_MAX_ATTEMPTS", "3")
        with pytest.raises(tessel.IoError, match=rf"s3://{BUCKET}/{prefix}/_METADATA: checksum mismatch"):
            tessel.checkpoint.restore(url)
        proxy.corrupt = lambda method, path: method == "GET" and "/w/0" in path.split("?")[0]
        with pytest.raises(tessel.Error) as e:
            tessel.checkpoint.restore(url)
        assert "'w' chunk 0.0" in str(e.value) and "CRC-32C mismatch" in str(e.value), str(e.value)


def test_a_save_to_a_bucket_root_is_refused(s3):
    with pytest.raises(tessel.ArgumentError, match="root of the bucket 's3://tessel-test': give a prefix"):
        tessel.checkpoint.save(f"s3://{BUCKET}", {"w": np.ones(4, np.float32)})


def tensorstore_read_s3(endpoint, bucket, item_prefix, name, use_ocdbt, use_zarr3):
    """The array through TensorStore's own s3 kvstore (under OCDBT for that layout)."""
    s3 = {"driver": "s3", "bucket": bucket, "endpoint": endpoint, "aws_region": CREDENTIALS["AWS_REGION"]}
    if use_ocdbt:
        kvstore = {"driver": "ocdbt", "base": s3 | {"path": item_prefix + "/"}, "path": f"{name}/"}
    else:
        kvstore = s3 | {"path": f"{item_prefix}/{name}/"}
    spec = {"driver": "zarr3" if use_zarr3 else "zarr", "kvstore": kvstore}
    return np.asarray(ts.open(spec, open=True).result().read().result())


@pytest.mark.parametrize("layout", ["ocdbt", "files", "zarr3", "safetensors"])
def test_tessel_saves_into_a_bucket(rng, tmp, s3, server, layout):
    """tessel writes straight into the bucket (objects in parts; the commit marker last); it and
    TensorStore's s3 kvstore read every array back bit for bit."""
    mesh = tessel.Mesh({"x": 4})
    # Large enough that some objects go up in several parts (16 MiB each).
    tree = {"big": random_array(rng, (rng.randrange(1100, 1400), 4096), "float32"),
            "layers": {str(i): {"w": random_array(rng, (rng.randrange(8, 90), rng.randrange(1, 40)), "float32")}
                       for i in range(3)},
            # safetensors' NumPy API has no bfloat16
            "emb": random_array(rng, (64, 8), "float16" if layout == "safetensors" else "bfloat16")}
    shardings = {p: tessel.NamedSharding(mesh, tessel.P("x" if v.shape[0] % 4 == 0 else None))
                 for p, v in leaves(tree).items()}
    prefix = f"saved-{layout}-{rng.randrange(10**9)}"
    url = f"s3://{BUCKET}/{prefix}"
    if layout == "safetensors":
        tessel.checkpoint.save_safetensors(url, tree, max_file_bytes=8 << 20)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]]
        assert f"{prefix}/model.safetensors.index.json" in keys, keys
        import safetensors.numpy as stnp
        for k in keys:
            if k.endswith(".safetensors"):
                data = s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()
                for name, value in stnp.load(data).items():
                    assert_bit_identical(value, leaves(tree)[name.replace(".", "/")], name)
    else:
        tessel.checkpoint.save(url, tree, shardings=shardings, use_ocdbt=layout != "files",
                               use_zarr3=layout == "zarr3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]]
        assert f"{prefix}/commit_success.txt" in keys and f"{prefix}/_METADATA" in keys, keys
        assert not any(".orbax-checkpoint-tmp" in k for k in keys), keys
        for path, want in leaves(tree).items():
            got = tensorstore_read_s3(server, BUCKET, prefix, path.replace("/", "."), layout != "files", layout == "zarr3")
            assert_bit_identical(got, want, f"TensorStore {path}")
    got = tessel.checkpoint.restore(url, shardings=shardings)
    check_shards(got, tree, url)
    with pytest.raises(tessel.IoError, match="already exists"):
        tessel.checkpoint.save(url, tree)


def test_a_save_that_dies_leaves_no_step(rng, tmp, s3, server, monkeypatch):
    """The server gone mid-save: the save fails, no step is committed; the steps before it and a
    later save to the same step are whole."""
    tree = {"w": random_array(rng, (512, 1024), "float32"), "b": random_array(rng, (1024,), "float32")}
    root = f"s3://{BUCKET}/run-{rng.randrange(10**9)}"
    tessel.checkpoint.save(root + "/1", tree)
    assert tessel.checkpoint.steps(root) == [1]
    # A proxy that forwards a few requests, then drops every connection: the server is gone.
    with FaultProxy(server, rate=0.0, seed=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        monkeypatch.setenv("TESSEL_S3_MAX_ATTEMPTS", "2")
        original = proxy.rng.random

        def dying():
            return 0.0 if proxy.forwarded >= 6 else 1.0

        proxy.rng.random = dying
        proxy.rate = 0.5
        proxy.FAULTS = ("drop",)
        with pytest.raises(tessel.IoError):
            tessel.checkpoint.save(root + "/2", {"w": random_array(rng, (512, 1024), "float32")})
        proxy.rng.random = original
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server)
    monkeypatch.delenv("TESSEL_S3_MAX_ATTEMPTS")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=root.removeprefix(f"s3://{BUCKET}/") + "/2/").get("Contents", [])]
    assert not any(k.endswith("commit_success.txt") for k in keys), keys
    assert tessel.checkpoint.steps(root) == [1]
    got = tessel.checkpoint.restore(root)
    assert_bit_identical(got["w"].to_numpy(), tree["w"], "step 1 after the failed save")
    # The same step saved again: what the dead save left is cleared first.
    again = {"w": random_array(rng, (16, 8), "float32")}
    tessel.checkpoint.save(root + "/2", again)
    assert tessel.checkpoint.steps(root) == [1, 2]
    assert_bit_identical(tessel.checkpoint.restore(root)["w"].to_numpy(), again["w"], "step 2")


MODEL = "model: transformer\nvocab: 256\nembed: 32\nlayers: 2\nheads: 4\nmlp: 64\n"


def test_training_checkpoints_in_a_bucket(rng, tmp, s3):
    """`tessel train` with its CheckpointManager in a bucket: steps committed by their marker,
    max_to_keep applied, a step's leftovers cleared, resumed onto another mesh; the run equals the
    same run checkpointed on a local disk, bit for bit."""
    model = os.path.join(tmp, "m.yml")
    with open(model, "w") as f:
        f.write(MODEL)
    url = f"s3://{BUCKET}/train-{rng.randrange(10**9)}"
    local = os.path.join(tmp, "ckpt")
    common = [cli(), "train", "--model", model, "--batch", "8", "--seq", "16", "--steps", "6", "--warmup", "2",
              "--checkpoint-every", "2", "--keep", "2"]

    def train(where, *extra):
        r = subprocess.run(common + ["--checkpoint-dir", where, *extra], capture_output=True, text=True,
                           env=dict(os.environ))
        assert r.returncode == 0, r.stderr
        return r.stdout

    for where in (url, local):
        train(where, "--stop-at", "4")
    assert tessel.checkpoint.steps(url) == tessel.checkpoint.steps(local) == [2, 4]
    # A save of step 6 that died: objects, no marker. Not a step; the next manager clears it.
    prefix = url.removeprefix(f"s3://{BUCKET}/")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/6/default/_METADATA", Body=b"{}")
    assert tessel.checkpoint.steps(url) == [2, 4]
    out = train(url, "--resume", "--mesh", "fsdp=4,tensor=2")
    assert "resumed step 4" in out, out
    train(local, "--resume", "--mesh", "fsdp=4,tensor=2")
    assert tessel.checkpoint.steps(url) == tessel.checkpoint.steps(local) == [4, 6]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]]
    assert not any(k.startswith(f"{prefix}/2/") for k in keys), "step 2 is past --keep 2"
    assert f"{prefix}/6/commit_success.txt" in keys
    remote, here = tessel.checkpoint.restore(url), tessel.checkpoint.restore(local)
    assert set(leaves(remote)) == set(leaves(here))
    for path, array in leaves(here).items():
        assert_bit_identical(leaves(remote)[path].to_numpy(), array.to_numpy(), path)


def test_a_multi_process_job_saves_and_restores_in_a_bucket(rng, s3):
    """A 2-process JAX job saves into the bucket (each process uploading its own blocks into its
    own OCDBT database, process 0 merging and committing); jobs of 4 and 1 processes restore it
    from the bucket onto other meshes, each process reading only its blocks."""
    from jax_job import run_job
    from test_multi_process import TOTAL_DEVICES, check_restored, random_case, random_layout

    case = random_case(rng, f"s3://{BUCKET}/job-{rng.randrange(10**9)}")
    case["save"] = random_layout(rng, case)
    saved = run_job("save_tessel", 2, 4, case)
    assert all(r.get("saved") for r in saved), saved
    prefix = case["path"].removeprefix(f"s3://{BUCKET}/")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]]
    assert {k.split("/")[1] for k in keys if "/ocdbt.process_" in k} == {"ocdbt.process_0", "ocdbt.process_1"}, keys
    assert f"{prefix}/commit_success.txt" in keys
    for processes in (4, 1):
        case["restore"] = random_layout(rng, case)
        case["restore"]["form"] = "sds"
        results = run_job("restore_tessel", processes, TOTAL_DEVICES // processes, case)
        check_restored(results, case, processes)
