"""A journal group commit does its I/O without the tracker's lock.

An add takes its group under the lock (``Journal.take``) and writes it after letting the lock
go (``Journal.write_taken``): with ``sync_interval_ms=0`` before the call returns, with a window
on a thread beside the caller. A seal's checkpoint begins with no I/O at all: the pending group
is taken, bound for the file the checkpoint replaces, and written first by ``write_checkpoint``.
Real files; a gate in the file layer holds a write open so the test sees what waits for it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from contextlib import contextmanager

import numpy as np

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.durability.journal import Journal
from bucketstore.engine.store.store import Store
from bucketstore.format.fs import FileSystem

from helpers import FakeClock

_CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=1000)


class LogFS(FileSystem):
    """Real files; records (operation, file name) of every write, fsync, create and rename."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self._names: dict[int, str] = {}

    def create(self, path: str) -> int:
        fd = super().create(path)
        self._names[fd] = os.path.basename(path).removesuffix(".tmp")  # (renamed into place, kept open)
        self.log.append(("create", os.path.basename(path)))
        return fd

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        self._names[fd] = os.path.basename(path)
        return fd

    def write(self, fd, data) -> None:
        self.log.append(("write", self._names.get(fd, "?")))
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self.log.append(("fsync", self._names.get(fd, "?")))
        super().fsync(fd)

    def rename(self, src: str, dst: str) -> None:
        self.log.append(("rename", os.path.basename(dst)))
        super().rename(src, dst)


class FsyncGateFS(FileSystem):
    """Real files; a journal fsync on any thread but the main one records whether another
    thread could take ``watch``'s lock, then waits until the test opens ``gate``."""

    def __init__(self) -> None:
        self.watch = None
        self.lock_free: list[bool] = []
        self.threads: list[str] = []
        self.held = threading.Event()
        self.gate = threading.Event()
        self._journal_fds: set[int] = set()

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        if path.endswith(".journal"):
            self._journal_fds.add(fd)
        return fd

    def create(self, path: str) -> int:
        fd = super().create(path)
        if ".journal" in path:
            self._journal_fds.add(fd)
        return fd

    def fsync(self, fd: int) -> None:
        if self.watch is not None and fd in self._journal_fds \
                and threading.current_thread() is not threading.main_thread():
            self.threads.append(threading.current_thread().name)
            self.lock_free.append(_lock_is_free(self.watch))
            self.held.set()
            assert self.gate.wait(60), "test never opened the gate"
        super().fsync(fd)


def _lock_is_free(tracker) -> bool:
    got: list[bool] = []

    def probe() -> None:
        got.append(tracker._lock.acquire(timeout=2))
        if got[-1]:
            tracker._lock.release()

    prober = threading.Thread(target=probe)
    prober.start()
    prober.join()
    return got[0]


@contextmanager
def _gated_tracker(path):
    """A journal tracker (sync_interval_ms=0) holding (1, 0), whose journal fsyncs on other
    threads are held at ``fs.gate`` from now on."""
    fs = FsyncGateFS()
    with Store(path, "journal", fs=fs, background=True) as store:
        t = store.tracker("t", _CFG, FakeClock(0))
        assert t.add_message(1, 0, 1000)  # creates the journal's first file
        fs.watch = t
        yield t, fs


def _positions(path) -> list[tuple[int, int]]:
    clock = FakeClock(0)
    with bucketstore.open(path, "journal") as store:
        t = store.tracker("t", _CFG, clock)
        clock.now = 10 ** 9
        return t.get_scheduled_messages(10 ** 4)


def test_an_add_writes_its_group_without_the_lock_and_returns_once_it_is_durable(tmp_path):
    path, image = tmp_path / "s", tmp_path / "image"
    with _gated_tracker(path) as (t, fs):
        returned = threading.Event()

        def add() -> None:
            assert t.add_message(1, 1, 1001)
            returned.set()

        adder = threading.Thread(target=add, name="adder")
        adder.start()
        assert fs.held.wait(60)
        assert fs.lock_free == [True]  # its fsync runs without the tracker's lock
        assert t.contains_message(1, 0) and t.contains_message(1, 1)  # (takes the lock)
        assert not returned.is_set()  # sync_interval_ms=0: durable before it returns
        fs.gate.set()
        adder.join(60)
        assert returned.is_set()
        shutil.copytree(path, image)  # a crash now: both adds were acknowledged durable
    assert _positions(image) == [(1, 0), (1, 1)]


