"""A mark-delete over part of a batch not yet confirmed: the acknowledged positions never come back.

Found by the topic crash-point enumeration (``tests/crash/test_topic_crash_points.py``): a
subscription's ``mark_delete`` left the acknowledged rows in its unconfirmed batch, so a restart
(a kill, or a clean close, which confirms nothing) delivered them again: ``contains_message``
said yes to acknowledged positions and the count held them; the delivery then skipped them
without counting them off, so the count stayed above zero forever with nothing to deliver.
A tracker drops acknowledged positions from its unconfirmed batches (``Model.mark_delete``).
"""

from __future__ import annotations

from pathlib import Path

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.topics.subscription_state import SubscriptionState

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=0)


def test_acknowledged_part_of_an_unconfirmed_batch_is_not_delivered_again(tmp_path: Path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="journal") as store:
        sub = store.topic("t", config=CONFIG, clock=clock).subscription("a")
        sub.add_messages([(1, 1, 1_005), (1, 2, 1_005), (1, 3, 1_005)])
        clock.advance(10)
        assert sub.get_scheduled_messages(10) == [(1, 1), (1, 2), (1, 3)]
        sub.mark_delete(1, 2)  # acknowledges two of the three, none confirmed
        assert sub.stats()["unconfirmed"] == 1  # the record keeps only what may come back
    with bucketstore.open(tmp_path, durability="journal") as store:
        sub = store.topic("t", config=CONFIG, clock=clock).subscription("a")
        assert sub.number_of_delayed_messages == 1
        assert [sub.contains_message(1, e) for e in (1, 2, 3)] == [False, False, True]
        assert sub.get_scheduled_messages(10) == [(1, 3)]
        assert sub.number_of_delayed_messages == 0 and sub.next_delivery_time() is None


def test_a_record_written_before_the_fix_drops_its_acknowledged_unconfirmed_rows() -> None:
    # Such a record holds the acknowledged rows in its unconfirmed batch; its count does not.
    old = SubscriptionState("a", frontier=(1_005, 1, 3, 2), mark_delete=(1, 2), count_base=0,
                            unconfirmed=[(1_005, 1, 1, 0), (1_005, 1, 2, 1), (1_005, 1, 3, 2)])
    state = SubscriptionState.decode("a", old.encode())
    assert state.redeliver == [(1_005, 1, 3, 2)] and state.count(0) == 1
