"""The real MaxText 0.2.5 (.venv-maxtext: scripts/venv.sh maxtext) as the tests drive it: one
worker process (maxtext_worker.py) in MaxText's environment runs its tools one job after another,
each bounded in time; what the worker prints outside its jobs goes to LOG_DIR/maxtext_worker.log.
The worker is killed, its whole process group, on a timeout, a failure or the session's end.

    with MaxTextSession(log_dir) as mt:
        mt.run("train", [base_yml, "run_name=x", ...], cwd=out, log=os.path.join(out, "train.log"))
"""
import json
import os
import queue
import signal
import subprocess
import threading

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MAXTEXT_PYTHON = os.environ.get("TESSEL_MAXTEXT_VENV_PYTHON", os.path.join(ROOT, ".venv-maxtext", "bin", "python"))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "maxtext_worker.py")
START_TIMEOUT = 300


def maxtext_env(devices=8):
    """MaxText's environment: its train sets unsafe_rbg itself (its checkpoints' RNG keys are 4
    words); its other tools read those checkpoints only with the same."""
    env = dict(os.environ)
    env.update({"DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu", "JAX_DEFAULT_PRNG_IMPL": "unsafe_rbg",
                "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
    env.pop("PYTHONPATH", None)
    return env


class MaxTextError(AssertionError):
    pass


class MaxTextSession:
    def __init__(self, log_dir, devices=8):
        assert os.path.exists(MAXTEXT_PYTHON), (
            f"{MAXTEXT_PYTHON} is missing: scripts/venv.sh maxtext makes it (scripts/test.sh does)")
        self.log = os.path.join(log_dir, "maxtext_worker.log")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([MAXTEXT_PYTHON, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=log, text=True, start_new_session=True, env=maxtext_env(devices))
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.maxtext_dir = self._answer(START_TIMEOUT, "starting")["maxtext_dir"]

    def _read(self):
        for line in self.process.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def _answer(self, timeout, what):
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise MaxTextError(f"MaxText's worker did not finish {what} in {timeout} s") from None
        if line is None:
            self.close()
            raise MaxTextError(f"MaxText's worker exited while {what} (code {self.process.returncode}); "
                               f"its log:\n{tail(self.log)}")
        return json.loads(line)

    def run(self, job, argv, cwd, log, timeout=600):
        """Runs one job (maxtext_worker.py lists them); returns what it printed. Raises MaxTextError
        with the end of that and the traceback when it fails or runs past `timeout`."""
        request = {"job": job, "argv": [str(a) for a in argv], "cwd": str(cwd), "log": str(log)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        try:
            answer = self._answer(timeout, job)
        except MaxTextError as e:
            raise MaxTextError(f"{e}; its log:\n{tail(log)}") from None
        if not answer["ok"]:
            raise MaxTextError(f"MaxText's {job} failed:\n{tail(log)}\n{answer['error']}")
        return open(log, errors="replace").read()

    def close(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tail(path, n=4000):
    try:
        return open(path, errors="replace").read()[-n:]
    except OSError:
        return "(none)"
