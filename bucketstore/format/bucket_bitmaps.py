"""The delayed-index bitmaps of a bucket snapshot's entry 0 (see :mod:`~bucketstore.format.snapshot`).

Per ledger, a roaring bitmap of entry ids, serialized in the portable roaring format
(``BitMap`` for 32-bit entry ids, ``BitMap64`` when one is 2**32 or more): built from
columns of positions, and held serialized (:class:`LedgerBitmaps`) until someone asks.
The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from typing import Union

import numpy as np
from pyroaring import BitMap, BitMap64

from .entry_lists import EntryLists
from .segment_codec import _BLOCK_ROWS

__all__ = ["BITMAP32", "BITMAP64", "EntryBitmap", "EntryLists", "LedgerBitmaps", "bitmaps_with_lists",
           "entry_columns", "flat_bitmaps", "ledger_bitmaps", "segment_bitmaps", "serialized_bitmaps", "split_counts",
           "split_lists", "union_bitmaps"]

#: Entry 0's width tags: the bitmap after the tag is a ``BitMap`` (32) or a ``BitMap64`` (64).
BITMAP32 = 32
BITMAP64 = 64
_U64 = np.dtype("<u8")

EntryBitmap = Union[BitMap, BitMap64]


#: Entry ids given to pyroaring per call: it holds the GIL while it builds, about 0.5 ms for
#: this many, so a maintenance thread building a bucket's bitmaps never keeps another thread
#: (a single add) waiting for longer than that.
_BUILD_CHUNK = 1 << 17


def _make_bitmap(entries: np.ndarray) -> EntryBitmap:
    if len(entries) and int(entries.max()) >= 1 << 32:
        bm: EntryBitmap = BitMap64(entries.tolist())
    else:
        # pyroaring builds fastest from array('I'); a numpy array takes its slow path.
        ids = entries.astype(np.uint32)
        bm = BitMap()
        for lo in range(0, len(ids), _BUILD_CHUNK):
            bm.update(array("I", ids[lo:lo + _BUILD_CHUNK].tobytes()))
    bm.run_optimize()
    bm.shrink_to_fit()
    return bm


def _range_bitmap(first: int, stop: int) -> EntryBitmap:
    """The bitmap of the entry ids ``first .. stop - 1``, as :func:`_make_bitmap` makes it, without
    handing pyroaring every id. Only for ranges whose first and last containers (65,536 ids
    each) hold 4 ids or more: a run then serializes smaller than an array, whichever way the
    bitmap was built; with 3 a run and an array tie, and the two builds keep different ones."""
    bm: EntryBitmap = BitMap64(range(first, stop)) if stop > 1 << 32 else BitMap(range(first, stop))
    bm.run_optimize()
    bm.shrink_to_fit()
    return bm


def _range_fits(first: int, stop: int) -> bool:
    """Whether :func:`_range_bitmap` serializes ``first .. stop - 1`` as :func:`_make_bitmap` does."""
    head = min(stop, (first | 0xFFFF) + 1) - first
    tail = stop - max(first, (stop - 1) & ~0xFFFF)
    return head >= 4 and tail >= 4


def segment_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, EntryBitmap]:
    """Per-ledger bitmaps of entry ids for one segment's columns."""
    order = np.lexsort((entries, ledgers))
    sl, se = ledgers[order], entries[order]
    cuts = np.flatnonzero(sl[1:] != sl[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(sl)]))
    return {int(sl[a]): _make_bitmap(se[a:b]) for a, b in zip(starts.tolist(), ends.tolist())}


