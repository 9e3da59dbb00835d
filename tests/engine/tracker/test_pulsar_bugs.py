"""One test per bug of Pulsar's bucket tracker that reference §6 lists, named after it.

Each builds the situation that hurt Pulsar's users and asserts what bucketstore does
instead; each would fail on the behaviour the reference describes.
"""

from __future__ import annotations

import os

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.errors import MaintenanceError
from bucketstore.testing.faults import FaultyFileSystem
from bucketstore.engine.store.store import Store

SMALL = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2)


def _seal_ledgers(tracker, ledgers, per_ledger=4, base=1000, step=10):
    """Add ``per_ledger`` indexes to each ledger in turn; each roll seals the previous one.
    Returns once the seals (and the merges they start) are installed: they run on the
    store's maintenance thread."""
    for ledger in ledgers:
        for entry in range(per_ledger):
            tracker.add_message(ledger, entry, base + step * entry + ledger)
    tracker.add_message(max(ledgers) + 1, 0, base + 10**6)  # roll: seal the last one
    tracker.wait_for_maintenance()


def _drain(tracker, clock):
    clock.now = 10**9
    return tracker.get_scheduled_messages(10**7)


def test_26251_merge_keeps_loaded_segment_and_never_delivers_twice(tmp_path):
    """#26251: a merge skipped the loaded segment 1 (lost), or re-merged it (delivered twice)."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4,
                                               max_indexes_per_segment=2, max_num_buckets=1), clock)
        _seal_ledgers(t, [1, 2, 3])
        assert t.stats()["merge"]["succeeded"] >= 1
        expected = {(l, e) for l in (1, 2, 3) for e in range(4)} | {(4, 0)}
        got = _drain(t, clock)
        assert sorted(got) == sorted(expected) and len(got) == len(set(got))


def test_26230_expired_readd_of_unloaded_position_is_dispatched_now(tmp_path):
    """#26230: contains was checked before expiry, so an expired, unloaded position was skipped."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        _seal_ledgers(t, [1])  # (1, 3) sits in segment 2, not loaded
        clock.now = 5000
        assert t.add_message(1, 3, 4000) is False  # due: dispatch it now
        assert not t.contains_message(1, 3)
        assert (1, 3) not in _drain(t, clock)


def test_26239_failed_create_during_merge_keeps_the_sources(tmp_path):
    """#26239: a failed merge create still deleted the source snapshots."""
    clock = FakeClock(0)
    fs = FaultyFileSystem()
    store = Store(tmp_path / "s", durability="sealed", fs=fs)
    t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4,
                                           max_indexes_per_segment=2, max_num_buckets=2), clock)
    _seal_ledgers(t, [1, 2])
    # The third seal succeeds; the merge it triggers writes a ledger whose fsync fails.
    rule = fs.fail(ops=["fsync"], first_call=fs.calls + 3, times=None)
    with pytest.raises(MaintenanceError):  # the background merge's failure, raised once
        _seal_ledgers(t, [3])
    assert t.stats()["merge"]["failed"] >= 1
    fs.rules.remove(rule)
    assert len(store.catalog.buckets("sub")) >= 2  # sources kept
    store.close()
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        held = {(l, e) for l in (1, 2) for e in range(4)}
        assert all(t.contains_message(*p) for p in held)


def test_26240_trim_never_deletes_a_bucket_overlapping_the_first_live_ledger(tmp_path):
    """#26240: trim used a clipped range and deleted a bucket that overlapped the first live ledger."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=8,
                                               max_indexes_per_segment=2), clock)
        for ledger in (1, 2):  # one bucket [1, 2]
            for entry in range(4):
                t.add_message(ledger, entry, 1000 + entry)
        t.add_message(5, 0, 2000)
        t.wait_for_maintenance()
        assert [(b.start_ledger, b.end_ledger) for b in t.buckets()] == [(1, 2)]
        t.mark_delete(2, 0)  # first live ledger 2 lies inside [1, 2]
        assert len(t.buckets()) == 1
        assert all(t.contains_message(2, e) for e in (1, 2, 3))


def test_26280_loading_does_not_hang_on_a_removed_sentinel(tmp_path):
    """#26280: the next segment loaded only when the last index of the current one was popped;
    when that index was removed (expired re-add, trim), the bucket never loaded again."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        _seal_ledgers(t, [1])  # segments {(1,0),(1,1)} and {(1,2),(1,3)}
        clock.now = 1005
        assert t.add_message(1, 1, 1004) is False  # the sentinel of segment 1 is untracked
        clock.now = 10**6
        assert t.get_scheduled_messages(10) == [(1, 0), (1, 2), (1, 3)]


