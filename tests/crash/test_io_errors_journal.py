"""I/O errors in ``durability="journal"``: a failed journal write or fsync raises ``JournalError``
and poisons the journal (never retried), and a reopen finds everything acknowledged before.

Faults come from :class:`~bucketstore.testing.faults.FaultyFileSystem` on real files.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import bucketstore
from bucketstore import BucketStoreError, JournalError, TrackerConfig
from bucketstore.errors import MaintenanceError
from bucketstore.testing.faults import FaultyFileSystem, abandon_store
from bucketstore.engine.store.store import Store

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                       max_time_step_per_segment_ms=100)

FAULTS = [
    pytest.param(dict(err=errno.EIO, ops=["write"]), id="write-EIO"),
    pytest.param(dict(err=errno.ENOSPC, ops=["write"]), id="write-ENOSPC"),
    pytest.param(dict(err=errno.ENOSPC, ops=["write"], short=True), id="short-write-ENOSPC"),
    pytest.param(dict(err=errno.EIO, ops=["fsync"]), id="fsync-EIO"),
    pytest.param(dict(err=errno.ENOSPC, ops=["fsync"]), id="fsync-ENOSPC"),
]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("during", ["add", "add-batch", "delivery"])
def test_failed_journal_commit_raises_poisons_and_loses_nothing_acknowledged(tmp_path: Path, fault: dict,
                                                                            during: str) -> None:
    clock = FakeClock(1_000)
    fs = FaultyFileSystem()
    store = Store(tmp_path, durability="journal", fs=fs, confirm_sync_ms=0)  # every confirmation commits
    fs.attach(store.catalog)
    tracker = store.tracker("sub", CONFIG, clock)
    acked = {(1, e): 1_100 + 10 * e for e in range(3)}
    assert tracker.add_messages([(l, e, t) for (l, e), t in acked.items()]) == 3
    clock.now = 1_100
    assert tracker.get_scheduled_messages(1) == [(1, 0)]
    if during != "delivery":
        tracker.confirm_delivered()  # durable: the frontier is past (1, 0)
        del acked[(1, 0)]
    # else the failing delivery call is the one that confirms (1, 0): it journals the frontier
    journal_path = tracker._journal._current_path()
    rule = fs.fail(fault["err"], ops=fault["ops"], times=1, short=fault.get("short", False))
    with pytest.raises(JournalError) as info:
        if during == "add":
            tracker.add_message(1, 7, 5_000)
        elif during == "add-batch":
            tracker.add_messages([(1, 8, 5_000), (1, 9, 5_001)])
        else:
            clock.now = 1_110
            tracker.get_scheduled_messages(1)
    assert rule.fired == 1
    assert isinstance(info.value, BucketStoreError) and info.value.path == journal_path
    # Poisoned: later calls that must journal raise clearly, and nothing is fsynced again.
    calls_before = fs.calls
    with pytest.raises(JournalError, match="unusable after an earlier failure"):
        tracker.add_message(1, 20, 6_000)
    with pytest.raises(JournalError, match="unusable after an earlier failure"):
        tracker.flush()
    assert fs.fsync_retries == [], "a failed journal fsync was retried"
    assert not any(op in ("write", "fsync") for op, _ in fs.log[calls_before:]), "a poisoned journal wrote again"
    abandon_store(store)  # the embedder gives up on the process (a close would raise too)
    with bucketstore.open(tmp_path, durability="journal") as reopened:
        t = reopened.tracker("sub", CONFIG, clock)
        for position in acked:
            if during == "delivery" and position == (1, 0):
                continue  # its confirmation's write or fsync failed: it may have reached the disk
            # ((1, 1), delivered by the failed call and never confirmed, must come back.)
            assert t.contains_message(*position), f"{position} was acknowledged before the failure and is lost"
        if during != "delivery":
            assert not t.contains_message(1, 0), "a durably delivered index came back"
        assert not t.contains_message(1, 20)


@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "background"])
def test_every_fsync_failing_during_a_seal_loses_nothing_acknowledged(tmp_path: Path, background: bool) -> None:
    """The disk fails every fsync from now on: the seal fails (its rows stay in memory), the
    batch's journal commit fails with JournalError, and a reopen has every index acknowledged
    before. In the background the seal fails on the worker and is raised once."""
    clock = FakeClock(1_000)
    fs = FaultyFileSystem()
    store = Store(tmp_path, durability="journal", fs=fs, background=background)
    fs.attach(store.catalog)
    tracker = store.tracker("sub", CONFIG, clock)
    rows = [(1, e, 2_000 + e) for e in range(5)]
    tracker.add_messages(rows)
    fs.fail(errno.EIO, ops=["fsync"], first_call=fs.calls, times=None)
    with pytest.raises(JournalError):
        tracker.add_messages([(2, 0, 3_000)])  # rolls the ledger: the seal fails first
    if background:
        with pytest.raises(MaintenanceError):
            tracker.wait_for_maintenance()
    assert tracker.stats()["create"]["failed"] == 1
    assert fs.fsync_retries == []
    abandon_store(store)
    with bucketstore.open(tmp_path, durability="journal") as reopened:
        t = reopened.tracker("sub", CONFIG, clock)
        assert all(t.contains_message(l, e) for l, e, _ in rows)
