"""Pulsar's shared tracker scenarios (reference §5) and edge cases, for both trackers."""

from __future__ import annotations

import threading

import pytest

import bucketstore
from bucketstore import TrackerConfig

from helpers import FakeClock


def test_shared_scenario_basic(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=1), clock)
    assert t.add_message(1, 2, 20)
    assert t.add_message(2, 1, 10)
    assert t.add_message(3, 3, 30)
    assert t.add_message(4, 5, 50)
    assert t.add_message(5, 4, 40)
    assert t.number_of_delayed_messages == 5
    assert not t.has_message_available()
    clock.now = 15
    assert not t.add_message(6, 6, 10)  # already due: dispatch now
    assert t.has_message_available()
    assert t.get_scheduled_messages(10) == [(2, 1)]
    assert t.number_of_delayed_messages == 4
    clock.now = 60
    assert t.get_scheduled_messages(1) == [(1, 2)]
    assert t.get_scheduled_messages(3) == [(3, 3), (4, 5), (5, 4)]
    assert t.number_of_delayed_messages == 0
    assert t.next_delivery_time() is None
    assert not t.has_message_available()


def test_add_within_tick_time(make_tracker):
    t = make_tracker(TrackerConfig(tick_time_ms=100), FakeClock(0))
    assert not t.add_message(1, 1, 10)
    assert not t.add_message(2, 2, 99)
    assert not t.add_message(3, 3, 100)
    assert t.add_message(4, 4, 101)
    assert t.add_message(5, 5, 200)
    assert t.number_of_delayed_messages == 2


def test_add_with_strict_delay(make_tracker):
    t = make_tracker(TrackerConfig(tick_time_ms=100, deliver_at_time_strict=True), FakeClock(10))
    assert not t.add_message(1, 1, 9)
    assert not t.add_message(2, 2, 10)
    assert t.add_message(3, 3, 11)
    assert t.number_of_delayed_messages == 1
    assert not t.has_message_available()


def test_duplicate_add_is_tracked_once(make_tracker):
    t = make_tracker(TrackerConfig(tick_time_ms=0), FakeClock(0))
    assert t.add_message(1, 1, 100)
    assert t.add_message(1, 1, 50)  # already tracked: True, time unchanged
    assert t.number_of_delayed_messages == 1
    assert t.next_delivery_time() == 100


