"""Two builds of tessel's train step against each other within rounds (bench/rounds.py): a commit
before a change (OLD) and after it (NEW), each a `bench_train_rounds serve` process, their steps
alternating, so that a change of a few percent shows through a machine whose speed drifts.
Usage: ab_rounds.py OLD NEW [ROUNDS] [MODEL] [MESH]   (defaults: 60 lm data=1)
Prints one JSON object: speed = OLD's step / NEW's (above 1: NEW is faster) and its quartiles.
"""
import json
import os
import sys

import rounds


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    for binary in (old, new):
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise SystemExit(f"ab_rounds.py: {binary!r} is not an executable bench_train_rounds")
    try:
        count = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    except ValueError:
        raise SystemExit(f"ab_rounds.py: ROUNDS must be a whole number, got {sys.argv[3]!r}") from None
    if count < 2:
        raise SystemExit(f"ab_rounds.py: ROUNDS must be at least 2 (each build steps every other round), got {count}")
    model = sys.argv[4] if len(sys.argv) > 4 else "lm"
    mesh = sys.argv[5] if len(sys.argv) > 5 else "data=1"
    proc, old_step = rounds.tessel_stepper(old, model, mesh)
    try:
        result = rounds.alternate(old_step, new, model, mesh, count)
    finally:
        proc.stdin.close()
        proc.wait()
    print(json.dumps({"old_s": result.pop("peer_s"), "new_s": result.pop("tessel_s"), **result}))


if __name__ == "__main__":
    main()
