"""The bucket tests, whatever the store: test_s3.py runs them against moto's S3 server and
test_gcs.py against the GCS emulator, each giving the `store` fixture (object_store.py's S3Store or
GcsStore, with its server's `endpoint`; tessel already pointed at it).

What Orbax wrote (OCDBT + zarr v2, plain files, zarr3) and safetensors sets, restored by tessel
straight from the bucket onto other meshes, bit for bit per device block and reading the bytes a
local restore reads; steps and items listed by prefix; the CLI too. tessel saving into the bucket,
read back by TensorStore's own kvstore; the CheckpointManager and `tessel train`; a multi-process
JAX job. Faults a store gives (throttling, 5xx, dropped connections) are retried; a truncated
object, bytes damaged in transit, a missing bucket or prefix, a save that dies and exhausted
retries are clear errors and never a committed step."""
import os
import re
import subprocess

import jax
import numpy as np
import pytest
import tensorstore as ts

import tessel
from conftest import cli
from object_store import FaultProxy, upload_tree
from test_tessel_reads_orbax import random_jax_tree, save_with_manager, target_mesh
from trees import assert_bit_identical, leaves, random_array

BUCKET = "tessel-test"


def check_shards(restored, values, where):
    for path, want in leaves(values).items():
        for shard in leaves(restored)[path].shards:
            assert_bit_identical(shard.data, want[shard.index], f"{where} {path} device {shard.device}")


@pytest.mark.parametrize("layout", ["default", "files", "zarr3"])
def test_tessel_restores_orbax_checkpoints_from_a_bucket(rng, tmp, x64, store, layout):
    devices = jax.devices()
    root = os.path.join(tmp, "ckpt")
    trees = {step: (random_jax_tree(rng, devices), random_jax_tree(rng, devices)) for step in (1, 2)}
    steps = save_with_manager(root, layout, sorted(trees), {s: (a[1], b[1]) for s, (a, b) in trees.items()})
    prefix = f"runs/{layout}-{rng.randrange(10**9)}"
    upload_tree(store, root, prefix)
    url = store.url(prefix)

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


def test_safetensors_sets_from_a_bucket(rng, tmp, store):
    layers = {str(i): {"w": random_array(rng, (rng.randrange(64, 300), rng.randrange(8, 64)), "float32")}
              for i in range(rng.randrange(3, 7))}
    tree = {"model": {"layers": layers, "embed": random_array(rng, (128, 24), "bfloat16")}}
    local = os.path.join(tmp, "hf")
    tessel.checkpoint.save_safetensors(local, tree, max_file_bytes=1 << 20)
    assert len([f for f in os.listdir(local) if f.endswith(".safetensors")]) >= 1
    prefix = f"hf-{rng.randrange(10**9)}"
    upload_tree(store, local, prefix)
    url = store.url(prefix)
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


def test_convert_between_a_disk_and_buckets(rng, tmp, store):
    """convert from a local item into the bucket, from the bucket into the bucket (another format),
    and back to a disk: the same values at each hop."""
    tree = {"model": {"embed": random_array(rng, (64, 24), "float32"),
                      "layers": {str(i): {"w": random_array(rng, (rng.randrange(8, 40), 16), "float32")} for i in range(3)}}}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, tree)
    base = store.url(f"convert-{rng.randrange(10**9)}")
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
    # MaxText's parameter-only checkpoint (step 0, item 'items', committed by its marker) into the
    # bucket: the same bits as the same conversion to a disk.
    tessel.checkpoint.convert(local, base + "/decode", to="maxtext-params")
    tessel.checkpoint.convert(local, os.path.join(tmp, "decode"), to="maxtext-params")
    assert tessel.checkpoint.steps(base + "/decode") == [0]
    assert {i["name"] for i in tessel.checkpoint.items(base + "/decode/0")} == {"items"}
    remote = leaves(tessel.checkpoint.restore(base + "/decode", item="items"))
    here = leaves(tessel.checkpoint.restore(os.path.join(tmp, "decode"), item="items"))
    assert set(remote) == set(here) == {"step"} | {"params/params/" + p for p in leaves(tree)}, sorted(remote)
    for path, array in here.items():
        assert_bit_identical(remote[path].to_numpy(), array.to_numpy(), f"maxtext-params {path}")
    with pytest.raises(tessel.IoError, match="already exists"):
        tessel.checkpoint.convert(local, base + "/decode", to="maxtext-params")


