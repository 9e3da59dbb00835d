"""Membership of unopened sealed buckets, answered from disk one ledger at a time.

A sealed bucket recovered from its catalog summary stays *unopened* until an
operation must change its positions (delivery, an add or expiry on its ledgers,
a trim through it, a merge): only then are its per-ledger bitmaps put in the
tracker-wide index, where they cost about 500 bytes a ledger. A question changes
nothing, so ``contains_message`` on an unopened bucket's ledger does not open it:
this module answers it.

Reading entry 0 for every question would cost about a millisecond per question (a
50,000-position bucket), and keeping the decoded bitmaps is the memory this avoids.
So the first question about a bucket reads its entry 0 once and *spills* its live
positions — per ledger, its entry ids sorted, as fixed-width little-endian integers
(u16, u32 or u64, the narrowest that holds the bucket's largest), or, for a
ledger of long runs of consecutive ids (a dense one), as its serialized roaring
bitmap when that is smaller — to one anonymous temporary file per tracker (a
ledger of thousands of ids in a few runs stays in memory as such a bitmap: a few
hundred bytes, under 0.2 byte an id). Memory keeps per bucket a directory only:
where each ledger's ids start in the spill, 4 bytes a ledger, and its ledgers (as
offsets from the bucket's first ledger, 4 bytes more) unless they are every ledger
of their stretch, as in a sparse bucket. A question then costs a bisect in the
directory (or none), one ``pread`` of that ledger's ids (served by the page cache,
which the kernel may reclaim; it is not the process's memory) and a byte search
in them; questions on the same ledger in a row (a broker asks of the entries it
reads, in order) read its ids once.

The answers are exact because nothing changes an unopened bucket's positions:
every operation that would opens the bucket first, and opening (or deleting)
it drops its spilled copy (:meth:`SpilledMembership.forget`). The directories
are bounded by a byte budget: past it, the least recently asked bucket's
directory is dropped, and its next question reads entry 0 again. The spill file
is compacted once most of it belongs to dropped buckets; it has no name, so
nothing of it outlives the process, and a failure to write it (a full disk) only
makes the tracker open the bucket instead, as before this module.
"""

from __future__ import annotations

import logging
import os
import tempfile
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
from pyroaring import BitMap

from ...format.bucket_bitmaps import entry_columns

__all__ = ["SpilledMembership", "DIRECTORY_BUDGET"]

log = logging.getLogger("bucketstore")

#: Bytes of directories kept (4 to 8 a ledger: 16 MiB covers 2 to 4 million ledgers of spilled buckets).
DIRECTORY_BUDGET = 16 << 20
#: The spill file is rewritten when its dropped regions exceed both its live bytes and this.
_COMPACT_MIN = 16 << 20
_U32 = 1 << 32
_WIDTH = {"H": 2, "I": 4, "Q": 8}
#: A ledger of at least this many ids may be kept as a roaring bitmap (when that is smaller).
_ROARING_MIN = 64
#: ... and kept in memory when it holds this many ids at least in at most this many bytes.
_HELD_MIN = 1024
_HELD_MAX_BYTES = 256


class _Spilled:
    """One bucket's directory: ledger offsets from ``start``, and where their ids lie in the spill."""

    __slots__ = ("start", "ledgers", "offsets", "code", "base", "size", "roaring", "pinned")

    def __init__(self, start: int, ledgers: array | None, offsets: array, code: str, base: int, size: int,
                 roaring: dict[int, BitMap | None] | None, pinned: bool = False) -> None:
        self.start = start
        # Sorted ledger - start; None when they are 0, 1, 2, ... (every ledger of the stretch from
        # ``start`` holds positions, as in a sparse bucket): the ledger's index is its offset then.
        self.ledgers = ledgers
        self.offsets = offsets   # ledger count + 1 byte offsets, relative to base
        self.code = code         # the ids' array type code: 'H', 'I' or 'Q'
        self.base = base
        self.size = size
        # Ledgers (by index) kept as roaring bitmaps: in memory, or (None) serialized in the spill.
        self.roaring = roaring
        # The only copy of a paged-out bucket's membership (see index_pager): never dropped
        # under the budget, only by forget().
        self.pinned = pinned

    def keys(self) -> array | range:
        """The ledgers, as offsets from ``start``."""
        return range(len(self.offsets) - 1) if self.ledgers is None else self.ledgers

    @property
    def nbytes(self) -> int:
        return ((0 if self.ledgers is None else self.ledgers.itemsize * len(self.ledgers))
                + self.offsets.itemsize * len(self.offsets)
                + sum(100 if bm is None else 200 + len(bm.serialize()) for bm in (self.roaring or {}).values())
                + 200)  # the object and its arrays' headers


