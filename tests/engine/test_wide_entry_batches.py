"""A batch that re-adds a tracked position of a ledger beside an entry id beyond 2**32.

Found by a random program of public calls with ids at the edges of 32 and 64 bits: a ledger whose
tracked entries all fit 32 bits keeps a 32-bit bitmap; ``add_messages`` of a batch of that
ledger holding a tracked entry and one >= 2**32 asked the index which rows were tracked by ANDing
the 32-bit bitmap with a 64-bit one, and pyroaring raised a bare ``TypeError``.
"""

from __future__ import annotations

import pytest

import bucketstore
from bucketstore import TrackerConfig

from helpers import FakeClock

WIDE = 2**40


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_a_batch_beside_a_tracked_narrow_entry(tmp_path, durability) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", durability, background=False) as store:
        tracker = store.tracker("t", TrackerConfig(tick_time_ms=0), clock=clock)
        assert tracker.add_message(5, 1, 5_000)
        assert tracker.add_messages([(5, 1, 6_000), (5, WIDE, 6_000)]) == 2  # a re-add and a new one
        assert tracker.add_messages([(5, WIDE, 7_000), (5, WIDE + 1, 7_000), (5, 2, 7_000)]) == 3
        assert tracker.number_of_delayed_messages == 4
        assert all(tracker.contains_message(5, e) for e in (1, 2, WIDE, WIDE + 1))
        clock.advance(10_000)
        # The first time of a position wins: (5, 1) at 5000, (5, WIDE) at 6000.
        assert tracker.get_scheduled_messages(1) == [(5, 1)]
        assert tracker.get_scheduled_messages(1) == [(5, WIDE)]
        assert sorted(tracker.get_scheduled_messages(10)) == [(5, 2), (5, WIDE + 1)]
