"""The tracker-wide membership index: which positions are tracked and undelivered.

One roaring bitmap of entry ids per ledger (32-bit, upgraded to 64-bit for a
ledger the first time an entry id >= 2**32 arrives). This is the single source
of truth PIP-195's master branch converged on: ``contains_message`` answers
from it, a delivery counts only if it removes a bit here (so a duplicate queue
entry is never delivered twice), and ``number_of_delayed_messages`` is its
cardinality, kept in a counter so reading it is O(1).

A queue row ``(ts, ledger, entry)`` is *live* when its position is tracked. One
case needs more: a position untracked while a row of it may remain — by an
expired re-add, or delivered while a sealed segment on disk still holds it —
and then added again with another time must not be delivered early by that
old row. Such positions are remembered as *ghosts* (per-ledger bitmaps); a
ghost that is tracked again is *retimed*: only the row carrying its current
time is live.

Delivery removes positions in bulk. The shared queue's frontier hands over the
positions a call delivers with :meth:`DelayedIndexSet.deliver`: the count drops at
once and :meth:`~DelayedIndexSet.contains` answers False for them from then on, but
their bits leave the bitmaps (and become ghosts where a sealed file still holds
their rows) only at the next :meth:`~DelayedIndexSet.settle` — one bitmap operation
per ledger for many calls instead of one per ledger per call. Every other method
settles first, so the pending removals are invisible outside. The frontier also
asks which ledgers changed since it last looked (:meth:`~DelayedIndexSet.changes`):
only those of its rows need their liveness checked again.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

__all__ = ["DelayedIndexSet", "bitmap_of", "sort_positions"]

_U32_LIMIT = 1 << 32
#: Above this many pending removals, a membership lookup settles them first instead of
#: scanning them (a scan costs about a nanosecond a row; a settle, a few microseconds a ledger).
_PENDING_SCAN_MAX = 4096
#: Changed ledgers :meth:`DelayedIndexSet.changes` names one by one; beyond, it says "any may have"
#: (the frontier then checks all its unread rows again: one bulk lookup, as after a trim).
_DIRTY_MAX = 4096
Bitmap = BitMap | BitMap64


def bitmap_of(entries: np.ndarray, wide: bool = False) -> Bitmap:
    """A bitmap of the given uint64 entry ids (64-bit when needed or asked for)."""
    if wide or (len(entries) and int(entries.max()) >= _U32_LIMIT):
        return BitMap64(np.asarray(entries, dtype=np.uint64).tolist())
    # Sorted first: pyroaring, which holds the GIL, builds 3-5x faster from sorted ids (a merge's
    # segments, in time order, are not), and numpy's sort releases the GIL.
    return BitMap(array("I", np.sort(np.asarray(entries, dtype=np.uint32)).tobytes()))


class DelayedIndexSet:
    """Set of ``(ledger_id, entry_id)`` positions, as per-ledger roaring bitmaps.

    Not thread-safe by itself: the owning tracker's lock guards it.
    """

    __slots__ = ("_ledgers", "_count", "_ghosts", "_retimed", "_pending_l", "_pending_e", "_pending_n",
                 "_pending_cols", "_dirty", "_all_dirty", "ghost_filter")

    def __init__(self) -> None:
        self._ledgers: dict[int, Bitmap] = {}
        self._count = 0
        # ledger -> positions untracked while an old row of them may linger somewhere.
        self._ghosts: dict[int, Bitmap] = {}
        # ledger -> entry -> the only live timestamp, for re-added expired positions.
        self._retimed: dict[int, dict[int, int]] = {}
        # Positions delivered whose bits are still set (see deliver/settle), as column chunks.
        self._pending_l: list[np.ndarray] = []
        self._pending_e: list[np.ndarray] = []
        self._pending_n = 0
        self._pending_cols: tuple[np.ndarray, np.ndarray] | None = None
        # Ledgers whose membership or live times changed since changes() was last asked.
        self._dirty: set[int] = set()
        self._all_dirty = False
        #: ``ledger -> bool``: whether a delivered position of that ledger must become a
        #: ghost (a sealed file still holds its row). None: never.
        self.ghost_filter: Callable[[int], bool] | None = None

    def __len__(self) -> int:
        return self._count

    def __contains__(self, position: tuple[int, int]) -> bool:
        return self.contains(position[0], position[1])

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        if self._pending_n > _PENDING_SCAN_MAX:
            self.settle()  # a scan of many pending rows per lookup would cost more
        bm = self._ledgers.get(ledger_id)
        if bm is None or not _fits(bm, entry_id) or entry_id not in bm:
            return False
        return not self._pending_n or not self._is_pending(ledger_id, entry_id)

    # -- bulk delivery: pending removals ------------------------------------------------------
    def deliver(self, ledgers: np.ndarray, entries: np.ndarray) -> None:
        """Untrack positions known to be tracked, live and distinct (uint64 columns): the
        count drops now, the bits leave the bitmaps at the next :meth:`settle`."""
        if not len(ledgers):
            return
        self._pending_l.append(ledgers)
        self._pending_e.append(entries)
        self._pending_n += len(ledgers)
        self._pending_cols = None
        self._count -= len(ledgers)

    def _is_pending(self, ledger_id: int, entry_id: int) -> bool:
        cols = self._pending_cols
        if cols is None:
            cols = self._pending_cols = (np.concatenate(self._pending_l), np.concatenate(self._pending_e))
        return bool(((cols[0] == np.uint64(ledger_id)) & (cols[1] == np.uint64(entry_id))).any())

    def settle(self) -> None:
        """Apply the pending removals: one bitmap difference per ledger (and one ghost union
        per ledger the :attr:`ghost_filter` names)."""
        if not self._pending_n:
            return
        ledgers, entries = sort_positions(np.concatenate(self._pending_l), np.concatenate(self._pending_e))
        self._pending_l, self._pending_e, self._pending_n, self._pending_cols = [], [], 0, None
        ghost = self.ghost_filter
        cuts = (np.flatnonzero(ledgers[1:] != ledgers[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, len(ledgers)]):
            ledger = int(ledgers[a])
            bm = self._ledgers[ledger]
            gone = bitmap_of(entries[a:b], wide=isinstance(bm, BitMap64))
            bm -= gone
            if not bm:
                del self._ledgers[ledger]
            times = self._retimed.get(ledger)
            if times:
                for entry in gone:
                    self._forget_time(ledger, entry)
            if ghost is not None and ghost(ledger):
                self.add_ghosts(ledger, gone)

    def _touch(self, ledger_id: int) -> None:
        """Note that a ledger changed, for :meth:`changes`. Past :data:`_DIRTY_MAX` ledgers, note
        that any may have instead: the set would otherwise hold every ledger a publishing run
        touches until delivery next asks (a Python int each, and, freed all at once, the
        interpreter's memory left fragmented: 0.3 B/index at 100 M built live)."""
        if not self._all_dirty:
            dirty = self._dirty
            dirty.add(ledger_id)
            if len(dirty) > _DIRTY_MAX:
                self._all_dirty = True
                self._dirty = set()

    def changes(self) -> set[int] | None:
        """The ledgers whose membership or live times changed since the last call (None: any
        may have), and start afresh."""
        dirty = None if self._all_dirty else self._dirty
        self._dirty = set()
        self._all_dirty = False
        return dirty

    def all_claimable(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> bool:
        """True when every row of these (ts, ledger, entry) slices would deliver its position,
        shown with one bitmap operation per slice and no sort: each slice holds one ledger that
        no other slice holds, no position twice, only tracked positions, none re-added after
        an expiry. False when that cannot be shown so cheaply (then ask :meth:`claimable_mask`).
        The frontier's common case: the segments of sealed buckets of one ledger each."""
        self.settle()
        seen: set[int] = set()
        for _ts, ledgers, entries in parts:
            n = len(ledgers)
            ledger = int(ledgers[0])
            if ledger in seen or int(ledgers[-1]) != ledger or (n > 2 and not (ledgers == ledgers[0]).all()):
                return False
            seen.add(ledger)
            bm = self._ledgers.get(ledger)
            if bm is None or self._retimed.get(ledger):
                return False
            # (Sorted first: a bitmap builds ~5x faster from sorted ids; a slice is in time order.)
            wanted = bitmap_of(np.sort(entries), wide=isinstance(bm, BitMap64))
            if isinstance(wanted, BitMap64) and isinstance(bm, BitMap):
                return False
            if len(wanted) != n or bm.intersection_cardinality(wanted) != n:
                return False  # a position twice, or one not tracked
        return True

    def claimable_mask(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Which rows (in delivery order) would deliver their position: live, and the first
        live row of their position among these rows. Does not change the set.

        One sort puts the rows in (ledger, entry, row) order: a position's rows are then
        adjacent, its first row first, and each ledger is one slice checked with one
        bitmap operation."""
        self.settle()
        n = len(ledgers)
        mask = np.zeros(n, dtype=bool)
        if not n:
            return mask
        order = _position_order(ledgers, entries)
        ls, es = ledgers[order], entries[order]
        first = np.ones(n, dtype=bool)
        first[1:] = (ls[1:] != ls[:-1]) | (es[1:] != es[:-1])
        cuts = (np.flatnonzero(ls[1:] != ls[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, n]):
            ledger = int(ls[a])
            bm = self._ledgers.get(ledger)
            if bm is None:
                continue
            ents = es[a:b]
            wanted = bitmap_of(ents, wide=isinstance(bm, BitMap64))
            if isinstance(wanted, BitMap64) and isinstance(bm, BitMap):
                wanted = BitMap(v for v in wanted if v < _U32_LIMIT)  # beyond 2**32: not in a 32-bit bitmap
            hit = bm.intersection_cardinality(wanted)
            if not hit:
                continue
            if hit == len(wanted):
                live = np.ones(b - a, dtype=bool)
            else:
                hits = bm & wanted
                live = np.isin(ents, np.fromiter(hits, dtype=np.uint64, count=len(hits)))
            times = self._live_rows(ledger, ents, ts[order[a:b]])
            if times is None:
                live &= first[a:b]  # a position's rows are all live or all not: keep its first
            else:
                # A re-added expired position is live only in its row of the current time,
                # which need not be its first row: keep the first live row of each position.
                live &= times
                at = np.flatnonzero(live)
                if len(at) > 1:
                    live[at[1:][ents[at[1:]] == ents[at[:-1]]]] = False
            mask[order[a:b]] = live
        return mask

    def _bitmap_for(self, ledger_id: int, entry_id: int) -> Bitmap:
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            bm = BitMap64() if entry_id >= _U32_LIMIT else BitMap()
            self._ledgers[ledger_id] = bm
        elif entry_id >= _U32_LIMIT and isinstance(bm, BitMap):
            bm = BitMap64(bm)
            self._ledgers[ledger_id] = bm
        return bm

    def add(self, ledger_id: int, entry_id: int, ts: int | None = None) -> bool:
        """Track a position (due at ``ts``); True if it was not tracked before."""
        bm = self._bitmap_for(ledger_id, entry_id)
        if entry_id in bm:
            if self._pending_n > _PENDING_SCAN_MAX:
                self.settle()
                bm = self._bitmap_for(ledger_id, entry_id)
                if entry_id in bm:
                    return False
            elif not self._pending_n or not self._is_pending(ledger_id, entry_id):
                return False
            self.settle()  # delivered, its bit not yet cleared: clear it, then track it again
            bm = self._bitmap_for(ledger_id, entry_id)
        bm.add(entry_id)
        self._count += 1
        self._touch(ledger_id)
        if self._ghosts and ts is not None and self._is_ghost(ledger_id, entry_id):
            self._retimed.setdefault(ledger_id, {})[entry_id] = ts
        return True

    def expire(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack a position because it was re-added already due; True if it was tracked.

        Its older rows may still sit in the queue or a sealed segment, so the
        position is remembered: if it is tracked again, only its new row is live.
        """
        if not self.discard(ledger_id, entry_id):
            return False
        ghosts = self._ghosts.get(ledger_id)
        if ghosts is None or (entry_id >= _U32_LIMIT and isinstance(ghosts, BitMap)):
            ghosts = self._ghosts[ledger_id] = BitMap64(ghosts or ()) if entry_id >= _U32_LIMIT else BitMap()
        ghosts.add(entry_id)
        self._forget_time(ledger_id, entry_id)
        return True

    def add_ghosts(self, ledger_id: int, entries: Bitmap) -> None:
        """Remember delivered positions whose rows remain in a sealed segment on disk."""
        self.settle()
        ghosts = self._ghosts.get(ledger_id)
        if ghosts is None:
            self._ghosts[ledger_id] = entries.copy()
        elif type(ghosts) is type(entries):
            ghosts |= entries
        else:
            self._ghosts[ledger_id] = BitMap64(ghosts) | BitMap64(entries)

    def _is_ghost(self, ledger_id: int, entry_id: int) -> bool:
        ghosts = self._ghosts.get(ledger_id)
        return ghosts is not None and _fits(ghosts, entry_id) and entry_id in ghosts

    def _forget_time(self, ledger_id: int, entry_id: int) -> None:
        times = self._retimed.get(ledger_id)
        if times is not None and times.pop(entry_id, None) is not None and not times:
            del self._retimed[ledger_id]

    def _live_rows(self, ledger_id: int, entries: np.ndarray, ts: np.ndarray | None) -> np.ndarray | None:
        """Mask of rows of one ledger whose time is the live one (None: all are)."""
        times = self._retimed.get(ledger_id)
        if not times or ts is None:
            return None
        mask = np.ones(len(entries), dtype=bool)
        for entry, live_ts in times.items():
            mask &= ~((entries == entry) & (ts != live_ts))
        return mask

    def live_time_mask(self, ledger_id: int, entries: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
        """Mask of rows of one ledger at their position's live time (None: all are; most
        ledgers have no re-added position). Membership is not checked."""
        self.settle()
        return self._live_rows(ledger_id, entries, ts)

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Untrack a position; True if it was tracked."""
        self.settle()
        self._touch(ledger_id)
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
        self.settle()
        self._touch(ledger_id)
        bm = self._bitmap_for(ledger_id, entries.max())
        if isinstance(bm, BitMap64) and isinstance(entries, BitMap):
            entries = BitMap64(entries)
        before = len(bm)
        bm |= entries
        added = len(bm) - before
        self._count += added
        return added

    def add_many(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray | None = None) -> int:
        """Track many positions (uint64 columns, due at ``ts``); return how many were new."""
        self.settle()
        if self._ghosts and ts is not None:
            for ledger, entry, at in zip(ledgers.tolist(), entries.tolist(), ts.tolist()):
                if self._is_ghost(ledger, entry) and not self.contains(ledger, entry):
                    self._retimed.setdefault(ledger, {})[entry] = at
        added = 0
        for ledger, ents in _group_by_ledger(ledgers, entries):
            added += self.add_bitmap(ledger, bitmap_of(ents))
        return added

    def overlaps(self, ledger_id: int, entries: Bitmap) -> bool:
        """True if any of ``entries`` (one ledger) is tracked."""
        self.settle()
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            return False
        if type(bm) is type(entries):
            return bm.intersection_cardinality(entries) > 0
        return any(self.contains(ledger_id, e) for e in entries)

    def add_new(self, ledger_id: int, entries: Bitmap, entry_ids: np.ndarray, ts: np.ndarray) -> None:
        """Track positions known to be untracked and distinct (``entries`` as a bitmap,
        ``entry_ids``/``ts`` as columns, for positions that were expired before)."""
        self.settle()
        if self._ghosts.get(ledger_id) is not None:
            self.add_many(np.full(len(entry_ids), ledger_id, dtype=np.uint64), entry_ids, ts)
            return
        self.add_bitmap(ledger_id, entries)

    def is_live(self, ledger_id: int, entry_id: int, ts: int) -> bool:
        """True if the row ``(ts, ledger_id, entry_id)`` would be delivered now."""
        self.settle()
        if not self.contains(ledger_id, entry_id):
            return False
        times = self._retimed.get(ledger_id)
        return not times or times.get(entry_id, ts) == ts

    def take(self, ledger_id: int, entries: np.ndarray, ts: np.ndarray | None = None) -> Bitmap | None:
        """Untrack whichever rows of one ledger are live; return their entry ids as a bitmap.

        This is the delivery step: a position is delivered only if this call is
        the one that removes it, so duplicates in the queues are dropped here.
        """
        self.settle()
        self._touch(ledger_id)
        bm = self._ledgers.get(ledger_id)
        if bm is None:
            return None
        live = self._live_rows(ledger_id, entries, ts)
        if live is not None:
            entries = entries[live]
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
            if live is not None:
                for entry in list(self._retimed.get(ledger_id, ())):
                    if entry in hits:
                        self._forget_time(ledger_id, entry)
        return hits

    def present_mask(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of which rows are live (tracked, at their live time when ``ts`` is
        given). Does not change the set."""
        self.settle()
        mask = np.zeros(len(ledgers), dtype=bool)
        if not len(ledgers):
            return mask
        for ledger, rows in _ledger_rows(ledgers):
            bm = self._ledgers.get(ledger)
            if bm is None:
                continue
            if not isinstance(rows, slice) and len(rows) == 1:
                # One row (a bucket of many small ledgers): a scalar lookup beats building a bitmap.
                row = int(rows[0])
                entry = int(entries[row])
                if _fits(bm, entry) and entry in bm:
                    live = self._live_rows(ledger, entries[row:row + 1], None if ts is None else ts[row:row + 1])
                    mask[row] = live is None or bool(live[0])
                continue
            ents = entries[rows]
            wanted = bitmap_of(ents, wide=isinstance(bm, BitMap64))
            hits = bm & wanted
            if len(hits) == len(wanted):
                mask[rows] = True  # every row's entry is tracked: no per-row lookup needed
            elif hits:
                mask[rows] = np.isin(ents, np.asarray(hits.to_array() if isinstance(hits, BitMap)
                                                      else list(hits), dtype=np.uint64))
            else:
                continue
            # Either way, a re-added expired position is live only in its row of the current time.
            live = self._live_rows(ledger, ents, None if ts is None else ts[rows])
            if live is not None:
                mask[rows] &= live
        return mask

    def drop_ledgers_below(self, first_live_ledger: int) -> int:
        """Untrack every position of ledgers before ``first_live_ledger``; return how many."""
        self.settle()
        self._all_dirty = True
        dead = [l for l in self._ledgers if l < first_live_ledger]
        dropped = 0
        for ledger in dead:
            dropped += len(self._ledgers.pop(ledger))
        self._count -= dropped
        for ledger in [l for l in self._ghosts if l < first_live_ledger]:
            del self._ghosts[ledger]
        for ledger in [l for l in self._retimed if l < first_live_ledger]:
            del self._retimed[ledger]
        return dropped

    def drop_through(self, ledger_id: int, entry_id: int) -> int:
        """Untrack entries ``0..entry_id`` of one ledger; return how many."""
        self.settle()
        self._touch(ledger_id)
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

    def ledger_ids(self) -> np.ndarray:
        """The ledgers holding tracked positions, sorted (uint64)."""
        self.settle()
        ids = np.fromiter(self._ledgers, dtype=np.uint64, count=len(self._ledgers))
        ids.sort()
        return ids

    def ledger_count(self) -> int:
        """How many ledgers hold tracked positions (pending removals not applied: an upper bound)."""
        return len(self._ledgers)

    def take_ledgers(self, ledger_ids: list[int]) -> dict[int, Bitmap]:
        """Remove these ledgers' bitmaps from the set and return them (paged out: see
        :mod:`~bucketstore.engine.buckets.index_pager`). Their ghosts and live times stay."""
        self.settle()
        out = {}
        for ledger in ledger_ids:
            bm = self._ledgers.pop(ledger, None)
            if bm is not None:
                out[ledger] = bm
                self._count -= len(bm)
                self._touch(ledger)
        return out

    def ledgers(self) -> Iterator[tuple[int, Bitmap]]:
        self.settle()
        return iter(self._ledgers.items())

    def clear(self) -> None:
        self._ledgers.clear()
        self._count = 0
        self._ghosts.clear()
        self._retimed.clear()
        self._pending_l, self._pending_e, self._pending_n, self._pending_cols = [], [], 0, None
        self._all_dirty = True

    def memory_bytes(self) -> int:
        """Approximate bytes held by the bitmaps: their containers plus a per-ledger overhead."""
        self.settle()
        return sum(_bitmap_bytes(bm) + 120 for bm in self._ledgers.values())

    def _check(self) -> None:
        self.settle()
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


def sort_positions(ledgers: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (uint64 columns) sorted by (ledger, entry): one in-place sort of packed keys
    when both spans fit in 64 bits together, else a lexsort."""
    if len(ledgers) < 2:
        return ledgers, entries
    l0, e0 = int(ledgers.min()), int(entries.min())
    lb = (int(ledgers.max()) - l0).bit_length()
    eb = (int(entries.max()) - e0).bit_length()
    if lb + eb >= 64:
        order = np.lexsort((entries, ledgers))
        return ledgers[order], entries[order]
    key = (ledgers - np.uint64(l0)) << np.uint64(eb)
    key |= entries - np.uint64(e0)
    key.sort()
    out_e = (key & np.uint64((1 << eb) - 1)) + np.uint64(e0)
    key >>= np.uint64(eb)
    key += np.uint64(l0)
    return key, out_e


def _position_order(ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """The permutation that sorts rows by (ledger, entry, row number): one sort of packed keys
    when they fit in 64 bits, else a stable lexsort."""
    n = len(ledgers)
    l0, e0 = int(ledgers.min()), int(entries.min())
    lb = (int(ledgers.max()) - l0).bit_length()
    eb = (int(entries.max()) - e0).bit_length()
    rb = (n - 1).bit_length()
    if lb + eb + rb >= 64:
        return np.lexsort((entries, ledgers))
    key = (ledgers - np.uint64(l0)) << np.uint64(eb + rb)
    key |= (entries - np.uint64(e0)) << np.uint64(rb)
    key |= np.arange(n, dtype=np.uint64)
    key.sort()
    return (key & np.uint64((1 << rb) - 1)).astype(np.intp)


def _ledger_rows(ledgers: np.ndarray) -> Iterator[tuple[int, slice | np.ndarray]]:
    """Yield ``(ledger, its rows)`` in ledger order: a slice for the common one-ledger
    input, else index arrays from one stable sort (not one scan per ledger, which is
    quadratic when a bucket spans thousands of ledgers)."""
    if not len(ledgers):
        return
    first = ledgers[0]
    if ledgers[-1] == first and (ledgers == first).all():
        yield int(first), slice(None)
        return
    order = np.argsort(ledgers, kind="stable")
    ordered = ledgers[order]
    cuts = (np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()
    for a, b in zip([0, *cuts], [*cuts, len(order)]):
        yield int(ordered[a]), order[a:b]


def _group_by_ledger(ledgers: np.ndarray, entries: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(ledger, entries of that ledger)``; fast path for the common one-ledger batch."""
    for ledger, rows in _ledger_rows(ledgers):
        yield ledger, entries[rows]
