"""Restore from a local object store (moto's S3 server, or the GCS emulator, on 127.0.0.1)
against TensorStore reading the same objects through its own kvstore (`s3` or `gcs`), in one run,
rounds alternating, each reader in a fresh process (so that RSS is its own).

The checkpoint: `--mib` MiB of float32 in 8 arrays of [rows, 4096], saved by tessel (OCDBT + zarr
v2, or plain files with `--layout files`; uncompressed, chunks of `--chunk-kib`, 16 MiB unless
given) into the bucket. tessel restores every array onto one device
(`tessel.checkpoint.restore(url)`); TensorStore opens each array (`zarr` over `ocdbt` over the
store, or straight over the store for plain files) and reads it whole into NumPy. The physical limit in the same run: the same objects'
bytes downloaded whole into memory on 8 threads (boto3 for S3, GCS's JSON API for GCS). Each
figure is the median of the rounds: GB/s of array bytes, and the process's peak RSS growth over
the read, against the bytes read.

    .venv/bin/python bench/bucket_restore_bench.py [--store s3|gs] [--mib 512] [--rounds 5] [--prime]
        [--layout ocdbt|files] [--chunk-kib 16384]

Both servers are Python (moto on Flask; the emulator single-threaded): their rate bounds all
three readers alike; the ratios between them are the figures that carry to a real store.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
COLS = 4096
ARRAYS = 8
BUCKET = "bench"


def peak_rss():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM")).split()[1]) * 1024


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reader(kind, store, rows, prime, layout):
    """One restore in this process; prints {"seconds", "bytes", "rss_growth"}."""
    import numpy as np

    # The reader's libraries are loaded before the baseline: RSS growth is the read's own.
    if kind == "tessel":
        import tessel  # noqa: F401
    elif kind == "tensorstore":
        import tensorstore  # noqa: F401
    if prime:  # this VM's balloon: a fresh process's first touch of huge pages is slow (see below)
        touched = np.ones(3 * ARRAYS * rows * COLS * 4, np.uint8)
        del touched
        with open("/proc/self/clear_refs", "w") as f:  # peak RSS from here on
            f.write("5")
    base = rss()
    t0 = time.perf_counter()
    nbytes = 0
    if kind == "tessel":
        import tessel

        got = tessel.checkpoint.restore(store.url("ckpt"))  # the arrays are on their device when it returns
        assert len(got) == ARRAYS and all(tuple(got[f"a{i}"].shape) == (rows, COLS) for i in range(ARRAYS))
        nbytes = ARRAYS * rows * COLS * 4
    elif kind == "tensorstore":
        import tensorstore as ts

        base_kv = store.kvstore("ckpt/")
        kvstores = [{"driver": "ocdbt", "base": base_kv, "path": f"a{i}/"} if layout == "ocdbt"
                    else store.kvstore(f"ckpt/a{i}/") for i in range(ARRAYS)]
        arrays = [ts.open({"driver": "zarr", "kvstore": kv}, open=True).result() for kv in kvstores]
        futures = [a.read() for a in arrays]
        values = [np.asarray(f.result()) for f in futures]
        nbytes = sum(v.nbytes for v in values)
    else:  # the objects' bytes, whole, on 8 threads
        from concurrent.futures import ThreadPoolExecutor

        keys = store.keys("ckpt/ocdbt.process_0/d/") if layout == "ocdbt" else [
            k for k in store.keys("ckpt/a") if not k.rsplit("/", 1)[1].startswith(".")]
        with ThreadPoolExecutor(8) as pool:
            nbytes = sum(len(b) for b in pool.map(store.get, keys))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "bytes": nbytes, "rss_growth": peak_rss() - base}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--store", choices=["s3", "gs"], default="s3")
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prime", action="store_true", help="each reader touches 3x the bytes first")
    p.add_argument("--layout", choices=["ocdbt", "files"], default="ocdbt")
    p.add_argument("--chunk-kib", type=int, default=16 << 10)
    p.add_argument("--reader", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    from object_store import STORES, gcs_server, moto_server

    if a.reader:
        kind, endpoint, rows, prime, layout = a.reader
        reader(kind, STORES[a.store](endpoint, BUCKET, create=False), int(rows), prime == "1", layout)
        return
    import numpy as np

    import tessel

    rows = a.mib * (1 << 20) // (ARRAYS * COLS * 4)
    with moto_server() if a.store == "s3" else gcs_server(BUCKET) as endpoint:
        store = STORES[a.store](endpoint, BUCKET)
        env = dict(os.environ, **store.environment())
        os.environ.update(store.environment())
        rng = np.random.default_rng(0)
        tree = {f"a{i}": rng.random((rows, COLS), dtype=np.float32) for i in range(ARRAYS)}
        url = store.url("ckpt")
        t0 = time.perf_counter()
        tessel.checkpoint.save(url, tree, max_chunk_bytes=a.chunk_kib << 10, use_ocdbt=a.layout == "ocdbt")
        print(f"saved {a.mib} MiB into the bucket in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        results = {k: [] for k in ("objects", "tessel", "tensorstore")}
        for r in range(a.rounds):
            order = list(results)[r % 3:] + list(results)[:r % 3]
            for kind in order:
                out = subprocess.run([sys.executable, __file__, "--store", a.store, "--reader", kind, endpoint, str(rows),
                                      str(int(a.prime)), a.layout],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    raise SystemExit(f"{kind} failed:\n{out.stderr}")
                results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
        summary = {}
        for kind, runs in results.items():
            gbs = [x["bytes"] / x["seconds"] / 1e9 for x in runs]
            summary[kind] = {"gb_s": statistics.median(gbs), "runs": [round(g, 3) for g in gbs],
                             "rss_over_bytes": statistics.median(x["rss_growth"] / x["bytes"] for x in runs)}
        # Speed ratios within a round: the other reader's time over tessel's.
        summary["tessel_over_tensorstore"] = statistics.median(
            s["seconds"] / t["seconds"] for t, s in zip(results["tessel"], results["tensorstore"]))
        summary["tessel_over_objects"] = statistics.median(
            o["seconds"] / t["seconds"] for t, o in zip(results["tessel"], results["objects"]))
        print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
