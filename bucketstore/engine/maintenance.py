"""The maintenance worker: seals and merges run off the caller's thread.

One daemon thread per store takes jobs in submission order. A job is prepared
under its tracker's lock (a short swap: the rows or buckets it works on are
frozen, and stay deliverable), does its slow part — sort, encode, read, write,
fsync — holding no lock, then installs its result under the lock again,
reconciling what happened meanwhile. Jobs of one tracker therefore finish in
the order they were started, which is what ``flush()`` waits on.

A thread, not a process pool, by measurement (``tools/bench/bench_maintenance.py
--cases gil``): the encode is partly GIL-bound (a pure-Python
thread keeps about 70 % of its rate beside it), but handing the rows to a pool
worker costs more GIL time than it saves (pickling the frozen columns out and the
payloads back): beside the worker process the other thread kept less of its rate,
and the encode was no faster, on two cores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..errors import MaintenanceError
from .worker_thread import WorkerThread

__all__ = ["Job", "MaintenanceCounters", "MaintenanceWorker", "close_on_exit"]

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


class MaintenanceWorker(WorkerThread[Job]):
    """The store's maintenance thread (started on the first job); :meth:`stop` finishes
    the queued jobs first."""

    def __init__(self, name: str) -> None:
        super().__init__(f"bucketstore-maintenance {name}")
        self._name = name

    def submit(self, job: Job) -> None:
        if not self._enqueue(job):
            raise RuntimeError("maintenance worker is stopped")

    def _handle(self, job: Job) -> None:
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

    def run_while_waiting(self) -> bool:
        """Called by a tracker about to wait (holding its lock) for one of its jobs.

        A worker that runs jobs only when told (``bucketstore.testing.SteppedWorker``,
        which makes the order of background I/O deterministic for crash enumeration)
        runs its next step here, on the waiting thread, and returns True; this threaded
        worker needs no help and returns False (the tracker then waits on its condition).
        """
        return False


def close_on_exit(close: Callable[[], object], block_raised: bool) -> None:
    """``__exit__`` of a tracker or a store: close, and raise a background failure that
    ``close()`` reports only when the ``with`` block is not already raising its own error
    (which must not be hidden; the failure was logged when it happened)."""
    try:
        close()
    except MaintenanceError:
        if not block_raised:
            raise
