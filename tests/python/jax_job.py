"""A multi-process JAX job on this machine for the tests: `run_job` starts N processes of this file
on 127.0.0.1 (a free port, host CPU devices, gloo collectives), bounded in time and always killed
at the end; each runs one scenario and prints its result as JSON on its last line.

Every process builds the same arrays from the case's seed, so each checks its own shards of what it
restored against the expected values bit for bit, with no gathering."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(argv, processes: int, devices: int, timeout: float = 240) -> list:
    """Starts `processes` processes, `argv(p, "127.0.0.1:PORT")` each, of `devices` host CPU devices
    each; returns each one's (returncode, stdout, stderr). All are killed by the end, also when one
    hangs (an AssertionError naming it) or the test fails."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    procs = []
    try:
        for p in range(processes):
            procs.append(subprocess.Popen([sys.executable, *argv(p, coordinator)], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env=env, start_new_session=True))
        deadline = time.monotonic() + timeout
        outs = []
        for p, proc in enumerate(procs):
            try:
                out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{argv(p, coordinator)[:2]}: process {p} of {processes} did not finish within "
                                     f"{timeout} s") from None
            outs.append((proc.returncode, out, err))
        return outs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_job(scenario: str, processes: int, devices: int, case: dict, timeout: float = 240,
            expect_failure: bool = False) -> list:
    """Runs `scenario` of this file in a job; returns each process's result (a dict), or with
    expect_failure each one's (returncode, result or None, the end of its stderr)."""
    outs = run_processes(lambda p, coordinator: [os.path.join(HERE, "jax_job.py"), scenario, str(p), str(processes),
                                                 coordinator, json.dumps(case)], processes, devices, timeout)
    results = []
    for p, (rc, out, err) in enumerate(outs):
        line = next((l for l in reversed(out.splitlines()) if l.startswith("RESULT ")), None)
        result = json.loads(line[len("RESULT "):]) if line else None
        if expect_failure:
            results.append((rc, result, err[-3000:]))
        else:
            assert rc == 0 and result is not None, f"{scenario}: process {p} of {processes} failed (rc {rc}):\n{err[-4000:]}"
            results.append(result)
    return results


# ---------------------------------------------------------------------------------------------
# Inside a process of the job


