"""What the two in-memory trackers share: the calls a durable tracker needs and they do not.

:class:`~bucketstore.InMemoryTracker` and :class:`~bucketstore.memory.timebucket_tracker.TimeBucketTracker`
keep nothing across a restart. An embedder still calls every tracker the same way (flush after a
batch, confirm what it delivered, say when its replay is done), so these calls exist here as
checks that the tracker is open, with the reason they have nothing to do. The acknowledgement
rule (a mark-delete position never moves back) is shared too, so both answer alike.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self

from ..errors import StoreClosedError


class VolatileTracker:
    """Base of the in-memory trackers: open/closed state, the no-op durability calls, and the
    monotone mark-delete position. Subclasses set ``_lock``, ``_closed`` and ``_mark_delete``."""

    _lock: threading.RLock
    _closed: bool
    _mark_delete: tuple[int, int] | None

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("tracker is closed")

    def _acknowledged(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is at or before the mark-delete position (nothing to track)."""
        return self._mark_delete is not None and (ledger_id, entry_id) <= self._mark_delete

    def _move_mark_delete(self, ledger_id: int, entry_id: int) -> bool:
        """Record a new mark-delete position; False (and nothing recorded) if it would move back."""
        if self._mark_delete is not None and (ledger_id, entry_id) < self._mark_delete:
            return False
        self._mark_delete = (ledger_id, entry_id)
        return True

    def flush(self) -> None:
        """Nothing is durable in memory; present for interface parity."""

    def confirm_delivered(self) -> None:
        """Confirm the positions returned so far (see
        :meth:`bucketstore.BucketTracker.confirm_delivered`). Nothing survives a restart
        here, so a delivery is final when it is returned and there is nothing to record;
        present so that embedders call every tracker the same way."""
        with self._lock:
            self._check_open()

    def replay_done(self) -> None:
        """The embedder has replayed its log (see :meth:`bucketstore.BucketTracker.replay_done`).
        Nothing is kept across a restart here, so nothing is held for a replay; present so
        that embedders call every tracker the same way."""
        with self._lock:
            self._check_open()

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
