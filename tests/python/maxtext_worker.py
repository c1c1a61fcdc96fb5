"""Run by the MaxText venv's Python (tests/python/maxtext_session.py starts it): one process that runs
MaxText 0.2.5's tools one job after another, so that a test pays for importing MaxText, JAX and
their dependencies once (about 13 s a process) instead of once a tool.

Requests come one JSON object a line on stdin: {"job": JOB, "argv": [...], "cwd": DIR, "log": FILE}.
JOB is one of
- "train": maxtext.trainers.pre_train.train's main(argv), as `python -m ...train argv` runs it;
- "param_only": maxtext.utils.generate_param_only_checkpoint's main(argv);
- "forward": maxtext_forward.main(argv[0], argv[1:]);
- "to_maxtext": maxtext_to_maxtext.main(argv[0], argv[1], argv[2:]).
What the job prints (its stdout, its stderr and absl's log) goes to FILE. Each answer is one JSON
line on stdout, where nothing else is written: {"ok": true} or {"ok": false, "error": the
traceback}; the first one, before any request, is {"maxtext_dir": MaxText's package directory}.
At the end of its input (the test process gone) the worker exits.

The backend is the one the process starts with (XLA_FLAGS' host device count): to_maxtext's
--simulated_cpu_devices_count must agree with it.
"""
import json
import os
import sys
import traceback


def run_job(job, argv):
    if job == "train":
        from maxtext.trainers.pre_train import train
        train.main(["train"] + argv)
    elif job == "param_only":
        from maxtext.utils import generate_param_only_checkpoint
        generate_param_only_checkpoint.main(["generate_param_only_checkpoint"] + argv)
    elif job == "forward":
        import maxtext_forward
        maxtext_forward.main(argv[0], argv[1:])
    elif job == "to_maxtext":
        import maxtext_to_maxtext
        maxtext_to_maxtext.main(argv[0], argv[1], argv[2:])
    else:
        raise ValueError(f"unknown job {job!r}")


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what prints outside a job goes to the worker's own log, not among the answers
    # As absl's app.run would: flags parsed, INFO logged to stderr (MaxText's max_logging.log).
    from absl import flags, logging
    flags.FLAGS(["maxtext_worker"])
    logging.set_verbosity(logging.INFO)
    logging.use_absl_handler()
    import maxtext
    answers.write(json.dumps({"maxtext_dir": os.path.dirname(maxtext.__file__)}) + "\n")
    saved = os.dup(1), os.dup(2)
    for line in sys.stdin:
        request = json.loads(line)
        answer = {"ok": True}
        try:
            with open(request["log"], "ab") as log:  # a log it cannot open fails the job, not the worker
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            os.chdir(request["cwd"])
            run_job(request["job"], request["argv"])
        except BaseException:  # SystemExit included: MaxText exits on a NaN loss
            answer = {"ok": False, "error": traceback.format_exc()}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
