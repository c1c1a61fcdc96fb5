"""Multi-process restore against Orbax's: a 2-process JAX job (jax.distributed on 127.0.0.1, 4
host CPU devices each) restores one checkpoint that Orbax saved from a 2-process job, onto the
job's global mesh, with tessel (`tessel.checkpoint.restore(..., shardings=ShapeDtypeStructs,
as_jax=True)`) and with Orbax (`StandardCheckpointer().restore(path, target)`), rounds
alternating, each round a fresh job.

Two targets: `same` (the saved sharding: rows over fsdp=8) and `other` (columns over tensor=8, the
devices in reverse order: every device needs a slab of every saved chunk). Per process it
measures the restore's wall time (after a barrier, to block_until_ready), bytes read (rchar of
/proc/self/io: read() and pread() bytes, page cache hits included), its shards' bytes, and peak
RSS growth over the restore; and, as the physical limit in the same run, reading this process's
half of the checkpoint's files into memory (the same bytes, no decoding, no placing). The job's
time is its slower process; the figures are medians of the rounds. Warm page cache (the
checkpoint was just written) unless --cold (root: drops the page cache before each restore).

    .venv/bin/python bench/multi_process_restore_bench.py [--gib 1] [--rounds 3] [--cold]
    .venv/bin/python bench/multi_process_restore_bench.py --save [--gib 1] [--rounds 3]

With --save it times the saves instead: the same state saved by the 2-process job with tessel
(uncompressed, its default, and zstd level 1, Orbax's codec) and with Orbax.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
ROWS = COLS = 4096  # each array: 64 MiB of float32


def value_block(i, index):
    """Array i's block at `index` (slices), the same in every process: a hash of each element's
    global position as a float in [1, 2) with 23 random mantissa bits, so that it does not
    compress (as trained weights hardly do) and costs little to make."""
    import numpy as np

    r, c = index
    rows = np.arange(r.start or 0, r.stop if r.stop is not None else ROWS, dtype=np.uint32)
    cols = np.arange(c.start or 0, c.stop if c.stop is not None else COLS, dtype=np.uint32)
    x = rows[:, None] * np.uint32(COLS) + cols[None, :] + np.uint32(i * ROWS * COLS)
    x = (x ^ (x >> np.uint32(16))) * np.uint32(0x45D9F3B)
    x = (x ^ (x >> np.uint32(16))) * np.uint32(0x45D9F3B)
    x ^= x >> np.uint32(16)
    return ((x >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32)


def rchar():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("rchar")).split()[1])


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(role, engine, pid, count, coordinator, config):
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=count, process_id=pid, initialization_timeout=120)
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils

    import tessel

    devices = sorted(jax.devices(), key=lambda d: d.id)
    P = jax.sharding.PartitionSpec
    names = [f"w{i}" for i in range(config["arrays"])]
    if role == "save":
        mesh = jax.sharding.Mesh(np.array(devices), ("fsdp",))
        s = jax.sharding.NamedSharding(mesh, P("fsdp", None))
        tree = {n: jax.make_array_from_callback((ROWS, COLS), s, lambda idx, i=i: value_block(i, idx))
                for i, n in enumerate(names)}
        if engine == "orbax-untimed":  # the checkpoint the restores read
            with ocp.StandardCheckpointer() as c:
                c.save(config["path"], tree)
            print("RESULT {}", flush=True)
            return
        jax.block_until_ready(tree)
        prime = np.ones(3 * config["arrays"] * ROWS * COLS * 4 // count, np.uint8)  # as for the restores
        del prime
        multihost_utils.sync_global_devices("start")
        t0 = time.perf_counter()
        if engine == "orbax":  # its defaults: OCDBT, zstd; done when the checkpointer has finished
            with ocp.StandardCheckpointer() as c:
                c.save(config["path"], tree)
        else:  # "tessel" (uncompressed, its default) or "tessel-zstd" (Orbax's codec)
            tessel.checkpoint.save(config["path"], tree, compression="zstd:1" if engine == "tessel-zstd" else "none")
        seconds = time.perf_counter() - t0
        multihost_utils.sync_global_devices("end")
        print("RESULT " + json.dumps({"process": pid, "seconds": seconds,
                                      "shard_bytes": sum(s.data.nbytes for a in tree.values()
                                                         for s in a.addressable_shards)}), flush=True)
        return
    if config["target"] == "same":
        s = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("fsdp",)), P("fsdp", None))
    else:
        s = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices[::-1]), ("tensor",)), P(None, "tensor"))
    target = {n: jax.ShapeDtypeStruct((ROWS, COLS), np.float32, sharding=s) for n in names}
    peak = {"rss": 0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak["rss"] = max(peak["rss"], rss())
            time.sleep(0.005)

    # This VM's balloon hands memory that stayed free a few seconds back to the host, and the next
    # first touch of it pays a host fault (2-5x slower: bench/restore_bench.sh). Each process
    # touches and frees 3x its share first, so that both restores run on memory the host backs,
    # as in a running job.
    prime = np.ones(3 * config["arrays"] * ROWS * COLS * 4 // count, np.uint8)
    del prime
    multihost_utils.sync_global_devices("start")
    rss0, read0 = rss(), rchar()
    t = threading.Thread(target=watch)
    t.start()
    import resource
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    stats = {}
    if engine == "tessel":
        restored = tessel.checkpoint.restore(config["path"], shardings=target, as_jax=True, stats=stats)
    else:
        with ocp.StandardCheckpointer() as c:
            restored = c.restore(config["path"], target)
    jax.block_until_ready(restored)
    seconds = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = {"user": cpu1.ru_utime - cpu0.ru_utime, "sys": cpu1.ru_stime - cpu0.ru_stime,
           "minflt": cpu1.ru_minflt - cpu0.ru_minflt}
    done.set()
    t.join()
    peak["rss"] = max(peak["rss"], rss())
    bytes_read = rchar() - read0
    shard_bytes = sum(s.data.nbytes for a in restored.values() for s in a.addressable_shards)
    # Spot checks: a shard of the first and last arrays equals its values.
    for i in (0, len(names) - 1):
        sh = restored[names[i]].addressable_shards[0]
        assert np.array_equal(np.asarray(sh.data), value_block(i, sh.index)), (engine, names[i])
    # The physical limit: this process's share of the checkpoint's stored bytes read into memory
    # (no decoding, no placing), best of 3.
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(config["path"]) for f in fs)
    share = sum(os.path.getsize(f) for f in files) // count
    buf = bytearray(64 << 20)
    limit = float("inf")
    for _ in range(3):
        left, t1 = share, time.perf_counter()
        for f in files[pid:] + files[:pid]:
            with open(f, "rb", buffering=0) as fh:
                while left > 0:
                    n = fh.readinto(memoryview(buf)[:min(len(buf), left)])
                    if not n:
                        break
                    left -= n
            if left <= 0:
                break
        limit = min(limit, time.perf_counter() - t1)
    print("RESULT " + json.dumps({"process": pid, "seconds": seconds, "bytes_read": bytes_read,
                                  "shard_bytes": shard_bytes, "rss_growth": peak["rss"] - rss0,
                                  "limit_seconds": limit, "library_seconds": stats.get("seconds"), "cpu": cpu}), flush=True)


def run(role, engine, config, processes=2, devices=4):
    from jax_job import run_processes

    outs = run_processes(lambda p, coordinator: [os.path.abspath(__file__), "--worker", role, engine, str(p),
                                                 str(processes), coordinator, json.dumps(config)],
                         processes, devices, timeout=900)
    results = []
    for p, (rc, out, err) in enumerate(outs):
        line = next((l for l in reversed(out.splitlines()) if l.startswith("RESULT ")), None)
        if rc != 0 or line is None:
            raise SystemExit(f"{role} {engine}: process {p} failed (rc {rc}):\n{err[-3000:]}")
        results.append(json.loads(line[len("RESULT "):]))
    return results


def save_rounds(config, rounds):
    """The same 1 GiB state saved by a 2-process job: tessel (uncompressed, and zstd level 1 as
    Orbax writes) against Orbax's StandardCheckpointer, rounds alternating, a fresh directory each."""
    total = config["arrays"] * ROWS * COLS * 4
    engines = ("tessel", "tessel-zstd", "orbax")
    times = {e: [] for e in engines}
    base = config["path"]
    for r in range(rounds):
        for e in engines:
            config["path"] = f"{base}-{e}-{r}"
            times[e].append(max(x["seconds"] for x in run("save", e, config)))
            shutil.rmtree(config["path"], ignore_errors=True)
    print(f"save by 2 processes of 4 devices, {total / 2**30:.2f} GiB (rows over fsdp=8), {rounds} rounds")
    print("| save | job time, median (rounds) | GB/s (job) | Orbax / it |")
    print("|---|---|---|---|")
    med = {e: statistics.median(times[e]) for e in engines}
    for e in engines:
        print(f"| {e} | {med[e]:.3f} s ({', '.join(f'{x:.3f}' for x in times[e])}) | {total / med[e] / 1e9:.2f} | "
              f"{med['orbax'] / med[e]:.2f}x |")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        role, engine, pid, count, coordinator, config = sys.argv[2:8]
        worker(role, engine, int(pid), int(count), coordinator, json.loads(config))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint size (arrays of 64 MiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each restore (root)")
    ap.add_argument("--save", action="store_true", help="time saves instead (tessel's and Orbax's)")
    ap.add_argument("--dir", default=None, help="where the checkpoint goes (default: a temporary directory)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir=args.dir)
    try:
        config = {"arrays": max(1, round(args.gib * 16)), "path": os.path.join(work, "ckpt")}
        if args.save:
            save_rounds(config, args.rounds)
            return
        run("save", "orbax-untimed", config)
        total = config["arrays"] * ROWS * COLS * 4
        print(f"checkpoint: Orbax, saved by 2 processes, {total / 2**30:.2f} GiB in {config['arrays']} float32 arrays "
              f"[{ROWS}, {COLS}] (rows over fsdp=8); {'cold' if args.cold else 'warm'} page cache; {args.rounds} rounds")
        for target in os.environ.get("TARGETS", "same,other").split(","):
            config["target"] = target
            rounds = {"tessel": [], "orbax": []}
            for _ in range(args.rounds):
                for engine in ("tessel", "orbax"):
                    if args.cold:
                        drop_caches()
                    rounds[engine].append(run("restore", engine, config))
            med = lambda xs: statistics.median(xs)  # noqa: E731
            job = {e: [max(r["seconds"] for r in rs) for rs in rounds[e]] for e in rounds}
            limit = med([max(r["limit_seconds"] for r in rs) for rs in rounds["tessel"]])
            print(f"\ntarget {target}: " + ("rows over fsdp=8, as saved" if target == "same"
                                            else "columns over tensor=8, devices reversed"))
            print("| restore | job time (median) | GB/s per process | / limit | bytes read per process | "
                  "its shards | RSS growth / its shards |")
            print("|---|---|---|---|---|---|---|")
            for e in ("tessel", "orbax"):
                per = [r for rs in rounds[e] for r in rs]
                shard = med([r["shard_bytes"] for r in per])
                read = med([r["bytes_read"] for r in per])
                growth = med([r["rss_growth"] / r["shard_bytes"] for r in per])
                t = med(job[e])
                print(f"| {e} | {t:.3f} s ({', '.join(f'{x:.3f}' for x in job[e])}) | {shard / t / 1e9:.2f} | "
                      f"{limit / t:.2f} | {read / 2**20:.0f} MiB | {shard / 2**20:.0f} MiB | {growth:.2f}x |")
            print("tessel's library call (open, plan, read, place) of the job time:",
                  f"{med([max(r['library_seconds'] for r in rs) for rs in rounds['tessel']]):.3f} s")
            print(f"limit (each process reads its share of the stored bytes into memory, best of 3): {limit:.3f} s; "
                  f"tessel / Orbax: {med(job['orbax']) / med(job['tessel']):.2f}x faster")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
