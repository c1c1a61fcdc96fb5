"""The peer of bench/sharding_bench.sh: Flax Linen's own logical_to_mesh_axes on MaxText's rules
and the qwen3-0.6b state (from the project's environment, scripts/venv.sh).

  flax_peer.py time RULES LOGICAL   -> ns per entry (best of 5 runs of 200 passes)
  flax_peer.py once RULES LOGICAL   -> one whole resolution, printed (for the process timing)
"""
import json
import sys
import time

import flax.linen as nn
import yaml


def load(rules_path, logical_path):
    with open(rules_path) as f:
        rules = [(name, tuple(axes) if isinstance(axes, list) else axes)
                 for name, axes in yaml.safe_load(f)["logical_axis_rules"]]
    with open(logical_path) as f:
        entries = [tuple(v["partition_spec"]) for v in json.load(f).values()]
    return rules, entries


def main():
    mode, rules_path, logical_path = sys.argv[1:4]
    rules, entries = load(rules_path, logical_path)
    if mode == "once":
        print(json.dumps([str(nn.logical_to_mesh_axes(e, rules)) for e in entries]))
        return
    reps = 200
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            for e in entries:
                nn.logical_to_mesh_axes(e, rules)
        best = min(best, (time.perf_counter_ns() - t0) / (reps * len(entries)))
    print(f"{best:.1f}")


if __name__ == "__main__":
    main()
