"""PyTorch against tessel within rounds, for bench/train_bench.sh: each round times one PyTorch
train step here and one tessel step in a `bench_train_rounds serve` process (the order alternating
from round to round), so that both sides of each ratio run in the same minute of this machine.
The models and steps are bench/torch_peer.py's; tessel's are bench_train's, on 1 device.
Usage: torch_rounds.py THREADS ROUNDS BENCH_TRAIN_ROUNDS  -> one JSON object per model on stdout.
"""
import json
import statistics
import subprocess
import sys
import time

import torch

import torch_peer


def tessel_stepper(binary, model):
    """A function running one tessel step in the serving process and returning its seconds."""
    proc = subprocess.Popen([binary, "serve", model, "data=1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, bufsize=1)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{binary} serve {model}: no 'ready' line (exit status {proc.wait()})")

    def step():
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{binary} serve {model}: ended early (exit status {proc.wait()})")
        return float(line)
    return proc, step


def timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def rounds_of(model, torch_step, binary, rounds):
    proc, tessel_step = tessel_stepper(binary, model)
    try:
        for _ in range(2):
            torch_step()
        theirs, ours = [], []
        for r in range(rounds):
            if r % 2:
                ours.append(tessel_step())
                theirs.append(timed(torch_step))
            else:
                theirs.append(timed(torch_step))
                ours.append(tessel_step())
    finally:
        proc.stdin.close()
        proc.wait()
    speed = [t / o for t, o in zip(theirs, ours)]  # above 1: tessel is faster
    q = statistics.quantiles(speed, n=4)
    return {"model": model, "rounds": rounds, "threads": torch.get_num_threads(), "torch_s": statistics.median(theirs),
            "tessel_s": statistics.median(ours), "speed": statistics.median(speed), "speed_q1": q[0], "speed_q3": q[2]}


def main():
    threads, rounds, binary = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch_peer.use_threads(threads)
    torch.manual_seed(0)
    print(json.dumps(rounds_of("mlp", torch_peer.mlp_step_fn(), binary, rounds)), flush=True)
    print(json.dumps(rounds_of("lm", torch_peer.lm_step_fn()[0], binary, rounds)), flush=True)


if __name__ == "__main__":
    main()
