"""``tracker.wait_scheduled``: blocking until positions are due, on every tracker type.

With a :class:`FakeClock` every step is deterministic: ``clock.wait_for_sleepers(n)`` returns
once ``n`` waiters have looked at the clock's current time and gone back to sleep, so "not
delivered yet" is proven by the waiter itself, never by a real delay. The real-clock tests
check the same promises against wall time (never early; an earlier add wakes the waiter).
"""

from __future__ import annotations

import threading
import time

import pytest

import bucketstore
from bucketstore import StoreClosedError, TrackerConfig
from bucketstore.cutoff import system_clock
from bucketstore.waiting import CancelToken
from helpers import SMALL, FakeClock

STRICT = TrackerConfig(tick_time_ms=0)


class Waiter(threading.Thread):
    """One thread blocked in ``wait_scheduled``; ``result`` is its batch or the error it raised."""

    def __init__(self, tracker, max_messages: int = 100, **kwargs) -> None:
        super().__init__(daemon=True)
        self.tracker, self.max_messages, self.kwargs = tracker, max_messages, kwargs
        self.result: object = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            self.result = self.tracker.wait_scheduled(self.max_messages, **self.kwargs)
        except BaseException as exc:  # handed to the test thread
            self.result = exc
        finally:
            self.done.set()

    def get(self) -> object:
        assert self.done.wait(60), "the waiter never returned"
        return self.result


