"""The maintenance worker: seals and merges run off the caller's thread.

Two daemon threads per store take jobs in submission order. A job is prepared
under its tracker's lock (a short swap: the rows or buckets it works on are
frozen, and stay deliverable), does its slow part — sort, encode, read, write,
fsync — holding no lock, then installs its result under the lock again,
reconciling what happened meanwhile.

The slow parts of two jobs run side by side (a seal beside a merge, two seals:
most of that work is numpy and zstd, which release the GIL, so on two cores they
overlap), but jobs *install* one at a time in the order they were submitted, as
with one thread: jobs of one tracker therefore finish in the order they were
started, which is what ``flush()`` waits on, and every install sees the state
the one-thread worker would have shown it. What the overlap adds is only that a
later job's ledger file may be written, fsynced and renamed before an earlier
job's catalog commit; a crash then leaves it an orphan, which the next open
removes, as it removes any job's file written before its commit. Two jobs never
work on the same rows: a seal's are its frozen runs, a merge's are buckets
marked ``merging``, which no other merge takes.

A thread, not a process pool, by measurement (``tools/bench/bench_maintenance.py
--cases gil``): the encode is partly GIL-bound (a pure-Python
thread keeps about 70 % of its rate beside it), but handing the rows to a pool
worker costs more GIL time than it saves (pickling the frozen columns out and the
payloads back): beside the worker process the other thread kept less of its rate,
and the encode was no faster, on two cores.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...errors import MaintenanceError
from ..threads.worker_thread import WorkerThread

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


#: Jobs whose slow parts run side by side (the machine this was measured on has two cores).
MAINTENANCE_THREADS = 2


class MaintenanceWorker(WorkerThread[tuple[int, Job]]):
    """The store's maintenance threads (started as jobs come): each job's work runs on one of
    them, side by side, and the installs run one at a time in submission order;
    :meth:`stop` finishes the queued jobs first."""

    def __init__(self, name: str, threads: int = MAINTENANCE_THREADS) -> None:
        super().__init__(f"bucketstore-maintenance {name}", threads)
        self._name = name
        self._submitted = 0  # the sequence number of the next job submitted
        self._turn = threading.Condition()
        self._installing = 0  # the sequence number of the job whose install is next

    def submit(self, job: Job) -> None:
        with self._cond:  # (reentrant) numbered in the order of the queue
            if not self._enqueue((self._submitted, job)):
                raise RuntimeError("maintenance worker is stopped")
            self._submitted += 1

    def _handle(self, item: tuple[int, Job]) -> None:
        number, job = item
        # work() keeps its own failure for install() to report, and install() must run
        # whatever happens: a job must never leave its tracker waiting for it.
        try:
            job.work()
        except BaseException:  # a bug, not an I/O failure: keep the thread alive, say so loudly
            log.exception("bucketstore maintenance: %r failed", job)
        with self._turn:
            # Jobs are taken in order, so every earlier one is in another thread's hands: it installs.
            while self._installing != number:
                self._turn.wait()
        try:
            job.install()
        except BaseException:
            log.exception("bucketstore maintenance: installing %r failed", job)
        finally:
            with self._turn:
                self._installing = number + 1
                self._turn.notify_all()

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