def test_a_restore_lists_each_parameter_once_not_each_chunk(rng, tmp, store, monkeypatch):
    """Plain files in a bucket: a parameter's objects are listed once, with their sizes, and each
    chunk is then read without a request for its size (S3's HEAD, GCS's metadata GET): a restore
    of many chunks makes about half the requests."""
    n = rng.choice([4, 8])
    names = [f"p{i}" for i in range(rng.randrange(2, 5))]
    values = {k: random_array(rng, (n * rng.randrange(1, 4), rng.randrange(2, 7)), "float32") for k in names}
    mesh = tessel.Mesh({"x": n})
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, shardings={k: tessel.P("x") for k in names}, mesh=mesh, use_ocdbt=False)
    prefix = f"listed-{rng.randrange(10**9)}"
    upload_tree(store, local, prefix)
    url = store.url(prefix)
    chunks = {k for k in store.keys(prefix + "/") if re.fullmatch(r"p\d+/\d+\.\d+", k[len(prefix) + 1:])}
    assert len(chunks) == n * len(names), sorted(chunks)

    requests = []
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        store.point_at(monkeypatch, proxy.endpoint)
        proxy.on_request = lambda method, path: requests.append((method, path))
        got = tessel.checkpoint.restore(url, mesh=tessel.Mesh({"x": rng.choice([1, 2, n])}))
        for k, want in values.items():
            assert_bit_identical(got[k].to_numpy(), want, k)
        sizes = [store.size_asked(m, p) for m, p in requests]
        assert not chunks & set(sizes), [s for s in sizes if s in chunks]
        # Every chunk read, none more than once: the reads did not move elsewhere.
        read = [(store.object_name(p) or "").removeprefix(f"/{store.bucket}/") for m, p in requests if m == "GET"]
        assert all(read.count(c) == 1 for c in chunks), read
    # A chunk that is not there fails as it does on a disk, naming it (the store asked directly:
    # the proxy is gone).
    store.point_at(monkeypatch, store.endpoint)
    gone = sorted(chunks)[rng.randrange(len(chunks))]
    store.remove(gone)
    os.remove(os.path.join(local, gone[len(prefix) + 1:]))
    param, chunk = gone[len(prefix) + 1:].split("/")
    for where in (url, local):
        with pytest.raises(tessel.Error, match=rf"'{param}' chunk {re.escape(chunk)} \({re.escape(where)}/{param}/{re.escape(chunk)}\) is missing"):
            tessel.checkpoint.restore(where)


def small_arrays_in_bucket(rng, tmp, store, name, count):
    """An item of `count` small one-chunk arrays saved as plain files and uploaded under a fresh
    prefix: (names, values, prefix, url)."""
    names = [f"p{i}" for i in range(count)]
    values = {k: random_array(rng, (rng.randrange(1, 5), rng.randrange(2, 7)), "float32") for k in names}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, use_ocdbt=False)
    prefix = f"{name}-{rng.randrange(10**9)}"
    upload_tree(store, local, prefix)
    return names, values, prefix, store.url(prefix)


def test_a_small_item_is_listed_whole_in_one_request(rng, tmp, store, monkeypatch):
    """Plain files in a bucket: an item of fewer objects than a listing page (1000) is listed whole,
    once, and each one-chunk array then costs TensorStore's two requests (its zarr metadata and its
    chunk), no listing or size request of its own. An item of a page of objects or more lists each
    array's directory instead, with the same values."""
    names, values, prefix, url = small_arrays_in_bucket(rng, tmp, store, "whole", rng.randrange(6, 14))

    def restore_seen():
        requests = []
        with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
            store.point_at(monkeypatch, proxy.endpoint)
            proxy.on_request = lambda method, path: requests.append((method, path))
            got = tessel.checkpoint.restore(url)
        store.point_at(monkeypatch, store.endpoint)
        for k, want in values.items():
            assert_bit_identical(got[k].to_numpy(), want, k)
        listings = [store.listing(m, p) for m, p in requests]
        return requests, [l for l in listings if l is not None and l[1] == "" and l[0].startswith(prefix + "/")]

    requests, listings = restore_seen()
    assert listings == [(prefix + "/", "")], listings
    for k in names:
        below = f"{prefix}/{k}/"
        reads = [o.removeprefix(f"/{store.bucket}/") for m, p in requests if m == "GET" and (o := store.object_name(p))]
        assert sorted(o for o in reads if o.startswith(below)) == [below + ".zarray", below + "0.0"], reads
        sizes = [s for s in (store.size_asked(m, p) for m, p in requests) if s and s.startswith(below)]
        assert not sizes, sizes

    # A page of objects more (outside the tree): the item is listed by its arrays' directories.
    # One upload at a time: the GCS emulator drops connections under many at once.
    for i in range(1000):
        store.put(f"{prefix}/extra/{i}", b"x")
    _, listings = restore_seen()
    assert sorted(listings) == sorted([(prefix + "/", "")] + [(f"{prefix}/{k}/", "") for k in names]), listings


