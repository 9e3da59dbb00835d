"""Giving the heap that seals and merges free back to the system (glibc's ``malloc_trim``).

A seal sorts and encodes its bucket's rows in fresh numpy columns, a merge reads
and rewrites whole buckets; freed, those columns stay resident in a glibc process:
in the allocator's free lists, and at the top of the heap below its trim
threshold, which glibc raises each time a large block it had mapped is freed
(its dynamic mmap threshold), up to 32 MiB. Measured with 10 M sparse indexes
added live in one process (199 seals of 50,000, ``tools/bench/bench_sparse.py
--live``): after the last seal the process held 34 MB more than the open store,
and 19 MB after one ``malloc_trim(0)``.

``malloc_trim(0)`` hands every arena's free pages back (``madvise``), and the top
of the main heap (not a thread heap's top: glibc shrinks that only on a free, past
the trim threshold). It costs about 1 ms at that heap size, up to tens of ms on a
loaded machine (it walks the free lists holding each arena's lock), and what it
returns the next seal faults in again. So the maintenance worker calls it after
a job's install at most once per :data:`INTERVAL` while jobs keep coming, and
once when its thread has been idle for :data:`IDLE` after a job: the memory goes
back when the work stops, and a busy worker pays a few ms a second (36 trims took
0.16 s over a 21 s build; the build took as long with ``BUCKETSTORE_MALLOC_TRIM=0``).

Only on glibc (where ``ctypes`` finds ``malloc_trim``); elsewhere nothing is done.
``BUCKETSTORE_MALLOC_TRIM=0`` in the environment turns it off, for a host process
that tunes its allocator itself. It changes no answer: it only returns free memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable

__all__ = ["HeapRelease", "HEAP", "IDLE", "INTERVAL"]

#: Seconds between two trims while jobs keep coming.
INTERVAL = 1.0
#: Seconds a maintenance thread waits idle after a job before trimming.
IDLE = 0.5


def _glibc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another C library, or not found)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it: musl's malloc has no trim)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapRelease:
    """When to trim: after work, at most once per ``interval`` and once more when idle.

    Thread-safe: the maintenance threads of every store in the process share one
    (the heap is the process's).

    :param trim: the trimming function (``malloc_trim``); None: never trim.
    :param clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, trim: Callable[[int], int] | None, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._trim = trim
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._dirty = False  # a job finished since the last trim
        #: Trims made and the seconds they took (tests, and the cost measured in the docs).
        self.trims = 0
        self.seconds = 0.0

    @property
    def enabled(self) -> bool:
        return self._trim is not None

    def after_job(self) -> bool:
        """A job was installed: trim if the last trim is ``interval`` old. True if it trimmed."""
        # Never waits: a thread trimming now returns this job's pages too.
        lock = self._lock
        if not lock.acquire(blocking=False):
            return False
        try:
            self._dirty = True
            if self._clock() - self._last < self.interval:
                return False
            return self._run()
        finally:
            lock.release()

    def when_idle(self) -> bool:
        """A maintenance thread has been idle a while: trim if a job finished since the last trim."""
        lock = self._lock
        if not lock.acquire(blocking=False):
            return False
        try:
            return self._dirty and self._run()
        finally:
            lock.release()

    def _after_fork(self) -> None:
        # A fork while another thread trimmed would leave the child's lock held for good.
        self._lock = threading.Lock()

    def _run(self) -> bool:
        if self._trim is None:
            return False
        started = self._clock()
        self._trim(0)
        self._last = self._clock()
        self._dirty = False
        self.trims += 1
        self.seconds += self._last - started
        return True


#: The process's: off when ``BUCKETSTORE_MALLOC_TRIM=0`` or not on glibc.
HEAP = HeapRelease(None if os.environ.get("BUCKETSTORE_MALLOC_TRIM", "1") == "0" else _glibc_trim())
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HEAP._after_fork)