def ledger_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, EntryBitmap]:
    """Per-ledger bitmaps of the entry ids of unsorted columns (a whole bucket's).

    Dense positions (few ledgers, most ids of their span) are marked in a grid instead
    (:func:`_dense_ledger_bitmaps`); others are sorted by (ledger, entry) first: pyroaring,
    which holds the GIL, builds a bitmap about four times faster from sorted ids
    (bench_maintenance ``steps``), and numpy's sort releases the GIL, so the maintenance
    thread leaves more of it to adders.
    """
    if not len(ledgers):
        return {}
    dense = _dense_ledger_bitmaps(ledgers, entries)
    if dense is not None:
        return dense
    first = ledgers[0]
    if (ledgers == first).all():
        return {int(first): _make_bitmap(np.sort(entries))}
    lo = int(ledgers.min())
    shift = 64 - (int(ledgers.max()) - lo).bit_length()
    if int(entries.max()) < 1 << shift:
        # One uint64 key per position, (ledger - lo) above the entry id: one vectorised sort.
        key = ledgers - np.uint64(lo)
        key <<= np.uint64(shift)
        key |= entries
        key.sort()
        sl = (key >> np.uint64(shift)) + np.uint64(lo)
        se = key & np.uint64((1 << shift) - 1)
    else:
        order = np.lexsort((entries, ledgers))
        sl, se = ledgers[order], entries[order]
    cuts = np.flatnonzero(sl[1:] != sl[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(sl)]
    return {int(sl[a]): _make_bitmap(se[a:b]) for a, b in zip(starts, ends)}


#: A bucket's positions are *dense* when the grid of its ledgers by its entry-id span has at
#: most this many cells a position: :func:`_dense_ledger_bitmaps` then marks them in a grid of
#: bytes instead of sorting them.
_DENSE_CELLS_PER_POSITION = 4


def _dense_ledger_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, EntryBitmap] | None:
    """:func:`ledger_bitmaps` of dense positions (few ledgers, each with most entry ids of a
    span: what a producer writes), without sorting them: each position marks its cell in a
    ledgers x entry-span grid of bytes, and each ledger's row of the grid gives its ids in
    order. One pass of numpy work that releases the GIL, where a sort of a merge's 4 M
    positions took four times as long; a ledger holding every id of its range becomes a
    bitmap of one range, with no id handed to pyroaring. None when the positions are not dense."""
    ledgers, entries = np.asarray(ledgers, dtype=_U64), np.asarray(entries, dtype=_U64)
    l0, e0, e1 = int(ledgers.min()), int(entries.min()), int(entries.max())
    rows, span = int(ledgers.max()) - l0 + 1, e1 - e0 + 1
    if rows * span > _DENSE_CELLS_PER_POSITION * len(ledgers) or e1 >= 1 << 32:
        return None
    cell = np.subtract(ledgers, np.uint64(l0))
    cell *= np.uint64(span)
    cell += entries
    cell -= np.uint64(e0)
    grid = np.zeros(rows * span, dtype=np.bool_)
    grid[cell.view(np.intp)] = True
    del cell
    out: dict[int, EntryBitmap] = {}
    for j in range(rows):
        row = grid[j * span:(j + 1) * span]
        first = int(row.argmax())
        if not row[first]:
            continue  # no position of this ledger
        last = span - 1 - int(row[::-1].argmax())
        if _range_fits(e0 + first, e0 + last + 1) and row[first:last + 1].all():
            out[l0 + j] = _range_bitmap(e0 + first, e0 + last + 1)
        else:
            out[l0 + j] = _make_bitmap(np.flatnonzero(row[first:last + 1]).astype(np.uint32) + np.uint32(e0 + first))
    return out


