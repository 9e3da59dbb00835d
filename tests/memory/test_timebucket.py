"""TimeBucketIndex and TimeBucketTracker against simple models."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pyroaring import BitMap, BitMap64

from bucketstore.errors import StoreClosedError
from bucketstore.config import TrackerConfig
from bucketstore.memory.timebucket import OPTIMIZE_EVERY, TimeBucketIndex
from bucketstore.memory.timebucket_tracker import TimeBucketTracker

WIDE = 1 << 32

timestamps = st.integers(0, 5000)
ledgers = st.integers(0, 4)
# Mostly small entries, sometimes ones that need a 64-bit bitmap.
entries = st.one_of(st.integers(0, 40), st.integers(WIDE - 2, WIDE + 2), st.just((1 << 64) - 1))


class IndexModel(RuleBasedStateMachine):
    """The index must behave as a dict position -> timestamp, popped in trimmed order."""

    @initialize(bits=st.sampled_from([0, 1, 3, 8]))
    def setup(self, bits: int) -> None:
        self.bits = bits
        self.index = TimeBucketIndex(bits)
        self.model: dict[tuple[int, int], int] = {}

    @rule(ts=timestamps, ledger=ledgers, entry=entries)
    def add(self, ts: int, ledger: int, entry: int) -> None:
        added = self.index.add(ts, ledger, entry)
        assert added == ((ledger, entry) not in self.model)
        self.model.setdefault((ledger, entry), ts)

    @rule(ledger=ledgers, entry=entries)
    def remove(self, ledger: int, entry: int) -> None:
        assert self.index.remove(ledger, entry) == ((ledger, entry) in self.model)
        self.model.pop((ledger, entry), None)

    @rule(ledger=ledgers, entry=entries)
    def contains(self, ledger: int, entry: int) -> None:
        assert self.index.contains(ledger, entry) == ((ledger, entry) in self.model)

    @rule(ledger=ledgers, entry=entries)
    def remove_through(self, ledger: int, entry: int) -> None:
        gone = [pos for pos in self.model if pos <= (ledger, entry)]
        assert self.index.remove_through(ledger, entry) == len(gone)
        for pos in gone:
            del self.model[pos]

    @rule(cutoff=timestamps, limit=st.one_of(st.none(), st.integers(0, 30)))
    def pop_due(self, cutoff: int, limit: int | None) -> None:
        order = sorted((ts >> self.bits, ledger, entry) for (ledger, entry), ts in self.model.items()
                       if ts >> self.bits <= cutoff >> self.bits)
        expected = [(ledger, entry) for _, ledger, entry in order][:limit]
        assert self.index.pop_due(cutoff, limit) == expected
        for pos in expected:
            del self.model[pos]

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model.clear()

    @invariant()
    def consistent(self) -> None:
        self.index._check()
        assert len(self.index) == len(self.model)
        if self.model:
            earliest = min(self.model.values())
            assert self.index.next_timestamp() == (earliest >> self.bits) << self.bits
        else:
            assert self.index.next_timestamp() is None


TestIndexModel = IndexModel.TestCase
TestIndexModel.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)


@given(bits=st.integers(0, 16), stamps=st.lists(st.integers(0, 1 << 40), min_size=1, max_size=30),
       cutoff=st.integers(0, 1 << 40))
def test_never_late_and_at_most_2_pow_bits_minus_1_early(bits: int, stamps: list[int], cutoff: int) -> None:
    index = TimeBucketIndex(bits)
    for entry, ts in enumerate(stamps):
        index.add(ts, 1, entry)
    popped = {entry for _, entry in index.pop_due(cutoff)}
    for entry, ts in enumerate(stamps):
        if ts <= cutoff:
            assert entry in popped, "an index due at the cutoff was held back (late)"
        if entry in popped:
            assert ts - cutoff <= (1 << bits) - 1, "an index came out more than 2**bits - 1 ms early"


def test_bucket_edges_for_ten_bits() -> None:
    index = TimeBucketIndex(10)
    index.add(2047, 1, 1)  # last millisecond of bucket 1 (1024..2047)
    index.add(2048, 1, 2)  # first millisecond of bucket 2
    assert index.pop_due(1023) == []
    assert index.pop_due(1024) == [(1, 1)]  # 1023 ms early: the allowed maximum
    assert index.pop_due(2047) == []
    assert index.pop_due(2048) == [(1, 2)]


def test_precision_zero_is_exact() -> None:
    index = TimeBucketIndex(0)
    index.add(1_700_000_000_001, 3, 0)
    assert index.pop_due(1_700_000_000_000) == []
    assert index.next_timestamp() == 1_700_000_000_001
    assert index.pop_due(1_700_000_000_001) == [(3, 0)]


def test_order_is_trimmed_time_then_ledger_then_entry() -> None:
    index = TimeBucketIndex(4)
    index.add(20, 9, 1)
    index.add(17, 9, 0)
    index.add(31, 2, 5)
    index.add(5, 7, 3)
    assert index.pop_due(100) == [(7, 3), (2, 5), (9, 0), (9, 1)]


def test_max_items_splits_a_bitmap_and_keeps_the_rest() -> None:
    index = TimeBucketIndex(3)
    for entry in range(10):
        index.add(8, 1, entry)
    assert index.pop_due(8, 4) == [(1, e) for e in range(4)]
    index._check()
    assert index.pop_due(8, 0) == []
    assert index.pop_due(8) == [(1, e) for e in range(4, 10)]
    assert len(index) == 0


def test_wide_entries_upgrade_to_bitmap64() -> None:
    index = TimeBucketIndex(0)
    index.add(10, 1, 5)
    assert isinstance(index._buckets[10][1], BitMap)
    assert index.add(10, 1, WIDE + 7)
    assert isinstance(index._buckets[10][1], BitMap64)
    index.add(11, 1, 6)
    index._check()
    assert index.pop_due(11) == [(1, 5), (1, WIDE + 7), (1, 6)]


def test_consecutive_entries_are_run_optimized() -> None:
    index = TimeBucketIndex(20)
    for entry in range(4 * OPTIMIZE_EVERY):
        index.add(1000, 1, entry)
    stats = index._buckets[0][1].get_statistics()
    assert stats["n_run_containers"] == 1 and stats["n_bytes_run_containers"] < 16
    index._check()


def test_memory_estimate_tracks_the_bitmaps() -> None:
    index = TimeBucketIndex(10)
    assert index.memory_bytes() == 0
    for entry in range(3000):
        index.add(entry * 997 % 10_000_000, 1, entry)  # scattered: many small bitmaps
    scattered = index.memory_bytes()
    assert scattered > 3000 * 2  # at least the array-container payload
    index.clear()
    for entry in range(3000):
        index.add(5000, 1, entry)
    assert index.memory_bytes() < scattered / 10


@pytest.mark.parametrize("args, error", [
    ((-1, 1, 1), ValueError), ((1, -1, 1), ValueError), ((1, 1, -1), ValueError),
    ((1, 1, 1 << 64), ValueError), ((1.5, 1, 1), TypeError), ((1, "1", 1), TypeError),
    ((1, 1, True), TypeError),
])
def test_bad_arguments(args: tuple, error: type) -> None:
    index = TimeBucketIndex(0)
    with pytest.raises(error):
        index.add(*args)
    assert len(index) == 0
    index._check()


def test_bad_precision_and_limits() -> None:
    with pytest.raises(ValueError):
        TimeBucketIndex(64)
    with pytest.raises(TypeError):
        TimeBucketIndex(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TimeBucketIndex(0).pop_due(5, -1)
    with pytest.raises(ValueError):
        TimeBucketIndex(0).pop_due(-5)


# -- the tracker ---------------------------------------------------------------------------------

class FakeClock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


Config = TrackerConfig


def test_tracker_pulsar_shared_scenario() -> None:
    clock = FakeClock(0)
    tracker = TimeBucketTracker(Config(tick_time_ms=1), clock)
    for ledger, entry, at in [(1, 2, 20), (2, 1, 10), (3, 3, 30), (4, 5, 50), (5, 4, 40)]:
        assert tracker.add_message(ledger, entry, at)
    assert tracker.number_of_delayed_messages == 5
    assert not tracker.has_message_available()
    assert tracker.next_delivery_time() == 10
    clock.now = 15
    assert not tracker.add_message(6, 6, 10)  # already due
    assert tracker.has_message_available()
    assert tracker.get_scheduled_messages(10) == [(2, 1)]
    clock.now = 60
    assert tracker.get_scheduled_messages(1) == [(1, 2)]
    assert tracker.get_scheduled_messages(3) == [(3, 3), (4, 5), (5, 4)]
    assert tracker.number_of_delayed_messages == 0


def test_tracker_tick_and_strict_refusals() -> None:
    tracker = TimeBucketTracker(Config(tick_time_ms=100), FakeClock(0))
    assert [tracker.add_message(1, e, at) for e, at in enumerate([10, 99, 100, 101, 200])] == \
        [False, False, False, True, True]
    strict = TimeBucketTracker(Config(deliver_at_time_strict=True), FakeClock(10))
    assert [strict.add_message(1, e, at) for e, at in enumerate([9, 10, 11])] == [False, False, True]
    assert strict.number_of_delayed_messages == 1 and not strict.has_message_available()
    assert not strict.add_message(1, 9, -5)


def test_tracker_due_re_add_untracks_and_tracked_re_add_is_true() -> None:
    clock = FakeClock(0)
    tracker = TimeBucketTracker(Config(tick_time_ms=0), clock)
    assert tracker.add_message(1, 1, 100)
    assert tracker.add_message(1, 1, 500)  # already tracked: keeps 100
    assert tracker.next_delivery_time() == 100
    clock.now = 50
    assert not tracker.add_message(1, 1, 20)  # due now: the caller dispatches it
    assert not tracker.contains_message(1, 1)
    assert tracker.number_of_delayed_messages == 0


def test_tracker_cutoff_never_moves_backwards() -> None:
    clock = FakeClock(1000)
    tracker = TimeBucketTracker(Config(tick_time_ms=0), clock)
    tracker.add_message(1, 1, 1500)
    tracker.has_message_available()
    clock.now = 2000
    assert tracker.has_message_available()
    clock.now = 100  # the clock jumps back
    assert tracker.has_message_available()
    assert not tracker.add_message(1, 2, 1999)
    assert tracker.get_scheduled_messages(5) == [(1, 1)]


def test_tracker_precision_bits_deliver_early_not_late() -> None:
    clock = FakeClock(0)
    tracker = TimeBucketTracker(Config(tick_time_ms=0, precision_bits=10), clock)
    tracker.add_message(1, 1, 2047)
    assert tracker.next_delivery_time() == 1024
    clock.now = 1023
    assert tracker.get_scheduled_messages(10) == []
    clock.now = 1024
    assert tracker.get_scheduled_messages(10) == [(1, 1)]


def test_tracker_mark_delete_clear_stats_close() -> None:
    clock = FakeClock(0)
    with TimeBucketTracker(None, clock) as tracker:
        for ledger in range(3):
            for entry in range(4):
                tracker.add_message(ledger, entry, 10_000 + entry)
        tracker.mark_delete(1, 1)
        assert tracker.number_of_delayed_messages == 6
        assert not tracker.contains_message(1, 1) and tracker.contains_message(1, 2)
        stats = tracker.stats()
        assert stats["number_of_delayed_messages"] == 6 and stats["memory_bytes"] > 0
        assert stats["create"] == {"succeeded": 0, "failed": 0, "total": 0, "latency_ms": 0.0}
        tracker.flush()
        tracker.clear()
        assert tracker.number_of_delayed_messages == 0
    with pytest.raises(StoreClosedError):
        tracker.add_message(1, 1, 10**6)
    tracker.close()  # idempotent


def test_tracker_argument_errors() -> None:
    tracker = TimeBucketTracker(None, FakeClock(0))
    with pytest.raises(ValueError):
        tracker.get_scheduled_messages(-1)
    with pytest.raises(TypeError):
        tracker.add_message(1, 1, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tracker.add_message(-1, 1, 10**6)
    with pytest.raises(ValueError):
        TimeBucketTracker(Config(tick_time_ms=-1))


def test_docstring_examples() -> None:
    import doctest

    import bucketstore.memory.timebucket

    assert doctest.testmod(bucketstore.memory.timebucket).failed == 0
