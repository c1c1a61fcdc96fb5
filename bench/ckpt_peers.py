"""The peers of bench/checkpoint_bench.sh, one measurement per process (its own peak RSS): a BYTES
f32 state of 8192x4096 arrays (values like trained weights), sharded P('fsdp') over 8 host CPU
devices, saved and restored as jax.Arrays onto fsdp=8 (the same mesh) or data=2,tensor=4 (another
mesh, P(None, 'tensor'): every block held twice).

  ckpt_peers.py PEER save DIR BYTES CODEC      PEER: orbax, tensorstore, tessel (the Python package)
  ckpt_peers.py PEER restore DIR BYTES MESH    CODEC: none or zstd:1 (Orbax's default is zstd level 1)
  ckpt_peers.py zarr write|read|columns DIR BYTES CODEC   python zarr on the host, no JAX

Orbax: its StandardCheckpointer layout (OCDBT + zarr v2), compression on or off. TensorStore
directly: one zarr v2 array per parameter in plain files, chunks of one shard, every shard written
and every device's block read as concurrent TensorStore operations. tessel: tessel.checkpoint.save
from the jax.Arrays and restore(as_jax=True). Prints one JSON line: state bytes per second, seconds,
the process's peak RSS, its RSS before the work (the interpreter and JAX), and the target bytes.
"""
import json
import os
import resource
import sys
import time

