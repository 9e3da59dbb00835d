"""A maintenance worker that runs background seals and merges only when the test says so.

``Store(path, background=True, maintenance=SteppedWorker())`` queues every seal and merge
its trackers start instead of handing them to a thread. The test then decides when the
next job does its off-lock part (:meth:`SteppedWorker.work`: sort, encode, write and
fsync the ledger file) and when it installs (:meth:`SteppedWorker.install`: catalog
commit, swap into the queue, journal checkpoint, source deletion), interleaving tracker
calls in between. Everything runs on the test's thread, so the order of durable calls is
the same on every run: crash points inside background steps can be enumerated, and a
:class:`~bucketstore.testing.faults.SimulatedCrash` raised inside a job propagates to the
caller like the death of the process.

Jobs run in the order the real worker runs them: the oldest job's work, then its install,
then the next job's. A tracker that must wait for its jobs (backpressure on a full
backlog, ``flush``, ``close``, ``wait_for_maintenance``) asks the worker to help
(:meth:`run_while_waiting`), which runs the next half-step on the waiting thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from bucketstore.engine.maintenance import Job, MaintenanceWorker

__all__ = ["SteppedWorker"]


class SteppedWorker(MaintenanceWorker):
    """Background jobs queued until :meth:`work`, :meth:`install` or :meth:`run_all` runs them.

    :ivar history: ``(kind, phase)`` of every half-step run, in order (``kind`` is the
        job's ``"create"`` or ``"merge"``, ``phase`` ``"work"`` or ``"install"``), for
        tests to check that a workload reaches the steps it claims to.
    :ivar spans: with ``calls`` given, ``(kind, phase, first, end)`` per half-step: it
        made the numbered calls ``first <= k < end`` (``end`` is None if it never returned).
    :param calls: a counter of durable calls, e.g. ``lambda: fs.calls`` of a
        :class:`~bucketstore.testing.faults.FaultyFileSystem`.
    """

    def __init__(self, name: str = "stepped", *, calls: Callable[[], int] | None = None) -> None:
        super().__init__(name)
        self._queue: collections.deque[Job] = collections.deque()
        self._worked = False  # the head job's work has run, its install has not
        self._calls = calls
        self.history: list[tuple[str, str]] = []
        self.spans: list[tuple[str, str, int, int | None]] = []

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise RuntimeError("maintenance worker is stopped")
        self._queue.append(job)

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet installed."""
        return len(self._queue)

    @property
    def head_worked(self) -> bool:
        """Whether the oldest pending job has done its work and waits for its install."""
        return bool(self._queue) and self._worked

    def pending_kinds(self) -> list[str]:
        """The kinds of the pending jobs, oldest first."""
        return [getattr(job, "kind", "?") for job in self._queue]

    def work(self) -> bool:
        """Run the oldest pending job's off-lock part, unless it already ran; False if none."""
        if not self._queue or self._worked:
            return False
        job = self._queue[0]
        self._worked = True
        self._run(job, "work", job.work)
        return True

    def install(self) -> bool:
        """Finish the oldest pending job: its work if not done yet, then its install; False if none."""
        if not self._queue:
            return False
        if not self._worked:
            self.work()
        job = self._queue.popleft()
        self._worked = False
        self._run(job, "install", job.install)
        return True

    def _run(self, job: Job, phase: str, fn: Callable[[], None]) -> None:
        self.history.append((_kind(job), phase))
        if self._calls is None:
            fn()
            return
        span = len(self.spans)
        self.spans.append((_kind(job), phase, self._calls(), None))
        fn()
        kind, phase, first, _ = self.spans[span]
        self.spans[span] = (kind, phase, first, self._calls())

    def step(self) -> bool:
        """Run the next half-step (the oldest job's work, or else its install); False if none."""
        return self.work() or self.install()

    def run_all(self) -> int:
        """Run every pending job to its end, including jobs their installs start (merges);
        return how many jobs finished."""
        done = 0
        while self.install():
            done += 1
        return done

    def run_while_waiting(self) -> bool:
        if not self._queue:
            # The tracker would wait forever on the test's own thread: fail loudly instead.
            raise AssertionError("a tracker waits for background work, but the stepped worker has none queued")
        self.step()
        return True

    def stop(self, timeout: float | None = None) -> bool:
        """Run what is still queued (a clean store close: cancelled jobs remove their files)."""
        self.run_all()
        self._stopping = True
        return True


def _kind(job: Any) -> str:
    return str(getattr(job, "kind", type(job).__name__))
