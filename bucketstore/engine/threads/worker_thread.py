"""Daemon threads that handle queued items in order: the base of the store's
maintenance worker (seals, merges) and of its read-ahead reader.

A thread starts with the first item, so a store that never needs one never has
it; with ``threads`` above 1, another starts when an item waits and no thread is
idle, up to that many. Items are taken in submission order and handled holding no
lock (by one thread: one at a time; by several: side by side).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Generic, TypeVar

__all__ = ["WorkerThread"]

T = TypeVar("T")


class WorkerThread(Generic[T]):
    """Queue items; up to ``threads`` threads, started on demand, hand each to :meth:`_handle`."""

    #: What :meth:`stop` does with items still queued: True handles them first, False drops them.
    finish_queued_on_stop = True

    def __init__(self, thread_name: str, threads: int = 1) -> None:
        self._thread_name = thread_name
        self._max_threads = threads
        self._items: collections.deque[T] = collections.deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for an item
        self._stopping = False

    def _enqueue(self, item: T) -> bool:
        """Queue an item; False (and nothing queued) once :meth:`stop` was called.

        :raises RuntimeError: no thread runs and none could be started (nothing queued)."""
        with self._cond:
            if self._stopping:
                return False
            self._items.append(item)
            if len(self._items) > self._idle and len(self._threads) < self._max_threads:
                name = self._thread_name + (f" #{len(self._threads) + 1}" if self._threads else "")
                thread = threading.Thread(target=self._loop, name=name, daemon=True)
                try:
                    thread.start()
                except BaseException:
                    # Out of threads or memory. With a thread already running the item waits for
                    # it; with none, nothing stays queued for a thread that never runs, and the
                    # next item tries to start one again.
                    if not self._threads:
                        self._items.pop()
                        raise
                else:
                    self._threads.append(thread)
            self._cond.notify()
            return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._items or (self._stopping and not self.finish_queued_on_stop):
                    return
                item = self._items.popleft()
            self._handle(item)

    def _handle(self, item: T) -> None:
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> bool:
        """End the threads (after the queued items, or dropping them: see
        :attr:`finish_queued_on_stop`); False if one still runs after ``timeout``."""
        with self._cond:
            self._stopping = True
            if not self.finish_queued_on_stop:
                self._items.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        if threading.current_thread() in threads:
            return True  # stopped from an item: the others may wait for this one to return
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)