def until(predicate, what: str) -> None:
    """Poll a condition the test cannot be notified of (bounded: a failure, never a hang)."""
    for _ in range(6000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture(params=["bucket-sealed", "bucket-journal", "memory", "timebucket"])
def make(request, tmp_path):
    stores = []

    def make(config=STRICT, clock=None):
        if request.param == "memory":
            return bucketstore.InMemoryTracker(config, clock)
        if request.param == "timebucket":
            return bucketstore.TimeBucketTracker(config, clock)
        s = bucketstore.open(tmp_path / f"s{len(stores)}", durability=request.param.split("-")[1])
        stores.append(s)
        return s.tracker("sub", config, clock)

    yield make
    for s in stores:
        s.close()


def test_wakes_exactly_when_the_fake_clock_reaches_the_index(make) -> None:
    clock = FakeClock(1_000)
    tracker = make(clock=clock)
    assert tracker.add_message(1, 1, 10_000) and tracker.add_message(1, 2, 10_000)
    assert tracker.add_message(2, 1, 20_000)
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    clock.now = 9_999
    clock.wait_for_sleepers(1)  # it looked at 9 999 and went back to sleep: nothing early
    assert not waiter.done.is_set()
    clock.now = 10_000
    assert waiter.get() == [(1, 1), (1, 2)]
    assert tracker.wait_scheduled(10, timeout=0) == []  # never twice
    assert tracker.number_of_delayed_messages == 1


def test_the_tick_makes_indexes_due_early_as_get_scheduled_messages_does(make) -> None:
    clock = FakeClock(0)
    tracker = make(TrackerConfig(tick_time_ms=100), clock)
    tracker.add_message(1, 1, 1_000)
    waiter = Waiter(tracker)
    clock.now = 899
    clock.wait_for_sleepers(1)
    clock.now = 900  # cutoff = now + tick = 1 000
    assert waiter.get() == [(1, 1)]


def test_an_earlier_add_wakes_the_waiter_and_is_delivered_first(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    tracker.add_message(5, 5, 100_000)
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    tracker.add_message(3, 3, 500)  # earlier than the 100 000 it sleeps towards
    until(lambda: tracker._due._targets == [500], "the waiter re-armed for the earlier index")
    clock.now = 499
    clock.wait_for_sleepers(1)
    assert not waiter.done.is_set()
    clock.now = 500
    assert waiter.get() == [(3, 3)]


def test_a_later_add_does_not_wake_the_waiter(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    tracker.add_message(1, 1, 1_000)
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    targets_before = list(tracker._due._targets)
    tracker.add_message(1, 2, 2_000)
    assert tracker._due._targets == targets_before == [1_000]
    clock.now = 2_000
    assert waiter.get() == [(1, 1), (1, 2)]


def test_timeout_is_measured_on_the_trackers_clock(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    waiter = Waiter(tracker, timeout=5)
    clock.wait_for_sleepers(1)
    clock.now = 4_999
    clock.wait_for_sleepers(1)
    assert not waiter.done.is_set()
    clock.now = 5_000
    assert waiter.get() == []


def test_close_wakes_the_waiter_with_store_closed_error(make) -> None:
    tracker = make(clock=FakeClock(0))
    tracker.add_message(1, 1, 1_000)
    clock = tracker._due._sleeper
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    tracker.close()
    assert isinstance(waiter.get(), StoreClosedError)
    with pytest.raises(StoreClosedError):
        tracker.wait_scheduled(1)


def test_clear_wakes_the_waiter_which_then_waits_for_new_adds(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    tracker.add_message(1, 1, 1_000)
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    tracker.clear()
    until(lambda: tracker._due._targets == [float("inf")], "the waiter saw the clear")
    clock.now = 1_000
    clock.wait_for_sleepers(1)
    assert not waiter.done.is_set()  # the cleared index is never delivered
    tracker.add_message(2, 2, 1_500)
    clock.now = 1_500
    assert waiter.get() == [(2, 2)]


def test_several_waiters_get_distinct_positions(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    for entry in range(10):
        tracker.add_message(1, entry, 1_000 + entry)
    waiters = [Waiter(tracker, 3) for _ in range(4)]
    clock.wait_for_sleepers(4)
    clock.now = 2_000
    batches = [w.get() for w in waiters]
    got = [p for b in batches for p in b]
    assert all(batches) and all(len(b) <= 3 for b in batches)
    assert sorted(got) == [(1, e) for e in range(10)] and len(set(got)) == 10


def test_a_cancelled_wait_returns_empty_and_loses_nothing(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock=clock)
    tracker.add_message(1, 1, 1_000)
    token = CancelToken()
    waiter = Waiter(tracker, cancel=token)
    clock.wait_for_sleepers(1)
    token.cancel()
    assert waiter.get() == []
    clock.now = 1_000
    assert tracker.wait_scheduled(5) == [(1, 1)]


def test_max_messages_zero_and_bad_arguments(make) -> None:
    tracker = make(clock=FakeClock(0))
    assert tracker.wait_scheduled(0) == []
    with pytest.raises(ValueError):
        tracker.wait_scheduled(1, timeout=-1)
    with pytest.raises(TypeError):
        tracker.wait_scheduled(1, timeout="1")
    with pytest.raises(ValueError):
        tracker.wait_scheduled(-1)


def test_real_clock_never_early_and_an_earlier_add_wakes(make) -> None:
    tracker = make()  # the system clock, strict
    far = system_clock() + 600_000
    tracker.add_message(9, 9, far)
    waiter = Waiter(tracker, timeout=120)
    until(lambda: tracker._due._targets, "the waiter is asleep")
    soon = system_clock() + 300
    assert tracker.add_message(1, 1, soon)
    assert waiter.get() == [(1, 1)]  # woken by the add: else [] after the 120 s timeout
    assert system_clock() >= soon  # never early
    assert tracker.wait_scheduled(10, timeout=0.05) == []


def test_delete_tracker_wakes_the_waiter(tmp_path) -> None:
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s") as store:
        tracker = store.tracker("sub", STRICT, clock)
        tracker.add_message(1, 1, 1_000)
        waiter = Waiter(tracker)
        clock.wait_for_sleepers(1)
        store.delete_tracker("sub")
        assert isinstance(waiter.get(), StoreClosedError)


@pytest.mark.parametrize("background", [True, False])
def test_waits_through_sealed_buckets_and_segment_loads(tmp_path, background: bool) -> None:
    """Indexes in sealed buckets (several segments each) come out in order, each at its time."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", background=background) as store:
        tracker = store.tracker("sub", SMALL, clock)
        times = {}
        for ledger in range(4):
            for entry in range(12):
                times[(ledger, entry)] = 1_000 + 37 * entry + ledger
                tracker.add_message(ledger, entry, times[(ledger, entry)])
        tracker.wait_for_maintenance()
        assert tracker.stats()["immutable_buckets"] >= 1
        delivered: list[tuple[int, int]] = []
        while len(delivered) < len(times):
            waiter = Waiter(tracker, 5)
            clock.wait_for_sleepers(1)
            clock.now = min(times[p] for p in times if p not in delivered)
            batch = waiter.get()
            assert batch and all(times[p] <= clock.now for p in batch)  # never early
            assert not set(batch) & set(delivered)  # never twice
            delivered += batch
        assert sorted(delivered) == sorted(times)


def test_journal_at_least_once_a_waited_batch_comes_back_until_confirmed(tmp_path) -> None:
    clock = FakeClock(0)
    path = tmp_path / "s"
    with bucketstore.open(path, durability="journal") as store:
        tracker = store.tracker("sub", STRICT, clock)
        tracker.add_message(1, 1, 1_000)
        tracker.add_message(1, 2, 2_000)
        clock.now = 1_000
        assert tracker.wait_scheduled(10) == [(1, 1)]
        # closed without a next call: the batch was never confirmed
    with bucketstore.open(path, durability="journal") as store:
        tracker = store.tracker("sub", STRICT, clock)
        assert tracker.wait_scheduled(10, timeout=0) == [(1, 1)]  # delivered again
        waiter = Waiter(tracker)  # starting a wait confirms the batch before it
        clock.wait_for_sleepers(1)
        clock.now = 2_000
        assert waiter.get() == [(1, 2)]
    with bucketstore.open(path, durability="journal") as store:
        tracker = store.tracker("sub", STRICT, clock)
        assert tracker.wait_scheduled(10, timeout=0) == [(1, 2)]  # (1, 1) confirmed, (1, 2) not


@pytest.mark.parametrize("config", [TrackerConfig(tick_time_ms=7), TrackerConfig(tick_time_ms=0, precision_bits=4),
                                    TrackerConfig(tick_time_ms=5, precision_bits=4, deliver_at_time_strict=True)],
                         ids=["tick", "bits", "bits-strict"])
def test_the_waiter_returns_at_the_first_millisecond_something_is_due(make, config) -> None:
    """Stepping a fake clock 1 ms at a time: the waiter sleeps exactly while a twin tracker's
    has_message_available() is False, and returns at the first step where it is True."""
    clock, twin_clock = FakeClock(0), FakeClock(0)
    tracker, twin = make(config, clock), make(config, twin_clock)
    assert tracker.add_message(3, 3, 213) and twin.add_message(3, 3, 213)
    waiter = Waiter(tracker)
    for now in range(0, 400):
        twin_clock.now = clock.now = now
        if twin.has_message_available():
            assert waiter.get() == [(3, 3)]
            return
        clock.wait_for_sleepers(1)
        assert not waiter.done.is_set(), f"delivered early at {now}"
    raise AssertionError("never due")


def test_store_close_wakes_the_waiter(tmp_path) -> None:
    clock = FakeClock(0)
    store = bucketstore.open(tmp_path / "s")
    tracker = store.tracker("sub", STRICT, clock)
    tracker.add_message(1, 1, 1_000)
    waiter = Waiter(tracker)
    clock.wait_for_sleepers(1)
    store.close()
    assert isinstance(waiter.get(), StoreClosedError)
