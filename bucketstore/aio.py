"""asyncio: await due positions without blocking the event loop.

``tracker.wait_scheduled`` blocks a thread, and reading segments or syncing the journal
touches the disk, so neither may run on the event loop. Each await here runs one
``wait_scheduled`` in a daemon thread of its own and resolves an asyncio future when it
returns; an earlier add, ``close`` or the clock wakes that thread exactly as it wakes a
synchronous waiter. A read-only tracker's ``peek_scheduled`` (which may read segments)
is awaited the same way (:func:`peek_scheduled`).

**Cancellation never loses a batch.** When the awaiting task is cancelled, the thread
is asked to stop (a :class:`~bucketstore.waiting.CancelToken`); if it had already taken
a batch from the tracker, that batch is kept by the :class:`AsyncTracker` and returned,
before anything else, by its next :meth:`AsyncTracker.next_due`, without asking the
tracker (asking would confirm it, in journal mode, before the embedder has seen it).
So the batch is handed out once in this process, and stays unconfirmed (redelivered
after a crash) until the call after that.

Threads, not an event-loop timer: the wait shares the synchronous path's code and
exactness, and a pending await costs one sleeping thread. Daemon threads, so a wait
never keeps the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from .errors import StoreClosedError
from .tracker_protocol import DelayedDeliveryTracker
from .waiting import CancelToken

__all__ = ["AsyncTracker", "next_due", "deliveries", "peek_scheduled"]

Batch = list[tuple[int, int]]


class AsyncTracker:
    """The asyncio face of a tracker (a :class:`~bucketstore.DelayedDeliveryTracker`; only its
    ``wait_scheduled`` is called).

    Calls on one ``AsyncTracker`` are served one at a time, in order; use one per
    consumer task (several on one tracker each get distinct positions).
    """

    def __init__(self, tracker: DelayedDeliveryTracker) -> None:
        self.tracker = tracker
        #: Batches taken by a thread whose await was cancelled, handed out first.
        self._held: list[Batch] = []
        self._orphan: asyncio.Future[Batch] | None = None
        self._turn: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def next_due(self, max_messages: int, timeout: float | None = None) -> Batch:
        """Wait until positions are due and return them (``tracker.wait_scheduled`` off the loop).

        :param timeout: seconds of the tracker's clock to wait at most (None: no limit).
        :return: the sorted positions; ``[]`` if the timeout passed first.
        :raises StoreClosedError: the tracker is closed, before or during the wait.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new loop (asyncio.run again): its lock
            self._loop, self._turn, self._orphan = loop, asyncio.Lock(), None
        assert self._turn is not None
        async with self._turn:
            if self._orphan is not None:
                # A cancelled await's thread: let it finish (it was asked to stop) so its
                # batch, if it took one, is kept before a new wait could confirm it.
                await asyncio.wait([self._orphan])
                self._orphan = None
            if self._held:
                return self._held.pop(0)
            token = CancelToken()
            future = _in_thread(lambda: self.tracker.wait_scheduled(max_messages, timeout, cancel=token))
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                self._orphan = future
                future.add_done_callback(self._keep)
                # cancel() takes the tracker's lock, which a disk read may hold: not on the loop.
                threading.Thread(target=token.cancel, name="bucketstore-aio-cancel", daemon=True).start()
                raise

    async def peek_scheduled(self, max_messages: int) -> Batch:
        """The positions due now, without taking them: ``tracker.peek_scheduled`` (a tracker of a
        store opened ``read_only=True``) off the loop, as it may read segments from disk.

        It neither waits nor changes anything, so it runs beside a pending :meth:`next_due`
        instead of after it.

        :raises TypeError: the tracker has no ``peek_scheduled`` (a writable one: looking
            without delivering is what a read-only open is for).
        :raises StoreClosedError: the tracker is closed.
        """
        peek = getattr(self.tracker, "peek_scheduled", None)
        if peek is None:
            raise TypeError(f"{type(self.tracker).__name__} has no peek_scheduled: open the store with "
                            "read_only=True to look at due positions without delivering them")
        return await _in_thread(lambda: peek(max_messages))

    def _keep(self, future: asyncio.Future[Batch]) -> None:
        """A cancelled await's thread ended: keep its batch for the next call."""
        if future.cancelled():
            return
        if future.exception() is None:  # (an error, e.g. StoreClosedError, the next call meets again)
            batch = future.result()
            if batch:
                self._held.append(batch)

    async def deliveries(self, max_messages: int) -> AsyncIterator[Batch]:
        """Each batch as it falls due, for ever; ends when the tracker closes.

        ``async for batch in deliveries: dispatch(batch)``; in journal mode each batch is
        confirmed when the loop asks for the next one (the at-least-once handoff).
        """
        while True:
            try:
                batch = await self.next_due(max_messages)
            except StoreClosedError:
                return
            yield batch


_wrappers: weakref.WeakKeyDictionary[Any, AsyncTracker] = weakref.WeakKeyDictionary()
_wrappers_lock = threading.Lock()


def _wrapper(tracker: DelayedDeliveryTracker) -> AsyncTracker:
    """One :class:`AsyncTracker` per tracker for the module functions (its held batches
    must outlive one call)."""
    with _wrappers_lock:
        wrapper = _wrappers.get(tracker)
        if wrapper is None:
            wrapper = _wrappers[tracker] = AsyncTracker(tracker)
        return wrapper


async def next_due(tracker: DelayedDeliveryTracker, max_messages: int, timeout: float | None = None) -> Batch:
    """``await next_due(tracker, 100)``: :meth:`AsyncTracker.next_due` on the tracker's shared wrapper."""
    return await _wrapper(tracker).next_due(max_messages, timeout)


def deliveries(tracker: DelayedDeliveryTracker, max_messages: int) -> AsyncIterator[Batch]:
    """``async for batch in deliveries(tracker, 100)``: :meth:`AsyncTracker.deliveries` on the
    tracker's shared wrapper."""
    return _wrapper(tracker).deliveries(max_messages)


async def peek_scheduled(tracker: Any, max_messages: int) -> Batch:
    """``await peek_scheduled(tracker, 100)``: :meth:`AsyncTracker.peek_scheduled` on the tracker's
    shared wrapper."""
    return await _wrapper(tracker).peek_scheduled(max_messages)


def _in_thread(work: Callable[[], Batch]) -> asyncio.Future[Batch]:
    """Run ``work`` in a daemon thread; its outcome resolves the returned future on this loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Batch] = loop.create_future()

    def settle(outcome: Batch | BaseException, failed: bool) -> None:
        if future.done():
            return
        if failed:
            future.set_exception(outcome)  # type: ignore[arg-type]
        else:
            future.set_result(outcome)  # type: ignore[arg-type]

    def run() -> None:
        try:
            outcome, failed = work(), False
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, outcome, failed)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits it (an unconfirmed batch is redelivered after a restart)

    threading.Thread(target=run, name="bucketstore-aio-wait", daemon=True).start()
    return future
