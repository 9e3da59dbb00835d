"""The maintenance worker: seals and merges run off the caller's thread.

One daemon thread per store takes jobs in submission order. A job is prepared
under its tracker's lock (a short swap: the rows or buckets it works on are
frozen, and stay deliverable), does its slow part — sort, encode, read, write,
fsync — holding no lock, then installs its result under the lock again,
reconciling what happened meanwhile. Jobs of one tracker therefore finish in
the order they were started, which is what ``flush()`` waits on.

A thread, not a process pool, by measurement (``tools/bench/bench_maintenance.py
--cases gil``, README "Figures"): the encode is partly GIL-bound (a pure-Python
thread keeps about 70 % of its rate beside it), but handing the rows to a pool
worker costs more GIL time than it saves (pickling the frozen columns out and the
payloads back): beside the worker process the other thread kept less of its rate,
and the encode was no faster, on two cores.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Job", "MaintenanceCounters", "MaintenanceWorker"]

log = logging.getLogger("bucketstore")


class Job(Protocol):
    """What the worker runs: ``work`` holds no lock; ``install`` takes the tracker's."""

    def work(self) -> None: ...

    def install(self) -> None: ...


@dataclass(slots=True)
class MaintenanceCounters:
    """One tracker's background work, as ``stats()["maintenance"]`` shows it."""

    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    last_error: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"queued": self.queued, "running": self.running, "done": self.done, "failed": self.failed,
                "cancelled": self.cancelled, "last_error": self.last_error, "seconds": round(self.seconds, 6)}


class MaintenanceWorker:
    """The store's maintenance thread (started on the first job)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("maintenance worker is stopped")
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"bucketstore-maintenance {self._name}",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            # work() keeps its own failure for install() to report, and install() must run
            # whatever happens: a job must never leave its tracker waiting for it.
            try:
                job.work()
            except BaseException:  # a bug, not an I/O failure: keep the thread alive, say so loudly
                log.exception("bucketstore maintenance: %r failed", job)
            try:
                job.install()
            except BaseException:
                log.exception("bucketstore maintenance: installing %r failed", job)

    def stop(self, timeout: float | None = None) -> bool:
        """Finish queued jobs and end the thread; False if it is still running after ``timeout``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()