def test_with_a_window_an_add_returns_while_its_group_is_written_beside_it_and_flush_waits(tmp_path):
    path, image = tmp_path / "s", tmp_path / "image"
    fs = FsyncGateFS()
    with Store(path, "journal", fs=fs, background=True, sync_interval_ms=1) as store:
        t = store.tracker("t", _CFG, FakeClock(0))
        t.add_message(1, 0, 1000)
        t.flush()  # the first file exists
        fs.watch = t
        time.sleep(0.01)
        assert t.add_message(1, 1, 1001)  # takes its group; written beside it
        assert fs.held.wait(60)
        assert fs.threads == ["bucketstore-encode"] and fs.lock_free == [True]
        time.sleep(0.01)
        assert t.add_message(1, 2, 1002)  # a write is in flight: this one waits in the pending group
        assert t._journal.has_pending
        flushed = threading.Event()

        def flush() -> None:
            t.flush()
            flushed.set()

        flusher = threading.Thread(target=flush)
        flusher.start()
        assert not flushed.wait(0.2)  # flush() writes the taken group first: it waits for the disk
        fs.gate.set()
        flusher.join(60)
        assert flushed.is_set() and not t._journal.has_pending
        shutil.copytree(path, image)
    assert _positions(image) == [(1, 0), (1, 1), (1, 2)]


def test_begin_checkpoint_writes_nothing_and_write_checkpoint_puts_the_taken_group_first(tmp_path):
    fs = LogFS()
    j = Journal(str(tmp_path / "j"), fs)
    one = np.array([1], dtype=np.uint64)
    j.add_one(1, 0, 100)
    j.commit()  # file 0
    j.add_one(1, 1, 101)  # pending: part of the state the checkpoint takes
    fs.log.clear()
    begun = j.begin_checkpoint([(one, one, one * 101)], None)
    assert fs.log == []  # nothing written, nothing waited for, under the tracker's lock
    assert begun.number == 1
    j.add_one(1, 2, 102)  # after the state: to the tail, file 2
    j.commit()
    j.write_checkpoint(begun)
    names = [(op, name) for op, name in fs.log]
    first = "00000000000000000000.journal"
    # The taken group reached file 0 (written and fsynced) before the tail was created and
    # before the checkpoint was: a crash before the checkpoint is durable replays file 0, then 2.
    assert names.index(("fsync", first)) < names.index(("rename", "00000000000000000002.journal"))
    assert names.index(("fsync", first)) < names.index(("rename", "00000000000000000001.journal"))
    assert sorted(os.listdir(tmp_path / "j")) == ["00000000000000000001.journal", "00000000000000000002.journal"]
    j.close()
    again = Journal(str(tmp_path / "j"))
    records = again.replay().records
    assert [r[0] for r in records] == ["a", "a"]  # the checkpoint's row, then the tail's add
    again.close()


def test_adds_that_wait_for_a_write_in_flight_share_the_next_fsync(tmp_path):
    """sync_interval_ms=0: adds of other threads that come while one add's group is being
    written take their groups (the lock is free) and wait for the disk; the first of them to
    write writes all of them, one group in one fsync, and each returns once it is durable."""
    path, image = tmp_path / "s", tmp_path / "image"
    with _gated_tracker(path) as (t, fs):
        adders = [threading.Thread(target=t.add_message, args=(1, 1, 1001))]
        adders[0].start()
        assert fs.held.wait(60)  # the first add's fsync, held
        for e in (2, 3):
            adders.append(threading.Thread(target=t.add_message, args=(1, e, 1000 + e)))
            adders[-1].start()
        deadline = time.monotonic() + 60
        while len(t._journal._taken) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(t._journal._taken) == 2  # both taken while the first write is held
        fs.gate.set()
        for a in adders:
            a.join(60)
        assert len(fs.threads) == 2  # the first add's fsync, then one for the two others
        shutil.copytree(path, image)
    assert _positions(image) == [(1, 0), (1, 1), (1, 2), (1, 3)]