class LedgerBitmaps(Mapping[int, EntryBitmap]):
    """Ledger id -> roaring bitmap of entry ids, held as entry 0's serialized bitmaps.

    A seal writes a bucket's bitmaps and never reads them back (the tracker-wide
    index has the positions already), so :func:`serialized_bitmaps` makes their
    portable serializations directly; the bitmap objects are deserialized only
    if someone reads this mapping.
    """

    __slots__ = ("_ledgers", "_flat", "_made", "_rest", "_lists", "_unpack", "_loaded", "_counts", "cardinality")

    def __init__(self, flat: list[object] | None, cardinality: int, lists: EntryLists | None = None,
                 rest: Mapping[int, EntryBitmap] | list[object] | None = None, *,
                 unpack: Callable[[], EntryLists] | None = None, listed: list[int] | None = None,
                 counts: np.ndarray | None = None) -> None:
        #: ``[ledger_id, width, blob, ...]`` in ascending ledger order: entry 0's bitmap list. None:
        #: not made yet, from ``rest`` (ledger -> bitmap, or a bitmap list of the unlisted ledgers)
        #: and the lists (see :func:`bitmaps_with_lists`).
        self._flat = flat
        self._made = flat is None  # made here: dropped once the bitmaps are loaded (they say the same)
        self._rest = rest
        self._lists = lists
        #: A decoded entry 0's lists, decoded again when needed: holding the columns' bytes costs
        #: about 2 bytes an index, their arrays 8 to 16.
        self._unpack = unpack
        if flat is not None:
            self._ledgers = flat[0::3]
        else:
            assert rest is not None and (listed is not None or lists is not None)
            ids = listed if listed is not None else lists.ledgers.tolist()  # type: ignore[union-attr]
            rest_ids = rest[0::3] if isinstance(rest, list) else list(rest)
            self._ledgers = sorted([*rest_ids, *ids]) if rest_ids else ids
        self._loaded: dict[int, EntryBitmap] | None = None
        #: A version-5 entry 0's: the listed ledgers' counts (``listed``'s order), all it stores of them.
        self._counts = counts
        #: The number of positions, the sum of the bitmaps' cardinalities.
        self.cardinality = cardinality

    @property
    def lists(self) -> EntryLists | None:
        """When known, the ledgers whose bitmaps are array containers only (what entry 0 stores as
        entry-id lists from version 4) with their entry ids, so that encoding entry 0 need not
        parse their serializations back; None: :func:`split_lists` parses them."""
        if self._lists is None and self._unpack is not None:
            return self._unpack()
        return self._lists

    def flat(self) -> list[object]:
        """Entry 0's bitmap list, ``[ledger_id, width, blob, ...]``."""
        if self._flat is None:
            if self._loaded is not None:
                self._flat = flat_bitmaps(self._loaded)
            else:
                assert self._rest is not None
                lists = self.lists
                assert lists is not None
                self._flat = _merged_flat(self._rest, lists)
        return self._flat

    def _load(self) -> dict[int, EntryBitmap]:
        if self._loaded is None:
            flat = self.flat()
            self._loaded = {flat[j]: (BitMap64 if flat[j + 1] == BITMAP64 else BitMap).deserialize(flat[j + 2])
                            for j in range(0, len(flat), 3)}
            if self._made:
                # Held now as bitmaps (about 1.3 bytes an index for a sparse bucket): let the
                # serializations and the lists' bytes go.
                self._flat = self._rest = self._lists = self._unpack = self._counts = None
        return self._loaded

    def __getitem__(self, ledger: int) -> EntryBitmap:
        return self._load()[ledger]

    def items(self) -> ItemsView[int, EntryBitmap]:
        # The loaded dict's own view: Mapping's would look every ledger up through __getitem__.
        return self._load().items()

    def __iter__(self) -> Iterator[int]:
        return iter(self._ledgers)

    def __len__(self) -> int:
        return len(self._ledgers)


# The portable 32-bit roaring serialization (RoaringFormatSpec), for the ledgers made
# by serialized_bitmaps' fast path: every container an array container.
_COOKIE_NO_RUNS = 12346
_ARRAY_MAX = 4096  # CRoaring keeps up to 4096 values in an array container, more in a bitset


