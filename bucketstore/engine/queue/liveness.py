"""A frozen view of which rows are live, for work done off the tracker's lock.

A background seal or merge filters rows without the tracker's lock, so it
cannot ask the tracker-wide index; it asks one of these, taken under the lock
when the job starts. Rows that die after that moment (delivered, trimmed,
expired) are still written; the index, and the ghosts it keeps for positions
whose rows remain on disk, keep them dead in memory, exactly as for rows of
a sealed bucket delivered before a merge.
"""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap

from .index_set import DelayedIndexSet

__all__ = ["FrozenMutableLiveness", "index_snapshot"]


class FrozenMutableLiveness:
    """Liveness of a frozen mutable bucket's rows at freeze time.

    Every row of a run-based mutable bucket was live when added; it can have died
    before the freeze only by acknowledgement (``mark_delete``), or because its
    position was untracked by an expired re-add (a *ghost*, maybe tracked again
    at another time). Deliveries consumed their rows from the runs already. So
    the mark-delete position and the ghosts of the bucket's ledgers decide, and
    copying them is cheap.
    """

    def __init__(self, index: DelayedIndexSet, start: int, end: int, mark_delete: tuple[int, int] | None) -> None:
        self.mark_delete = mark_delete
        #: ledger -> entry -> the live time (None: not tracked) of each ghost position.
        self.ghosts: dict[int, dict[int, int | None]] = {}
        for ledger, ghosts in index._ghosts.items():
            if start <= ledger <= end and ghosts:
                times = index._retimed.get(ledger, {})
                self.ghosts[ledger] = {entry: (times.get(entry) if index.contains(ledger, entry) else None)
                                       for entry in ghosts}

    def mask(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
        keep = np.ones(len(ts), dtype=bool)
        md = self.mark_delete
        if md is not None:
            l0, e0 = np.uint64(md[0]), np.uint64(md[1])
            keep &= (ledgers > l0) | ((ledgers == l0) & (entries > e0))
        for ledger, times in self.ghosts.items():
            rows = np.flatnonzero(ledgers == np.uint64(ledger))
            for row in rows.tolist():
                entry = int(entries[row])
                if entry in times:
                    live_ts = times[entry]
                    keep[row] = live_ts is not None and int(ts[row]) == live_ts
        return keep


def index_snapshot(index: DelayedIndexSet, start: int, end: int) -> DelayedIndexSet:
    """A copy of the index restricted to ledgers ``[start, end]`` (bitmaps and live times)."""
    snap = DelayedIndexSet()
    for ledger, bm in index.ledgers():
        if start <= ledger <= end:
            snap._ledgers[ledger] = bm.copy()
            snap._count += len(bm)
            times = index._retimed.get(ledger)
            if times:
                snap._retimed[ledger] = dict(times)
                snap._ghosts[ledger] = BitMap()  # only _retimed matters to present_mask
    return snap
