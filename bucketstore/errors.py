"""The exceptions bucketstore raises.

Every error the engine raises on purpose derives from :class:`BucketStoreError`.
Damage found in a file carries the file's ``path`` and the byte ``offset`` where
the reader stopped trusting it, so an operator can look at exactly that place
(``bucketstore dump`` / ``verify`` print the same two facts).

Argument errors are plain :class:`ValueError` / :class:`TypeError`, as callers
of a Python library expect.
"""

from __future__ import annotations

import os

__all__ = [
    "BucketStoreError",
    "CorruptLedgerError",
    "CatalogError",
    "LedgerIdentityError",
    "StoreLockedError",
    "StoreClosedError",
    "JournalError",
    "MaintenanceError",
    "CheckpointError",
    "ReadOnlyError",
    "StaleSnapshotError",
    "DurabilityMismatchError",
]


class BucketStoreError(Exception):
    """Base class of every error bucketstore raises on purpose."""


class CorruptLedgerError(BucketStoreError):
    """A ledger file (sealed bucket, snapshot) is damaged or is not a ledger.

    :ivar path: the file that is damaged.
    :ivar offset: the byte offset in that file where the damage was found
        (the start of the frame or structure that failed its check).
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"{self.path}: offset {self.offset}: {reason}")


class CatalogError(BucketStoreError):
    """The LMDB catalog is damaged, inconsistent with the ledger files, or unusable.

    :ivar path: the file or directory concerned, when known.
    :ivar key: the catalog key concerned, when known.
    :ivar offset: the byte offset in ``path`` where the damage was found, when known.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None,
                 key: str | None = None, offset: int | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.key = key
        self.offset = offset
        super().__init__(message)


class LedgerIdentityError(CatalogError):
    """A ledger file is intact but is not the file its catalog entry names: its header
    gives another ledger id, tracker, store or ledger range. Never dropped by
    ``repair=True`` (the file may be another tracker's data); see
    ``bucketstore repair --rebuild-catalog``."""


class StoreLockedError(BucketStoreError):
    """Another process (or another open handle in this process) owns the store for writing."""


class StoreClosedError(BucketStoreError):
    """The store or tracker was used after :meth:`close`."""


class JournalError(BucketStoreError):
    """The write-ahead journal is damaged in a way that cannot be cut off as a torn tail.

    :ivar path: the journal file.
    :ivar offset: the byte offset of the first record that failed its check.
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"{self.path}: offset {self.offset}: {reason}")


class MaintenanceError(BucketStoreError):
    """A background seal or merge of this tracker failed (I/O error, ENOSPC, damage).

    Raised once, by the first write-side call on the tracker after the failure (an
    add, a delivery, ``mark_delete``, ``clear``, ``flush``, ``wait_for_maintenance``;
    ``close`` raises it once closed); that call did nothing. Reads (``stats()``,
    counts, ``contains_message``, ``next_delivery_time``, metrics) never raise it.
    The indexes the failed step held stay in memory (as after a failed synchronous
    seal) and the tracker remains usable. The original exception is ``__cause__``;
    ``stats()`` shows it as ``maintenance_failure`` until raised, and
    ``stats()["maintenance"]`` keeps the count and the last error.
    """


class CheckpointError(BucketStoreError):
    """A checkpoint could not be made (nothing is left at its destination).

    :ivar path: the checkpoint's destination.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: {reason}")
class ReadOnlyError(BucketStoreError):
    """A change was asked of a store opened with ``read_only=True`` (or of one of its
    trackers), or a tracker it does not hold was asked for: a read-only handle never
    writes, deletes or creates anything."""


class StaleSnapshotError(BucketStoreError):
    """A read-only handle needs a ledger file that its snapshot names, but the store's live
    writer has deleted it since the snapshot was taken (a merge, a delivery or a mark-delete
    retired the bucket). Nothing is wrong with the store: open it read-only again to look at
    a newer snapshot.

    :ivar path: the ledger file that is gone.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        super().__init__(message)


class DurabilityMismatchError(BucketStoreError):
    """A tracker written in ``"journal"`` durability was asked for by a store opened in
    ``"sealed"`` durability. Its journal holds acknowledged indexes (and its delivery
    frontier) that a sealed open would neither see nor keep, so nothing is opened or
    changed: open the store with the durability the tracker was written in.

    (The other way round is allowed: a sealed tracker opened in journal mode becomes a
    journal tracker, a stronger promise, and is recorded as one.)

    :ivar tracker: the tracker's name.
    :ivar recorded: the durability the tracker was written in.
    :ivar requested: the durability the store was opened with.
    """

    def __init__(self, message: str, *, tracker: str, recorded: str, requested: str) -> None:
        self.tracker = tracker
        self.recorded = recorded
        self.requested = requested
        super().__init__(message)
