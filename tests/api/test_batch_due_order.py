"""A batch holding a live and a due row of one position ends as ``add_message`` row by row would.

Found by a random program of public calls checked against ``InMemoryTracker``: in one ledger's
run of ``add_messages``, a due row untracked its position only when it came first; a live row
followed by a due row of the same position (the embedder says "deliver later", then "it is due
now") stayed tracked, and was delivered again later, while ``add_message`` row by row, the
in-memory trackers and a topic's subscription untrack it. Both orders are checked, with the
row between rows of other positions, in both durability modes, and across a reopen.
"""

from __future__ import annotations

import pytest

import bucketstore
from bucketstore import InMemoryTracker, TrackerConfig

from helpers import FakeClock

NOW = 10_000
LATER, DUE = NOW + 5_000, NOW - 5
BATCHES = {
    "live-then-due": [(2, 4, LATER), (2, 4, DUE)],
    "live-twice-then-due": [(2, 4, LATER), (2, 4, LATER + 1), (2, 4, DUE)],
    "due-then-live": [(2, 4, DUE), (2, 4, LATER)],
    "live-due-live": [(2, 4, LATER), (2, 5, LATER), (2, 4, DUE), (2, 6, LATER), (2, 4, LATER + 7)],
    "others-between": [(2, 1, LATER), (2, 4, LATER), (2, 2, DUE), (2, 3, LATER), (2, 4, DUE), (2, 5, LATER)],
}


def _state(tracker) -> tuple[int, list[tuple[int, int]]]:
    return tracker.number_of_delayed_messages, [(2, e) for e in range(8) if tracker.contains_message(2, e)]


@pytest.mark.parametrize("durability", ["journal", "sealed"])
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_a_batch_ends_as_row_by_row(tmp_path, durability, name) -> None:
    rows = BATCHES[name]
    config = TrackerConfig(tick_time_ms=0)
    clock = FakeClock(NOW)
    model = InMemoryTracker(config, clock)
    expected = sum(model.add_message(*r) for r in rows)
    with bucketstore.open(tmp_path / "s", durability, background=False) as store:
        tracker = store.tracker("t", config, clock=clock)
        assert tracker.add_messages(rows) == expected
        assert _state(tracker) == _state(model)
        one_by_one = store.tracker("u", config, clock=clock)
        assert sum(one_by_one.add_message(*r) for r in rows) == expected
        assert _state(one_by_one) == _state(model)
        tracker.flush()  # sealed mode: what the mutable bucket holds is lost at close otherwise
    if durability == "journal":
        with bucketstore.open(tmp_path / "s", durability) as store:
            assert _state(store.tracker("t", config, clock=clock)) == _state(model)
    clock.advance(10**6)
    # Nothing else is delivered: the untracked position does not come back later.
    if durability == "journal":
        with bucketstore.open(tmp_path / "s", durability) as store:
            assert store.tracker("t", config, clock=clock).get_scheduled_messages(100) == \
                model.get_scheduled_messages(100)
