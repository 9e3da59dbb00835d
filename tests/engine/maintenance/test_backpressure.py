"""Backpressure by memory (``max_backlog_bytes``): the batch that grows the backlog waits,
before it takes its tracker's lock; single adds and small batches pass until the ceiling.

Seals are held in flight by a gate in the file layer (test_background_maintenance's
GateFS: a real file system whose ledger rename waits for the test), and each test steps
on the budget's ``waiting`` count, never on timings.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from bucketstore import TrackerConfig, metrics
from bucketstore.engine.maintenance.backlog_budget import ROW_BYTES, SMALL_BATCH_ROWS, BacklogBudget
from bucketstore.engine.store.store import Store
from bucketstore.testing import SteppedWorker

from helpers import FakeClock
from test_background_maintenance import GateFS

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=20)


def _batch(ledger: int, n: int, at: int = 5000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.full(n, ledger, np.uint64), np.arange(n, dtype=np.uint64), np.full(n, at, np.uint64))


def _until(predicate, what: str) -> None:
    """Step on a state another thread reaches (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.001)


def _sealing(tmp_path, budget_rows: int, rows: int = 30):
    """A store whose tracker has a seal of ``rows`` rows held before its rename."""
    fs, clock = GateFS(), FakeClock(0)
    store = Store(tmp_path / "s", "sealed", fs=fs, background=True, max_backlog_bytes=budget_rows * ROW_BYTES)
    t = store.tracker("t", CFG, clock)
    t.add_messages(_batch(1, rows, 1000))
    fs.armed = True
    assert t.add_message(2, 0, 2000)  # rolls: ledger 1's rows are frozen, their seal held
    assert fs.reached()
    return store, t, fs


def _in_thread(call) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (call(), done.set()))
    thread.start()
    return thread, done


def test_a_big_batch_waits_for_the_seal_while_single_adds_and_small_batches_pass(tmp_path):
    # Budget 100 rows: 30 frozen + 1 mutable + a batch of 100 exceed it; the ceiling (200) is far.
    store, t, fs = _sealing(tmp_path, budget_rows=100)
    with store:
        batch, batch_done = _in_thread(lambda: t.add_messages(_batch(2, 100, 3000)))
        _until(lambda: store.budget.waiting == 1, "the batch waits on the budget")
        # The waiting batch holds no lock: another thread's single adds and small batch go through.
        single, single_done = _in_thread(lambda: [t.add_message(2, 1000 + e, 4000) for e in range(10)])
        single.join(60)
        assert single_done.is_set()
        small, small_done = _in_thread(lambda: t.add_messages(_batch(2, SMALL_BATCH_ROWS, 4500)))
        small.join(60)
        assert small_done.is_set()
        assert not batch_done.is_set() and store.budget.waiting == 1  # still waiting for the worker
        fs.release()
        batch.join(60)
        assert batch_done.is_set()
        fs.armed = False
        t.flush()
        stats = t.stats()
        assert stats["number_of_delayed_messages"] == 30 + 100 + 10  # ledger 1; ledger 2's 0..99 and 1000..1009
        assert stats["backpressure"]["waits"] == 1 and stats["backpressure"]["wait_seconds"] > 0
        # The seal released its charge: what is left is ledger 2's mutable rows.
        assert stats["backpressure"]["store"]["jobs_in_flight"] == 0
        assert stats["backpressure"]["store"]["backlog_bytes"] == t._mutable.memory_bytes() > 0
        ops = metrics.collect(store)["trackers"]["t"]["operations"]["backpressure"]
        assert ops["ok"] == 1 and ops["sum_seconds"] > 0
        assert 'op="backpressure"' in metrics.prometheus_text(store)


def test_past_the_ceiling_a_single_add_waits_too(tmp_path):
    # Budget 10 rows, ceiling 20: the 30 frozen rows are past it.
    store, t, fs = _sealing(tmp_path, budget_rows=10)
    with store:
        single, done = _in_thread(lambda: t.add_message(2, 1, 2001))
        _until(lambda: store.budget.waiting == 1, "the single add waits past the ceiling")
        assert not done.is_set()
        fs.release()
        single.join(60)
        assert done.is_set()
        assert t.stats()["backpressure"]["waits"] == 1


def test_a_backlog_of_mutable_rows_alone_never_blocks(tmp_path):
    """Nothing in flight could shrink it: the batch passes (its own roll seals the rows)."""
    with Store(tmp_path / "s", "sealed", background=True, max_backlog_bytes=10 * ROW_BYTES) as store:
        t = store.tracker("t", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10_000), FakeClock(0))
        for ledger in (1, 2, 3):
            assert t.add_messages(_batch(ledger, 1000)) == 1000  # on this thread: a wait would hang
        assert store.budget.used >= 3000 * ROW_BYTES and t.stats()["backpressure"]["waits"] == 0


def test_a_stepped_worker_runs_the_jobs_a_waiting_batch_needs(tmp_path):
    """With a worker that runs jobs only when asked, the waiting batch runs them on its own
    thread (deterministic, as the crash enumeration needs), then goes through."""
    worker = SteppedWorker()
    with Store(tmp_path / "s", "sealed", background=True, maintenance=worker,
               max_backlog_bytes=100 * ROW_BYTES) as store:
        t = store.tracker("t", CFG, FakeClock(0))
        t.add_messages(_batch(1, 60))
        t.add_message(2, 0, 5000)  # the seal of ledger 1 is queued, not run
        assert worker.pending == 1 and store.budget.used >= 60 * ROW_BYTES
        assert t.add_messages(_batch(2, 80)) == 80
        assert worker.history[:2] == [("create", "work"), ("create", "install")]
        assert t.stats()["backpressure"]["waits"] == 1 and len(t.buckets()) == 1


def test_the_budget_is_released_by_every_job_end(tmp_path):
    """Installed, cancelled (clear) or merged: the backlog comes back to the mutable rows."""
    worker = SteppedWorker()
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=20, max_num_buckets=2,
                        max_indexes_per_segment=10)
    with Store(tmp_path / "s", "sealed", background=True, maintenance=worker) as store:
        t = store.tracker("t", cfg, FakeClock(0))
        for ledger in range(1, 7):
            t.add_messages(_batch(ledger, 30))
        worker.run_all()
        assert ("merge", "install") in worker.history
        assert store.budget.as_dict()["jobs_in_flight"] == 0
        t.add_messages(_batch(7, 30))
        assert worker.pending == 1  # ledger 6's seal
        t.clear()
        worker.run_all()
        assert store.budget.used == 0 and store.budget.as_dict()["jobs_in_flight"] == 0


@pytest.mark.parametrize("bad", [0, ROW_BYTES - 1, True, 1.5, "1"])
def test_a_bad_budget_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="max_backlog_bytes"):
        Store(tmp_path / "s", "sealed", max_backlog_bytes=bad)
    with pytest.raises(ValueError, match="max_backlog_bytes"):
        BacklogBudget(bad)
