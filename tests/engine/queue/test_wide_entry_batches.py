"""Entry ids beyond 2**32 in a ledger whose tracked entries all fit 32 bits (a 32-bit bitmap).

Found by random programs of public calls (and SIGKILLed writers) with ids at the edges of 32 and
64 bits:

* ``add_messages`` of a batch of such a ledger holding a tracked entry and one >= 2**32 ANDed
  the 32-bit bitmap with a 64-bit one: pyroaring raised a bare ``TypeError``;
* a delivery judged a queued row of a wide entry no longer tracked (untracked by a due re-add)
  live whenever every narrow entry of its ledger was: it was delivered again (a phantom), the
  count went below zero (``ValueError: __len__() should return >= 0``) and the next change of
  that ledger raised ``TypeError``;
* putting a 64-bit bitmap holding only narrow ids into such a ledger (a bucket's positions
  opened or paged in) raised ``TypeError``.
"""

from __future__ import annotations

import pytest
from pyroaring import BitMap64

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.queue.index_set import DelayedIndexSet

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


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_an_untracked_wide_entry_is_not_delivered_again(tmp_path, durability) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", durability, background=False) as store:
        tracker = store.tracker("t", TrackerConfig(tick_time_ms=0), clock=clock)
        assert tracker.add_message(5, WIDE, 5_000)
        assert not tracker.add_message(5, WIDE, 900)  # due: untracked, its queued row is stale
        assert tracker.add_message(5, 1, 6_000)  # the ledger's only entry now fits 32 bits
        clock.advance(10_000)
        assert tracker.get_scheduled_messages(10) == [(5, 1)]
        assert tracker.number_of_delayed_messages == 0
        assert tracker.add_message(5, 2, 20_000) and tracker.number_of_delayed_messages == 1


def test_a_wide_bitmap_of_narrow_ids_joins_a_narrow_ledger() -> None:
    index = DelayedIndexSet()
    index.add(1, 5)
    assert index.add_bitmap(1, BitMap64([7, 8])) == 2
    assert len(index) == 3 and index.contains(1, 7) and not index.contains(1, WIDE)
    assert index.add_bitmap(1, BitMap64([WIDE])) == 1 and index.contains(1, WIDE)