def serialized_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> LedgerBitmaps:
    """Per-ledger bitmaps of the positions in these columns (any order), serialized as
    entry 0 stores them: each exactly what ``_make_bitmap(...).serialize()`` gives.

    The common ledger of a sparse bucket (a few hundred entry ids, few of them
    consecutive) is a roaring bitmap of array containers only; those are laid out
    for all ledgers at once with array operations. A ledger whose bitmap has a run
    or a bitset container after run optimization, or an entry id of 2**32 or more,
    is built by pyroaring, as before. Repeated positions count once.
    """
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    if not len(ledgers):
        return LedgerBitmaps([], 0)
    if (int(ledgers.max()) - int(ledgers.min()) + 1) * _ARRAY_MAX < len(ledgers):
        # Few ledgers, thousands of positions each (a dense bucket): their containers are
        # runs or bitsets, pyroaring's to make, and sorting every position would cost more.
        bitmaps = ledger_bitmaps(ledgers, entries)
        flat = flat_bitmaps(bitmaps)
        out = LedgerBitmaps(flat, sum(len(bm) for bm in bitmaps.values()))
        out._loaded = bitmaps
        return out
    sl, se = _positions_in_order(ledgers, entries)
    flat: list[object] = []
    lists: list[EntryLists] = []
    total, lo, n = 0, 0, len(sl)
    # Blocks of whole ledgers (see segment_codec._BLOCK_ROWS: temporaries the allocator reuses).
    while lo < n:
        hi = n if n - lo <= _BLOCK_ROWS else int(np.searchsorted(sl, sl[lo + _BLOCK_ROWS], side="left"))
        if hi == lo:  # one ledger of more than _BLOCK_ROWS positions
            hi = int(np.searchsorted(sl, sl[lo], side="right"))
        total += _bitmap_block(sl[lo:hi], se[lo:hi], flat, lists)
        lo = hi
    # ``flat`` holds the other ledgers' bitmaps; the listed ones are serialized only if asked for
    # (a version-4 entry 0 stores them as lists).
    return LedgerBitmaps(None, total, _joined(lists), flat)


def _bitmap_block(sl: np.ndarray, se: np.ndarray, flat: list[object], lists: list[EntryLists] | None = None) -> int:
    """Append ``[ledger, width, blob, ...]`` for whole ledgers' sorted positions; return their count.
    Given ``lists``, append to it the array-only ledgers' entry ids (:class:`EntryLists`) instead,
    and to ``flat`` only the others."""
    n = len(sl)
    if n > 1:  # drop repeated positions: a bitmap is a set
        fresh = np.ones(n, dtype=np.bool_)
        fresh[1:] = (sl[1:] != sl[:-1]) | (se[1:] != se[:-1])
        if not fresh.all():
            sl, se = sl[fresh], se[fresh]
            n = len(sl)
    new_ledger = np.ones(n, dtype=np.bool_)
    np.not_equal(sl[1:], sl[:-1], out=new_ledger[1:])
    first_row = np.flatnonzero(new_ledger)
    per_ledger = np.diff(first_row, append=n)
    ledger_ids = sl[first_row]
    high = se >> np.uint64(16)
    new_container = new_ledger.copy()
    new_container[1:] |= high[1:] != high[:-1]
    first_in_container = np.flatnonzero(new_container)
    cards = np.diff(first_in_container, append=n)
    # A run starts wherever an entry id does not follow the one before it in its container.
    run_start = new_container.copy()
    run_start[1:] |= se[1:] != se[:-1] + np.uint64(1)
    runs = np.add.reduceat(run_start.astype(np.int64), first_in_container)
    # run_optimize keeps an array container unless runs are smaller: 2 + 4 runs < 2 + 2 card.
    array_like = (cards <= _ARRAY_MAX) & (2 * runs >= cards)
    container_ledger = np.cumsum(new_ledger)[first_in_container] - 1
    fast = np.logical_and.reduceat(array_like, np.flatnonzero(new_ledger[first_in_container]))
    wide = np.maximum.reduceat(se, first_row) >= np.uint64(1 << 32)
    fast &= ~wide
    blobs: list[bytes] = [b""] * len(ledger_ids)
    if lists is not None:
        rows = np.repeat(fast, per_ledger)
        lists.append(EntryLists(ledger_ids[fast], per_ledger[fast].astype(_U64), se[rows].astype(np.uint32)))
        for j in np.flatnonzero(~fast).tolist():
            lo = int(first_row[j])
            flat += [int(ledger_ids[j]), BITMAP64 if wide[j] else BITMAP32,
                     _make_bitmap(se[lo:lo + int(per_ledger[j])]).serialize()]
        return n
    if fast.any():
        _array_only_blobs(blobs, fast, se, first_row, per_ledger, first_in_container, cards, container_ledger, high)
    for j in np.flatnonzero(~fast).tolist():
        lo = int(first_row[j])
        blobs[j] = _make_bitmap(se[lo:lo + int(per_ledger[j])]).serialize()
    for ledger, is_wide, blob in zip(ledger_ids.tolist(), wide.tolist(), blobs):
        flat += [ledger, BITMAP64 if is_wide else BITMAP32, blob]
    return n


