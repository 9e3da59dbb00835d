"""A daemon thread that handles queued items in order: the base of the store's
maintenance worker (seals, merges) and of its read-ahead reader.

The thread starts with the first item, so a store that never needs it never has
it. Items are handled one at a time, in submission order, holding no lock.
"""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

__all__ = ["WorkerThread"]

T = TypeVar("T")


class WorkerThread(Generic[T]):
    """Queue items; one thread, started on demand, hands each to :meth:`_handle`."""

    #: What :meth:`stop` does with items still queued: True handles them first, False drops them.
    finish_queued_on_stop = True

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._items: collections.deque[T] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def _enqueue(self, item: T) -> bool:
        """Queue an item; False (and nothing queued) once :meth:`stop` was called.

        :raises RuntimeError: the thread could not be started (nothing queued)."""
        with self._cond:
            if self._stopping:
                return False
            self._items.append(item)
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
                try:
                    thread.start()
                except BaseException:
                    # Out of threads or memory: nothing stays queued for a thread that never runs,
                    # and the next item tries to start it again.
                    self._items.pop()
                    raise
                self._thread = thread
            self._cond.notify()
            return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._cond.wait()
                if not self._items or (self._stopping and not self.finish_queued_on_stop):
                    return
                item = self._items.popleft()
            self._handle(item)

    def _handle(self, item: T) -> None:
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> bool:
        """End the thread (after the queued items, or dropping them: see
        :attr:`finish_queued_on_stop`); False if it still runs after ``timeout``."""
        with self._cond:
            self._stopping = True
            if not self.finish_queued_on_stop:
                self._items.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()
