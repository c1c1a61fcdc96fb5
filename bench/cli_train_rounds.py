"""`tessel train`'s own step on a mesh against its 1-device step, within rounds: each round runs
the CLI once per binary and mesh (8 steps of the model; the median step after the first 2, from
its --metrics file), and the ratio to data=1 is taken inside the round; medians over the rounds.
Given two binaries (a commit before a change and after it), both run in every round.

    python3 bench/cli_train_rounds.py [--rounds 5] [--model examples/models/transformer.yml]
        [--mesh tensor=8] BINARY [BINARY...]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_s(binary, model, mesh, batch, seq):
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        r = subprocess.run([binary, "train", "--model", model, "--mesh", mesh, "--steps", "8", "--batch", str(batch),
                            "--seq", str(seq), "--metrics", metrics], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{binary} --mesh {mesh} failed:\n{r.stderr}")
        return statistics.median(json.loads(line)["step_s"] for line in list(open(metrics))[2:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", default=os.path.join(ROOT, "examples", "models", "transformer.yml"))
    p.add_argument("--mesh", default="tensor=8")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("binaries", nargs="+")
    a = p.parse_args()
    times = {(b, m): [] for b in a.binaries for m in ("data=1", a.mesh)}
    for _ in range(a.rounds):
        for b in a.binaries:
            for m in ("data=1", a.mesh):
                times[(b, m)].append(step_s(b, a.model, m, a.batch, a.seq))
    for b in a.binaries:
        ratios = [t / o for t, o in zip(times[(b, a.mesh)], times[(b, "data=1")])]
        print(json.dumps({"binary": b, "mesh": a.mesh, "step_ms": statistics.median(times[(b, a.mesh)]) * 1e3,
                          "one_device_ms": statistics.median(times[(b, "data=1")]) * 1e3,
                          "to_one_device": statistics.median(ratios), "rounds": [round(r, 3) for r in ratios]}))


if __name__ == "__main__":
    main()
