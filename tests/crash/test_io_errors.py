"""I/O errors during seal and delete: the tracker degrades to memory, loses nothing, and keeps delivering.

Faults come from :class:`~bucketstore.testing.faults.FaultyFileSystem`: ``EIO`` and
``ENOSPC`` once or forever, a write that stops half-way (a disk filling up), a
failed ``fsync`` (which must never be retried on the same file), and a failed
catalog commit (raised the way LMDB reports one). Every test runs in both designs: seals
on the calling thread (``background=False``) and on the maintenance thread, where a
failure is raised once as ``MaintenanceError`` by the next call (``Rig.fill`` waits for
the seal it triggers and counts those).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.errors import MaintenanceError
from bucketstore.testing.faults import FaultyFileSystem
from bucketstore.engine.store.store import Store

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                       max_time_step_per_segment_ms=100)


class Rig:
    """A store on a faulty file layer with one tracker, and the positions added to it."""

    def __init__(self, path: Path, background: bool = False) -> None:
        self.path = path
        self.background = background
        self.maintenance_errors = 0
        self.fs = FaultyFileSystem()
        self.store = Store(path, durability="sealed", fs=self.fs, background=background)  # journal: *_journal.py
        self.fs.attach(self.store.catalog)
        self.clock = FakeClock(1_000)
        self.tracker = self.store.tracker("sub", CONFIG, self.clock)
        self.added: dict[tuple[int, int], int] = {}

    def fill(self, ledger: int, count: int = 6) -> None:
        rows = [(ledger, e, self.clock.now + 50 + 40 * e + ledger) for e in range(count)]
        assert self.tracker.add_messages(rows) == count
        self.added.update({(l, e): t for l, e, t in rows})
        if self.background:
            try:  # the seal this roll started runs on the worker: wait for its outcome
                self.tracker.wait_for_maintenance()
            except MaintenanceError:
                self.maintenance_errors += 1

    def files(self) -> list[str]:
        return sorted(os.listdir(self.path / "ledgers"))

    def keys(self) -> dict[str, int]:
        return self.store.catalog.buckets("sub")

    def drain_all(self) -> list[tuple[int, int]]:
        """Deliver everything, one small call at a time, in time order; return the positions."""
        out: list[tuple[int, int]] = []
        for at in sorted(set(self.added.values())):
            self.clock.now = at
            got = self.tracker.get_scheduled_messages(100)
            assert all(self.added[p] <= at + CONFIG.tick_time_ms for p in got), "delivered early"
            out.extend(got)
        return out

    def close(self) -> None:
        self.store.close()


@pytest.fixture(params=[False, True], ids=["synchronous", "background"])
def rig(tmp_path: Path, request: pytest.FixtureRequest):
    r = Rig(tmp_path / "store", background=request.param)
    yield r
    r.close()


SEAL_FAULTS = [
    pytest.param(dict(err=errno.EIO, ops=["create"]), id="create-EIO"),
    pytest.param(dict(err=errno.EIO, ops=["write"]), id="write-EIO"),
    pytest.param(dict(err=errno.ENOSPC, ops=["write"]), id="write-ENOSPC"),
    pytest.param(dict(err=errno.ENOSPC, ops=["write"], short=True), id="short-write-ENOSPC"),
    pytest.param(dict(err=errno.EIO, ops=["fsync"]), id="fsync-EIO"),
    pytest.param(dict(err=errno.EIO, ops=["rename"]), id="rename-EIO"),
    pytest.param(dict(err=errno.EIO, ops=["fsync_dir"]), id="fsync_dir-EIO"),
    pytest.param(dict(err=errno.EIO, ops=["catalog_commit"]), id="catalog-commit-EIO"),
]


@pytest.mark.parametrize("fault", SEAL_FAULTS)
@pytest.mark.parametrize("forever", [False, True], ids=["once", "forever"])
def test_failed_seal_keeps_indexes_in_memory(rig: Rig, fault: dict, forever: bool) -> None:
    rig.fill(1)
    rule = rig.fs.fail(fault["err"], ops=fault["ops"], times=None if forever else 1, short=fault.get("short", False))
    rig.fill(2)  # ledger 2 rolls the mutable bucket over: the seal of ledger 1 fails
    assert rule.fired >= 1
    stats = rig.tracker.stats()
    assert stats["create"]["failed"] == 1 and stats["create"]["succeeded"] == 0
    assert rig.maintenance_errors == rig.background, "a background failure must be raised, once"
    assert rig.keys() == {}, "a failed seal must not be acknowledged in the catalog"
    assert rig.files() == [], f"a failed seal left {rig.files()} behind"
    assert rig.fs.fsync_retries == [], "a failed fsync was retried on the same file"
    assert rig.tracker.number_of_delayed_messages == len(rig.added)
    for position in rig.added:
        assert rig.tracker.contains_message(*position)
    rig.fill(3)  # the next seal: fails again if the fault is permanent, succeeds otherwise
    stats = rig.tracker.stats()
    assert stats["create"]["succeeded"] == (0 if forever else 1)
    assert len(rig.keys()) == (0 if forever else 1)
    delivered = rig.drain_all()
    assert sorted(delivered) == sorted(rig.added), "an index was lost or delivered twice"
    assert rig.tracker.number_of_delayed_messages == 0


def test_failed_fsync_poisons_the_file_and_is_not_retried(rig: Rig) -> None:
    rig.fill(1)
    rig.fs.fail(errno.EIO, ops=["fsync"], times=1)
    rig.fill(2)
    rig.fill(3)  # a later seal writes a new file, which may be fsynced
    assert rig.fs.fsync_retries == []
    fsynced = [target for op, target in rig.fs.log if op == "fsync"]
    assert len(fsynced) == len(set(fsynced)) == 2, f"files fsynced: {fsynced}"


def test_failed_delete_keeps_delivering_and_recovery_cleans_up(rig: Rig) -> None:
    rig.fill(1)
    rig.fill(2)  # seals ledger 1
    assert len(rig.keys()) == 1
    # Exhausting the bucket deletes it: fail that catalog commit.
    rig.fs.fail(errno.EIO, ops=["catalog_commit"], times=1)
    rig.clock.now = max(t for (l, _), t in rig.added.items() if l == 1)
    got = rig.tracker.get_scheduled_messages(100)
    assert {p for p in rig.added if p[0] == 1} <= set(got)
    assert rig.tracker.stats()["delete"]["failed"] == 1
    assert len(rig.keys()) == 1, "the key stays: the delete did not commit"
    rest = rig.drain_all()
    assert sorted(got + rest) == sorted(rig.added)
    rig.close()
    # Sealed recovery skips the bucket's (due) indexes but cannot know they were delivered:
    # it keeps the bucket until the embedder's replay is done, which then deletes it for good.
    with bucketstore.open(rig.path, durability="sealed") as store:
        tracker = store.tracker("sub", CONFIG, rig.clock)
        assert tracker.number_of_delayed_messages == 0
        assert len(store.catalog.buckets("sub")) == 1 and tracker.stats()["held_for_replay_buckets"] == 1
        tracker.replay_done()
        assert store.catalog.buckets("sub") == {}
        assert os.listdir(rig.path / "ledgers") == []


def test_failed_unlink_leaves_an_orphan_that_open_removes(rig: Rig) -> None:
    rig.fill(1)
    rig.fill(2)
    rig.fs.fail(errno.EIO, ops=["unlink"], times=1)
    rig.clock.now = max(t for (l, _), t in rig.added.items() if l == 1)
    rig.tracker.get_scheduled_messages(100)
    assert rig.keys() == {} and len(rig.files()) == 1  # key gone, file stuck
    rig.close()
    with bucketstore.open(rig.path, durability="sealed") as store:
        assert store.orphans_removed == 1
        assert os.listdir(rig.path / "ledgers") == []


@pytest.mark.parametrize("call", ["next_delivery_time", "get_scheduled_messages"])
def test_a_failed_segment_read_keeps_the_bucket_queued(tmp_path: Path, call: str) -> None:
    """A bucket whose next segment cannot be read for a moment (here: its file renamed away)
    raises from the call that needs it and stays queued: once the file is back, every row is
    delivered, in order, and the next delivery time is exact."""
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=5)
    clock = FakeClock(0)
    rows = [(ledger, entry, 1_000 + 10 * ledger + entry) for ledger in range(4) for entry in range(10)]
    with bucketstore.open(tmp_path / "s", durability="sealed", background=False, read_ahead=False) as store:
        t = store.tracker("t", config, clock)
        t.add_messages(rows)
        t.add_message(9, 0, 10**9)  # rolls the ledger range: ledgers 0..3 are sealed
        first = min(t.buckets(), key=lambda b: b.start_ledger).path
        clock.now = 1_004
        assert t.get_scheduled_messages(100) == [(0, e) for e in range(5)]  # the first segment of ledger 0
        os.rename(first, first + ".away")  # its second segment (due at 1,005) cannot be read now
        with pytest.raises(OSError):
            if call == "next_delivery_time":
                t.next_delivery_time()
            else:
                clock.now = 1_005
                t.get_scheduled_messages(100)
        os.rename(first + ".away", first)
        assert t.next_delivery_time() == 1_005
        clock.now = 10**6
        assert t.get_scheduled_messages(100) == sorted((ledger, entry) for ledger, entry, _ in rows[5:])