def test_pending_load_never_returns_short(tmp_path):
    """Pulsar returns nothing while a segment load is pending; here the load happens in the call."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        _seal_ledgers(t, [1, 2])
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)  # nothing loaded yet
        clock.now = 10**6
        assert len(t.get_scheduled_messages(100)) == 8


def test_26238_failed_catalog_write_after_create_leaves_no_orphan_and_loses_nothing(tmp_path):
    """#26238 / #17677: the property write failed after the ledger was created: the snapshot was
    orphaned and could not be recovered. Here the file is removed and the indexes stay in memory."""
    clock = FakeClock(0)
    fs = FaultyFileSystem()
    store = Store(tmp_path / "s", durability="sealed", fs=fs)
    fs.attach(store.catalog)
    t = store.tracker("sub", SMALL, clock)
    rule = fs.fail(ops=["catalog_commit"], times=None)
    with pytest.raises(MaintenanceError):  # the background seal's failure, raised once
        _seal_ledgers(t, [1])
    assert t.stats()["create"]["failed"] == 1
    fs.rules.remove(rule)
    assert os.listdir(tmp_path / "s" / "ledgers") == []
    assert sorted(_drain(t, clock)) == [(1, e) for e in range(4)] + [(2, 0)]
    store.close()


def test_22802_no_key_ever_points_at_a_missing_ledger(tmp_path):
    """#22802: the property was removed before the ledger was deleted (or the other way round)
    and leaked; here the key goes first, the file second, and open removes orphans."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        _seal_ledgers(t, [1])
        _drain(t, clock)  # exhausts the bucket: key removed, then file
        assert store.catalog.buckets("sub") == {}
        assert os.listdir(tmp_path / "s" / "ledgers") == []


def test_20638_journal_mode_redelivers_nothing_after_a_restart(tmp_path):
    """#20638: all delayed messages were redelivered after a broker restart."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", SMALL, clock)
        _seal_ledgers(t, [1, 2])
        clock.now = 1025
        first = t.get_scheduled_messages(100)
        assert first
        t.confirm_delivered()  # handed on (the next poll or flush() confirms too)
        clock.now = 1031
        unconfirmed = t.get_scheduled_messages(1)  # then the broker dies before dispatching it
        assert unconfirmed
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", SMALL, clock)
        rest = _drain(t, clock)
        assert not set(first) & set(rest), "a confirmed delivery came back"
        assert set(unconfirmed) <= set(rest), "an unconfirmed delivery was lost"
        assert len(first) + len(rest) == 9


def test_25371_ledger_inside_the_mutable_range_is_accepted(tmp_path):
    """#25371: a ledger strictly inside [start, end) of the mutable bucket raised an error."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", TrackerConfig(tick_time_ms=0), clock)
        t.add_message(1, 0, 1000)
        t.add_message(5, 0, 1000)
        assert t.add_message(3, 0, 1000)  # inside [1, 5)
        assert t.number_of_delayed_messages == 3


def test_26080_next_delivery_time_on_empty_queues(tmp_path):
    """#26080: nextDeliveryTime threw when the queues were empty (segments not loaded)."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        assert t.next_delivery_time() is None
        _seal_ledgers(t, [1])
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)  # segments on disk, nothing in memory
        assert t.next_delivery_time() == 1001


@pytest.mark.parametrize("max_buckets", [1, 2, 3])
def test_26241_max_num_buckets_1_to_3_merge(tmp_path, max_buckets):
    """#26241 / #26242: merging threw for maxNumBuckets 1..3."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4,
                                               max_indexes_per_segment=2, max_num_buckets=max_buckets), clock)
        _seal_ledgers(t, list(range(1, 8)))
        assert len(t.buckets()) <= max_buckets
        assert t.stats()["merge"]["failed"] == 0
        assert len(_drain(t, clock)) == 7 * 4 + 1


def test_entry_ids_beyond_32_bits_are_sealed_and_recovered(tmp_path):
    """Pulsar's 32-bit bitmaps cannot hold entry ids >= 2**32."""
    clock = FakeClock(0)
    big = (1 << 40) + 7
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        for e in range(4):
            t.add_message(1, big + e, 1000 + e)
        t.add_message(2, 0, 2000)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        assert t.contains_message(1, big + 3)
        assert _drain(t, clock) == [(1, big + e) for e in range(4)]