def arrays(case: dict) -> dict:
    """The case's arrays, the same in every process: {name: numpy array}."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(case["seed"])
    out = {}
    for name, (shape, dtype) in case["arrays"].items():
        if dtype == "bfloat16":
            out[name] = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
        elif dtype.startswith("int"):
            out[name] = rng.integers(-2**30, 2**30, size=shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def mesh(jax, spec: dict):
    """A global mesh of the job's devices in the order `spec["order"]` gives (a permutation of
    their positions by id), so that mesh order need not be process order."""
    import numpy as np

    devices = sorted(jax.devices(), key=lambda d: d.id)
    order = spec.get("order") or list(range(len(devices)))
    grid = np.array([devices[i] for i in order], dtype=object).reshape(spec["shape"])
    return jax.sharding.Mesh(grid, tuple(spec["axes"]))


def shardings(jax, case: dict, which: str) -> dict:
    m = mesh(jax, case[which]["mesh"])
    return {name: jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec(*spec))
            for name, spec in case[which]["specs"].items()}


def global_arrays(jax, case: dict, which: str) -> dict:
    full = arrays(case)
    return {name: jax.make_array_from_callback(full[name].shape, s, lambda index, a=full[name]: a[index])
            for name, s in shardings(jax, case, which).items()}


def nest(flat: dict) -> dict:
    """{"a/b": x} -> {"a": {"b": x}}"""
    out: dict = {}
    for path, v in flat.items():
        *parents, leaf = path.split("/")
        node = out
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = v
    return out


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        p = f"{prefix}/{k}" if prefix else k
        out.update(flatten(v, p) if isinstance(v, dict) else {p: v})
    return out


def check_shards(restored: dict, full: dict) -> dict:
    """Each addressable shard equal to the expected block bit for bit; returns its bytes (distinct
    blocks once) and the count of shards compared."""
    import numpy as np

    distinct, shards = set(), 0
    nbytes = 0
    for name, a in restored.items():
        assert a.shape == full[name].shape and a.dtype == full[name].dtype, (name, a.shape, a.dtype)
        for s in a.addressable_shards:
            got = np.asarray(s.data)
            want = full[name][s.index]
            assert got.tobytes() == want.tobytes(), f"{name} {s.index} on device {s.device.id} differs"
            key = (name, tuple((sl.start, sl.stop) for sl in s.index))
            if key not in distinct:
                distinct.add(key)
                nbytes += got.nbytes
            shards += 1
    return {"shard_bytes": nbytes, "shards": shards}


def main() -> None:
    scenario, pid, count, coordinator, case = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=count, process_id=pid,
                               initialization_timeout=120)
    import numpy as np

    import tessel

    result: dict = {"process": pid}
    path = case.get("path")
    if scenario == "save_tessel":
        tree = global_arrays(jax, case, "save")
        if case.get("die") == pid and "die_at_meeting" not in case:
            os._exit(3)  # dies instead of saving: the others must give up and commit nothing
        if case.get("die") == pid:  # dies in the middle of the save, at its n-th meeting
            from tessel import _job

            gather, calls = _job.Meeting.all_gather, [0]

            def dying(self, mine, what):
                calls[0] += 1
                if calls[0] > case["die_at_meeting"]:
                    os._exit(3)
                return gather(self, mine, what)

            _job.Meeting.all_gather = dying
        if case.get("fail") == pid:  # a bad leaf in this process only: every process must raise
            tree[next(iter(case["arrays"]))] = None
        if case.get("differ") == pid:  # another dtype in this process only: the same
            first = next(iter(case["arrays"]))
            tree[first] = tree[first].astype(np.float16)
        try:
            logical = {n: tuple(a) for n, a in case["logical"].items()} if "logical" in case else None
            tessel.checkpoint.save(path, nest(tree), timeout_s=case.get("timeout_s", 120),
                                   logical_axes=nest(logical) if logical else None)
            result["saved"] = True
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
    elif scenario == "save_orbax":
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as c:
            c.save(path, nest(global_arrays(jax, case, "save")))
        result["saved"] = True
    elif scenario in ("restore_tessel", "restore_orbax"):
        full = arrays(case)
        target = {name: jax.ShapeDtypeStruct(full[name].shape, full[name].dtype, sharding=s)
                  for name, s in shardings(jax, case, "restore").items()}
        stats: dict = {}
        if scenario == "restore_orbax":
            import orbax.checkpoint as ocp

            with ocp.StandardCheckpointer() as c:
                restored = flatten(c.restore(path, nest(target)))
        else:
            form = case["restore"].get("form", "sds")
            try:
                if form == "rules":  # a tessel Mesh of JAX's device ids and rules: the saved logical axes
                    jmesh = mesh(jax, case["restore"]["mesh"])
                    rules = tessel.LogicalRules([tuple(r) for r in case["rules"]])
                    sharded = flatten(tessel.checkpoint.restore(path, mesh=tessel.from_jax(jmesh), rules=rules,
                                                                stats=stats))
                    result["specs"] = {n: list(a.sharding.spec) for n, a in sharded.items()}
                elif form == "mesh":  # a tessel Mesh of JAX's device ids: the saved specs on it
                    jmesh = mesh(jax, case["restore"]["mesh"])
                    sharded = flatten(tessel.checkpoint.restore(path, mesh=tessel.from_jax(jmesh), stats=stats))
                    target = {n: jax.ShapeDtypeStruct(full[n].shape, full[n].dtype, sharding=jax.sharding.NamedSharding(
                        jmesh, jax.sharding.PartitionSpec(*case["save"]["specs"][n]))) for n in full}
                else:  # jax.ShapeDtypeStructs, or JAX NamedShardings
                    given = target if form == "sds" else {n: t.sharding for n, t in target.items()}
                    sharded = flatten(tessel.checkpoint.restore(path, shardings=given, stats=stats))
            except Exception as e:
                print("RESULT " + json.dumps({"process": pid, "error": f"{type(e).__name__}: {e}"}), flush=True)
                return
            # The jax.Arrays take tessel's buffers as they are: the same addresses, no copy.
            restored, aliased, blocks = {}, 0, 0
            for name, a in sharded.items():
                restored[name] = a.to_jax(target[name].sharding if form in ("sds", "named") else None)
                ours = {s.device: s.data.ctypes.data for s in a.shards}
                for s in restored[name].addressable_shards:
                    blocks += 1
                    aliased += s.data.unsafe_buffer_pointer() == ours.get(s.device.id)
            result.update(aliased=aliased, blocks=blocks)
        result.update(check_shards(restored, full))
        result.update({k: v for k, v in stats.items()})
        result["local_devices"] = len(jax.local_devices())
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print("RESULT " + json.dumps(result), flush=True)
    if "die" in case:  # JAX's shutdown would wait for the dead process at its exit barrier
        os._exit(0)


if __name__ == "__main__":
    main()