def test_expired_readd_untracks(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    assert t.add_message(1, 1, 100)
    clock.now = 50
    assert not t.add_message(1, 1, 40)  # expiry is checked before membership (Pulsar #26230)
    assert not t.contains_message(1, 1)
    assert t.number_of_delayed_messages == 0
    clock.now = 200
    assert t.get_scheduled_messages(10) == []


def test_cutoff_never_moves_backwards(make_tracker):
    clock = FakeClock(1000)
    t = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    assert t.add_message(1, 1, 1500)
    clock.now = 2000
    assert t.has_message_available()
    clock.now = 0  # the clock steps back
    assert t.has_message_available()
    assert not t.add_message(1, 2, 1999)  # still judged against cutoff 2000
    assert t.get_scheduled_messages(5) == [(1, 1)]


def test_max_zero_and_empty(make_tracker):
    t = make_tracker(TrackerConfig(tick_time_ms=0), FakeClock(10))
    assert t.get_scheduled_messages(0) == []
    assert t.get_scheduled_messages(10) == []
    assert t.next_delivery_time() is None
    assert not t.has_message_available()
    t.add_message(1, 1, 5)
    assert t.get_scheduled_messages(0) == []


def test_bad_arguments(make_tracker):
    t = make_tracker(TrackerConfig(), FakeClock(0))
    with pytest.raises(ValueError):
        t.add_message(-1, 0, 10_000)
    with pytest.raises(ValueError):
        t.add_message(0, 1 << 64, 10_000)
    with pytest.raises(TypeError):
        t.add_message("1", 0, 10_000)
    with pytest.raises(TypeError):
        t.add_message(1, 0, 10.5)
    with pytest.raises(ValueError):
        t.get_scheduled_messages(-1)
    with pytest.raises(TypeError):
        t.contains_message(1.0, 2)


def test_large_entry_ids(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    big = (1 << 64) - 1
    assert t.add_message(3, big, 100)
    assert t.add_message(3, 1 << 32, 90)
    assert t.add_message(3, 5, 95)
    assert t.contains_message(3, big)
    assert not t.contains_message(3, big - 1)
    clock.now = 100
    assert t.get_scheduled_messages(10) == [(3, 5), (3, 1 << 32), (3, big)]


def test_delivery_is_index_order_and_sorted_by_position(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    for ledger, entry, at in [(9, 1, 10), (1, 9, 30), (5, 5, 20), (1, 1, 40)]:
        t.add_message(ledger, entry, at)
    clock.now = 100
    assert t.get_scheduled_messages(2) == [(5, 5), (9, 1)]  # the two earliest, sorted by position
    assert t.get_scheduled_messages(2) == [(1, 1), (1, 9)]


def test_batch_add_equals_single_adds(make_tracker):
    clock = FakeClock(100)
    rows = [(1, e, 100 + (e * 37) % 500) for e in range(300)] + [(2, 0, 50), (1, 3, 400), (0, 7, 900)]
    a = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    tracked = a.add_messages(rows)
    b = bucketstore.InMemoryTracker(TrackerConfig(tick_time_ms=0), clock)
    singles = sum(b.add_message(*r) for r in rows)
    assert tracked == singles
    assert a.number_of_delayed_messages == b.number_of_delayed_messages
    clock.now = 10_000
    assert a.get_scheduled_messages(1000) == b.get_scheduled_messages(1000)


def test_mark_delete_drops_acknowledged(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=0), clock)
    for ledger in range(1, 4):
        for entry in range(5):
            t.add_message(ledger, entry, 100 + entry)
    t.mark_delete(2, 2)
    assert t.number_of_delayed_messages == 15 - 5 - 3
    assert not t.contains_message(1, 4) and not t.contains_message(2, 2) and t.contains_message(2, 3)
    clock.now = 1000
    assert t.get_scheduled_messages(100) == [(2, 3), (2, 4)] + [(3, e) for e in range(5)]


def test_threads_mixing_calls(make_tracker):
    clock = FakeClock(0)
    t = make_tracker(TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=200), clock)
    delivered = []
    lock = threading.Lock()
    errors = []

    def producer(ledger_base):
        try:
            for i in range(2000):
                t.add_message(ledger_base + i // 500, i, 1 + (i * 7919) % 5000)
                t.contains_message(ledger_base, i)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def consumer():
        try:
            for _ in range(300):
                got = t.get_scheduled_messages(50)
                with lock:
                    delivered.extend(got)
                t.has_message_available()
                t.next_delivery_time()
                clock.advance(10)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    def observer():
        try:
            for i in range(200):
                t.add_messages([(1000 + i // 50, i, 1 + (i * 31) % 5000)])
                t.stats()
                t.flush()
                t.contains_message(1000, i)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(b,)) for b in (0, 100)] + [
        threading.Thread(target=consumer), threading.Thread(target=observer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    clock.now = 10**9
    delivered.extend(t.get_scheduled_messages(10**6))
    assert len(delivered) == len(set(delivered))
    assert t.number_of_delayed_messages == 0


def test_readded_expired_position_is_not_delivered_early(make_tracker):
    """An expired re-add untracks a position; if it is added again later, its old
    row (still in the queue, or sealed) must not deliver it at the old time."""
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2, max_indexes_per_segment=2)
    t = make_tracker(cfg, clock)
    t.add_message(1, 1, 100)
    t.add_message(1, 2, 100)
    t.add_message(2, 1, 100)  # ledger roll: ledger 1's indexes are sealed (bucket tracker)
    clock.now = 50
    assert not t.add_message(1, 1, 40)  # expired: dispatched now, untracked
    assert t.add_message(1, 1, 500)  # tracked again, due later
    clock.now = 100
    assert t.get_scheduled_messages(10) == [(1, 2), (2, 1)]
    assert t.contains_message(1, 1)
    assert t.next_delivery_time() == 500
    clock.now = 500
    assert t.get_scheduled_messages(10) == [(1, 1)]
    assert t.number_of_delayed_messages == 0


def test_old_ledger_in_a_gap_never_stretches_the_mutable_bucket_over_sealed_ranges(tmp_path):
    """After a restart the mutable bucket is empty, and an embedder replaying its log adds
    old ledgers first. An old ledger lying in a gap between sealed ranges must not open the
    mutable bucket: newer ledgers would stretch it over a sealed range, the next seal would
    overlap that range, and recovery would delete the enclosed bucket as a merge leftover."""
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2, max_indexes_per_segment=2)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", cfg, clock)
        for ledger in (10, 12):  # seals [10, 10] when ledger 12 arrives
            for entry in range(3):
                t.add_message(ledger, entry, 1000 + entry)
        t.add_message(20, 0, 1000)  # seals [12, 12]
        sealed = {(12, e) for e in range(3)}
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", cfg, clock)
        t.add_message(11, 0, 1000)  # replay: an old ledger in the gap between [10, 10] and [12, 12]
        for entry in range(3):
            t.add_message(20, entry, 1000)
        t.add_message(21, 0, 1000)  # rolls: seals the mutable bucket
        t._check()
        ranges = [(b.start_ledger, b.end_ledger) for b in t.buckets()]
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), ranges
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", cfg, clock)
        t._check()
        assert all(t.contains_message(*p) for p in sealed), "a sealed bucket was lost"


def test_readded_position_is_not_delivered_early_by_a_merged_old_row(tmp_path):
    """A position delivered from a sealed segment and then added again with a later time
    must not come back at its old time when a merge rewrites that segment's file."""
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2, max_indexes_per_segment=1,
                        max_num_buckets=1)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", cfg, clock)
        t.add_message(1, 1, 100)
        t.add_message(1, 2, 300)
        t.add_message(2, 1, 400)  # seals ledger 1: segments {(100,1,1)} and {(300,1,2)}
        t.wait_for_maintenance()  # installed (background)
        t.add_message(2, 2, 500)
        clock.now = 100
        assert t.get_scheduled_messages(1) == [(1, 1)]  # delivered from bucket [1, 1]
        assert t.add_message(1, 1, 1000)  # the same position again, due much later
        t.add_message(3, 1, 600)  # seals ledger 2; two buckets > max 1: they are merged
        t.wait_for_maintenance()  # installed (background)
        assert t.stats()["merge"]["succeeded"] == 1
        clock.now = 999
        got = t.get_scheduled_messages(10)
        assert (1, 1) not in got and got == [(1, 2), (2, 1), (2, 2), (3, 1)]
        clock.now = 1000
        assert t.get_scheduled_messages(10) == [(1, 1)]


def test_readded_with_the_same_time_as_a_stale_row_seals_and_delivers_once(make_tracker):
    """Expire a position, then add it again with its old time: two equal rows now exist (the
    stale one and the new one); a seal or merge must keep one, and delivery gives it once."""
    clock = FakeClock(20)
    t = make_tracker(TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2, max_indexes_per_segment=2,
                                   max_num_buckets=1), clock)
    for entry in range(3):
        t.add_message(1, entry, 500 + entry)
    for _ in range(2):
        assert not t.add_message(1, 0, 10)  # expired: untracked
        assert t.add_message(1, 0, 500)  # back, with its old time
    t.add_message(2, 0, 600)  # rolls: seals ledger 1
    for entry in range(3):
        t.add_message(3, entry, 700)
    t.add_message(4, 0, 800)  # seals ledger 3; two buckets > 1: merged
    clock.now = 10**6
    got = t.get_scheduled_messages(100)
    assert got == [(1, 0), (1, 1), (1, 2), (2, 0), (3, 0), (3, 1), (3, 2), (4, 0)]
