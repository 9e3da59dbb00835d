"""What a tracker may use of its store: the catalog, the ledger directory and its id allocator.

The store builds one :class:`StoreServices` when it opens and hands it to every tracker it
opens, so the dependency points one way (``store`` -> ``tracker`` -> ``store_services``): a
tracker never sees the store's tracker table, its lock file or its other trackers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ...format.fs import FileSystem
from ...format.ledger_file import ledger_file_name
from ..buckets.read_ahead import SegmentReader
from ..catalog.catalog import Catalog
from ..durability.journal import FdPool
from ..maintenance.backlog_budget import BacklogBudget
from ..maintenance.maintenance import MaintenanceWorker

__all__ = ["StoreServices"]


class StoreServices:
    """The part of an open store that its trackers use.

    :ivar path: the store directory (a journal-mode tracker keeps its journal under it).
    :ivar durability: ``"sealed"`` or ``"journal"``.
    :ivar repair: drop damaged or missing buckets on recovery instead of raising.
    :ivar sync_interval_ms: journal mode's group-commit interval.
    :ivar confirm_sync_ms: journal mode's group-commit interval for a group holding only
        delivery confirmations (at least ``sync_interval_ms``).
    :ivar delivery: journal mode's delivery handoff, ``"at-least-once"`` or ``"at-most-once"``.
    :ivar fs: the file layer every durable call goes through.
    :ivar catalog: the store's LMDB catalog.
    :ivar ledgers_dir: the directory of ledger files.
    :ivar store_id: the store's identity, written into every ledger and journal file header.
    :ivar journal_fds: the store's bounded pool of open journal files.
    :ivar maintenance: the store's maintenance worker (used when ``background``).
    :ivar background: seals and merges run on ``maintenance``, off the trackers' locks.
    :ivar max_pending_maintenance: per tracker, pending seals/merges before batches wait.
    :ivar budget: the store's backlog budget: adds wait on it before they take a tracker's lock.
    :ivar segment_reader: the store's read-ahead thread, or None (read-ahead off: sealed
        buckets' segments are read when the queue needs them, under the tracker's lock).
    """

    def __init__(self, *, path: str, durability: str, repair: bool, sync_interval_ms: int, fs: FileSystem,
                 catalog: Catalog, ledgers_dir: str, next_ledger_id: int, store_id: str, journal_fds: FdPool,
                 tracker_closed: Callable[[Any], None], delivery: str = "at-least-once",
                 maintenance: MaintenanceWorker | None = None, background: bool = False,
                 max_pending_maintenance: int = 2, segment_reader: SegmentReader | None = None,
                 confirm_sync_ms: int = 0, budget: BacklogBudget | None = None) -> None:
        self.path = path
        self.confirm_sync_ms = confirm_sync_ms
        self.durability = durability
        self.repair = repair
        self.sync_interval_ms = sync_interval_ms
        self.delivery = delivery
        self.fs = fs
        self.catalog = catalog
        self.ledgers_dir = ledgers_dir
        self.store_id = store_id
        self.journal_fds = journal_fds
        self._next_ledger_id = next_ledger_id
        self._ids = threading.Lock()
        self._tracker_closed = tracker_closed
        self.maintenance = maintenance if maintenance is not None else MaintenanceWorker(path)
        self.background = background
        self.max_pending_maintenance = max_pending_maintenance
        self.segment_reader = segment_reader
        self.budget = budget if budget is not None else BacklogBudget()

    @property
    def next_ledger_id(self) -> int:
        """The id :meth:`allocate_ledger_id` hands out next."""
        return self._next_ledger_id

    def allocate_ledger_id(self) -> int:
        """Hand out a fresh ledger id. The catalog commit that registers the ledger
        persists the allocator, so ids are never reused."""
        with self._ids:
            lid = self._next_ledger_id
            self._next_ledger_id += 1
            return lid

    def ledger_path(self, ledger_id: int) -> str:
        """The path of ledger file ``ledger_id``."""
        return os.path.join(self.ledgers_dir, ledger_file_name(ledger_id))

    def remove_ledger_file(self, path: str) -> None:
        """Unlink a ledger file and make the removal durable. A missing file is fine;
        a failure leaves an orphan that the next open removes."""
        try:
            self.fs.unlink(path)
            self.fs.fsync_dir(os.path.dirname(path))
        except OSError:
            pass  # FileNotFoundError included: the next open's orphan sweep catches the rest

    def remove_ledger_files(self, paths: list[str]) -> None:
        """:meth:`remove_ledger_file` of several files with one ``fsync`` of each directory
        (a merge's four sources: each fsync of the directory costs milliseconds)."""
        dirs = []
        for path in paths:
            try:
                self.fs.unlink(path)
            except OSError:
                continue  # as above: an orphan, or already gone
            if os.path.dirname(path) not in dirs:
                dirs.append(os.path.dirname(path))
        for directory in dirs:
            try:
                self.fs.fsync_dir(directory)
            except OSError:
                pass

    def tracker_closed(self, tracker: Any) -> None:
        """Called by a tracker as it closes: the store drops its handle."""
        self._tracker_closed(tracker)
