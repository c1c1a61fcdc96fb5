"""tessel inside multi-process JAX jobs: 2 and 4 local processes (jax.distributed on 127.0.0.1,
host CPU devices, gloo), each restoring only its own devices' blocks and saving only the blocks
whose replica 0 it holds, in Orbax's multi-process layout; checked bit for bit across N -> M
processes and meshes whose device order is not process order, against Orbax both ways, and for
failures (a process that raises, one that dies, blocks missing on restore)."""
import json
import os

import numpy as np
import pytest

import tessel
from jax_job import run_job, run_processes

TOTAL_DEVICES = 8


def random_case(rng, path, seed_arrays=True):
    arrays = {
        "params/w": [[8 * rng.randint(4, 32), 8 * rng.randint(4, 32)], "float32"],
        "params/emb": [[8 * rng.randint(8, 64), 64], "bfloat16"],
        "params/e": [[8, 8, 8 * rng.randint(1, 3)], "int32"],
        "step": [[], "int32"],
    }
    return {"seed": rng.randrange(2**31), "path": path, "arrays": arrays}


def random_layout(rng, case, shape=None):
    """A global mesh of the 8 devices in a random order (not process order) and a random spec per
    array on it."""
    shape = shape or rng.choice([[2, 4], [4, 2], [8, 1], [1, 8]])
    order = list(range(TOTAL_DEVICES))
    rng.shuffle(order)
    axes = ["x", "y"]
    specs = {}
    for name, (dims, _) in case["arrays"].items():
        free = list(axes)
        spec = []
        for _ in dims:
            pick = rng.choice([None, None] + free)
            if pick is not None:
                free.remove(pick)
            spec.append(pick)
        specs[name] = spec
    return {"mesh": {"shape": shape, "axes": axes, "order": order}, "specs": specs}


def check_restored(results, case, processes):
    """Every process restored its shards (checked bit for bit in the process) reading only its
    part; returns the checkpoint's (logical bytes, stored bytes)."""
    total = sum(int(np.prod(dims)) * (2 if dt == "bfloat16" else np.dtype(dt).itemsize)
                for dims, dt in case["arrays"].values())
    stored = sum(a["stored_bytes"] for a in tessel.checkpoint.info(case["path"])["arrays"])
    assert len(results) == processes
    for r in results:
        assert r["shards"] > 0 and r["local_devices"] * processes == TOTAL_DEVICES
        if "aliased" in r:  # tessel: JAX took tessel's buffers without a second copy
            assert r["aliased"] == r["blocks"], r
        if "bytes_read" in r:
            if stored == total:  # uncompressed chunks (tessel's default): exactly its blocks' bytes
                assert r["bytes_read"] == r["shard_bytes"], r
            else:  # Orbax's zstd chunks are read whole, each once: never more than the checkpoint
                assert r["bytes_read"] <= stored, (r, stored)
    return total, stored