peer, mode, dest, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
arg = sys.argv[5]
ROWS, COLS = 8192, 4096
count = max(1, total // (ROWS * COLS * 4))
state_bytes = count * ROWS * COLS * 4

if peer != "zarr":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402


def rss_now():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def start():
    """The process's RSS when its measured work starts. With TESSEL_BENCH_PRIME_BYTES set, that many
    bytes are first touched and freed (bench/restore_bench.sh: on a VM whose balloon hands idle free
    memory back to the host, the work then runs on host-backed memory, like every other process of
    the comparison; the peak RSS figure then includes them)."""
    prime = int(os.environ.get("TESSEL_BENCH_PRIME_BYTES", "0"))
    if prime > 0:
        np.ones(prime, dtype=np.uint8)
    return rss_now()


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def values(i):
    """Random mantissas in a narrow exponent range, as bench_checkpoint writes: they barely compress."""
    rng = np.random.default_rng(i)
    bits = rng.integers(0, 1 << 25, size=(ROWS, COLS), dtype=np.uint32) | np.uint32(0x3C000000)
    return bits.view(np.float32)


def report(name, seconds, base, target_bytes):
    print(json.dumps({"name": name, "result": {"gbps": state_bytes / seconds / 1e9, "seconds": seconds,
                                               "peak_rss": peak_rss(), "base_rss": base,
                                               "target_bytes": target_bytes}}))


if peer == "zarr":
    import zarr
    from numcodecs import Zstd

    base = start()
    t0 = time.perf_counter()
    if mode == "write":
        value = values(0)
        t0 = time.perf_counter()
        for i in range(count):
            z = zarr.create_array(f"{dest}/{i}", shape=value.shape, chunks=(1024, COLS), dtype="<f4", zarr_format=2,
                                  compressors=Zstd(level=1) if arg == "zstd:1" else None, fill_value=0)
            z[...] = value
        os.sync()
        target = 0
    elif mode == "read":  # every array kept in memory until all are read, as a restore does
        kept = [zarr.open_array(f"{dest}/{i}", mode="r")[...] for i in range(count)]
        target = state_bytes
    else:  # onto data=2,tensor=4 by hand: 4 column blocks of every array, each kept twice
        kept = []
        for i in range(count):
            z = zarr.open_array(f"{dest}/{i}", mode="r")
            for k in range(4):
                block = z[:, k * 1024:(k + 1) * 1024]
                kept += [block, block.copy()]
        target = 2 * state_bytes
    report(f"zarr {mode} {arg}", time.perf_counter() - t0, base, target)
    sys.exit(0)

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

devices = jax.devices()
AXES = ("data", "fsdp", "tensor")


def sharding(mesh_text):
    if mesh_text == "fsdp=8":
        return NamedSharding(Mesh(np.array(devices).reshape(1, 8, 1), AXES), P("fsdp", None))
    if mesh_text == "data=2,tensor=4":
        return NamedSharding(Mesh(np.array(devices).reshape(2, 1, 4), AXES), P(None, "tensor"))
    raise SystemExit(f"unknown mesh {mesh_text}")


def state():
    s = sharding("fsdp=8")
    return {f"p{i}": jax.device_put(values(i), s) for i in range(count)}


def target_bytes(tree):
    return sum(shard.data.nbytes for a in tree.values() for shard in a.addressable_shards)


if peer == "orbax":
    import orbax.checkpoint as ocp

    def checkpointer(codec):
        return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=codec != "none"))

    if mode == "save":
        tree = state()
        base = start()
        t0 = time.perf_counter()
        with checkpointer(arg) as c:
            c.save(os.path.abspath(dest), tree)
        report(f"orbax save {arg}", time.perf_counter() - t0, base, 0)
    else:
        s = sharding(arg)
        target = {f"p{i}": jax.ShapeDtypeStruct((ROWS, COLS), np.float32, sharding=s) for i in range(count)}
        base = start()
        t0 = time.perf_counter()
        with checkpointer("none") as c:
            got = c.restore(os.path.abspath(dest), args=ocp.args.PyTreeRestore(
                item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
        jax.block_until_ready(got)
        report(f"orbax restore {arg}", time.perf_counter() - t0, base, target_bytes(got))

elif peer == "tensorstore":
    import tensorstore as ts

    def spec(i, codec):
        return {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{os.path.abspath(dest)}/p{i}/"},
                "metadata": {"shape": [ROWS, COLS], "chunks": [ROWS // 8, COLS], "dtype": "<f4",
                             "compressor": {"id": "zstd", "level": 1} if codec == "zstd:1" else None}}

    if mode == "save":
        tree = state()
        base = start()
        t0 = time.perf_counter()
        stores = [ts.open(spec(i, arg), create=True).result() for i in range(count)]
        writes = [stores[i][shard.index].write(np.asarray(shard.data))
                  for i, a in enumerate(tree.values()) for shard in a.addressable_shards if shard.replica_id == 0]
        for w in writes:
            w.result()
        report(f"tensorstore save {arg}", time.perf_counter() - t0, base, 0)
    else:
        s = sharding(arg)
        base = start()
        t0 = time.perf_counter()
        stores = [ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": f"{os.path.abspath(dest)}/p{i}/"}}).result()
                  for i in range(count)]
        index_map = s.devices_indices_map((ROWS, COLS))
        reads = [[(d, stores[i][index].read()) for d, index in index_map.items()] for i in range(count)]
        got = {}
        for i, per_device in enumerate(reads):
            blocks = [jax.device_put(future.result(), d) for d, future in per_device]
            got[f"p{i}"] = jax.make_array_from_single_device_arrays((ROWS, COLS), s, blocks)
        jax.block_until_ready(got)
        report(f"tensorstore restore {arg}", time.perf_counter() - t0, base, target_bytes(got))

elif peer == "tessel":
    import tessel

    if mode == "save":
        tree = state()
        base = start()
        t0 = time.perf_counter()
        tessel.checkpoint.save(dest, tree, compression=arg)
        report(f"tessel-python save {arg}", time.perf_counter() - t0, base, 0)
    else:
        s = sharding(arg)
        base = start()
        t0 = time.perf_counter()
        got = tessel.checkpoint.restore(dest, shardings={f"p{i}": s for i in range(count)}, as_jax=True)
        jax.block_until_ready(got)
        report(f"tessel-python restore {arg}", time.perf_counter() - t0, base, target_bytes(got))
else:
    raise SystemExit(f"unknown peer {peer}")
