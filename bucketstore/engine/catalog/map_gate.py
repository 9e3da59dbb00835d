"""``MapGate``: transactions on one LMDB environment share it; resizing its map excludes them.

LMDB remaps the data file when the map grows (``mdb_env_set_mapsize``), and it requires
that no transaction of the process be active meanwhile; py-lmdb invalidates the ones that
are. A catalog is used from several threads of one process (a tracker opening on the
caller's thread, seals and merges installing on the maintenance worker, an in-process
read-only open), so a write that fills the map on one thread and grows it would make a
read or write on another fail with "Attempt to operate on closed/deleted/dropped object"
or "mdb_txn_begin: Invalid argument" (measured with py-lmdb 1.x/LMDB 0.9.x: thousands of
failed reads while a writer grew the map eight times). Every transaction therefore holds
the gate shared, and a resize or a close holds it exclusively.

The gate is a readers-writer lock with two properties the catalog needs:

* a waiting exclusive holder stops new shared entries, so a steady stream of readers
  cannot starve a resize (and with it, every writer);
* a thread that holds the gate shared may enter it shared again (a read done inside
  another read of the same thread), even while an exclusive holder waits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MapGate"]


class MapGate:
    """A readers-writer lock: :meth:`shared` for transactions, :meth:`exclusive` for remaps."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0  # shared holds, all threads together
        self._exclusive: int | None = None  # the thread ident holding it exclusively
        self._waiting = 0  # threads waiting for it exclusively
        self._mine = threading.local()  # this thread's shared depth

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate shared (re-entrant per thread)."""
        depth = getattr(self._mine, "depth", 0)
        me = threading.get_ident()
        with self._cond:
            if depth == 0 and self._exclusive != me:
                while self._exclusive is not None or self._waiting:
                    self._cond.wait()
            self._shared += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            with self._cond:
                self._shared -= 1
                if self._shared == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the gate alone: no transaction of this process is active meanwhile.

        :raises RuntimeError: if this thread holds it shared (waiting would never end).
        """
        if getattr(self._mine, "depth", 0):
            raise RuntimeError("MapGate.exclusive() called by a thread holding it shared")
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive is not None or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = None
                self._cond.notify_all()
