#!/usr/bin/env python3
"""tessel train across MPI processes (run by ctest): mpi_train_test.py TESSEL MPIEXEC TEST

equivalence: 2 x 4 and 4 x 2 devices give bit for bit the losses, gradient norms and checkpoint of
             1 process x 8 devices.
restore:     a checkpoint saved by 2 processes resumes with 1 process and with 4 processes onto
             another mesh, the two continuing bit for bit alike.
kill:        a process killed (SIGKILL) while the job saves makes the others exit with an error
             soon, and every step left behind is complete and resumes.
mismatch:    processes started with different configurations all report it, and exit with 1.
moe:         tiny MaxText mixtral, deepseek3 (MLA, routed and shared experts) and gpt-oss (sinks,
             sliding windows, expert biases) models, the expert all_to_all across the processes, on data=2,expert=4 give bit for bit the losses of 1
             process at 2 and 4 processes.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TESSEL, MPIEXEC, TEST = sys.argv[1], sys.argv[2], sys.argv[3]
MPI = [MPIEXEC, "--allow-run-as-root", "--oversubscribe"]
# A smaller model than the default keeps each run to a second or two.
MODEL = "model: transformer\nvocab: 256\nembed: 64\nlayers: 2\nheads: 4\nmlp: 128\n"
BASE = ["--steps", "8", "--batch", "8", "--seq", "64", "--log-every", "1"]


def run(cmd, expect=0, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if expect is not None and p.returncode != expect:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p


def train(work, processes, *args, expect=0):
    base = BASE[2:] if "--steps" in args else BASE
    cmd = [TESSEL, "train", "--model", os.path.join(work, "model.yaml"), *base, *args]
    if processes > 0:
        cmd = MPI + ["-np", str(processes)] + cmd + ["--devices-per-process", str(8 // processes)]
    return run(cmd, expect)


def metrics(path):
    with open(path) as f:
        return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f)]


def exported(work, ckpt, step):
    """Every saved array of a step as raw .npy bytes, by path."""
    info = json.loads(run([TESSEL, "ckpt", "info", ckpt, "--step", str(step), "--json"]).stdout)
    out = {}
    for p in info["params"]:
        npy = os.path.join(work, "export.npy")
        run([TESSEL, "ckpt", "export", ckpt, "--step", str(step), "--path", p["path"], "--out", npy])
        with open(npy, "rb") as f:
            out[p["path"]] = f.read()
    return out


def check(cond, message):
    if not cond:
        sys.exit("FAIL: " + message)


def equivalence(work):
    runs = {}
    for processes in (0, 2, 4):
        tag = f"p{processes}"
        train(work, processes, "--stop-at", "6", "--metrics", f"{work}/{tag}.jsonl",
              "--checkpoint-dir", f"{work}/{tag}", "--checkpoint-every", "3")
        runs[processes] = metrics(f"{work}/{tag}.jsonl")
    check(len(runs[0]) == 6, f"6 steps expected, got {runs[0]}")
    for processes in (2, 4):
        check(runs[processes] == runs[0],
              f"{processes} processes: {runs[processes]}\n differ from 1 process: {runs[0]}")
    one = exported(work, f"{work}/p0", 6)
    for processes in (2, 4):
        other = exported(work, f"{work}/p{processes}", 6)
        check(other.keys() == one.keys(), "different arrays saved")
        for path in one:
            check(other[path] == one[path], f"{path} saved by {processes} processes differs from 1 process")
    print(f"equivalence: 6 steps and {len(one)} saved arrays bit-identical at 1, 2 and 4 processes")


def restore(work):
    train(work, 2, "--stop-at", "6", "--checkpoint-dir", f"{work}/saved", "--checkpoint-every", "3")
    reference = train(work, 0, "--metrics", f"{work}/uninterrupted.jsonl")
    cont = {}
    for processes in (0, 4):
        ckpt = f"{work}/resume{processes}"
        shutil.copytree(f"{work}/saved", ckpt)
        out = train(work, processes, "--resume", "--checkpoint-dir", ckpt, "--mesh", "fsdp=4,tensor=2",
                    "--metrics", f"{work}/resume{processes}.jsonl").stdout
        check("resumed step 6" in out, f"no resume reported:\n{out}")
        cont[processes] = metrics(f"{work}/resume{processes}.jsonl")
    check([s for s, _, _ in cont[0]] == [7, 8], f"steps 7 and 8 expected, got {cont[0]}")
    check(cont[4] == cont[0], f"4 processes resumed to {cont[4]}, 1 process to {cont[0]}")
    ref = metrics(f"{work}/uninterrupted.jsonl")[6:]
    for (s, loss, _), (_, want, _) in zip(cont[0], ref):
        check(abs(loss - want) <= 1e-4 * abs(want), f"step {s}: resumed loss {loss}, uninterrupted {want}")
    check(exported(work, f"{work}/resume0", 8) == exported(work, f"{work}/resume4", 8),
          "the steps saved after resuming with 1 and 4 processes differ")
    print("restore: a 2-process checkpoint resumed with 1 and 4 processes onto fsdp=4,tensor=2, bit-identical")


def rank_pids(mpirun_pid):
    """The application processes mpirun started, by rank."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(entry)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return pids


