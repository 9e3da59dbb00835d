"""``Deduplicator``: remembers recent message ids per key in bounded memory (seed 003).

Each key owns two generations of roaring bitmaps, like the two survivor
spaces of a generational garbage collector: new ids go to the *current*
generation; a lookup checks both. When the current generation already holds
``max_capacity // 2`` ids, the generations swap roles: the current one
becomes the *previous* one, the old previous one is dropped, and a fresh
bitmap becomes current. So a key never remembers more than ``max_capacity``
ids, and always remembers at least the last ``max_capacity // 2`` distinct ids
added to it.

The seed counts additions with one counter shared by all keys, so traffic on
one key could make another key forget its ids early; here the count is per
key (it is the cardinality of the key's current generation).

A snapshot is a sealed ledger file (``bucketstore.format.ledger_file``)::

    properties  {"kind": "dedup-snapshot", "format": 1, "max_capacity": N}
    entry 0     msgpack [[key, current width, previous width], ...]   (width 32 or 64)
    entry 2i+1  key i's current generation, portable roaring serialization
    entry 2i+2  key i's previous generation
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Union

import msgpack
from pyroaring import BitMap, BitMap64

from ..errors import CorruptLedgerError
from ..format.fs import REAL_FS
from ..format.ledger_file import HEADER_FIXED_SIZE, LedgerReader, write_ledger
from .timebucket import check_uint64

__all__ = ["Deduplicator", "SNAPSHOT_KIND", "SNAPSHOT_FORMAT"]

SNAPSHOT_KIND = "dedup-snapshot"
SNAPSHOT_FORMAT = 1

Bitmap = Union[BitMap, BitMap64]
_U32_LIMIT = 1 << 32
# Snapshot keys are written under ledger id 0: the id only salts the CRCs.
_SNAPSHOT_LEDGER_ID = 0


def _check_capacity(max_capacity: object) -> int:
    if isinstance(max_capacity, bool) or not isinstance(max_capacity, int):
        raise TypeError(f"max_capacity must be an int, not {type(max_capacity).__name__}")
    if max_capacity < 2:
        raise ValueError(f"max_capacity must be >= 2, got {max_capacity}")
    return max_capacity


def _has(bitmap: Bitmap, value: int) -> bool:
    # A 32-bit bitmap raises OverflowError on a wider value instead of answering False.
    return (value < _U32_LIMIT or type(bitmap) is BitMap64) and value in bitmap


def _width(bitmap: Bitmap) -> int:
    return 64 if type(bitmap) is BitMap64 else 32


class Deduplicator:
    """Per-key memory of recently seen message ids, in two swapping roaring bitmaps.

    Not thread-safe (as in the seed): guard it with a lock if shared.

    >>> dedup = Deduplicator(["orders"], max_capacity=4)
    >>> [dedup.is_duplicate_and_add("orders", i) for i in (1, 2, 1, 3, 4)]
    [False, False, True, False, False]
    >>> dedup.is_duplicate("orders", 2), dedup.is_duplicate("orders", 1)
    (True, True)
    >>> dedup.is_duplicate_and_add("orders", 5)  # third generation: ids 1 and 2 are forgotten
    False
    >>> dedup.is_duplicate("orders", 1)
    False

    :param keys: the keys (``str``) ids are tracked under; fixed for the object's life.
    :param max_capacity: the most ids remembered per key (an int >= 2).
    """

    def __init__(self, keys: Iterable[str], max_capacity: int) -> None:
        self._capacity = _check_capacity(max_capacity)
        self._half = max_capacity // 2
        keys = list(keys)
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
        # key -> [current generation, previous generation]
        self._generations: dict[str, list[Bitmap]] = {key: [BitMap(), BitMap()] for key in keys}

    @property
    def max_capacity(self) -> int:
        """The most ids remembered per key."""
        return self._capacity

    @property
    def keys(self) -> list[str]:
        """The keys, in the order given."""
        return list(self._generations)

    def _pair(self, key: str) -> list[Bitmap]:
        pair = self._generations.get(key) if isinstance(key, str) else None
        if pair is None:
            if not isinstance(key, str):
                raise TypeError(f"key must be str, not {type(key).__name__}")
            raise ValueError(f"unknown key {key!r}")
        return pair

    def _add(self, pair: list[Bitmap], message_id: int) -> None:
        current = pair[0]
        if len(current) >= self._half:
            pair[1] = current
            current = pair[0] = BitMap()
        if message_id >= _U32_LIMIT and type(current) is BitMap:
            current = pair[0] = BitMap64(current)
        current.add(message_id)

    def is_duplicate(self, key: str, message_id: int) -> bool:
        """Whether ``message_id`` is remembered under ``key``. Runtime complexity: O(1).

        :raises ValueError: for an unknown key or an id outside 0..2**64-1.
        :raises TypeError: for a non-str key or a non-int id.
        """
        pair = self._pair(key)
        message_id = check_uint64("message_id", message_id)
        return _has(pair[0], message_id) or _has(pair[1], message_id)

    def is_duplicate_and_add(self, key: str, message_id: int) -> bool:
        """Return whether ``message_id`` was already remembered; remember it if not.

        Runtime complexity: O(1) (a generation swap allocates a fresh bitmap).
        """
        pair = self._pair(key)
        message_id = check_uint64("message_id", message_id)
        if _has(pair[0], message_id) or _has(pair[1], message_id):
            return True
        self._add(pair, message_id)
        return False

    def reconstruct(self, key: str, ids: Iterable[int]) -> None:
        """Rebuild ``key``'s memory from ``ids`` (oldest first), e.g. after a restart.

        The key's current memory is discarded first; then the ids are added in
        order under the same swapping rule, so with more than ``max_capacity``
        ids only the most recent are remembered. All ids are validated before
        anything changes.
        """
        pair = self._pair(key)
        checked = [check_uint64("message_id", i) for i in ids]
        pair[0], pair[1] = BitMap(), BitMap()
        for message_id in checked:
            if not (_has(pair[0], message_id) or _has(pair[1], message_id)):
                self._add(pair, message_id)

    def memory_bytes(self) -> int:
        """The bitmaps' payload bytes (``get_statistics()``) plus ~200 bytes per bitmap object."""
        total = 0
        for pair in self._generations.values():
            for bitmap in pair:
                stats = bitmap.get_statistics()
                total += 200 + stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"] \
                    + stats["n_bytes_bitset_containers"]
        return total

    # -- snapshots -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write a crash-safe snapshot to ``path``, replacing any previous one; return the path.

        The snapshot is first sealed as a ledger file under ``path + ".next"``
        (written to a temporary name, fsynced, renamed, directory fsynced),
        then renamed over ``path`` and the directory fsynced again. A crash at
        any point leaves either the old snapshot or the new one at ``path``.
        """
        path = os.fspath(path)
        directory, name = os.path.split(os.path.abspath(path))
        staged = name + ".next"
        for leftover in (staged, staged + ".tmp"):
            # A crash during an earlier save may have left these; they were never the snapshot.
            try:
                REAL_FS.unlink(os.path.join(directory, leftover))
            except FileNotFoundError:
                pass
        index = []
        entries: list[bytes] = []
        for key, pair in self._generations.items():
            index.append([key, _width(pair[0]), _width(pair[1])])
            for bitmap in pair:
                # Ids arrive mostly in order: runs shrink the file, often by orders of magnitude.
                bitmap.run_optimize()
                entries.append(bitmap.serialize())
        entries.insert(0, msgpack.packb(index, use_bin_type=True))
        properties = {"kind": SNAPSHOT_KIND, "format": SNAPSHOT_FORMAT, "max_capacity": self._capacity}
        staged_path = write_ledger(directory, _SNAPSHOT_LEDGER_ID, properties, entries, file_name=staged)
        REAL_FS.rename(staged_path, path)
        REAL_FS.fsync_dir(directory)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Deduplicator":
        """Rebuild a deduplicator from a snapshot written by :meth:`save`.

        :raises CorruptLedgerError: if the file is damaged or is not a valid
            snapshot (naming the file and the offset of the failing part).
        :raises FileNotFoundError: if there is no file at ``path``.
        """
        with LedgerReader(path) as reader:
            return cls._from_reader(reader)

    @classmethod
    def _from_reader(cls, reader: LedgerReader) -> "Deduplicator":
        def damage(entry: int | None, reason: str) -> CorruptLedgerError:
            # Without an entry, the fault is in the header's properties, which follow its fixed part.
            offset = HEADER_FIXED_SIZE if entry is None else reader.entry_offset(entry)
            return CorruptLedgerError(reader.path, offset, reason)

        props = reader.properties
        if props.get("kind") != SNAPSHOT_KIND:
            raise damage(None, f"not a dedup snapshot (kind {props.get('kind')!r})")
        if props.get("format") != SNAPSHOT_FORMAT:
            raise damage(None, f"unsupported dedup snapshot format {props.get('format')!r}")
        capacity = props.get("max_capacity")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 2:
            raise damage(None, f"bad max_capacity {capacity!r}")
        if reader.entry_count < 1:
            raise damage(None, "snapshot has no key index")
        try:
            index = msgpack.unpackb(reader.read_entry(0), raw=False, use_list=True)
        except (ValueError, msgpack.UnpackException) as exc:
            raise damage(0, f"key index does not decode: {exc}") from None
        if not isinstance(index, list) or reader.entry_count != 1 + 2 * len(index):
            raise damage(0, "key index does not match the number of entries")
        dedup = cls([], capacity)
        for position, row in enumerate(index):
            if (not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str)
                    or any(type(width) is not int or width not in (32, 64) for width in row[1:])):
                raise damage(0, f"key index row {position} is malformed")
            key = row[0]
            if key in dedup._generations:
                raise damage(0, f"key {key!r} appears twice")
            pair = []
            for generation, width in enumerate(row[1:]):
                entry = 1 + 2 * position + generation
                kind = BitMap64 if width == 64 else BitMap
                try:
                    bitmap = kind.deserialize(reader.read_entry(entry))
                except (ValueError, IndexError, OverflowError) as exc:
                    raise damage(entry, f"bitmap of key {key!r} does not deserialize: {exc}") from None
                if len(bitmap) > dedup._half:
                    raise damage(entry, f"generation of key {key!r} holds {len(bitmap)} ids, "
                                        f"more than half the capacity {capacity}")
                pair.append(bitmap)
            dedup._generations[key] = pair
        return dedup

    def _check(self) -> None:
        """Assert the structural invariants (for tests)."""
        for key, pair in self._generations.items():
            assert len(pair) == 2, f"key {key!r} does not have two generations"
            for bitmap in pair:
                assert type(bitmap) in (BitMap, BitMap64)
                assert len(bitmap) <= self._half, f"a generation of {key!r} exceeds half the capacity"
            older = BitMap64(pair[1]) if type(pair[1]) is BitMap else pair[1]
            newer = BitMap64(pair[0]) if type(pair[0]) is BitMap else pair[0]
            assert older.isdisjoint(newer), f"an id of {key!r} is in both generations"
