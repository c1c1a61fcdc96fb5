"""A peer's train step against tessel's within rounds (bench/torch_rounds.py, bench/jax_rounds.py):
each round times one step of the peer in this process and one tessel step in a
`bench_train_rounds serve` process, the order alternating from round to round, so that both sides
of each ratio run in the same minute of a machine whose speed drifts.
"""
import statistics
import subprocess
import time


def tessel_stepper(binary, model, mesh):
    """(process, step): step() runs one tessel step in the serving process and returns its seconds."""
    proc = subprocess.Popen([binary, "serve", model, mesh], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            bufsize=1)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{binary} serve {model} {mesh}: no 'ready' line (exit status {proc.wait()})")

    def step():
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{binary} serve {model} {mesh}: ended early (exit status {proc.wait()})")
        return float(line)
    return proc, step


def alternate(peer_step, binary, model, mesh, rounds):
    """Medians over `rounds` rounds: the peer's step, tessel's, and speed = peer / tessel (above 1:
    tessel is faster) with its quartiles. peer_step() runs one step (two run first, to warm up)."""
    proc, tessel_step = tessel_stepper(binary, model, mesh)
    try:
        for _ in range(2):
            peer_step()
        theirs, ours = [], []
        for r in range(rounds):
            if r % 2:
                ours.append(tessel_step())
            t0 = time.perf_counter()
            peer_step()
            theirs.append(time.perf_counter() - t0)
            if r % 2 == 0:
                ours.append(tessel_step())
    finally:
        proc.stdin.close()
        proc.wait()
    speed = [t / o for t, o in zip(theirs, ours)]
    q = statistics.quantiles(speed, n=4)
    return {"model": model, "mesh": mesh, "rounds": rounds, "peer_s": statistics.median(theirs),
            "tessel_s": statistics.median(ours), "speed": statistics.median(speed), "speed_q1": q[0], "speed_q3": q[2]}