@pytest.mark.parametrize("saver", ["tessel", "orbax"])
def test_saved_by_2_processes_restores_with_1_2_4_onto_other_meshes(tmp, rng, saver):
    case = random_case(rng, os.path.join(tmp, "ckpt"))
    case["save"] = random_layout(rng, case)
    saved = run_job(f"save_{saver}", 2, 4, case)
    assert all(r.get("saved") for r in saved), saved
    assert os.path.isdir(case["path"]) and not os.path.exists(case["path"] + ".orbax-checkpoint-tmp")
    if saver == "tessel":  # Orbax's multi-process layout: one OCDBT database per process
        assert sorted(d for d in os.listdir(case["path"]) if d.startswith("ocdbt.process_")) == \
            ["ocdbt.process_0", "ocdbt.process_1"]
    for processes, form in ((1, "sds"), (2, rng.choice(["sds", "named", "mesh"])), (4, rng.choice(["sds", "named"]))):
        case["restore"] = random_layout(rng, case)
        case["restore"]["form"] = form
        results = run_job("restore_tessel", processes, TOTAL_DEVICES // processes, case)
        total, stored = check_restored(results, case, processes)
        for r in results:
            print(f"{saver} save by 2 -> tessel restore by {processes} ({form}), process {r['process']}: read {r['bytes_read']} B "
                  f"for its {r['shard_bytes']} B of shards (checkpoint {total} B, stored {stored} B), {r['blocks']} "
                  "blocks handed to JAX without a copy")
    if saver == "tessel":  # and Orbax restores tessel's multi-process checkpoint in a job of its own
        case["restore"] = random_layout(rng, case)
        check_restored(run_job("restore_orbax", 2, 4, case), case, 2)


def test_saved_by_4_processes_restores_with_2(tmp, rng):
    case = random_case(rng, os.path.join(tmp, "ckpt"))
    case["save"] = random_layout(rng, case)
    # Saved with logical axes, restored by them through rules on the job's mesh.
    case["logical"] = {"params/w": ["rows", "cols"], "params/emb": ["vocab", "cols"], "params/e": ["depth", "rows", "cols"],
                       "step": []}
    case["rules"] = [["rows", "x"], ["vocab", "x"], ["cols", "y"], ["depth", None]]
    assert all(r.get("saved") for r in run_job("save_tessel", 4, 2, case))
    assert len([d for d in os.listdir(case["path"]) if d.startswith("ocdbt.process_")]) == 4
    case["restore"] = random_layout(rng, case)
    case["restore"]["form"] = "rules"
    results = run_job("restore_tessel", 2, 4, case)
    check_restored(results, case, 2)
    assert results[0]["specs"] == {"params/w": ["x", "y"], "params/emb": ["x", "y"], "params/e": [None, "x", "y"],
                                   "step": []}, results[0]["specs"]
    # In one process, without JAX's job: the same values.
    restored = tessel.checkpoint.restore(case["path"], mesh=tessel.Mesh({"x": 4, "y": 2}))
    from jax_job import arrays

    full = arrays(case)
    for name, want in full.items():
        keys = name.split("/")
        got = restored
        for k in keys:
            got = got[k]
        assert got.to_numpy().tobytes() == want.tobytes(), name


def test_a_process_that_raises_or_dies_leaves_no_step(tmp, rng):
    case = random_case(rng, os.path.join(tmp, "raises"))
    case["save"] = random_layout(rng, case)
    case["fail"] = 1
    results = run_job("save_tessel", 2, 4, case, expect_failure=True)
    for rc, result, err in results:
        assert result is not None and "error" in result, err
    assert "None leaves" in results[1][1]["error"]
    assert "failed on process 1" in results[0][1]["error"] and "None leaves" in results[0][1]["error"]
    assert not os.path.exists(case["path"])

    case = random_case(rng, os.path.join(tmp, "differs"))
    case["save"] = random_layout(rng, case)
    case["differ"] = 1
    for rc, result, err in run_job("save_tessel", 2, 4, case, expect_failure=True):
        assert result is not None and "saves another tree than process 0" in result["error"], (result, err)
        assert "float16" in result["error"], result
    assert not os.path.exists(case["path"])

    case = random_case(rng, os.path.join(tmp, "dies"))
    case["save"] = random_layout(rng, case)
    case["die"], case["timeout_s"] = 1, 8
    results = run_job("save_tessel", 2, 4, case, expect_failure=True, timeout=120)
    assert results[1][0] == 3
    rc, result, err = results[0]
    assert result is not None and "did not arrive within 8 s" in result["error"] and "[1]" in result["error"], (result, err)
    assert not os.path.exists(case["path"])  # at most its .orbax-checkpoint-tmp, which no reader takes

    # Dies in the middle: after writing its blocks, at the meeting where the checksums are
    # gathered for the commit (the save's 4th: preparing, starting, the process databases, this).
    case = random_case(rng, os.path.join(tmp, "dies_writing"))
    case["save"] = random_layout(rng, case)
    case["die"], case["die_at_meeting"], case["timeout_s"] = 1, 3, 8
    results = run_job("save_tessel", 2, 4, case, expect_failure=True, timeout=120)
    assert results[1][0] == 3
    rc, result, err = results[0]
    assert result is not None and "did not arrive within 8 s" in result["error"], (result, err)
    assert "saving" in result["error"], result
    assert not os.path.exists(case["path"])
    assert not os.path.exists(case["path"] + ".orbax-checkpoint-tmp")  # process 0 removed what was written


def test_blocks_missing_on_restore_are_a_clear_error(tmp, rng):
    case = random_case(rng, os.path.join(tmp, "ckpt"))
    case["save"] = random_layout(rng, case, shape=[2, 4])
    # Every array split over both processes' devices, so each database holds a part of each.
    case["save"]["specs"] = {name: (["x"] + [None] * (len(dims) - 1) if dims and dims[0] % 2 == 0 else [None] * len(dims))
                             for name, (dims, _) in case["arrays"].items()}
    case["save"]["mesh"]["order"] = list(range(TOTAL_DEVICES))  # x=0: process 0's devices, x=1: process 1's
    assert all(r.get("saved") for r in run_job("save_tessel", 2, 4, case))
    import shutil

    shutil.rmtree(os.path.join(case["path"], "ocdbt.process_1"))
    with pytest.raises(tessel.Error) as e:
        tessel.checkpoint.restore(case["path"], mesh=tessel.Mesh({"x": 2}))
    message = str(e.value)  # names the array, its chunk and the file that is gone
    assert "ocdbt.process_1" in message and "chunk" in message and "'params/" in message, message
    print("missing blocks:", message)


def test_docs_nnx_workflow_runs_as_a_two_process_job(tmp):
    """examples/python/nnx_multi_host.py (docs/nnx.md, section 7): one's own NNX module placed by
    tessel on the job's global mesh, created sharded, saved by both processes, restored onto
    another global mesh (devices in reverse order) reading only each process's blocks, by tessel
    and by Orbax: the same bits as saved, the same loss."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "nnx_multi_host.py")
    outs = run_processes(lambda p, coordinator: [script, str(p), "2", coordinator, tmp], 2, 4)
    results = []
    for p, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"process {p}: {err[-4000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        print("nnx_multi_host:", r)
        assert r["equal_bit_for_bit"]
        assert abs(r["loss_after"] - r["loss_before"]) <= 1e-5 * abs(r["loss_before"])
        # fsdp=4 over both processes: each holds and reads half of the sharded weights.
        assert r["bytes_read"] == r["shard_bytes"] < 0.75 * r["total_bytes"], r