def test_an_item_in_a_bucket_opens_its_arrays_together(rng, tmp, store, monkeypatch):
    """Plain files in a far bucket: opening an item asks for its arrays' listings and zarr metadata
    several at a time, not one round trip after another (an item of thousands of arrays opened in
    minutes), each array's still once."""
    names, values, prefix, url = small_arrays_in_bucket(rng, tmp, store, "opened", rng.randrange(24, 40))
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        store.point_at(monkeypatch, proxy.endpoint)
        proxy.delay = 0.05  # a round trip to a bucket in another region
        got = tessel.checkpoint.restore(url)
        for k, want in values.items():
            assert_bit_identical(got[k].to_numpy(), want, k)
    read = [((store.object_name(p) or "").removeprefix(f"/{store.bucket}/"), n) for m, p, n in proxy.arrivals if m == "GET"]
    zarrays = [(o, n) for o, n in read if o.endswith("/.zarray")]
    assert sorted(o for o, _ in zarrays) == sorted(f"{prefix}/{k}/.zarray" for k in names), zarrays
    assert max(n for _, n in zarrays) > 1, "the arrays' metadata were asked for one after another"


def test_faults_are_retried_and_failures_are_clear(rng, tmp, store, monkeypatch):
    values = {"w": random_array(rng, (64, 48), "float32"), "b": random_array(rng, (48,), "float32")}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, use_ocdbt=False)
    prefix = f"faults-{rng.randrange(10**9)}"
    upload_tree(store, local, prefix)
    url = store.url(prefix)

    # A third of the requests answered with 503 SlowDown, 500, 429 or a dropped connection, none
    # more than 4 times in a row (the clients make 8 attempts).
    with FaultProxy(store.endpoint, rate=0.3, seed=rng.randrange(2**32), max_in_a_row=4) as proxy:
        store.point_at(monkeypatch, proxy.endpoint)
        for _ in range(3):
            got = tessel.checkpoint.restore(url, mesh=tessel.Mesh({"x": 4}))
            for name, want in values.items():
                assert_bit_identical(got[name].to_numpy(), want, name)
        assert sum(proxy.faults.values()) > 0 and proxy.forwarded > 0, proxy.faults
        print("faults injected and retried in restores:", proxy.faults, "forwarded:", proxy.forwarded)
        before = sum(proxy.faults.values())
        # A save through the same faults: objects of several parts (S3's multipart upload, GCS's
        # resumable one, resumed from what the server says it holds), whole afterwards.
        big = {"w": random_array(rng, (rng.randrange(1100, 1500), 4096), "float32")}
        tessel.checkpoint.save(url + "-saved", big)
        assert_bit_identical(tessel.checkpoint.restore(url + "-saved")["w"].to_numpy(), big["w"], "saved through faults")
        assert sum(proxy.faults.values()) > before
        print("and in a save and its restore:", proxy.faults, "forwarded:", proxy.forwarded)
    # Every request failing, with few attempts: the error names the object and the answer.
    with FaultProxy(store.endpoint, rate=1.0, seed=1) as proxy:
        proxy.FAULTS = ("503",)
        store.point_at(monkeypatch, proxy.endpoint)
        monkeypatch.setenv(store.attempts_variable, "2")
        with pytest.raises(tessel.IoError, match=rf"{re.escape(url)}\S*: {proxy.endpoint}/\S*{BUCKET}\S* answered HTTP 503"):
            tessel.checkpoint.restore(url)
        assert proxy.faults["503"] >= 2
    store.point_at(monkeypatch)
    monkeypatch.delenv(store.attempts_variable)

    # A chunk object cut short.
    chunks = [k for k in store.keys(prefix + "/w/") if not k.endswith(".zarray")]
    body = store.get(chunks[0])
    store.put(chunks[0], body[: len(body) // 2])
    with pytest.raises(tessel.Error, match=rf"\({re.escape(store.url(chunks[0]))}\): {len(body) // 2} bytes, an uncompressed "
                                           rf"chunk of \[\d+, \d+\] float32 has {len(body)}"):
        tessel.checkpoint.restore(url)

    with pytest.raises(tessel.IoError, match="does not exist"):
        tessel.checkpoint.restore(store.url("no/such/prefix"))
    with pytest.raises(tessel.IoError, match=store.missing_bucket):
        tessel.checkpoint.restore(f"{store.scheme}://no-such-bucket-here/x")
    with pytest.raises(tessel.ArgumentError, match="bucket name"):
        tessel.checkpoint.restore(f"{store.scheme}://Bad_Bucket/x")


def test_bytes_damaged_in_transit_are_read_again_or_refused(rng, tmp, store, monkeypatch):
    """A metadata object whose bytes do not match the store's checksum (S3's MD5 ETag, GCS's
    x-goog-hash CRC-32C) is read again, and refused when it stays damaged; a chunk damaged on its way fails its CRC-32C, naming the chunk."""
    values = {"w": random_array(rng, (32, 16), "float32")}
    local = os.path.join(tmp, "item")
    tessel.checkpoint.save(local, values, use_ocdbt=False)
    prefix = f"damaged-{rng.randrange(10**9)}"
    upload_tree(store, local, prefix)
    url = store.url(prefix)
    name = lambda path: store.object_name(path) or ""  # noqa: E731
    metadata = lambda method, path: method == "GET" and name(path).endswith("/_METADATA")  # noqa: E731
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        store.point_at(monkeypatch, proxy.endpoint)
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
        monkeypatch.setenv(store.attempts_variable, "3")
        with pytest.raises(tessel.IoError, match=rf"{re.escape(url)}/_METADATA: checksum mismatch"):
            tessel.checkpoint.restore(url)
        proxy.corrupt = lambda method, path: method == "GET" and "/w/0" in name(path)
        with pytest.raises(tessel.Error) as e:
            tessel.checkpoint.restore(url)
        assert "'w' chunk 0.0" in str(e.value) and "CRC-32C mismatch" in str(e.value), str(e.value)


def test_a_save_to_a_bucket_root_is_refused(store):
    root = f"{store.scheme}://{BUCKET}"
    with pytest.raises(tessel.ArgumentError, match=f"root of the bucket '{root}': give a prefix"):
        tessel.checkpoint.save(root, {"w": np.ones(4, np.float32)})


def tensorstore_read(store, item_prefix, name, use_ocdbt, use_zarr3):
    """The array through TensorStore's own kvstore for the store (under OCDBT for that layout)."""
    if use_ocdbt:
        kvstore = {"driver": "ocdbt", "base": store.kvstore(item_prefix + "/"), "path": f"{name}/"}
    else:
        kvstore = store.kvstore(f"{item_prefix}/{name}/")
    spec = {"driver": "zarr3" if use_zarr3 else "zarr", "kvstore": kvstore}
    return np.asarray(ts.open(spec, open=True).result().read().result())


@pytest.mark.parametrize("layout", ["ocdbt", "files", "zarr3", "safetensors"])
def test_tessel_saves_into_a_bucket(rng, tmp, store, layout):
    """tessel writes straight into the bucket (objects in parts; the commit marker last); it and
    TensorStore's own kvstore read every array back bit for bit."""
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
    url = store.url(prefix)
    if layout == "safetensors":
        tessel.checkpoint.save_safetensors(url, tree, max_file_bytes=8 << 20)
        keys = store.keys(prefix + "/")
        assert f"{prefix}/model.safetensors.index.json" in keys, keys
        import safetensors.numpy as stnp
        for k in keys:
            if k.endswith(".safetensors"):
                data = store.get(k)
                for name, value in stnp.load(data).items():
                    assert_bit_identical(value, leaves(tree)[name.replace(".", "/")], name)
    else:
        tessel.checkpoint.save(url, tree, shardings=shardings, use_ocdbt=layout != "files",
                               use_zarr3=layout == "zarr3")
        keys = store.keys(prefix + "/")
        assert f"{prefix}/commit_success.txt" in keys and f"{prefix}/_METADATA" in keys, keys
        assert not any(".orbax-checkpoint-tmp" in k for k in keys), keys
        for path, want in leaves(tree).items():
            got = tensorstore_read(store, prefix, path.replace("/", "."), layout != "files", layout == "zarr3")
            assert_bit_identical(got, want, f"TensorStore {path}")
    got = tessel.checkpoint.restore(url, shardings=shardings)
    check_shards(got, tree, url)
    with pytest.raises(tessel.IoError, match="already exists"):
        tessel.checkpoint.save(url, tree)


def test_a_save_that_dies_leaves_no_step(rng, tmp, store, monkeypatch):
    """The server gone mid-save: the save fails, no step is committed; the steps before it and a
    later save to the same step are whole."""
    tree = {"w": random_array(rng, (512, 1024), "float32"), "b": random_array(rng, (1024,), "float32")}
    prefix = f"run-{rng.randrange(10**9)}"
    root = store.url(prefix)
    tessel.checkpoint.save(root + "/1", tree)
    assert tessel.checkpoint.steps(root) == [1]
    # A proxy that forwards a few requests, then drops every connection: the server is gone.
    with FaultProxy(store.endpoint, rate=0.0, seed=0) as proxy:
        store.point_at(monkeypatch, proxy.endpoint)
        monkeypatch.setenv(store.attempts_variable, "2")
        original = proxy.rng.random

        def dying():
            return 0.0 if proxy.forwarded >= 6 else 1.0

        proxy.rng.random = dying
        proxy.rate = 0.5
        proxy.FAULTS = ("drop",)
        with pytest.raises(tessel.IoError):
            tessel.checkpoint.save(root + "/2", {"w": random_array(rng, (512, 1024), "float32")})
        proxy.rng.random = original
    store.point_at(monkeypatch)
    monkeypatch.delenv(store.attempts_variable)
    keys = store.keys(prefix + "/2/")
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


def test_training_checkpoints_in_a_bucket(rng, tmp, store):
    """`tessel train` with its CheckpointManager in a bucket: steps committed by their marker,
    max_to_keep applied, a step's leftovers cleared, resumed onto another mesh; the run equals the
    same run checkpointed on a local disk, bit for bit."""
    model = os.path.join(tmp, "m.yml")
    with open(model, "w") as f:
        f.write(MODEL)
    prefix = f"train-{rng.randrange(10**9)}"
    url = store.url(prefix)
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
    store.put(f"{prefix}/6/default/_METADATA", b"{}")
    assert tessel.checkpoint.steps(url) == [2, 4]
    out = train(url, "--resume", "--mesh", "fsdp=4,tensor=2")
    assert "resumed step 4" in out, out
    train(local, "--resume", "--mesh", "fsdp=4,tensor=2")
    assert tessel.checkpoint.steps(url) == tessel.checkpoint.steps(local) == [4, 6]
    keys = store.keys(prefix + "/")
    assert not any(k.startswith(f"{prefix}/2/") for k in keys), "step 2 is past --keep 2"
    assert f"{prefix}/6/commit_success.txt" in keys
    remote, here = tessel.checkpoint.restore(url), tessel.checkpoint.restore(local)
    assert set(leaves(remote)) == set(leaves(here))
    for path, array in leaves(here).items():
        assert_bit_identical(leaves(remote)[path].to_numpy(), array.to_numpy(), path)


def test_a_multi_process_job_saves_and_restores_in_a_bucket(rng, store):
    """A 2-process JAX job saves into the bucket (each process uploading its own blocks into its
    own OCDBT database, process 0 merging and committing); jobs of 4 and 1 processes restore it
    from the bucket onto other meshes, each process reading only its blocks."""
    from jax_job import run_job
    from test_multi_process import TOTAL_DEVICES, check_restored, random_case, random_layout

    prefix = f"job-{rng.randrange(10**9)}"
    case = random_case(rng, store.url(prefix))
    case["save"] = random_layout(rng, case)
    saved = run_job("save_tessel", 2, 4, case)
    assert all(r.get("saved") for r in saved), saved
    keys = store.keys(prefix + "/")
    assert {k.split("/")[1] for k in keys if "/ocdbt.process_" in k} == {"ocdbt.process_0", "ocdbt.process_1"}, keys
    assert f"{prefix}/commit_success.txt" in keys
    for processes in (4, 1):
        case["restore"] = random_layout(rng, case)
        case["restore"]["form"] = "sds"
        results = run_job("restore_tessel", processes, TOTAL_DEVICES // processes, case)
        check_restored(results, case, processes)