class SpilledMembership:
    """The spilled positions of unopened sealed buckets, keyed by bucket (its ledger file id).

    Not thread-safe by itself: the owning tracker's lock guards it.

    :param directory: where the anonymous spill file is made (the store's ledger
        directory: the same disk as the data); the system's temporary directory if
        that fails (a read-only store).
    :param budget: bytes of directories kept in memory (default: :data:`DIRECTORY_BUDGET`).
    """

    def __init__(self, directory: str | None, budget: int | None = None) -> None:
        self._directory = directory
        self.budget = DIRECTORY_BUDGET if budget is None else budget
        self._file: Any = None
        self._end = 0          # bytes written to the spill file
        self._live = 0         # of which belong to buckets still spilled
        self._by_bucket: OrderedDict[int, _Spilled] = OrderedDict()  # least recently asked first
        self._resident = 0
        self._pinned = 0       # of which belong to pinned (paged-out) buckets, outside the budget
        # The directory, ledger index and ids of the last ledger read by contains().
        self._last: tuple[_Spilled, int, bytes] | None = None
        #: Counters for ``stats()``: entry 0 reads that spilled a bucket, questions answered,
        #: directories dropped under the budget, spill failures (the bucket was opened instead).
        self.spills = self.questions = self.evictions = self.failures = 0
        #: Buckets not spilled because each of their ledgers is a few runs (opened instead).
        self.dense = 0

    def __len__(self) -> int:
        return len(self._by_bucket)

    def contains(self, bucket_id: int, ledger_id: int, entry_id: int) -> bool | None:
        """Whether the spilled bucket holds the position; None when it is not spilled."""
        rec = self._by_bucket.get(bucket_id)
        if rec is None:
            return None
        if not rec.pinned:  # (a pinned directory is never dropped: its place in the order is moot)
            self._by_bucket.move_to_end(bucket_id)
        self.questions += 1
        width = _WIDTH[rec.code]
        if entry_id >> (8 * width):
            return False  # wider than every id of the bucket (its roaring-kept ledgers' too)
        i = ledger_id - rec.start
        ledgers = rec.ledgers
        if ledgers is None:
            if i < 0 or i >= len(rec.offsets) - 1:
                return False
        else:
            key, i = i, bisect_left(ledgers, i)
            if i == len(ledgers) or ledgers[i] != key:
                return False
        last = self._last
        if last is not None and last[0] is rec and last[1] == i:
            raw = last[2]  # the ledger asked last: a broker asks of the entries it reads, in order
        else:
            lo, hi = rec.offsets[i], rec.offsets[i + 1]
            raw = os.pread(self._file.fileno(), hi - lo, rec.base + lo) if hi > lo else b""
            if len(raw) != hi - lo:
                raise OSError(f"spill file {self._file.name!r}: short read at {rec.base + lo}")
            # (Held with its directory, which it is compared by: a directory forgotten and made
            # again for the same bucket is another object, so this never answers for it.)
            self._last = (rec, i, raw)
        if rec.roaring is not None and i in rec.roaring:
            held = rec.roaring[i]
            if held is None:
                held = BitMap.deserialize(raw)
            return entry_id < _U32 and entry_id in held
        # The ids are sorted fixed-width integers: a byte search for the entry's encoding, kept
        # only at a multiple of the width, is exact, and cheaper in Python than decoding them.
        key_bytes = entry_id.to_bytes(width, "little")
        at = raw.find(key_bytes)
        while at > 0 and at % width:
            at = raw.find(key_bytes, at + 1)
        return at >= 0

    def positions(self, bucket_id: int) -> dict[int, np.ndarray | BitMap]:
        """Every spilled position of a bucket, ``ledger -> entry ids`` (a uint64 column, or a
        32-bit roaring bitmap for a ledger kept as one), read with one ``pread``."""
        rec = self._by_bucket[bucket_id]
        raw = os.pread(self._file.fileno(), rec.size, rec.base) if rec.size else b""
        if len(raw) != rec.size:
            raise OSError(f"spill file {self._file.name!r}: short read at {rec.base}")
        dtype = {"H": "<u2", "I": "<u4", "Q": "<u8"}[rec.code]
        out: dict[int, np.ndarray | BitMap] = {}
        offsets, roaring = rec.offsets, rec.roaring or {}
        for i, key in enumerate(rec.keys()):
            lo, hi = offsets[i], offsets[i + 1]
            if i in roaring:
                held = roaring[i]
                out[rec.start + key] = held.copy() if held is not None else BitMap.deserialize(raw[lo:hi])
            else:
                out[rec.start + key] = np.frombuffer(raw, dtype=dtype, count=(hi - lo) // np.dtype(dtype).itemsize,
                                                     offset=lo).astype(np.uint64)
        return out

    def add(self, bucket_id: int, start: int, positions: Mapping[int, Any], pinned: bool = False) -> bool:
        """Spill a bucket's live positions (``ledger -> bitmap of entry ids``). False when it is
        not spilled and the caller should open the bucket instead: every ledger is a few runs
        (a dense bucket, as small in the index), or the spill file could not be written (logged).

        ``pinned``: the spill is the only copy (a bucket paged out of the index): its directory
        is kept whatever the budget, until :meth:`forget`."""
        self.forget(bucket_id)
        ledgers = sorted(positions)
        # A version-4 entry 0 holds a sparse bucket's ids as lists: taken as they are, no bitmap made.
        columns = entry_columns(positions)
        bitmaps: list[Any] = [] if columns is not None else [positions[ledger] for ledger in ledgers]
        ids, counts = columns if columns is not None else _entry_ids(bitmaps)
        top = int(ids.max()) if len(ids) else 0
        code, dtype = ("H", "<u2") if top < 1 << 16 else ("I", "<u4") if top < _U32 else ("Q", "<u8")
        width = np.dtype(dtype).itemsize
        sizes = counts * width
        # A ledger of long runs of consecutive ids is kept as its serialized 32-bit roaring
        # bitmap, a few bytes a run, rather than as its ids; one of thousands of ids in a few
        # runs stays in memory as that bitmap (about 200 bytes, under 0.2 byte an id).
        roaring: dict[int, bytes] = {}              # ledger index -> its bytes in the spill
        held: dict[int, BitMap | None] = {}         # ledger index -> bitmap in memory, or None
        # (Listed ledgers are array containers even run-optimised: never smaller as roaring.)
        for i in np.flatnonzero(counts >= _ROARING_MIN).tolist() if columns is None else []:
            bm = bitmaps[i]
            if isinstance(bm, BitMap) and bm.max() - bm.min() < 2 * len(bm):
                runs = bm.copy()
                runs.run_optimize()
                packed = runs.serialize()
                if len(packed) < sizes[i]:
                    if len(bm) >= _HELD_MIN and len(packed) <= _HELD_MAX_BYTES:
                        runs.shrink_to_fit()
                        held[i], roaring[i] = runs, b""
                    else:
                        held[i], roaring[i] = None, packed
        if ledgers and len(held) == len(ledgers) and all(bm is not None for bm in held.values()):
            # Every ledger a few runs (a dense bucket): the index would hold it in as few bytes
            # and answer faster; the caller opens it (or keeps it resident).
            if not pinned:
                self.dense += 1
            return False
        column = ids.astype(dtype)
        if roaring:
            cuts = np.cumsum(counts).tolist()
            chunks = [roaring[i] if i in roaring else column[a:b].tobytes()
                      for i, (a, b) in enumerate(zip([0, *cuts], cuts))]
            sizes = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
            blob = b"".join(chunks)
        else:
            blob = column.tobytes()
        offsets = np.zeros(len(ledgers) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        try:
            base = self._write(blob)
        except OSError as exc:
            self.failures += 1
            log.warning("membership spill file failed (%s): opening the bucket instead", exc)
            return False
        keys = [ledger - start for ledger in ledgers]
        if keys and keys[-1] - keys[0] == len(keys) - 1:
            start, keys_array = ledgers[0], None  # every ledger of the stretch: no keys to keep
        else:
            keys_array = array("I" if not keys or keys[-1] < _U32 else "Q", keys)
        rec = _Spilled(start, keys_array,
                       array("I" if len(blob) < _U32 else "Q", offsets.tolist()), code, base, len(blob),
                       held or None, pinned)
        self._by_bucket[bucket_id] = rec
        self._resident += rec.nbytes
        self._live += len(blob)
        if pinned:
            self._pinned += rec.nbytes
            return True
        self.spills += 1
        if self._resident - self._pinned > self.budget:
            # The least recently asked unpinned directories go first; the one just made stays.
            for victim in [b for b, r in self._by_bucket.items() if not r.pinned and b != bucket_id]:
                if self._resident - self._pinned <= self.budget:
                    break
                self._drop(victim)
                self.evictions += 1
        return True

    def forget(self, bucket_id: int) -> None:
        """Drop a bucket's spilled copy (it is being opened, or it is gone)."""
        if bucket_id in self._by_bucket:
            self._drop(bucket_id)

    def _drop(self, bucket_id: int) -> None:
        rec = self._by_bucket.pop(bucket_id)
        if self._last is not None and self._last[0] is rec:
            self._last = None
        self._resident -= rec.nbytes
        if rec.pinned:
            self._pinned -= rec.nbytes
        self._live -= rec.size
        if not self._by_bucket:
            self._end = self._live = 0  # the next spill starts the file afresh
            if self._file is not None:
                self._file.truncate(0)

    def _write(self, blob: bytes) -> int:
        if self._file is None:
            self._file = self._make_file()
        elif self._end - self._live > max(self._live, _COMPACT_MIN):
            self._compact()
        base = self._end
        if blob:
            written = os.pwrite(self._file.fileno(), blob, base)
            if written != len(blob):
                raise OSError(f"spill file: short write ({written} of {len(blob)} bytes)")
        self._end += len(blob)
        return base

    def _make_file(self) -> Any:
        if self._directory is not None:
            try:
                return tempfile.TemporaryFile(dir=self._directory, prefix=".membership-")
            except OSError:
                pass  # a read-only store's directory: the system's temporary directory will do
        return tempfile.TemporaryFile(prefix="bucketstore-membership-")

    def _compact(self) -> None:
        """Copy the spilled buckets' regions to a new file, dropping the regions of forgotten ones."""
        old, new = self._file, self._make_file()
        bases, end = [], 0
        try:
            for rec in self._by_bucket.values():
                if rec.size:
                    data = os.pread(old.fileno(), rec.size, rec.base)
                    if len(data) != rec.size or os.pwrite(new.fileno(), data, end) != rec.size:
                        raise OSError("spill file: short read or write while compacting")
                bases.append(end)
                end += rec.size
        except BaseException:
            new.close()  # the old file and every directory stay as they were
            raise
        for rec, base in zip(self._by_bucket.values(), bases):
            rec.base = base
        self._file, self._end = new, end
        old.close()

    def resident_bytes(self) -> int:
        """Bytes of directories held in memory."""
        return self._resident

    def spill_bytes(self) -> int:
        """Bytes of the spill file (on disk, in the page cache at most)."""
        return self._end

    def close(self) -> None:
        self._by_bucket.clear()
        self._last = None
        self._resident = self._pinned = self._end = self._live = 0
        if self._file is not None:
            self._file.close()
            self._file = None


def _entry_ids(bitmaps: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The bitmaps' entry ids, each bitmap's in order, as one column; and each one's count."""
    counts = np.fromiter((len(bm) for bm in bitmaps), dtype=np.int64, count=len(bitmaps))
    if all(isinstance(bm, BitMap) for bm in bitmaps):
        ids = array("I")
        for bm in bitmaps:
            ids += bm.to_array()  # sorted: a bitmap iterates in order
        return np.frombuffer(ids, dtype=np.uint32), counts
    parts = [np.fromiter(bm, dtype=np.uint64, count=len(bm)) for bm in bitmaps]
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)), counts
