"""``tracker.last_delivery_time()``: how far ahead the backlog reaches, on every tracker.

Checked against a model of what is tracked: None exactly when nothing is; never
before the latest tracked time (an upper bound); exact while indexes leave only
by delivery (TimeBucketTracker: always, on its bucket grid); through seals, a
reopen (sealed buckets from their summaries, the journal replayed) and the
read-only view.
"""

from __future__ import annotations

import random

import pytest

import bucketstore
from bucketstore import InMemoryTracker, TimeBucketTracker, TrackerConfig
from helpers import SMALL, FakeClock

STEPS = 400


class Model:
    def __init__(self) -> None:
        self.times: dict[tuple[int, int], int] = {}
        self.exact = True  # no index left otherwise than by delivery since the model was last empty

    def latest(self) -> int | None:
        return max(self.times.values(), default=None)


def _drive(tracker, clock: FakeClock, seed: int, *, grid: int = 0, reopen=None) -> None:
    """Random adds, deliveries, re-adds and mark-deletes, checking last_delivery_time after each."""
    rng = random.Random(seed)
    model = Model()
    ledger, entry = 1, 0
    for step in range(STEPS):
        op = rng.random()
        if op < 0.6:
            entry += 1
            if rng.random() < 0.1:
                ledger, entry = ledger + 1, 0
            at = clock() + rng.randint(1, 20_000)
            if not model.times:
                model.exact = True
            if tracker.add_message(ledger, entry, at):
                model.times.setdefault((ledger, entry), at)
        elif op < 0.85:
            clock.advance(rng.randint(0, 3_000))
            for pos in tracker.get_scheduled_messages(rng.randint(1, 50)):
                del model.times[pos]
            tracker.confirm_delivered()  # else a reopen delivers them again (at-least-once)
        elif op < 0.93 and model.times:  # a re-add already due: the position leaves untracked
            pos = rng.choice(sorted(model.times))
            assert not tracker.add_message(*pos, clock() - 1)
            del model.times[pos]
            model.exact = False
        elif model.times:
            pos = rng.choice(sorted(model.times))
            tracker.mark_delete(*pos)
            for p in [p for p in model.times if p <= pos]:
                del model.times[p]
            model.exact = False
        if reopen is not None and step % 97 == 96:
            tracker = reopen(tracker)
        _check(tracker, model, grid)


def _check(tracker, model: Model, grid: int) -> None:
    last = tracker.last_delivery_time()
    latest = model.latest()
    if latest is None:
        assert last is None
        return
    if grid:
        latest = latest >> grid << grid  # the start of its time bucket, as next_delivery_time gives
    assert last is not None and last >= latest, (last, latest)
    assert tracker.next_delivery_time() <= last
    if model.exact:
        assert last == latest, (last, latest)


@pytest.mark.parametrize("seed", [1, 2])
def test_in_memory_tracker(seed) -> None:
    clock = FakeClock(1_000_000)
    _drive(InMemoryTracker(SMALL, clock), clock, seed)


@pytest.mark.parametrize("bits", [0, 6])
def test_time_bucket_tracker_is_exact(bits) -> None:
    clock = FakeClock(1_000_000)
    tracker = TimeBucketTracker(TrackerConfig(tick_time_ms=0, precision_bits=bits), clock)
    rng = random.Random(bits)
    model: dict[tuple[int, int], int] = {}
    for entry in range(300):
        at = clock() + rng.randint(1, 20_000)
        if tracker.add_message(1, entry, at):
            model.setdefault((1, entry), at)
        if entry % 3 == 0:
            clock.advance(rng.randint(0, 2_000))
            for pos in tracker.get_scheduled_messages(20):
                del model[pos]
        if entry % 50 == 49:
            tracker.mark_delete(1, entry - 10)
            model = {p: t for p, t in model.items() if p > (1, entry - 10)}
        latest = max(model.values(), default=None)
        assert tracker.last_delivery_time() == (None if latest is None else latest >> bits << bits)


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_bucket_tracker_through_seals(tmp_path, durability) -> None:
    clock = FakeClock(1_000_000)
    with bucketstore.open(tmp_path / "s", durability) as store:
        _drive(store.tracker("t", SMALL, clock), clock, 3)


def test_bucket_tracker_through_reopens_and_the_read_only_view(tmp_path) -> None:
    """Reopened, the sealed buckets count from their catalog summaries (no file is read) and the
    journal's indexes from its replay; the read-only view gives the writer's answer."""
    clock = FakeClock(1_000_000)
    path = tmp_path / "s"
    stores = [bucketstore.open(path, "journal")]

    def reopen(tracker):
        before = tracker.last_delivery_time()
        stores[-1].close()
        stores.append(bucketstore.open(path, "journal"))
        tracker = stores[-1].tracker("t", SMALL, clock)
        unopened = tracker.stats()["unopened_buckets"]
        assert tracker.last_delivery_time() == before
        assert tracker.stats()["unopened_buckets"] == unopened  # answered without opening a bucket
        with bucketstore.open(path, read_only=True) as view:
            assert view.tracker("t", clock=clock).last_delivery_time() == before
        return tracker

    try:
        _drive(stores[0].tracker("t", SMALL, clock), clock, 4, reopen=reopen)
    finally:
        stores[-1].close()


def test_a_reopened_tracker_reaches_as_far_as_its_sealed_buckets(tmp_path) -> None:
    clock = FakeClock(1_000_000)
    path = tmp_path / "s"
    with bucketstore.open(path, "sealed") as store:
        t = store.tracker("t", SMALL, clock)
        t.add_messages([(ledger, e, 2_000_000 + 1000 * ledger + e) for ledger in range(4) for e in range(12)])
        t.add_message(9, 0, 1_500_000)  # roll: the four ledgers are sealed
        t.wait_for_maintenance()
        assert t.stats()["immutable_buckets"] >= 1
    with bucketstore.open(path, "sealed") as store:
        t = store.tracker("t", SMALL, clock)  # sealed mode: the unsealed row is the embedder's to replay
        assert t.last_delivery_time() == 2_000_000 + 3000 + 11
        assert t.stats()["unopened_buckets"] >= 1
