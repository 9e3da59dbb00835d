"""The store: a directory holding a catalog, ledger files and (in journal mode) a journal.

::

    store/
      LOCK        held (flock) by the one process that has the store open for writing
      catalog/    LMDB environment (see catalog.py)
      ledgers/    one file per sealed bucket, named by its ledger id
      journal/    the write-ahead journal (durability="journal")

Opening a store removes what a crash can leave behind: temporary ledger files
(``*.ledger.tmp``) and ledger files no catalog key references (a seal that
crashed between the file's rename and the catalog commit, or a delete that
crashed between the key's removal and the unlink).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import threading
from typing import Any

from .catalog import Catalog, validate_tracker_name
from ..config import TrackerConfig, config_or_default
from ..cutoff import Clock
from ..errors import StoreClosedError, StoreLockedError
from ..format.fs import REAL_FS, FileSystem
from .journal import journal_directory
from .maintenance import MaintenanceWorker
from ..format.ledger_file import ledger_file_name
from .tracker import BucketTracker

__all__ = ["Store", "open_store", "DURABILITY_MODES"]

DURABILITY_MODES = ("sealed", "journal")
_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")


class Store:
    """An open bucketstore directory. Use :func:`bucketstore.open` to get one.

    :ivar path: the store directory.
    :ivar durability: ``"sealed"`` or ``"journal"``.
    :ivar repair: when True, catalog keys whose ledger file is missing or damaged
        are dropped on recovery (and reported) instead of raising.
    :ivar sync_interval_ms: journal mode's group commit: 0 makes every call
        durable before it returns; N > 0 commits at most every N ms (and at
        :meth:`BucketTracker.flush`), trading that window for throughput.
    :ivar background: True: seals and merges run on the store's maintenance thread,
        the tracker's lock held only to freeze and to install; False (the default for
        now): they run on the calling thread, under the lock (the synchronous design).
    :ivar max_pending_maintenance: how many seals and merges of one tracker may be
        queued or running before adds wait for the worker (backpressure; each pending
        seal holds its frozen bucket's rows in memory).
    """

    def __init__(self, path: str | os.PathLike[str], durability: str = "sealed", *, repair: bool = False,
                 sync_interval_ms: int = 0, fs: FileSystem = REAL_FS, background: bool = False,
                 max_pending_maintenance: int = 2) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if isinstance(sync_interval_ms, bool) or not isinstance(sync_interval_ms, int) or sync_interval_ms < 0:
            raise ValueError("sync_interval_ms must be an int >= 0")
        if isinstance(max_pending_maintenance, bool) or not isinstance(max_pending_maintenance, int) \
                or max_pending_maintenance < 1:
            raise ValueError("max_pending_maintenance must be an int >= 1")
        self.background = bool(background)
        self.max_pending_maintenance = max_pending_maintenance
        self.sync_interval_ms = sync_interval_ms
        self.path = os.path.abspath(os.fspath(path))
        self.durability = durability
        self.repair = repair
        self.fs = fs
        self.ledgers_dir = os.path.join(self.path, "ledgers")
        self._lock = threading.RLock()
        self._id_lock = threading.Lock()
        self._trackers: dict[str, BucketTracker] = {}
        self._closed = False
        self.maintenance = MaintenanceWorker(self.path)
        fs.makedirs(self.path)
        self._lock_fd = _acquire_lock(os.path.join(self.path, "LOCK"))
        catalog = None
        try:
            fs.makedirs(self.ledgers_dir)
            catalog = self.catalog = Catalog(os.path.join(self.path, "catalog"))
            self._next_ledger_id = self.catalog.next_ledger_id()
            self.orphans_removed = self._remove_orphans()
        except BaseException:
            # Release everything: LMDB refuses a second open of one environment in a process.
            if catalog is not None:
                catalog.close()
            os.close(self._lock_fd)
            raise

    # -- files ----------------------------------------------------------------------------------
    def _remove_orphans(self) -> int:
        referenced = {lid for keys in self.catalog.all_buckets().values() for lid in keys.values()}
        removed = 0
        highest = -1
        for name in os.listdir(self.ledgers_dir):
            m = _LEDGER_NAME.match(name)
            if m:
                lid = int(m.group(1))
                highest = max(highest, lid)
                if lid in referenced:
                    continue
            elif not name.endswith(".ledger.tmp"):
                continue  # not ours: leave it alone
            self.fs.unlink(os.path.join(self.ledgers_dir, name))
            removed += 1
        if removed:
            self.fs.fsync_dir(self.ledgers_dir)
        # Never reuse an id a file on disk had, even one that was just removed.
        self._next_ledger_id = max(self._next_ledger_id, highest + 1, max(referenced, default=-1) + 1)
        return removed

    def allocate_ledger_id(self) -> int:
        """Hand out a fresh ledger id. The catalog commit that registers the ledger
        persists the allocator, so ids are never reused. (Its own lock: the maintenance
        thread allocates while a closing store holds the store lock, waiting for it.)"""
        with self._id_lock:
            lid = self._next_ledger_id
            self._next_ledger_id += 1
            return lid

    def remove_ledger_file(self, path: str) -> None:
        """Unlink a ledger file and make the removal durable. A missing file is fine;
        a failure leaves an orphan that the next open removes."""
        try:
            self.fs.unlink(path)
            self.fs.fsync_dir(os.path.dirname(path))
        except FileNotFoundError:
            pass
        except OSError:
            pass

    def ledger_path(self, ledger_id: int) -> str:
        return os.path.join(self.ledgers_dir, ledger_file_name(ledger_id))

    # -- trackers -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    def tracker(self, name: str, config: TrackerConfig | None = None, clock: Clock | None = None) -> BucketTracker:
        """Open (creating if needed) the tracker ``name`` and recover its buckets.

        One handle per name at a time: asking again for an open tracker returns
        the same object (its config must match).
        """
        validate_tracker_name(name)
        config = config_or_default(config)
        with self._lock:
            self._check_open()
            live = self._trackers.get(name)
            if live is not None:
                if live.config != config:
                    raise ValueError(f"tracker {name!r} is already open with a different config")
                return live
            tracker = BucketTracker(self, name, config, clock)
            self._trackers[name] = tracker
            return tracker

    def _forget(self, tracker: BucketTracker) -> None:
        with self._lock:
            if self._trackers.get(tracker.name) is tracker:
                del self._trackers[tracker.name]

    def trackers(self) -> list[str]:
        """Names of every tracker in the store (open or not), sorted."""
        with self._lock:
            self._check_open()
            return self.catalog.tracker_names()

    def delete_tracker(self, name: str) -> None:
        """Delete a tracker: its keys and state in one transaction, then its ledger files."""
        validate_tracker_name(name)
        with self._lock:
            self._check_open()
            live = self._trackers.pop(name, None)
            if live is not None:
                with live._lock:  # not while one of its jobs installs: that would re-add a key
                    live._cancel_jobs()
                    live._closed = True
                    live._cond.notify_all()
            ledger_ids = list(self.catalog.buckets(name).values())
            self.catalog.delete_tracker(name)
            for lid in ledger_ids:
                self.remove_ledger_file(self.ledger_path(lid))
            if live is not None and live._journal is not None:
                live._journal.close()
            journal_dir = journal_directory(self.path, name)
            if os.path.isdir(journal_dir):
                for f in os.listdir(journal_dir):
                    self.fs.unlink(os.path.join(journal_dir, f))
                os.rmdir(journal_dir)
                self.fs.fsync_dir(os.path.dirname(journal_dir))

    def stats(self) -> dict[str, Any]:
        """Store-level figures: trackers, buckets, bytes on disk, orphans removed on open."""
        with self._lock:
            self._check_open()
            files = [f for f in os.listdir(self.ledgers_dir) if _LEDGER_NAME.match(f)]
            return {
                "path": self.path,
                "durability": self.durability,
                "trackers": len(self.catalog.tracker_names()),
                "ledger_files": len(files),
                "ledger_bytes": sum(os.path.getsize(os.path.join(self.ledgers_dir, f)) for f in files),
                "orphans_removed_on_open": self.orphans_removed,
                "next_ledger_id": self._next_ledger_id,
            }

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every open tracker, the catalog and the lock. Idempotent."""
        with self._lock:
            if self._closed:
                return
            for tracker in list(self._trackers.values()):
                tracker.close()  # drains its seals and merges
            self.maintenance.stop()
            self.catalog.close()
            os.close(self._lock_fd)
            self._closed = True

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _acquire_lock(path: str) -> int:
    """Take the store's write lock (flock on LOCK) and record our pid in it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = f"process {holder}" if holder else "another process"
            if holder == str(os.getpid()):
                who = "this process (another open handle)"
            raise StoreLockedError(f"{os.path.dirname(path)} is open for writing by {who}") from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
    return fd


def open_store(path: str | os.PathLike[str], durability: str = "sealed", *, repair: bool = False,
               sync_interval_ms: int = 0, background: bool = False, max_pending_maintenance: int = 2) -> Store:
    """Open (creating if missing) the store at ``path``.

    :param durability: ``"sealed"`` — an index is durable once its bucket is sealed
        (Pulsar's model; the embedder replays its log after a crash); ``"journal"`` —
        every add, untrack and delivery is written to a write-ahead journal, durable
        when the call returns (or within ``sync_interval_ms``, and at ``flush()``).
    :param sync_interval_ms: journal group-commit interval (0: every call is durable).
    :param repair: drop catalog keys whose ledger file is missing or damaged, and
        report them in the tracker's ``recovery_report``, instead of raising.
    :param background: run seals and merges on the store's maintenance thread; False
        (the default) runs them on the calling thread under the tracker's lock.
    :param max_pending_maintenance: per tracker, how many seals/merges may be pending
        before adds wait for the worker (bounds the frozen rows held in memory).
    :raises StoreLockedError: another process or handle has the store open.
    """
    return Store(path, durability, repair=repair, sync_interval_ms=sync_interval_ms, background=background,
                 max_pending_maintenance=max_pending_maintenance)
