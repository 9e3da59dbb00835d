"""``bucketstore.aio``: awaiting due positions without blocking the event loop, cancellation-safe."""

from __future__ import annotations

import asyncio
import threading

import pytest

import bucketstore
from bucketstore import StoreClosedError, TrackerConfig, aio
from bucketstore.cutoff import system_clock
from helpers import FakeClock

STRICT = TrackerConfig(tick_time_ms=0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))  # a hang fails the test instead


async def sleepers(clock: FakeClock, n: int) -> None:
    """Wait (off the loop) until ``n`` waiters sleep having seen the clock's current time."""
    await asyncio.to_thread(clock.wait_for_sleepers, n)


async def move(clock: FakeClock, now: int) -> None:
    await asyncio.to_thread(setattr, clock, "now", now)  # moving it takes the trackers' locks


@pytest.fixture(params=["bucket-sealed", "bucket-journal", "memory"])
def make(request, tmp_path):
    stores = []

    def make(clock=None):
        if request.param == "memory":
            return bucketstore.InMemoryTracker(STRICT, clock)
        s = bucketstore.open(tmp_path / f"s{len(stores)}", durability=request.param.split("-")[1])
        stores.append(s)
        return s.tracker("sub", STRICT, clock)

    yield make
    for s in stores:
        s.close()


def test_next_due_waits_for_the_clock_and_the_loop_stays_free(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock)
    tracker.add_message(1, 1, 1_000)

    async def main():
        task = asyncio.create_task(aio.next_due(tracker, 10))
        ticks = 0
        await sleepers(clock, 1)
        for _ in range(5):  # the loop runs other work while the wait sleeps in its thread
            await asyncio.sleep(0)
            ticks += 1
        assert not task.done() and ticks == 5
        await move(clock, 999)
        await sleepers(clock, 1)
        assert not task.done()
        await move(clock, 1_000)
        return await task

    assert run(main()) == [(1, 1)]


def test_deliveries_yields_each_batch_and_ends_when_the_tracker_closes(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock)
    for entry in range(3):
        tracker.add_message(1, entry, 1_000 * (entry + 1))

    async def main():
        got = []

        async def consume():
            async for batch in aio.deliveries(tracker, 10):
                got.append(batch)
                if len(got) == 3:
                    await asyncio.to_thread(tracker.close)
            return got

        task = asyncio.create_task(consume())
        for t in (1_000, 2_000, 3_000):
            await sleepers(clock, 1)
            await move(clock, t)
        return await task

    assert run(main()) == [[(1, 0)], [(1, 1)], [(1, 2)]]


def test_an_earlier_add_wakes_an_await_with_the_real_clock(make) -> None:
    tracker = make()
    tracker.add_message(9, 9, system_clock() + 600_000)

    async def main():
        task = asyncio.create_task(aio.next_due(tracker, 10, timeout=120))
        while not tracker._due._targets:
            await asyncio.sleep(0.01)
        soon = system_clock() + 200
        assert await asyncio.to_thread(tracker.add_message, 1, 1, soon)
        batch = await task
        assert system_clock() >= soon  # never early
        return batch

    assert run(main()) == [(1, 1)]


def test_a_cancelled_await_while_sleeping_takes_nothing(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock)
    tracker.add_message(1, 1, 1_000)

    async def main():
        wrapper = aio.AsyncTracker(tracker)
        task = asyncio.create_task(wrapper.next_due(10))
        await sleepers(clock, 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tracker.number_of_delayed_messages == 1
        nxt = asyncio.create_task(wrapper.next_due(10))
        await sleepers(clock, 1)
        await move(clock, 1_000)
        return await nxt

    assert run(main()) == [(1, 1)]


def test_a_batch_taken_after_the_await_was_cancelled_is_returned_by_the_next_call(make) -> None:
    """The thread took the batch, then the task was cancelled before it saw it: the batch
    is not dropped; the next await returns it (without asking the tracker)."""
    clock = FakeClock(0)
    tracker = make(clock)
    tracker.add_message(1, 1, 1_000)
    tracker.add_message(1, 2, 5_000)

    async def main():
        wrapper = aio.AsyncTracker(tracker)
        task = asyncio.create_task(wrapper.next_due(10))
        await sleepers(clock, 1)
        taken = threading.Event()
        original = tracker.get_scheduled_messages

        def spy(n):
            batch = original(n)
            if batch:
                taken.set()
            return batch

        tracker.get_scheduled_messages = spy
        clock.now = 1_000  # on the loop: the thread now takes (1, 1) ...
        assert taken.wait(60)  # ... blocking the loop so the task cannot see the result first
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tracker.number_of_delayed_messages == 1  # (1, 1) left the tracker
        return await wrapper.next_due(10)

    assert run(main()) == [(1, 1)]


def test_journal_a_batch_of_a_cancelled_await_stays_unconfirmed(tmp_path) -> None:
    clock = FakeClock(0)
    path = tmp_path / "s"
    with bucketstore.open(path, durability="journal") as store:
        tracker = store.tracker("sub", STRICT, clock)
        tracker.add_message(1, 1, 1_000)

        async def main():
            wrapper = aio.AsyncTracker(tracker)
            task = asyncio.create_task(wrapper.next_due(10))
            await sleepers(clock, 1)
            clock.now = 1_000
            while tracker.number_of_delayed_messages:  # the thread takes the batch
                threading.Event().wait(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the process dies here, before the held batch is handed out or confirmed

        run(main())
    with bucketstore.open(path, durability="journal") as store:
        assert store.tracker("sub", STRICT, clock).wait_scheduled(10, timeout=0) == [(1, 1)]


def test_next_due_on_a_closed_tracker_raises(make) -> None:
    tracker = make(FakeClock(0))
    tracker.close()
    with pytest.raises(StoreClosedError):
        run(aio.next_due(tracker, 1))


def test_a_timeout_returns_empty(make) -> None:
    clock = FakeClock(0)
    tracker = make(clock)

    async def main():
        task = asyncio.create_task(aio.next_due(tracker, 1, timeout=2))
        await sleepers(clock, 1)
        await move(clock, 2_000)
        return await task

    assert run(main()) == []


def test_peek_scheduled_awaits_a_read_only_trackers_look_and_takes_nothing(tmp_path) -> None:
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        writer = store.tracker("sub", STRICT, clock)
        writer.add_messages([(1, e, 100 + e) for e in range(5)] + [(2, 0, 10**6)])
        writer.flush()
        with bucketstore.open(tmp_path / "s", read_only=True) as view:
            looked = view.tracker("sub", STRICT, clock)
            clock.now = 102

            async def main():
                first = await aio.peek_scheduled(looked, 10)
                again = await aio.AsyncTracker(looked).peek_scheduled(2)
                return first, again

            first, again = run(main())
            assert first == [(1, 0), (1, 1), (1, 2)] == looked.peek_scheduled(10)
            assert again == [(1, 0), (1, 1)]
            assert writer.get_scheduled_messages(10) == first  # nothing was taken

            async def writable():
                await aio.peek_scheduled(writer, 10)

            with pytest.raises(TypeError, match="read_only=True"):
                run(writable())
