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

By default jobs run one after the other: the oldest job's work, then its install, then
the next job's. The real worker has two threads (``MAINTENANCE_THREADS``): while the oldest
job has not installed, the job behind it is in the other thread's hands, and its work may
run before, beside or after the oldest one's. ``work(1)`` runs that second job's work at
the point the test chooses, so a test holds two jobs in flight (two seals, a seal beside a
merge, a merge beside a seal) and interleaves tracker calls between their steps. Installs
stay in submission order, as the real worker keeps them: :meth:`install` always finishes
the oldest job, and a job whose work already ran ahead does not work again. What this
cannot produce is one job's durable calls interleaved *inside* another's half-step: each
half-step runs whole, and the two jobs' files are distinct.

A tracker that must wait for its jobs (backpressure on a full backlog, ``flush``,
``close``, ``wait_for_maintenance``) asks the worker to help (:meth:`run_while_waiting`),
which runs the next half-step of the oldest job on the waiting thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from bucketstore.engine.maintenance.maintenance import MAINTENANCE_THREADS, Job, MaintenanceWorker

__all__ = ["SteppedWorker"]


class SteppedWorker(MaintenanceWorker):
    """Background jobs queued until :meth:`work`, :meth:`install` or :meth:`run_all` runs them.

    :ivar history: ``(kind, phase)`` of every half-step run, in order (``kind`` is the
        job's ``"create"`` or ``"merge"``, ``phase`` ``"work"``, ``"commit"`` or ``"install"``), for
        tests to check that a workload reaches the steps it claims to.
    :ivar spans: with ``calls`` given, ``(kind, phase, first, end)`` per half-step: it
        made the numbered calls ``first <= k < end`` (``end`` is None if it never returned).
    :ivar side_by_side: ``(kind, oldest_kind)`` each time :meth:`work` ran the work of a job
        behind the oldest pending one (of kind ``oldest_kind``), which had not installed:
        the pairs of jobs a test held in flight together.
    :param calls: a counter of durable calls, e.g. ``lambda: fs.calls`` of a
        :class:`~bucketstore.testing.faults.FaultyFileSystem`.
    :param threads: how many of the oldest pending jobs may do their work before the
        oldest installs (``work(position)`` with ``position < threads``); the real
        worker's thread count by default. 1 keeps jobs strictly one after the other.
    """

    def __init__(self, name: str = "stepped", *, calls: Callable[[], int] | None = None,
                 threads: int = MAINTENANCE_THREADS) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        super().__init__(name, threads)
        self._queue: collections.deque[Job] = collections.deque()
        # Pending jobs whose work has run (by id: a job leaves this set when it installs,
        # before its id could be reused).
        self._worked: set[int] = set()
        self._threads_stepped = threads
        self._calls = calls
        self.history: list[tuple[str, str]] = []
        self.spans: list[tuple[str, str, int, int | None]] = []
        self.side_by_side: list[tuple[str, str]] = []

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
        return self.worked(0)

    def worked(self, position: int = 0) -> bool:
        """Whether the pending job at ``position`` (0: the oldest) has done its work."""
        return position < len(self._queue) and id(self._queue[position]) in self._worked

    def pending_kinds(self) -> list[str]:
        """The kinds of the pending jobs, oldest first."""
        return [getattr(job, "kind", "?") for job in self._queue]

    def work(self, position: int = 0) -> bool:
        """Run the off-lock part of the pending job at ``position``, unless it already ran;
        False if there is no such job.

        ``position=0`` (the default) is the oldest pending job; ``1`` the job behind it,
        which the real worker's second thread works on while the oldest has not installed
        (it installs later all the same: installs keep submission order).

        :raises ValueError: ``position`` is not below the worker's ``threads``.
        """
        if not 0 <= position < self._threads_stepped:
            raise ValueError(f"only the {self._threads_stepped} oldest pending jobs can work before the "
                             f"oldest installs (position {position})")
        if position >= len(self._queue) or id(self._queue[position]) in self._worked:
            return False
        job = self._queue[position]
        self._worked.add(id(job))
        if position:
            self.side_by_side.append((_kind(job), _kind(self._queue[0])))
        self._run(job, "work", job.work)
        return True

    def install(self) -> bool:
        """Finish the oldest pending job: its work if not done yet, then its install; False if none."""
        if not self._queue:
            return False
        self.work()
        job = self._queue.popleft()
        self._worked.discard(id(job))
        self._run(job, "install", job.install)
        return True

    def commit(self) -> bool:
        """Run the oldest pending job's work if not done yet, then the first step of its install,
        the one before the tracker's lock (a seal's or merge's catalog commit): tracker calls
        can then run between the commit and the rest of the install (:meth:`install`, which
        does not commit again). False if no job is pending."""
        if not self._queue:
            return False
        self.work()
        job = self._queue[0]
        self._run(job, "commit", getattr(job, "commit", lambda: None))
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
