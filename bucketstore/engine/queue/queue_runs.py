"""The items of the shared queue: sorted runs of indexes, a sealed bucket's segment slot, and the
buffer that batches single adds into runs (see :mod:`~bucketstore.engine.queue.shared_queue`).

A run is three numpy uint64 columns (timestamp, ledger, entry), sorted, with a read position;
its ``owner`` is the sealed bucket whose segment it is (None for rows held only in memory).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...format.row_sort import sort_rows

__all__ = ["Run", "RunBuffer", "Slot", "SegmentSource", "sorted_run"]

_U64 = np.dtype("<u8")
_EMPTY = np.zeros(0, dtype=_U64)


class SegmentSource(Protocol):
    """What the queue needs from a sealed bucket to load its segments lazily."""

    dead: bool
    #: False while the bucket's file is unread (its queued rows came from the catalog).
    opened: bool

    def has_next_segment(self) -> bool: ...

    def next_segment_min_ts(self) -> int: ...

    def next_segment_ready(self) -> bool: ...

    def load_next_segment(self) -> "Run": ...


class Run:
    """A sorted run of indexes with a read position.

    :ivar owner: the sealed bucket whose segment this is, or None.
    A run is *dead* once it is replaced (the mutable bucket was sealed or
    compacted) or its bucket is gone (deleted, merged away); the queue drops
    dead runs when it meets them.
    """

    __slots__ = ("ts", "ledgers", "entries", "pos", "owner", "_killed")

    def __init__(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray,
                 owner: SegmentSource | None = None) -> None:
        self.ts = ts
        self.ledgers = ledgers
        self.entries = entries
        self.pos = 0
        self.owner = owner
        self._killed = False

    @property
    def dead(self) -> bool:
        return self._killed or (self.owner is not None and self.owner.dead)

    def kill(self) -> None:
        """Mark the run replaced and let go of its rows (the queue drops the entry later)."""
        self._killed = True
        self.ts = self.ledgers = self.entries = _EMPTY
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.ts) - self.pos

    def head(self) -> tuple[int, int, int]:
        p = self.pos
        return int(self.ts[p]), int(self.ledgers[p]), int(self.entries[p])

    def due_count(self, cutoff: int) -> int:
        """How many unread rows have a timestamp at or before ``cutoff``."""
        if cutoff < 0:
            return 0
        return int(np.searchsorted(self.ts[self.pos:], np.uint64(cutoff), side="right"))

    def rest(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The unread rows (views)."""
        p = self.pos
        return self.ts[p:], self.ledgers[p:], self.entries[p:]

    def extend(self, other: "Run") -> None:
        """Append a run whose rows all sort after this one's (the bucket's next segment)."""
        p = self.pos
        self.ts = np.concatenate((self.ts[p:], other.ts))
        self.ledgers = np.concatenate((self.ledgers[p:], other.ledgers))
        self.entries = np.concatenate((self.entries[p:], other.entries))
        self.pos = 0


class Slot:
    """A sealed bucket's next segment, not yet read from its ledger file."""

    __slots__ = ("bucket",)

    def __init__(self, bucket: SegmentSource) -> None:
        self.bucket = bucket

    @property
    def dead(self) -> bool:
        return self.bucket.dead


class RunBuffer:
    """An append buffer that turns into sorted runs.

    Single adds go to three Python lists (the cheapest per-call append);
    :meth:`flush` sorts them once into a :class:`Run`.
    """

    __slots__ = ("ts", "ledgers", "entries")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.ledgers: list[int] = []
        self.entries: list[int] = []

    def __len__(self) -> int:
        return len(self.ts)

    def append(self, ts: int, ledger_id: int, entry_id: int) -> None:
        self.ts.append(ts)
        self.ledgers.append(ledger_id)
        self.entries.append(entry_id)

    def flush(self) -> Run | None:
        if not self.ts:
            return None
        run = sorted_run(np.array(self.ts, dtype=_U64), np.array(self.ledgers, dtype=_U64),
                         np.array(self.entries, dtype=_U64))
        self.ts, self.ledgers, self.entries = [], [], []
        return run


def sorted_run(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, owner: SegmentSource | None = None) -> Run:
    """A :class:`Run` of the given columns, sorted by (timestamp, ledger, entry)."""
    if len(ts) > 1:
        ts, ledgers, entries = sort_rows(ts, ledgers, entries)
    return Run(ts, ledgers, entries, owner)
