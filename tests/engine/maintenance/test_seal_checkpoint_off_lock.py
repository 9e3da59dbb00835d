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

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.format.fs import FileSystem

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
