"""This process's part of a multi-process JAX job (one process per host, `jax.distributed`).

tessel meets the job's other processes through JAX's own coordination service (its key-value
store), not a coordinator of its own: a save's processes exchange their chunk checksums and
failures there, and process 0 commits once every process has written its blocks.
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from typing import Any

from tessel._tessel import Error

_saves = itertools.count()  # every process saves in the same order, so the n-th save meets the n-th


@dataclass(frozen=True)
class Job:
    """The job's devices (JAX's ids, ascending, and each one's process) and this process."""

    index: int
    count: int
    device_ids: tuple
    device_processes: tuple
    local_ids: frozenset

    @staticmethod
    def current() -> "Job | None":
        """The job this process is part of, or None outside a multi-process JAX job (JAX not
        imported by the caller, or one process)."""
        jax = sys.modules.get("jax")
        if jax is None or not _jax_started():
            return None
        if jax.process_count() == 1:
            return None
        devices = sorted(jax.devices(), key=lambda d: d.id)
        return Job(jax.process_index(), jax.process_count(), tuple(d.id for d in devices),
                   tuple(d.process_index for d in devices), frozenset(d.id for d in jax.local_devices()))


def _jax_started() -> bool:
    """Whether JAX's distributed client or a backend is up: asking for the process count otherwise
    would start the backends (on a GPU, taking most of its memory) just to learn there is one."""
    try:
        from jax._src import distributed, xla_bridge

        return distributed.global_state.client is not None or bool(getattr(xla_bridge, "_backends", True))
    except ImportError:  # pragma: no cover - another JAX layout: ask JAX
        return True


class Meeting:
    """The meeting points of one save: a ProcessGroup over JAX's key-value store (the C++ writer
    calls all_gather). A process that does not arrive within `timeout_s` (it died, or failed
    before the meeting) makes the others raise, naming it."""

    def __init__(self, job: Job, timeout_s: float):
        from jax._src import distributed

        self.client = distributed.global_state.client
        if self.client is None:  # pragma: no cover - process_count() > 1 implies a client
            raise Error("a multi-process save needs jax.distributed.initialize() first")
        self.index, self.count = job.index, job.count
        self.timeout_s = timeout_s
        self.number = next(_saves)
        self.prefix = f"tessel/save/{self.number}"
        self.rounds = itertools.count()

    def all_gather(self, mine: bytes, what: str) -> list:
        key = f"{self.prefix}/{next(self.rounds)}"
        self.client.key_value_set_bytes(f"{key}/{self.index}", bytes(mine))
        deadline = time.monotonic() + self.timeout_s
        parts = []
        for p in range(self.count):
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                parts.append(self.client.blocking_key_value_get_bytes(f"{key}/{p}", left_ms))
            except Exception as e:  # JaxRuntimeError: DEADLINE_EXCEEDED, or the service is gone
                missing = [q for q in range(p, self.count) if not self._arrived(f"{key}/{q}")]
                raise Error(f"{what}: process(es) {missing or [p]} of {self.count} did not arrive within "
                            f"{self.timeout_s:g} s (one died or failed before this point); nothing was committed "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        if key.endswith("/0") and self.index == 0 and self.number > 0:
            # Every process has met in this save, so all are done with the previous one: its keys go.
            try:
                self.client.key_value_delete(f"tessel/save/{self.number - 1}")
            except Exception:  # pragma: no cover - the store keeps a few stale keys then
                pass
        return parts

    def _arrived(self, key: str) -> bool:
        try:
            return self.client.key_value_try_get_bytes(key) is not None
        except Exception:
            return False

    def agree(self, error: BaseException | None, what: str, layout: str = "") -> None:
        """A meeting on Python's side of a save: raises on every process when any failed, or when
        the processes' `layout`s (what each is about to save) differ."""
        parts = self.all_gather(b"+" + layout.encode() if error is None else b"-" + str(error).encode()[:2000], what)
        for p, part in enumerate(parts):
            if part[:1] == b"+":
                continue
            if error is not None:
                raise error
            raise Error(f"{what} failed on process {p}: {part[1:].decode(errors='replace')}")
        for p, part in enumerate(parts):
            if part != parts[0]:
                raise Error(f"{what}: process {p} saves another tree than process 0 (every process must pass the "
                            f"same paths, shapes, dtypes and shardings): {_first_difference(parts[0], part)}")


def _first_difference(a: bytes, b: bytes) -> str:
    for x, y in zip(a[1:].decode().split("\n"), b[1:].decode().split("\n")):
        if x != y:
            return f"process 0 has {x[:300]!r}, this one {y[:300]!r}"
    return "one has more leaves than the other"


def jax_device_ids(job: Job | None) -> dict[str, Any]:
    """What _tessel.restore takes of the job (nothing outside one)."""
    if job is None:
        return {}
    return {"job_devices": list(job.device_ids), "job_processes": list(job.device_processes),
            "process_index": job.index}
