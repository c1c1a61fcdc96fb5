"""PyTorch against tessel within rounds (bench/rounds.py), for bench/train_bench.sh: the models and
steps of bench/torch_peer.py against bench_train's on 1 device.
Usage: torch_rounds.py THREADS ROUNDS BENCH_TRAIN_ROUNDS  -> one JSON object per model on stdout.
"""
import json
import os
import sys

# PyTorch's OpenMP threads spin after each parallel region (libgomp's default), and so would the
# tessel process's (oneDNN's libgomp), on the cores the other side's step is about
# to use: in alternating rounds on two cores tessel's MLP step measured 0.22 s against 0.15 s
# alone, and PyTorch's slowed too. Both sides wait passively between steps: set before torch
# loads libgomp, and inherited by the tessel process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import rounds  # noqa: E402
import torch_peer  # noqa: E402


def main():
    threads, count, binary = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch_peer.use_threads(threads)
    torch.manual_seed(0)
    for model, step in (("mlp", torch_peer.mlp_step_fn()), ("lm", torch_peer.lm_step_fn()[0])):
        print(json.dumps({**rounds.alternate(step, binary, model, "data=1", count), "threads": torch.get_num_threads()}),
              flush=True)


if __name__ == "__main__":
    main()
