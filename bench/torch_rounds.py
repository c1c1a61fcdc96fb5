"""PyTorch against tessel within rounds (bench/rounds.py), for bench/train_bench.sh: the models and
steps of bench/torch_peer.py against bench_train's on 1 device.
Usage: torch_rounds.py THREADS ROUNDS BENCH_TRAIN_ROUNDS  -> one JSON object per model on stdout.
"""
import json
import sys

import torch

import rounds
import torch_peer


def main():
    threads, count, binary = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch_peer.use_threads(threads)
    torch.manual_seed(0)
    for model, step in (("mlp", torch_peer.mlp_step_fn()), ("lm", torch_peer.lm_step_fn()[0])):
        print(json.dumps({**rounds.alternate(step, binary, model, "data=1", count), "threads": torch.get_num_threads()}),
              flush=True)


if __name__ == "__main__":
    main()