def kill(work):
    rng = random.Random(7)
    mid_save = 0
    for attempt in range(3):
        ckpt = f"{work}/killed{attempt}"
        cmd = MPI + ["-np", "2", TESSEL, "train", "--model", f"{work}/model.yaml", "--steps", "100000",
                     "--batch", "8", "--seq", "64", "--checkpoint-dir", ckpt, "--checkpoint-every", "1",
                     "--keep", "2", "--devices-per-process", "4"]
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        victim, after = rng.choice([0, 1]), rng.randint(2, 6)
        deadline = time.time() + 120
        pids = {}
        # Wait for step `after` to be committed, then for a save in progress, and kill one process in it.
        while time.time() < deadline:
            names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
            steps = [int(n) for n in names if n.isdigit()]
            if steps and max(steps) >= after and any(n.endswith(".orbax-checkpoint-tmp") for n in names):
                pids = rank_pids(job.pid)
                if victim in pids:
                    os.kill(pids[victim], signal.SIGKILL)
                    break
            time.sleep(0.001)
        check(victim in pids, f"attempt {attempt}: the job never reached a save in progress")
        left = sorted(os.listdir(ckpt))
        if any(n.endswith(".orbax-checkpoint-tmp") for n in left):
            mid_save += 1
        try:
            _, err = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            sys.exit(f"FAIL: attempt {attempt}: the job hung after process {victim} was killed")
        check(job.returncode != 0, f"attempt {attempt}: mpirun exited 0 after a process was killed")
        steps = sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())
        check(steps, f"attempt {attempt}: no step left in {ckpt}")
        for s in steps:
            out = run([TESSEL, "ckpt", "verify", ckpt, "--step", str(s)], expect=None)
            check(out.returncode == 0, f"attempt {attempt}: step {s} left behind is damaged:\n{out.stdout}{out.stderr}")
        out = train(work, 0, "--resume", "--checkpoint-dir", ckpt, "--steps", str(steps[-1] + 1)).stdout
        check(f"resumed step {steps[-1]}" in out, f"attempt {attempt}: the latest step did not resume:\n{out}")
        print(f"kill: process {victim} killed; mpirun exited {job.returncode}; steps {steps} intact and resumable")
    check(mid_save >= 1, "no kill landed while a step was being written")


