"""The tracker-wide membership index: which positions are tracked and undelivered.

One roaring bitmap of entry ids per ledger (32-bit, upgraded to 64-bit for a
ledger the first time an entry id >= 2**32 arrives). This is the single source
of truth PIP-195's master branch converged on: ``contains_message`` answers
from it, a delivery counts only if it removes a bit here (so a duplicate queue
entry is never delivered twice), and ``number_of_delayed_messages`` is its
cardinality, kept in a counter so reading it is O(1).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

__all__ = ["DelayedIndexSet", "bitmap_of"]

_U32_LIMIT = 1 << 32
Bitmap = BitMap | BitMap64


def bitmap_of(entries: np.ndarray, wide: bool = False) -> Bitmap:
    """A bitmap of the given uint64 entry ids (64-bit when needed or asked for)."""
    if wide or (len(entries) and int(entries.max()) >= _U32_LIMIT):
        return BitMap64(np.asarray(entries, dtype=np.uint64).tolist())
    return BitMap(array("I", np.asarray(entries, dtype=np.uint32).tobytes()))


class DelayedIndexSet:
    """Set of ``(ledger_id, entry_id)`` positions, as per-ledger roaring bitmaps.

    Not thread-safe by itself: the owning tracker's lock guards it.
    """

    __slots__ = ("_ledgers", "_count")

    def __init__(self) -> None:
        self._ledgers: dict[int, Bitmap] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, position: tuple[int, int]) -> bool:
        bm = self._ledgers.get(position[0])
        return bm is not None and _fits(bm, position[1]) and position[1] in bm

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        bm = self._ledgers.get(ledger_id)
        return bm is not None and _fits(bm, entry_id) and entry_id in bm

    def _bitmap_for(self, ledger_id: int, entry_id: int) -> Bitmap:
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            bm = BitMap64() if entry_id >= _U32_LIMIT else BitMap()
            self._ledgers[ledger_id] = bm
        elif entry_id >= _U32_LIMIT and isinstance(bm, BitMap):
            bm = BitMap64(bm)
            self._ledgers[ledger_id] = bm
        return bm

    def add(self, ledger_id: int, entry_id: int) -> bool:
        """Track a position; True if it was not tracked before."""
        bm = self._bitmap_for(ledger_id, entry_id)
        if entry_id in bm:
            return False
        bm.add(entry_id)
        self._count += 1
        return True

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack a position; True if it was tracked."""
        bm = self._ledgers.get(ledger_id)
        if bm is None or not _fits(bm, entry_id) or entry_id not in bm:
            return False
        bm.remove(entry_id)
        self._count -= 1
        if not bm:
            del self._ledgers[ledger_id]
        return True

    def add_bitmap(self, ledger_id: int, entries: Bitmap) -> int:
        """OR a bitmap of entry ids into a ledger; return how many were new."""
        if not entries:
            return 0
        bm = self._bitmap_for(ledger_id, entries.max())
        if isinstance(bm, BitMap64) and isinstance(entries, BitMap):
            entries = BitMap64(entries)
        before = len(bm)
        bm |= entries
        added = len(bm) - before
        self._count += added
        return added

    def add_many(self, ledgers: np.ndarray, entries: np.ndarray) -> int:
        """Track many positions (uint64 columns); return how many were new."""
        added = 0
        for ledger, ents in _group_by_ledger(ledgers, entries):
            added += self.add_bitmap(ledger, bitmap_of(ents))
        return added

    def take(self, ledger_id: int, entries: np.ndarray) -> Bitmap | None:
        """Untrack whichever of ``entries`` (one ledger) are tracked; return them as a bitmap.

        This is the delivery step: a position is delivered only if this call is
        the one that removes it, so duplicates in the queues are dropped here.
        """
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            return None
        wanted = bitmap_of(entries, wide=isinstance(bm, BitMap64))
        if isinstance(wanted, BitMap64) and isinstance(bm, BitMap):
            # Entry ids beyond 2**32 cannot be in a 32-bit bitmap: drop them from the request.
            wanted = BitMap(v for v in wanted if v < _U32_LIMIT)
        hits = bm & wanted
        if hits:
            bm -= hits
            self._count -= len(hits)
            if not bm:
                del self._ledgers[ledger_id]
        return hits

    def present_mask(self, ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Boolean mask of which rows are tracked (does not change the set)."""
        mask = np.zeros(len(ledgers), dtype=bool)
        if not len(ledgers):
            return mask
        for ledger in np.unique(ledgers).tolist():
            bm = self._ledgers.get(ledger)
            if bm is None:
                continue
            rows = np.flatnonzero(ledgers == ledger)
            ents = entries[rows]
            hits = bm & bitmap_of(ents, wide=isinstance(bm, BitMap64))
            if hits:
                mask[rows] = np.isin(ents, np.asarray(hits.to_array() if isinstance(hits, BitMap)
                                                      else list(hits), dtype=np.uint64))
        return mask

    def drop_ledgers_below(self, first_live_ledger: int) -> int:
        """Untrack every position of ledgers before ``first_live_ledger``; return how many."""
        dead = [l for l in self._ledgers if l < first_live_ledger]
        dropped = 0
        for ledger in dead:
            dropped += len(self._ledgers.pop(ledger))
        self._count -= dropped
        return dropped

    def drop_through(self, ledger_id: int, entry_id: int) -> int:
        """Untrack entries ``0..entry_id`` of one ledger; return how many."""
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            return 0
        before = len(bm)
        limit = entry_id + 1 if isinstance(bm, BitMap64) else min(entry_id + 1, _U32_LIMIT)
        bm.remove_range(0, limit)
        dropped = before - len(bm)
        self._count -= dropped
        if not bm:
            del self._ledgers[ledger_id]
        return dropped

    def ledgers(self) -> Iterator[tuple[int, Bitmap]]:
        return iter(self._ledgers.items())

    def clear(self) -> None:
        self._ledgers.clear()
        self._count = 0

    def memory_bytes(self) -> int:
        """Approximate bytes held by the bitmaps: their containers plus a per-ledger overhead."""
        return sum(_bitmap_bytes(bm) + 120 for bm in self._ledgers.values())

    def _check(self) -> None:
        assert self._count == sum(len(bm) for bm in self._ledgers.values()), "count drifted from cardinality"
        assert all(len(bm) for bm in self._ledgers.values()), "empty bitmap kept"


def _bitmap_bytes(bm: Bitmap) -> int:
    if isinstance(bm, BitMap64):
        return len(bm.serialize())
    stats = bm.get_statistics()
    return (stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"]
            + stats["n_bytes_bitset_containers"])


def _fits(bm: Bitmap, entry_id: int) -> bool:
    return entry_id < _U32_LIMIT or isinstance(bm, BitMap64)


def _group_by_ledger(ledgers: np.ndarray, entries: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(ledger, entries of that ledger)``; fast path for the common one-ledger batch."""
    if not len(ledgers):
        return
    first = ledgers[0]
    if (ledgers == first).all():
        yield int(first), entries
        return
    for ledger in np.unique(ledgers).tolist():
        yield ledger, entries[ledgers == ledger]
