"""Opening an item of many small arrays in a far bucket: plain files (zarr v2, one chunk per
array) in moto's S3 server behind tests/python/object_store.py's FaultProxy, which holds every
request `--delay-ms` first (a round trip to a bucket in another region). Rounds alternate, each
reader in a fresh process:

- tessel: `tessel.checkpoint.restore(url)` (the item's arrays opened, their chunks read);
- tensorstore: TensorStore opens every array's `zarr` driver at once (its futures), then reads
  them all (its own asynchronous I/O);
- floor: one request per array's object, `--delay-ms` each, on 16 threads (the bound for any
  reader making one round trip per object with tessel's 16 threads).

`--old PATH` adds a reader importing tessel from PATH (an older build's package: before and after
a change, in the same run). Prints the medians, seconds, each reader's over tessel's, and the
requests each reader made.

    .venv/bin/python bench/bucket_open_bench.py [--arrays 200] [--delay-ms 20] [--rounds 3] [--old DIR]
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
BUCKET = "bench"


def reader(kind, store, arrays):
    """One open and read in this process; prints {"seconds"}."""
    import numpy as np

    if kind in ("tessel", "old"):
        import tessel

        t0 = time.perf_counter()
        got = tessel.checkpoint.restore(store.url("ckpt"))
        assert len(got) == arrays
    else:
        import tensorstore as ts

        t0 = time.perf_counter()
        opened = [ts.open({"driver": "zarr", "kvstore": store.kvstore(f"ckpt/a{i}/")}, open=True) for i in range(arrays)]
        reads = [f.result().read() for f in opened]
        assert sum(np.asarray(r.result()).size for r in reads) > 0
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arrays", type=int, default=200)
    p.add_argument("--delay-ms", type=float, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", help="a directory holding an older build's `tessel` package")
    p.add_argument("--reader", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    from object_store import STORES, FaultProxy, moto_server

    if a.reader:
        kind, endpoint, arrays = a.reader
        reader(kind, STORES["s3"](endpoint, BUCKET, create=False), int(arrays))
        return
    import numpy as np

    import tessel

    with moto_server() as endpoint:
        store = STORES["s3"](endpoint, BUCKET)
        os.environ.update(store.environment())
        rng = np.random.default_rng(0)
        tree = {f"a{i}": rng.random((4, 16), dtype=np.float32) for i in range(a.arrays)}
        tessel.checkpoint.save(store.url("ckpt"), tree, use_ocdbt=False)
        with FaultProxy(endpoint, rate=0.0, seed=0) as proxy:
            proxy.delay = a.delay_ms / 1000
            env = dict(os.environ, **store.environment(proxy.endpoint))
            kinds = ["tessel", "tensorstore", "floor"] + (["old"] if a.old else [])
            results = {k: [] for k in kinds}
            requests = {k: [] for k in kinds if k != "floor"}
            for r in range(a.rounds):
                for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                    if kind == "floor":
                        from concurrent.futures import ThreadPoolExecutor

                        t0 = time.perf_counter()
                        with ThreadPoolExecutor(16) as pool:
                            list(pool.map(lambda _: time.sleep(a.delay_ms / 1000), range(a.arrays)))
                        results[kind].append(time.perf_counter() - t0)
                        continue
                    run_env = dict(env, PYTHONPATH=a.old) if kind == "old" else env
                    before = len(proxy.arrivals)
                    out = subprocess.run([sys.executable, __file__, "--reader", kind, proxy.endpoint, str(a.arrays)],
                                         capture_output=True, text=True, env=run_env)
                    if out.returncode != 0:
                        raise SystemExit(f"{kind} failed:\n{out.stderr}")
                    results[kind].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
                    requests[kind].append(len(proxy.arrivals) - before)
            summary = {"arrays": a.arrays, "delay_ms": a.delay_ms}
            for kind, counts in requests.items():
                summary[kind + "_requests"] = statistics.median(counts)
            for kind, runs in results.items():
                summary[kind + "_s"] = statistics.median(runs)
                summary[kind + "_runs"] = [round(x, 3) for x in runs]
            for kind in kinds:
                if kind != "tessel":
                    summary[kind + "_over_tessel"] = summary[kind + "_s"] / summary["tessel_s"]
            print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