def _positions_in_order(ledgers: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The columns sorted by (ledger, entry): one sort of packed keys when the ranges fit 64 bits."""
    l0, e0 = ledgers.min(), entries.min()
    lb = (int(ledgers.max()) - int(l0)).bit_length()
    eb = (int(entries.max()) - int(e0)).bit_length()
    if lb + eb > 64:
        order = np.lexsort((entries, ledgers))
        return ledgers[order], entries[order]
    if lb == 0:
        return ledgers.copy(), np.sort(entries)
    # Two buffers in all (fresh pages are dear on a VM): the key, sorted in place, becomes
    # the entry column, and the scratch buffer the ledger column.
    key = np.subtract(ledgers, l0)
    scratch = np.empty_like(key)
    if eb:
        key <<= np.uint64(eb)
        key |= np.subtract(entries, e0, out=scratch)
    key.sort()
    sl = np.right_shift(key, np.uint64(eb), out=scratch)
    sl += l0
    if eb:
        key &= np.uint64((1 << eb) - 1)
        key += e0
        return sl, key
    return sl, np.full(len(key), e0, dtype=_U64)


def _array_only_blobs(blobs: list[bytes], fast: np.ndarray, se: np.ndarray, first_row: np.ndarray,
                      per_ledger: np.ndarray, first_in_container: np.ndarray, cards: np.ndarray,
                      container_ledger: np.ndarray, high: np.ndarray) -> None:
    """Fill ``blobs[j]`` for the ``fast`` ledgers: portable roaring bitmaps of array containers only.

    Layout (no run containers): cookie u32 = 12346, container count u32, per container
    its key u16 and cardinality - 1 u16, per container its byte offset u32, then each
    container's sorted low 16 bits as u16. Every field is a whole number of u16, so
    all the ledgers are written into one u16 buffer and sliced.
    """
    chosen = np.flatnonzero(fast)
    containers = np.bincount(container_ledger, minlength=len(fast))
    c = containers[chosen].astype(np.int64)
    size16 = 4 + 4 * c + per_ledger[chosen]
    base = np.cumsum(size16) - size16
    buf = np.zeros(int(size16.sum()), dtype="<u2")
    buf[base] = _COOKIE_NO_RUNS
    buf[base + 2] = c & 0xFFFF
    buf[base + 3] = c >> 16
    # Containers of the chosen ledgers, in order; q = the container's index in its ledger.
    where = np.full(len(fast), -1, dtype=np.int64)
    where[chosen] = np.arange(len(chosen))
    slot = where[container_ledger]
    keep = slot >= 0
    k_slot = slot[keep]
    k_first = first_in_container[keep]
    k_card = cards[keep]
    k_ledger_first_container = np.cumsum(containers) - containers  # global container index of each ledger's first
    q = np.flatnonzero(keep) - k_ledger_first_container[container_ledger[keep]]
    k_base, k_c = base[k_slot], c[k_slot]
    header = k_base + 4 + 2 * q
    buf[header] = high[k_first].astype(np.uint16)
    buf[header + 1] = (k_card - 1).astype(np.uint16)
    # Byte offset of each container: after the 8-byte preamble and 8 bytes of header per container,
    # plus the values of the ledger's earlier containers (first row of the container - first row of the ledger).
    offset = 8 + 8 * k_c + 2 * (k_first - first_row[container_ledger[keep]])
    at = k_base + 4 + 2 * k_c + 2 * q
    buf[at] = offset & 0xFFFF
    buf[at + 1] = offset >> 16
    # Values: the ledger's entry ids in order, low 16 bits, after its headers.
    rows_per = per_ledger[chosen]
    rows = np.repeat(first_row[chosen], rows_per) + (np.arange(int(rows_per.sum())) -
                                                      np.repeat(np.cumsum(rows_per) - rows_per, rows_per))
    dest = np.repeat(base + 4 + 4 * c - first_row[chosen], rows_per) + rows
    buf[dest] = (se[rows] & np.uint64(0xFFFF)).astype(np.uint16)
    blob = buf.tobytes()
    for j, a, b in zip(chosen.tolist(), (2 * base).tolist(), (2 * (base + size16)).tolist()):
        blobs[j] = blob[a:b]


def union_bitmaps(parts: Iterable[Mapping[int, EntryBitmap]]) -> dict[int, EntryBitmap]:
    """The per-ledger union of several ``ledger -> bitmap`` maps (new bitmaps; 64-bit where
    any part is)."""
    union: dict[int, EntryBitmap] = {}
    for bitmaps in parts:
        for ledger, bm in bitmaps.items():
            have = union.get(ledger)
            if have is None:
                union[ledger] = bm.copy()
            elif type(have) is type(bm):
                have |= bm
            else:
                union[ledger] = BitMap64(have) | BitMap64(bm)
    return union


def flat_bitmaps(bitmaps: Mapping[int, EntryBitmap]) -> list[object]:
    if isinstance(bitmaps, LedgerBitmaps):
        return bitmaps.flat()
    flat: list[object] = []
    for ledger in sorted(bitmaps):
        bm = bitmaps[ledger]
        flat += [ledger, BITMAP64 if isinstance(bm, BitMap64) else BITMAP32, bm.serialize()]
    return flat


def _joined(parts: list[EntryLists]) -> EntryLists:
    if not parts:
        empty = np.zeros(0, dtype=_U64)
        return EntryLists(empty, empty, empty)
    if len(parts) == 1:
        return parts[0]
    return EntryLists(*(np.concatenate(c) for c in zip(*parts)))


def split_lists(bitmaps: Mapping[int, EntryBitmap]) -> tuple[list[object], EntryLists]:
    """Split a bucket's bitmaps as entry 0 stores them from version 4: the ledgers whose portable
    serialization has array containers only (no run, no bitset; 32-bit), as :class:`EntryLists`,
    and the others as ``[ledger_id, width, blob, ...]``, ascending.

    The choice is the serialization's, so it is the same however the bitmaps were made; for
    :func:`serialized_bitmaps`' result the lists are known already and nothing is parsed."""
    known = bitmaps.lists if isinstance(bitmaps, LedgerBitmaps) else None
    if known is not None:
        assert isinstance(bitmaps, LedgerBitmaps)
        if bitmaps._flat is None and bitmaps._rest is not None:
            # A seal's or a decoded entry 0's: the listed ledgers' serializations were never made.
            rest = bitmaps._rest if isinstance(bitmaps._rest, list) else flat_bitmaps(bitmaps._rest)
        else:
            flat = bitmaps.flat()
            listed = set(known.ledgers.tolist())
            rest = [v for j in range(0, len(flat), 3) if flat[j] not in listed for v in flat[j:j + 3]]
        # The known lists are the ledgers serialized_bitmaps' vectorised path made; pyroaring made
        # the others, where a run and an array of equal size (3 ids in a row) stay an array: rare.
        if not any(width == BITMAP32 and _array_only_entries(blob) is not None  # type: ignore[arg-type]
                   for width, blob in zip(rest[1::3], rest[2::3])):
            return rest, known
    flat = flat_bitmaps(bitmaps)
    rest = []
    ledgers: list[int] = []
    counts: list[int] = []
    ids: list[np.ndarray] = []
    for j in range(0, len(flat), 3):
        ledger, width, blob = flat[j:j + 3]
        entries = _array_only_entries(blob) if width == BITMAP32 else None  # type: ignore[arg-type]
        if entries is None:
            rest += [ledger, width, blob]
        else:
            ledgers.append(ledger)  # type: ignore[arg-type]
            counts.append(len(entries))
            ids.append(entries)
    lists = EntryLists(np.array(ledgers, dtype=_U64), np.array(counts, dtype=_U64),
                       np.concatenate(ids) if ids else np.zeros(0, dtype=_U64))
    return rest, lists


def split_counts(bitmaps: Mapping[int, EntryBitmap]) -> tuple[list[object], EntryLists]:
    """What a version-5 entry 0 stores of ``bitmaps``: :func:`split_lists`' bitmaps, and the listed
    ledgers with their counts (no ids). A decoded version-5 entry 0's are known: no id is read."""
    if isinstance(bitmaps, LedgerBitmaps) and bitmaps._counts is not None and bitmaps._rest is not None:
        rest = bitmaps._rest if isinstance(bitmaps._rest, list) else flat_bitmaps(bitmaps._rest)
        mapped = set(rest[0::3])
        ledgers = np.array([k for k in bitmaps._ledgers if k not in mapped], dtype=_U64)
        return rest, EntryLists(ledgers, bitmaps._counts, np.zeros(0, dtype=_U64))
    rest, lists = split_lists(bitmaps)
    return rest, EntryLists(lists.ledgers, lists.counts, np.zeros(0, dtype=_U64))


_PREAMBLE = struct.Struct("<II")  # cookie, container count


def _array_only_entries(blob: bytes) -> np.ndarray | None:
    """The entry ids of a portable 32-bit serialization made of array containers only, else None."""
    if len(blob) < _PREAMBLE.size:
        return None
    cookie, containers = _PREAMBLE.unpack_from(blob)
    if cookie != _COOKIE_NO_RUNS or not containers:
        return None
    header = np.frombuffer(blob, dtype="<u2", count=2 * containers, offset=_PREAMBLE.size).reshape(-1, 2)
    cards = header[:, 1].astype(np.int64) + 1
    if (cards > _ARRAY_MAX).any():
        return None  # a bitset container
    values = np.frombuffer(blob, dtype="<u2", count=int(cards.sum()), offset=_PREAMBLE.size + 8 * containers)
    return (np.repeat(header[:, 0].astype(_U64), cards) << np.uint64(16)) | values.astype(_U64)


def bitmaps_with_lists(rest: Mapping[int, EntryBitmap], lists: EntryLists,
                       unpack: Callable[[], EntryLists] | None = None) -> LedgerBitmaps:
    """A bucket's bitmaps from entry 0's two forms (version 4): bitmaps (``rest``, ledger -> bitmap)
    and entry-id lists (checked already: ledgers ascending and apart from ``rest``'s, entry ids
    ascending within each ledger). The lists' bitmaps are made (serialized with array operations,
    then deserialized) only if someone reads them: opening a bucket for its segments, or
    checking entry 0, needs neither. Given ``unpack`` (which gives ``lists`` again), the lists'
    arrays are not kept: ``unpack`` is called when they are needed."""
    total = sum(len(bm) for bm in rest.values()) + len(lists.entries)
    if unpack is None:
        return LedgerBitmaps(None, total, lists, rest)
    return LedgerBitmaps(None, total, None, rest, unpack=unpack, listed=lists.ledgers.tolist())


def _merged_flat(rest: Mapping[int, EntryBitmap] | list[object], lists: EntryLists) -> list[object]:
    flat: list[object] = []
    if len(lists.ledgers):
        _bitmap_block(np.repeat(lists.ledgers, lists.counts.astype(np.int64)), lists.entries.astype(_U64), flat)
    if rest:
        extra = rest if isinstance(rest, list) else flat_bitmaps(rest)
        merged = sorted(zip(flat[0::3] + extra[0::3], flat[1::3] + extra[1::3], flat[2::3] + extra[2::3]),
                        key=lambda t: t[0])  # type: ignore[arg-type, return-value]
        flat = [v for t in merged for v in t]
    return flat


def entry_columns(positions: Mapping[int, EntryBitmap]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every ledger's entry ids as one column (ascending ledgers, each one's ids ascending) and each
    ledger's count, when ``positions`` holds them as lists (a version-4 entry 0 whose ledgers are
    all listed, not read as bitmaps yet): no bitmap is made. None otherwise."""
    if not isinstance(positions, LedgerBitmaps) or positions._loaded is not None:
        return None
    lists = positions.lists
    if lists is None or len(lists.ledgers) != len(positions):
        return None
    return lists.entries, lists.counts.astype(np.int64)
