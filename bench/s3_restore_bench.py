"""Restore from a local S3 server (moto's, on 127.0.0.1) against TensorStore reading the same
objects through its own s3 kvstore, in one run, rounds alternating, each reader in a fresh
process (so that RSS is its own).

The checkpoint: `--mib` MiB of float32 in 8 arrays of [rows, 4096], saved by tessel (OCDBT + zarr
v2, uncompressed, chunks of 16 MiB) into the bucket. tessel restores every array onto one device
(`tessel.checkpoint.restore(url)`); TensorStore opens each array (`zarr` over `ocdbt` over `s3`)
and reads it whole into NumPy. The physical limit in the same run: boto3's download of the same
objects' bytes, whole, into memory (`get_object(...).read()` on 8 threads). Each figure is the
median of the rounds: GB/s of array bytes, and the process's peak RSS growth over the read,
against the bytes read.

    .venv/bin/python bench/s3_restore_bench.py [--mib 512] [--rounds 5] [--prime]

moto's server is Python (Flask): its rate bounds all three readers alike; the ratios between
them are the figures that carry to a real store.
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


def reader(kind, url, endpoint, rows, prime):
    """One restore in this process; prints {"seconds", "bytes", "rss_growth"}."""
    import numpy as np

    # The reader's libraries are loaded before the baseline: RSS growth is the read's own.
    if kind == "tessel":
        import tessel  # noqa: F401
    elif kind == "tensorstore":
        import tensorstore  # noqa: F401
    else:
        import boto3  # noqa: F401
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

        got = tessel.checkpoint.restore(url)  # the arrays are on their device when it returns
        assert len(got) == ARRAYS and all(tuple(got[f"a{i}"].shape) == (rows, COLS) for i in range(ARRAYS))
        nbytes = ARRAYS * rows * COLS * 4
    elif kind == "tensorstore":
        import tensorstore as ts

        prefix = url.removeprefix(f"s3://{BUCKET}/")
        base_kv = {"driver": "s3", "bucket": BUCKET, "endpoint": endpoint, "aws_region": "us-east-1",
                   "path": prefix + "/"}
        arrays = [ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": base_kv, "path": f"a{i}/"}},
                          open=True).result() for i in range(ARRAYS)]
        futures = [a.read() for a in arrays]
        values = [np.asarray(f.result()) for f in futures]
        nbytes = sum(v.nbytes for v in values)
    else:  # the objects' bytes, whole, on 8 threads
        from concurrent.futures import ThreadPoolExecutor

        from object_store import s3_client

        client = s3_client(endpoint)
        prefix = url.removeprefix(f"s3://{BUCKET}/")
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/ocdbt.process_0/d/")["Contents"]]
        with ThreadPoolExecutor(8) as pool:
            nbytes = sum(len(b) for b in pool.map(lambda k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read(), keys))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "bytes": nbytes, "rss_growth": peak_rss() - base}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prime", action="store_true", help="each reader touches 3x the bytes first")
    p.add_argument("--reader", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.reader:
        kind, url, endpoint, rows, prime = a.reader
        reader(kind, url, endpoint, int(rows), prime == "1")
        return
    import numpy as np

    import tessel
    from object_store import CREDENTIALS, moto_server, s3_client

    rows = a.mib * (1 << 20) // (ARRAYS * COLS * 4)
    env = dict(os.environ, **CREDENTIALS)
    os.environ.update(CREDENTIALS)
    with moto_server() as endpoint:
        env["AWS_ENDPOINT_URL_S3"] = os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        rng = np.random.default_rng(0)
        tree = {f"a{i}": rng.random((rows, COLS), dtype=np.float32) for i in range(ARRAYS)}
        url = f"s3://{BUCKET}/ckpt"
        t0 = time.perf_counter()
        tessel.checkpoint.save(url, tree, max_chunk_bytes=16 << 20)
        print(f"saved {a.mib} MiB into the bucket in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        results = {k: [] for k in ("objects", "tessel", "tensorstore")}
        for r in range(a.rounds):
            order = list(results)[r % 3:] + list(results)[:r % 3]
            for kind in order:
                out = subprocess.run([sys.executable, __file__, "--reader", kind, url, endpoint, str(rows), str(int(a.prime))],
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
