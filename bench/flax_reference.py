#!/usr/bin/env python3
"""The peer for bench/sharding_bench.sh: Flax Linen's logical_to_mesh_axes transcribed literally
(rules in order, set intersection of already-assigned mesh axes), since Flax and JAX are not
Debian packages. Flax's own loop is this pure-Python code plus jax.tree_util.tree_leaves calls,
so this is a lower bound on Flax's per-entry time.

  flax_reference.py time RULES LOGICAL MESH_FSDP   -> prints ns per entry (best of 5 runs)
  flax_reference.py once RULES LOGICAL             -> one whole resolution (for process timing)
"""
import json
import sys
import time

import yaml


def leaves(x):
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    out = []
    for item in x:
        out.extend(leaves(item))
    return out


UNASSIGNED = object()


def logical_to_mesh_axes(names, rules):
    counts = {}
    for n in names:
        if n is not None:
            counts[n] = counts.get(n, 0) + 1
    if any(v > 1 for v in counts.values()):
        raise ValueError("duplicate logical name")
    result = [UNASSIGNED if isinstance(n, str) else None for n in names]
    for rule_name, mesh_names in rules:
        if rule_name in names:
            pos = names.index(rule_name)
            existing = set(a for r in result if r is not UNASSIGNED for a in leaves(r))
            if not existing.intersection(leaves(mesh_names)) and result[pos] is UNASSIGNED:
                result[pos] = mesh_names
    return [None if r is UNASSIGNED else r for r in result]


def load(rules_path, logical_path):
    with open(rules_path) as f:
        rules = [tuple(r) for r in yaml.safe_load(f)["logical_axis_rules"]]
    with open(logical_path) as f:
        entries = [v["partition_spec"] for v in json.load(f).values()]
    return rules, entries


def main():
    mode, rules_path, logical_path = sys.argv[1:4]
    rules, entries = load(rules_path, logical_path)
    if mode == "once":
        json.dump([logical_to_mesh_axes(e, rules) for e in entries], sys.stdout)
        return
    reps = 2000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            for e in entries:
                logical_to_mesh_axes(e, rules)
        best = min(best, (time.perf_counter_ns() - t0) / (reps * len(entries)))
    print(f"{best:.1f}")


if __name__ == "__main__":
    main()
