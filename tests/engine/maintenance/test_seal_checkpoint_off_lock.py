"""A seal's journal checkpoint is written without the tracker's lock (``Journal.begin_checkpoint``
under it, ``write_checkpoint`` after it), while adds go on journaling to a tail file after it.

The checkpoint's rename is held open by a gate in the file layer (real files), so the test
decides what happens while it is being written: adds commit meanwhile, and a copy of the store
taken then is a crash image that must open with every index acknowledged.
"""

from __future__ import annotations

import os
import shutil
import threading

import numpy as np

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.queue.queue_runs import Run
from bucketstore.engine.store.store import Store
from bucketstore.format.fs import FileSystem
from bucketstore.testing import SteppedWorker

from helpers import FakeClock
from test_background_maintenance import lock_is_free

_CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=30, max_indexes_per_segment=10)


class CheckpointGateFS(FileSystem):
    """Real files; the rename that names a journal checkpoint written by a maintenance thread
    records whether another thread could take the tracker's lock (``watch``), then waits until
    the test opens ``gate``."""

    def __init__(self) -> None:
        self.watch = None
        self.lock_free: list[bool] = []
        self.held = threading.Event()
        self.gate = threading.Event()

    def rename(self, src: str, dst: str) -> None:
        if self.watch is not None and dst.endswith(".journal") \
                and threading.current_thread() is not threading.main_thread():
            self.lock_free.append(lock_is_free(self.watch))
            self.held.set()
            assert self.gate.wait(60), "test never opened the gate"
        super().rename(src, dst)


def _journal_files(path) -> list[str]:
    [directory] = os.listdir(path / "journal")
    return sorted(os.listdir(path / "journal" / directory))


def test_a_seals_checkpoint_is_written_without_the_lock_and_loses_no_add(tmp_path):
    path, image = tmp_path / "s", tmp_path / "image"
    fs = CheckpointGateFS()
    with Store(path, "journal", fs=fs, background=True) as store:
        t = store.tracker("t", _CFG, FakeClock(0))
        for e in range(40):
            assert t.add_message(1, e, 1000 + e)
        fs.watch = t
        assert t.add_message(2, 0, 5000)  # seals ledger 1; its install begins the checkpoint
        assert fs.held.wait(60)
        assert fs.lock_free == [True]
        for e in range(1, 20):  # journaled to the tail file meanwhile, each committed
            assert t.add_message(2, e, 5000 + e)
        t.mark_delete(1, 4)
        # Old file, the tail (the checkpoint is still a temporary file): replayed together.
        assert [f for f in _journal_files(path) if f.endswith(".journal")] == \
            ["00000000000000000000.journal", "00000000000000000002.journal"]
        shutil.copytree(path, image)  # a crash now
        fs.gate.set()
        t.flush()  # the seal's job ends once its checkpoint is written
        assert t.stats()["maintenance"]["failed"] == 0
        assert _journal_files(path) == ["00000000000000000001.journal", "00000000000000000002.journal"]
        for e in range(20, 25):
            assert t.add_message(2, e, 5000 + e)
    for where in (image, path):  # the crash image, and the store closed cleanly
        added = 20 if where == image else 25
        clock = FakeClock(0)
        with bucketstore.open(where, "journal") as again:
            t = again.tracker("t", _CFG, clock)
            assert t.number_of_delayed_messages == 35 + added, where
            clock.now = 10 ** 6
            assert t.get_scheduled_messages(10 ** 4) == [(1, e) for e in range(5, 40)] + \
                [(2, e) for e in range(added)], where
            t._check()


def test_a_seals_checkpoint_takes_the_memory_rows_as_views_without_sorting_them(tmp_path):
    """The state a seal's install takes under the lock: the mutable bucket's runs whose rows
    are all live as views of their columns (no copy), the runs left as they are (not compacted:
    that sorts up to a bucket of rows), a run holding a dead row as a filtered copy; joined by
    the checkpoint's write without the lock, which a reopen then reads back exactly."""
    worker = SteppedWorker()
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=30, max_indexes_per_segment=10)
    with Store(tmp_path, "journal", background=True, maintenance=worker) as store:
        t = store.tracker("t", cfg, clock)
        t.add_messages([(1, e, 1000 + e) for e in range(40)])
        for b in range(20):  # 20 runs (more than the mutable bucket compacts at) of ledger 2
            t.add_messages([(2, b * 10 + e, 5000 + 37 * e % 100 + b) for e in range(10)])
        clock.now = 5100
        assert not t.add_message(2, 3, 5000)  # an expired re-add: its old row is dead in its run
        # Ledger 1's frozen run (its seal queued) and ledger 2's 20 runs: held only in memory.
        runs = [r for r in t._queue.items() if isinstance(r, Run) and r.owner is None]
        assert len(runs) == 21
        with t._lock:
            begun = t._checkpoint(begin=True)
        assert len(begun.rows) == 21
        views = sum(any(np.shares_memory(part[0], r.ledgers) for r in runs) for part in begun.rows)
        assert views == 20  # every run but the one holding the dead row, which is a copy
        assert len([r for r in t._queue.items() if isinstance(r, Run) and r.owner is None]) == 21  # not compacted
        t.write_checkpoint(begun)
        worker.run_all()
        t.flush()
    clock = FakeClock(0)
    with bucketstore.open(tmp_path, "journal") as again:
        t = again.tracker("t", cfg, clock)
        clock.now = 10 ** 6
        got = t.get_scheduled_messages(10 ** 4)
    assert sorted(got) == sorted([(1, e) for e in range(40)] + [(2, e) for e in range(200) if e != 3])


def test_a_seal_with_another_in_flight_leaves_its_checkpoint_to_the_next_never_two_in_a_row(tmp_path):
    """Three seals in flight: the first install's checkpoint would rewrite the second's frozen
    rows, so it is left out (the journal's files stay); the second's is written (never two left
    out in a row), the third's too (none in flight behind it). Nothing is lost either way."""
    worker = SteppedWorker()
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=5, max_indexes_per_segment=10)
    with Store(tmp_path, "journal", background=True, maintenance=worker, max_pending_maintenance=5) as store:
        t = store.tracker("t", cfg, clock)
        for ledger in range(1, 5):  # seals of ledgers 1, 2 and 3 queued, 4 in the mutable bucket
            t.add_messages([(ledger, e, 1000 * ledger + e) for e in range(6)])
        assert worker.pending_kinds() == ["create"] * 3
        files = _journal_files(tmp_path)
        assert worker.install()  # seal 1, seals 2 and 3 behind it: no checkpoint
        assert _journal_files(tmp_path) == files
        assert worker.install()  # seal 2, seal 3 behind it: the previous was left out, so written
        assert _journal_files(tmp_path) != files
        files = _journal_files(tmp_path)
        assert worker.install()  # seal 3, none behind it
        assert _journal_files(tmp_path) != files
        assert t.stats()["maintenance"]["failed"] == 0
    clock = FakeClock(0)
    with bucketstore.open(tmp_path, "journal") as again:
        t = again.tracker("t", cfg, clock)
        clock.now = 10 ** 6
        assert sorted(t.get_scheduled_messages(10 ** 4)) == [(ledger, e) for ledger in range(1, 5) for e in range(6)]