def mismatch(work):
    cmd = MPI + ["-np", "1", TESSEL, "train", "--steps", "2", "--mesh", "data=2,fsdp=4", "--devices-per-process", "4",
                 ":", "-np", "1", TESSEL, "train", "--steps", "2", "--mesh", "data=4,fsdp=2", "--devices-per-process", "4"]
    p = run(cmd, expect=None, timeout=120)
    check(p.returncode != 0, "mismatched processes exited 0")
    for rank in (0, 1):
        check(f"tessel: error: process {rank} of 2: the training configuration differs between processes: --mesh is "
              "'data=2,fsdp=4' on process 0 and 'data=4,fsdp=2' on process 1\n" in p.stderr,
              f"process {rank} did not report the mismatch:\n{p.stderr}")
    p = run(MPI + ["-np", "2", TESSEL, "train", "--steps", "1"], expect=None, timeout=120)
    check(p.returncode != 0 and "give --devices-per-process" in p.stderr,
          f"a job started without --devices-per-process was not refused:\n{p.stderr}")
    # The same path naming different texts on the two processes (their working directories).
    for d, text in (("a", "the first text " * 40), ("b", "another text " * 40)):
        os.makedirs(f"{work}/{d}")
        with open(f"{work}/{d}/text.txt", "w") as f:
            f.write(text)
    args = [TESSEL, "train", "--steps", "50", "--seq", "16", "--data", "text.txt", "--devices-per-process", "4"]
    p = run(MPI + ["-np", "1", "-wdir", f"{work}/a"] + args + [":", "-np", "1", "-wdir", f"{work}/b"] + args,
            expect=None, timeout=120)
    for rank in (0, 1):
        check(f"process {rank} of 2: the training configuration differs between processes: the file --data names "
              "has other contents on process 1" in p.stderr, f"process {rank} did not report the other text:\n{p.stderr}")
    # A failure on process 0 alone (its working directory lacks the metrics directory) while
    # process 1 trains: the job ends, it does not wait forever.
    os.makedirs(f"{work}/b/m")
    args = [TESSEL, "train", "--steps", "50", "--metrics", "m/metrics.jsonl", "--devices-per-process", "4"]
    start = time.time()
    p = run(MPI + ["-np", "1", "-wdir", f"{work}/a"] + args + [":", "-np", "1", "-wdir", f"{work}/b"] + args,
            expect=None, timeout=120)
    check(p.returncode != 0, "a job where one process failed exited 0")
    check("tessel: error: process 0 of 2: cannot write the metrics file" in p.stderr,
          f"process 0 did not report its failure:\n{p.stderr}")
    print(f"mismatch: both processes name the differing configuration; a lone failure ended the job in "
          f"{time.time() - start:.0f} s")


def moe(work):
    maxtext = os.path.join(os.environ["TESSEL_TESTDATA"], "maxtext")
    tiny = ["base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=4", "base_mlp_dim=48",
            "base_num_decoder_layers=2", "vocab_size=256", "num_experts=8", "num_experts_per_tok=2"]
    models = {
        "mixtral": ("llama2-7b.yml", ["decoder_block=mixtral", "head_dim=8", "base_moe_mlp_dim=48",
                                      "load_balance_loss_weight=0.01"]),
        "deepseek3": ("deepseek3-tiny.yml", ["base_moe_mlp_dim=16", "first_num_dense_layers=1", "q_lora_rank=16",
                                             "kv_lora_rank=8", "qk_nope_head_dim=8", "qk_rope_head_dim=4",
                                             "v_head_dim=8"]),
        "gpt-oss": ("gpt-oss-20b.yml", ["head_dim=8", "base_mlp_dim=32", "base_moe_mlp_dim=32",
                                        "sliding_window_size=8", "base_num_kv_heads=2"]),
    }
    for name, (model, sets) in models.items():
        cmd = [TESSEL, "train", "--model", f"{maxtext}/models/{model}", "--base", f"{maxtext}/base.yml",
               *[a for s in tiny + sets for a in ("--set", s)], "--mesh", "data=2,expert=4", "--steps", "4",
               "--batch", "8", "--seq", "32", "--log-every", "1"]
        runs = {}
        for processes in (0, 2, 4):
            out = f"{work}/{name}{processes}.jsonl"
            full = cmd + ["--metrics", out]
            if processes:
                full = MPI + ["-np", str(processes)] + full + ["--devices-per-process", str(8 // processes)]
            run(full)
            runs[processes] = metrics(out)
        check(len(runs[0]) == 4, f"{name}: 4 steps expected, got {runs[0]}")
        for processes in (2, 4):
            check(runs[processes] == runs[0],
                  f"{name}, {processes} processes: {runs[processes]}\n differ from 1 process: {runs[0]}")
        print(f"moe: 4 steps of {name} on data=2,expert=4 bit-identical at 1, 2 and 4 processes: {runs[0]}")


def main():
    work = tempfile.mkdtemp(prefix="tessel-mpi-")
    try:
        with open(os.path.join(work, "model.yaml"), "w") as f:
            f.write(MODEL)
        {"equivalence": equivalence, "restore": restore, "kill": kill, "mismatch": mismatch, "moe": moe}[TEST](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
