"""NackTracker: independent redelivery times per message id, against a dict model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bucketstore.memory.nack import MessageId, NackTracker


class Clock:
    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_messages_of_one_entry_keep_independent_times() -> None:
    """PIP-393's interference case: a second nack of the same entry must not move the first."""
    clock = Clock(0)
    nacks = NackTracker(precision_bits=0, clock=clock)
    nacks.add(3, 9, 10_000, batch_index=0)
    nacks.add(3, 9, 20_000, batch_index=1)
    # A tracker keyed by (ledger, entry) would now hold one time, 20 s, for both.
    clock.now = 10_000
    assert nacks.pop_due() == [MessageId(3, 9, 0, -1)]
    assert len(nacks) == 1
    clock.now = 19_999
    assert nacks.pop_due() == []
    clock.now = 20_000
    assert nacks.pop_due() == [MessageId(3, 9, 1, -1)]


def test_re_adding_replaces_only_that_message() -> None:
    clock = Clock(0)
    nacks = NackTracker(precision_bits=0, clock=clock)
    assert nacks.add(1, 1, 5_000, batch_index=0)
    assert nacks.add(1, 1, 6_000, batch_index=1)
    assert not nacks.add(1, 1, 9_000, batch_index=0)  # replaced, not duplicated
    assert len(nacks) == 2
    assert nacks.next_redelivery_time() == 6_000
    clock.now = 6_000
    assert nacks.pop_due() == [MessageId(1, 1, 1, -1)]
    clock.now = 9_000
    assert nacks.pop_due() == [MessageId(1, 1, 0, -1)]


def test_precision_early_never_late() -> None:
    clock = Clock(0)
    nacks = NackTracker(clock=clock)  # default 8 bits: 256 ms buckets
    nacks.add(1, 1, 511)
    clock.now = 255
    assert nacks.pop_due() == []
    clock.now = 256  # 255 ms early: the most allowed
    assert nacks.pop_due() == [MessageId(1, 1)]


def test_partitions_wide_entries_and_order() -> None:
    clock = Clock(0)
    nacks = NackTracker(precision_bits=0, clock=clock)
    nacks.add(1, (1 << 40) + 3, 30, batch_index=2, partition=4)
    nacks.add(1, 3, 20, partition=4)
    nacks.add(2, 3, 10, batch_index=5, partition=0)
    nacks.add(1, 3, 20, partition=-1)
    clock.now = 100
    assert nacks.pop_due(3) == [MessageId(2, 3, 5, 0), MessageId(1, 3, -1, -1), MessageId(1, 3, -1, 4)]
    assert nacks.pop_due() == [MessageId(1, (1 << 40) + 3, 2, 4)]
    nacks._check()
    assert len(nacks) == 0 and nacks.next_redelivery_time() is None


def test_remove_clear_memory_and_errors() -> None:
    nacks = NackTracker(clock=Clock(0))
    for entry in range(1000):
        nacks.add(7, entry, 60_000)
    assert nacks.memory_bytes() > 0
    assert nacks.remove(7, 5) and not nacks.remove(7, 5) and not nacks.remove(8, 5)
    assert len(nacks) == 999
    nacks.clear()
    assert len(nacks) == 0 and nacks.memory_bytes() == 0
    with pytest.raises(ValueError):
        nacks.add(1, 1, 10, batch_index=-2)
    with pytest.raises(ValueError):
        nacks.add(1, 1, -10)
    with pytest.raises(TypeError):
        nacks.add(1, 1, 10, partition=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        nacks.pop_due(-1)
    with pytest.raises(ValueError):
        NackTracker(precision_bits=64)
    assert len(nacks) == 0


ids = st.builds(MessageId, st.integers(0, 3), st.one_of(st.integers(0, 5), st.just((1 << 33) + 1)),
                st.integers(-1, 2), st.integers(-1, 1))


class NackModel(RuleBasedStateMachine):
    """The tracker must behave as a dict message id -> redelivery time."""

    @initialize(bits=st.sampled_from([0, 2, 8]))
    def setup(self, bits: int) -> None:
        self.bits = bits
        self.clock = Clock(0)
        self.nacks = NackTracker(bits, self.clock)
        self.model: dict[MessageId, int] = {}

    @rule(mid=ids, at=st.integers(0, 2000))
    def add(self, mid: MessageId, at: int) -> None:
        assert self.nacks.add(mid.ledger_id, mid.entry_id, at, mid.batch_index, mid.partition) == \
            (mid not in self.model)
        self.model[mid] = at

    @rule(mid=ids)
    def remove(self, mid: MessageId) -> None:
        assert self.nacks.remove(*mid) == (mid in self.model)
        self.model.pop(mid, None)

    @rule(now=st.integers(0, 2000), limit=st.one_of(st.none(), st.integers(0, 6)))
    def pop_due(self, now: int, limit: int | None) -> None:
        self.clock.now = now
        start = lambda at: (at >> self.bits) << self.bits  # noqa: E731
        due = {mid for mid, at in self.model.items() if start(at) <= now}
        popped = self.nacks.pop_due(limit)
        assert len(popped) == len(set(popped)) == (len(due) if limit is None else min(limit, len(due)))
        assert set(popped) <= due
        popped_starts = [start(self.model[mid]) for mid in popped]
        left_starts = [start(self.model[mid]) for mid in due - set(popped)]
        # Earliest buckets go first: nothing left behind is due before something popped.
        if popped_starts and left_starts:
            assert max(popped_starts) <= min(left_starts)
        for mid in popped:
            at = self.model.pop(mid)
            assert at - now < (1 << self.bits), "redelivered more than 2**bits - 1 ms early"

    @invariant()
    def consistent(self) -> None:
        self.nacks._check()
        assert len(self.nacks) == len(self.model)


TestNackModel = NackModel.TestCase
TestNackModel.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_docstring_examples() -> None:
    import doctest

    import bucketstore.memory.nack

    assert doctest.testmod(bucketstore.memory.nack).failed == 0
