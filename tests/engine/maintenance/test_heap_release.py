"""Freed heap handed back after maintenance jobs (engine/maintenance/heap_release.py), and the
worker threads letting go of a handled item at once."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from bucketstore import TrackerConfig
from bucketstore.engine.maintenance import heap_release
from bucketstore.engine.maintenance.heap_release import HeapRelease
from bucketstore.engine.store.store import Store
from bucketstore.engine.threads.worker_thread import WorkerThread


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trims_at_most_once_per_interval_while_jobs_keep_coming() -> None:
    calls: list[int] = []
    clock = _Clock()
    heap = HeapRelease(lambda pad: calls.append(pad) or 1, interval=1.0, clock=clock)
    assert heap.after_job()          # the first job: nothing trimmed before
    clock.now += 0.4
    assert not heap.after_job()      # too soon
    clock.now += 0.4
    assert not heap.after_job()
    clock.now += 0.3                 # 1.1 s after the trim
    assert heap.after_job()
    assert calls == [0, 0] and heap.trims == 2


def test_idle_trims_only_after_work_since_the_last_trim() -> None:
    calls: list[int] = []
    clock = _Clock()
    heap = HeapRelease(lambda pad: calls.append(pad) or 1, interval=1.0, clock=clock)
    assert not heap.when_idle()      # no job yet: nothing was freed
    heap.after_job()                 # trims
    clock.now += 0.1
    heap.after_job()                 # rate-limited: freed memory left behind ...
    assert heap.when_idle()          # ... given back once the worker is idle
    assert not heap.when_idle()      # and not again without more work
    assert len(calls) == 2


def test_a_trim_in_another_thread_is_never_waited_for() -> None:
    """A thread finding another trimming goes on (that trim returns its pages too): no job
    waits on the lock, and a child forked meanwhile gets a free lock."""
    started, release = threading.Event(), threading.Event()

    def slow_trim(pad: int) -> int:
        started.set()
        release.wait(5)
        return 1

    heap = HeapRelease(slow_trim, interval=0.0)
    other = threading.Thread(target=heap.after_job)
    other.start()
    assert started.wait(5)
    t0 = time.monotonic()
    assert not heap.after_job() and not heap.when_idle()
    assert time.monotonic() - t0 < 1.0
    heap._after_fork()  # what the child of a fork made now runs
    assert heap._lock.acquire(blocking=False)
    heap._lock.release()
    release.set()
    other.join(5)
    assert heap.trims == 1


def test_off_without_a_trim_function() -> None:
    heap = HeapRelease(None)
    assert not heap.enabled
    assert not heap.after_job() and not heap.when_idle() and heap.trims == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_finds_glibc_malloc_trim() -> None:
    trim = heap_release._glibc_trim()
    if trim is None:
        pytest.skip("not glibc (musl?)")
    assert trim(0) in (0, 1)


class _Recorder(WorkerThread[object]):
    idle_after = 0.05

    def __init__(self) -> None:
        super().__init__("test-recorder")
        self.handled: list[object] = []
        self.after = 0
        self.idle = threading.Semaphore(0)
        self.idles = 0

    def _handle(self, item: object) -> None:
        self.handled.append(type(item).__name__)

    def _handled(self) -> None:
        self.after += 1

    def _on_idle(self) -> None:
        self.idles += 1
        self.idle.release()

    def put(self, item: object) -> None:
        assert self._enqueue(item)


class _Job:
    pass


def test_worker_lets_go_of_an_item_and_reports_idle_once() -> None:
    worker = _Recorder()
    job = _Job()
    ref = weakref.ref(job)
    worker.put(job)
    del job
    assert worker.idle.acquire(timeout=5)  # idle after the item
    gc.collect()
    # Without ``del item`` in the loop, the thread would keep the last job (its columns, its
    # entry 0) until the next item came.
    assert ref() is None
    assert worker.after == 1 and worker.handled == ["_Job"]
    time.sleep(0.2)
    assert worker.idles == 1  # not again without another item
    worker.put(_Job())
    assert worker.idle.acquire(timeout=5)
    assert worker.idles == 2 and worker.after == 2
    assert worker.stop(5)


def test_maintenance_jobs_trim_the_heap(tmp_path, monkeypatch) -> None:
    """Seals run through the real worker call the process's HeapRelease after their install,
    and once more when the worker goes idle."""
    calls: list[int] = []
    heap = HeapRelease(lambda pad: calls.append(pad) or 1, interval=3600.0)
    monkeypatch.setattr(heap_release, "HEAP", heap)
    with Store(str(tmp_path / "s"), durability="sealed") as store:
        t = store.tracker("t", TrackerConfig(min_index_count_per_bucket=1000), lambda: 0)
        for ledger in range(1, 6):
            entries = np.arange(1000, dtype=np.uint64)
            t.add_messages((np.full(1000, ledger, np.uint64), entries, entries + np.uint64(10_000)))
        t.flush()
        assert t.stats()["immutable_buckets"] >= 2
        deadline = time.monotonic() + 5
        while heap.trims < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # One after the first install (the interval holds back the others), one when idle.
        assert heap.trims == 2, heap.trims
        t.close()
