"""A position of a batch not confirmed that is re-added: delivered once after a restart, as a tracker does.

A lone journal-mode tracker *supersedes* a delivered position re-added before its batch is
durably confirmed (``engine/durability/handoff.py``): its new time replaces its redelivery. After
a restart, a position waiting to be delivered again is tracked at its old time, so a re-add of it
is ignored (an add already due untracks it). A subscription used to deliver such a position
twice, at its old time from the unconfirmed batch and at its new one from the re-added row, and
count it twice until then. Each case here runs on a subscription of a topic (alone; beside one
that still tracks the first row, so the re-add makes a position with two rows; or beside one that
delivered and confirmed it, so the re-add after the restart is a new row for that one only) and
on a lone tracker, restarted by a clean close or by a kill, and holds the subscription to the
tracker's answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.testing.faults import abandon_store

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=0)
# Every call written before it returns (a delivery too), so that a kill keeps the unconfirmed batch.
POSITIONS = [(1, e) for e in range(1, 5)]


class Side:
    """A lone tracker, or subscription ``a`` of a topic, with ``b`` beside it unless ``others``
    is ``"alone"``: ``b`` never delivers (``"tracking"``) or delivers with ``a`` (``"delivered"``)."""

    def __init__(self, path: Path, kind: str, others: str) -> None:
        self.path, self.kind, self.others = path, kind, others
        self.clock = FakeClock(1_000)
        self.open()

    def open(self) -> None:
        self.store = bucketstore.open(self.path, durability="journal", sync_interval_ms=0, confirm_sync_ms=0)
        if self.kind == "tracker":
            self.it: Any = self.store.tracker("a", CONFIG, self.clock)
        else:
            topic = self.store.topic("t", config=CONFIG, clock=self.clock)
            self.it = topic.subscription("a")
            if self.others != "alone":
                self.b = topic.subscription("b")

    def delivered(self) -> None:
        """After ``a``'s batch: ``b`` takes and confirms the same one."""
        if self.kind == "topic" and self.others == "delivered":
            self.b.get_scheduled_messages(10)
            self.b.confirm_delivered()

    def restart(self, how: str) -> None:
        if how == "close":
            self.store.close()  # confirms nothing: the batch comes back
        else:
            abandon_store(self.store)  # a kill
        self.open()

    def look(self) -> tuple:
        return (self.it.number_of_delayed_messages, [self.it.contains_message(*p) for p in POSITIONS],
                self.it.next_delivery_time())

    def drain(self) -> list[list[tuple[int, int]]]:
        """Batches at the clock now, then later and later: what is delivered, and when."""
        out = []
        for step in (0, 50, 200, 1_000):
            self.clock.advance(step)
            out.append(self.it.get_scheduled_messages(100))
        assert self.it.number_of_delayed_messages == 0
        return out


def _script(side: Side, case: str, how: str) -> list[Any]:
    seen: list[Any] = []
    side.it.add_messages([(1, 1, 1_005), (1, 2, 1_005), (1, 3, 1_050)])
    side.clock.advance(10)
    seen.append(side.it.get_scheduled_messages(10))  # (1, 1) and (1, 2), not confirmed
    side.delivered()
    if case == "before":  # re-added before the restart: its new time replaces its redelivery
        seen.append(side.it.add_message(1, 1, 1_100))
        seen.append(side.look())
    side.restart(how)
    seen.append(side.look())
    if case == "after":  # waiting to be delivered again: tracked at its old time
        seen.append(side.it.add_message(1, 1, 1_100))
    elif case == "due-after":  # an add already due untracks it
        seen.append(side.it.add_message(1, 1, 1_000))
    seen.append(side.look())
    seen.append(side.drain())
    return seen


@pytest.mark.parametrize("others", ["alone", "tracking", "delivered"])
@pytest.mark.parametrize("how", ["close", "kill"])
@pytest.mark.parametrize("case", ["before", "after", "due-after"])
def test_a_readded_unconfirmed_position_is_delivered_as_a_tracker_delivers_it(
        tmp_path: Path, case: str, how: str, others: str) -> None:
    tracker = Side(tmp_path / "tracker", "tracker", "alone")
    topic = Side(tmp_path / "topic", "topic", others)
    try:
        expected, got = _script(tracker, case, how), _script(topic, case, how)
    finally:
        tracker.store.close()
        topic.store.close()
    assert got == expected
    delivered = [p for batch in expected[-1] for p in batch]
    assert sorted(delivered) == sorted(set(delivered))  # once each, here: the point of the case


def test_the_readded_position_comes_at_its_new_time(tmp_path: Path) -> None:
    """The tracker's answer, spelled out: re-added before the restart, (1, 1) comes at 1_100."""
    side = Side(tmp_path, "topic", "tracking")
    try:
        batches = _script(side, "before", "kill")[-1]
    finally:
        side.store.close()
    assert batches == [[(1, 2)], [(1, 3)], [(1, 1)], []]
