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
crashed between the key's removal and the unlink). A read-only open
(``bucketstore.open(path, read_only=True)``, :mod:`~bucketstore.engine.store.read_only`)
removes, writes and locks nothing.

Deleting is the dangerous part, so it happens only when it is proven safe:
the catalog must be this store's healthy catalog (a missing, empty, new or
truncated ``data.mdb`` beside ledger or journal files is a
:class:`~bucketstore.CatalogError`, and nothing is touched), and an
unreferenced file must carry this store's id in its header (a file of another
store means the catalog is not the one these files belong to: an error, not
garbage). ``bucketstore repair --rebuild-catalog`` rebuilds a lost catalog
from the files themselves.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, Literal, overload

from ...config import TrackerConfig, config_or_default
from ...cutoff import Clock
from ...errors import CatalogError, CorruptLedgerError, MaintenanceError, StoreClosedError
from ...format.catalog_codec import validate_tracker_name
from ...format.fs import REAL_FS, FileSystem
from ...format.ledger_file import LedgerReader
from ...format.snapshot import BucketFile
from ..buckets.read_ahead import SegmentReader
from ..catalog.catalog import Catalog
from ..directory.disk_usage import dir_usage
from ..directory.store_lock import acquire_write_lock
from ..durability.handoff import DELIVERY_MODES
from ..durability.journal import FdPool, journal_directory
from ..maintenance.backlog_budget import DEFAULT_BUDGET_BYTES, BacklogBudget
from ..maintenance.maintenance import MaintenanceWorker, close_on_exit
from ..topics.topic_registry import TopicRegistry
from ..tracker.store_services import StoreServices
from ..tracker.tracker import BucketTracker
from .checkpoint import CheckpointReport, check_destination, make_checkpoint
from .read_only import ReadOnlyStore
from .tracker_record import check_durability, recorded_config
from .tracker_registry import TrackerRegistry

__all__ = ["Store", "open_store", "DURABILITY_MODES"]

DURABILITY_MODES = ("sealed", "journal")
_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")
log = logging.getLogger("bucketstore")
#: At most this many journal files are kept open at once (the rest reopen on their next commit).
JOURNAL_OPEN_FILES = 64
#: Default ``confirm_sync_ms``: the redelivery window a drain trades for one fsync per window.
CONFIRM_SYNC_MS = 100


class Store(TrackerRegistry[BucketTracker], TopicRegistry):
    """An open bucketstore directory. Use :func:`bucketstore.open` to get one.

    :ivar path: the store directory.
    :ivar durability: ``"sealed"`` or ``"journal"``.
    :ivar repair: when True, catalog keys whose ledger file is missing or damaged
        are dropped on recovery (and reported) instead of raising.
    :ivar sync_interval_ms: journal mode's group commit: 0 makes every call
        durable before it returns; N > 0 commits at most every N ms (and at
        :meth:`BucketTracker.flush`), trading that window for throughput.
    :ivar confirm_sync_ms: journal mode, ``delivery="at-least-once"``: how long a delivery
        confirmation (by the next ``get_scheduled_messages`` or ``confirm_delivered()``) may
        wait for its fsync when nothing else is pending. A lost confirmation only brings
        its batches back after a crash, never loses one, so a drain pays one fsync per
        window instead of one per call; adds and ``flush()`` never wait for it. 0: every
        confirmation is durable before its call returns (with ``sync_interval_ms=0``).
    :ivar delivery: journal mode's delivery handoff: ``"at-least-once"`` (a returned
        batch is durably delivered once confirmed; a crash before may deliver it
        again) or ``"at-most-once"`` (durably delivered when returned; a crash before
        the embedder used it loses it).
    :ivar background: True (the default): seals and merges run on the store's maintenance
        thread, the tracker's lock held only to freeze and to install; False: they run on
        the calling thread, under the lock (the synchronous design: a seal is installed
        when the add that triggered it returns).
    :ivar max_pending_maintenance: how many seals and merges of one tracker may be
        queued or running before batch adds wait for the worker (``add_message`` never
        waits for it; see ``max_backlog_bytes``).
    :ivar max_backlog_bytes: the store's budget of index rows (24 bytes each) held in
        mutable buckets and in seals and merges not yet installed: a batch add that would
        exceed it waits for the maintenance worker before it takes its tracker's lock;
        single adds and batches of up to 64 rows pass until twice the budget (see
        :mod:`~bucketstore.engine.maintenance.backlog_budget` and docs/maintenance.md).
    :ivar read_ahead: True: a sealed bucket's next segment is read and decoded on the
        store's reader thread once its loaded segment runs low, so
        ``get_scheduled_messages`` does not wait on the disk in the common case (at most
        one extra segment per bucket in memory); False: segments are read when the queue
        reaches them, under the tracker's lock. Defaults to ``background``.
    :param maintenance: the worker that runs background seals and merges (default: a
        thread of the store's own). ``bucketstore.testing.SteppedWorker`` runs them only
        when a test says so, which makes their I/O order deterministic.
    """

    def __init__(self, path: str | os.PathLike[str], durability: str = "journal", *, repair: bool = False,
                 sync_interval_ms: int = 0, delivery: str = "at-least-once", fs: FileSystem = REAL_FS,
                 confirm_sync_ms: int = CONFIRM_SYNC_MS, background: bool = True, max_pending_maintenance: int = 2,
                 read_ahead: bool | None = None, maintenance: MaintenanceWorker | None = None,
                 max_backlog_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if delivery not in DELIVERY_MODES:
            raise ValueError(f"delivery must be one of {DELIVERY_MODES}, not {delivery!r}")
        if delivery == "at-most-once" and durability != "journal":
            # Sealed mode keeps no delivery progress: recovery may deliver again, so it
            # cannot promise at-most-once.
            raise ValueError('delivery="at-most-once" needs durability="journal"')
        self.delivery = delivery
        if isinstance(sync_interval_ms, bool) or not isinstance(sync_interval_ms, int) or sync_interval_ms < 0:
            raise ValueError("sync_interval_ms must be an int >= 0")
        if isinstance(confirm_sync_ms, bool) or not isinstance(confirm_sync_ms, int) or confirm_sync_ms < 0:
            raise ValueError("confirm_sync_ms must be an int >= 0")
        self.confirm_sync_ms = confirm_sync_ms
        if isinstance(max_pending_maintenance, bool) or not isinstance(max_pending_maintenance, int) \
                or max_pending_maintenance < 1:
            raise ValueError("max_pending_maintenance must be an int >= 1")
        self.background = bool(background)
        self.max_pending_maintenance = max_pending_maintenance
        self.budget = BacklogBudget(max_backlog_bytes)  # validates it
        self.max_backlog_bytes = max_backlog_bytes
        self.read_ahead = self.background if read_ahead is None else bool(read_ahead)
        self.sync_interval_ms = sync_interval_ms
        raw_path = os.fspath(path)
        if isinstance(raw_path, bytes):
            raise TypeError("store path must be a str or os.PathLike[str], not bytes")
        if not raw_path:
            raise ValueError("store path is empty (give the store's directory)")
        self.path = os.path.abspath(raw_path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"store path {self.path} exists and is not a directory")
        self.durability = durability
        self.repair = repair
        self.fs = fs
        self.ledgers_dir = os.path.join(self.path, "ledgers")
        self._lock = threading.RLock()
        self._trackers: dict[str, BucketTracker] = {}
        self._deleting: set[str] = set()
        self._closed = False
        #: Open journal files, bounded: thousands of journal trackers share these descriptors.
        self.journal_fds = FdPool(JOURNAL_OPEN_FILES)
        #: Runs the background seals and merges: the store's own thread unless the caller
        #: passed a worker (the crash tests pass one they step by hand).
        self.maintenance = maintenance if maintenance is not None else MaintenanceWorker(self.path)
        self.segment_reader = SegmentReader(self.path) if self.read_ahead else None
        fs.makedirs(self.path)
        self._lock_fd = acquire_write_lock(self.path)
        catalog = None
        try:
            fs.makedirs(self.ledgers_dir)
            # With ledger or journal files present, the catalog must already exist: a lost
            # one is an error, never an empty catalog that makes every file an orphan.
            catalog = self.catalog = Catalog(os.path.join(self.path, "catalog"), must_exist=_holds_files(self.path))
            #: The store's identity, written into every ledger and journal file header.
            self.store_id: str = catalog.store_id  # type: ignore[assignment]
            #: Unreferenced ledger files left in place because they could not be proven garbage.
            self.orphans_kept: list[str] = []
            self.orphans_removed, next_ledger_id = self._remove_orphans(catalog.next_ledger_id())
            # What the trackers may use of the store: they get this, never the store itself.
            self._services = StoreServices(
                path=self.path, durability=durability, repair=repair, sync_interval_ms=sync_interval_ms,
                delivery=delivery, fs=fs, catalog=catalog, ledgers_dir=self.ledgers_dir, next_ledger_id=next_ledger_id,
                store_id=self.store_id, journal_fds=self.journal_fds, tracker_closed=self._forget,
                maintenance=self.maintenance, background=self.background,
                max_pending_maintenance=max_pending_maintenance, segment_reader=self.segment_reader,
                confirm_sync_ms=confirm_sync_ms, budget=self.budget)
        except BaseException:
            # Release everything: LMDB refuses a second open of one environment in a process.
            if catalog is not None:
                catalog.close()
            os.close(self._lock_fd)
            raise

    # -- files ----------------------------------------------------------------------------------
    def _remove_orphans(self, next_ledger_id: int) -> tuple[int, int]:
        """Remove temporary and unreferenced ledger files; return how many, and the next free ledger id."""
        referenced = {lid for keys in self.catalog.all_buckets().values() for lid in keys.values()}
        removed = 0
        highest = -1
        for name in os.listdir(self.ledgers_dir):
            m = _LEDGER_NAME.match(name)
            if m:
                lid = int(m.group(1))
                if lid > highest:
                    highest = lid
                if lid in referenced:
                    continue  # the common case, once per bucket at every open: nothing more to do
                path = os.path.join(self.ledgers_dir, name)
                if not self._provably_garbage(path, lid):
                    continue
                log.info("store %s: deleting ledger file %s (ledger %d, %s rows): no catalog key names it "
                         "(a seal that crashed before its commit, a delete or merge that crashed before "
                         "its unlink, or a key repair dropped)", self.path, path, lid, _rows_in(path))
            elif not name.endswith(".ledger.tmp"):
                continue  # not ours: leave it alone
            else:
                path = os.path.join(self.ledgers_dir, name)
                log.info("store %s: deleting %s: the temporary file of a seal or merge that did not finish",
                         self.path, path)
            try:
                self.fs.unlink(path)
            except FileNotFoundError:
                continue  # gone already (a seal's own clean-up of a file it could not commit): nothing to do
            removed += 1
        if removed:
            self.fs.fsync_dir(self.ledgers_dir)
        # Never reuse an id a file on disk had, even one that was just removed.
        return removed, max(next_ledger_id, highest + 1, max(referenced, default=-1) + 1)

    def _provably_garbage(self, path: str, ledger_id: int) -> bool:
        """Whether an unreferenced ledger file may be deleted: its header must be readable,
        name this ledger id and carry this store's id (files written before store ids
        existed carry none and are judged by the catalog alone).

        :raises CatalogError: the file belongs to another store, so this catalog is
            not the one the files were written with; deleting would destroy data.
        """
        try:
            with LedgerReader(path) as reader:
                header_id, owner = reader.ledger_id, reader.properties.get("store_id")
        except (CorruptLedgerError, OSError) as exc:
            # Renamed into place only after an fsync, a crash cannot leave such a file:
            # it is damage, which an operator should see; deleting it proves nothing.
            log.warning("unreferenced ledger file %s is kept: it cannot be read (%s)", path, exc)
            self.orphans_kept.append(path)
            return False
        if owner is not None and owner != self.store_id:
            raise CatalogError(f"{path} belongs to store {owner}, but the catalog {self.catalog.path} is "
                               f"store {self.store_id}: it is not these files' catalog, so nothing is deleted "
                               "(restore the right catalog, or run `bucketstore repair --rebuild-catalog`)",
                               path=path)
        if header_id != ledger_id:
            log.warning("unreferenced ledger file %s is kept: its header says ledger %d", path, header_id)
            self.orphans_kept.append(path)
            return False
        return True

    def allocate_ledger_id(self) -> int:
        """Hand out a fresh ledger id (see :meth:`StoreServices.allocate_ledger_id`)."""
        return self._services.allocate_ledger_id()

    def remove_ledger_file(self, path: str) -> None:
        """Unlink a ledger file durably (see :meth:`StoreServices.remove_ledger_file`)."""
        self._services.remove_ledger_file(path)

    def ledger_path(self, ledger_id: int) -> str:
        """The path of ledger file ``ledger_id``."""
        return self._services.ledger_path(ledger_id)

    # -- trackers -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    def tracker(self, name: str, config: TrackerConfig | None = None, clock: Clock | None = None) -> BucketTracker:
        """Open (creating if needed) the tracker ``name`` and recover its buckets.

        One handle per name at a time: asking again for an open tracker returns
        the same object (an explicit config must match).

        :param config: None (the default): the configuration the tracker recorded in the
            catalog (the defaults for a new tracker). An explicit one becomes the tracker's
            configuration from now on, and is recorded: it governs what comes next (the
            cutoff, new adds, seals, merges, memory) and rewrites nothing already stored.
        :raises DurabilityMismatchError: the tracker was written in journal mode and this
            store is open in sealed mode (see :mod:`~bucketstore.engine.store.tracker_record`).
        """
        validate_tracker_name(name)
        if config is not None:
            config = config_or_default(config)
        with self._lock:
            self._check_open()
            if name in self._deleting:
                raise ValueError(f"tracker {name!r} is being deleted")
            live = self._trackers.get(name)
            if live is not None:
                if config is not None and live.config != config:
                    raise ValueError(f"tracker {name!r} is already open with a different config")
                return live
            state = self.catalog.tracker_state(name)
            check_durability(state, self.path, name, self.durability)
            tracker = BucketTracker(self._services, name, config or recorded_config(state), clock)
            self._trackers[name] = tracker
            return tracker

    def trackers(self) -> list[str]:
        """Names of every tracker in the store (open or not), sorted."""
        with self._lock:
            self._check_open()
            return self.catalog.tracker_names()

    def delete_tracker(self, name: str) -> None:
        """Delete a tracker: its keys and state in one transaction, then its ledger and journal files.

        :raises KeyError: the store holds nothing of that name (as ``delete_topic`` and
            ``Topic.delete_subscription`` do; an embedder whose deletes must be idempotent
            suppresses it). Files a deletion that stopped half-way left behind (the catalog
            no longer names the tracker, its journal directory is still there) count as
            something: deleting again removes them.
        """
        validate_tracker_name(name)
        with self._lock:
            self._check_open()
            if name not in self._trackers and self.catalog.tracker_state(name) is None \
                    and not self.catalog.buckets(name) and not os.path.isdir(journal_directory(self.path, name)):
                raise KeyError(f"no tracker {name!r} in store {self.path}")
            live = self._trackers.pop(name, None)
            self._deleting.add(name)  # no new handle may recover it meanwhile
        try:
            if live is not None:
                # Under the tracker's own lock, taken without holding the store's (a seal holds
                # its tracker's lock and then takes the store's): an in-flight call finishes
                # first, and every later call sees the tracker closed.
                with live._lock:
                    live._cancel_jobs()  # a seal or merge in flight installs nothing now
                    live._closed = True
                    live._cond.notify_all()
                    # Wait (releasing the lock) until the cancelled jobs have ended: one may be
                    # writing its file right now, and only its install removes it. Returning
                    # earlier would leave a *.tmp or an orphan beside a deleted tracker.
                    live._wait_for_jobs(live._submitted)
                    if live._journal is not None:
                        live._journal.close()
            with self._lock:
                self._check_open()
                ledger_ids = list(self.catalog.buckets(name).values())
                self.catalog.delete_tracker(name)
                for lid in ledger_ids:
                    self.remove_ledger_file(self.ledger_path(lid))
                journal_dir = journal_directory(self.path, name)
                if os.path.isdir(journal_dir):
                    for f in os.listdir(journal_dir):
                        self.fs.unlink(os.path.join(journal_dir, f))
                    os.rmdir(journal_dir)
                    self.fs.fsync_dir(os.path.dirname(journal_dir))
        finally:
            with self._lock:
                self._deleting.discard(name)

    def stats(self) -> dict[str, Any]:
        """Store-level figures: trackers, buckets, bytes on disk, orphans removed on open."""
        with self._lock:
            self._check_open()
            # Trackers retire files without the store's lock: one gone before its stat is left out.
            ledgers = dir_usage(self.ledgers_dir, _LEDGER_NAME.match)
            return {
                "path": self.path,
                "durability": self.durability,
                "trackers": len(self.catalog.tracker_names()),
                "ledger_files": ledgers.files,
                "ledger_bytes": ledgers.bytes,
                "orphans_removed_on_open": self.orphans_removed,
                "orphans_kept": len(self.orphans_kept),
                "next_ledger_id": self._services.next_ledger_id,
            }

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, dest: str | os.PathLike[str]) -> CheckpointReport:
        """Copy the store into ``dest`` while it stays in use: a consistent crash image that
        opens as a store holding every index acknowledged before the call.

        Ledger files are hard-linked where the file system allows (copied otherwise), the
        catalog is copied in one read transaction, each journal up to its last commit; the
        order that makes them agree is argued in :mod:`bucketstore.engine.store.checkpoint`.
        Adds waiting for their group commit (``sync_interval_ms > 0``) are committed first,
        so that everything added before the call is in the copy. Trackers keep working
        meanwhile (nothing is paused); nothing is written into this store's directory.

        :param dest: a path that does not exist, or an empty directory. The copy is built
            under a temporary name beside it and renamed at the end, so a crash never
            leaves half a store at ``dest``.
        :raises ValueError: ``dest`` exists and is not an empty directory, or lies inside
            this store.
        :raises CheckpointError: the store kept retiring files faster than they could be
            pinned (see :data:`bucketstore.engine.store.checkpoint.ATTEMPTS`).
        """
        check_destination(dest, self.path)  # before committing anything
        with self._lock:
            self._check_open()
            trackers = list(self._trackers.values())
        for tracker in trackers:
            tracker._commit_pending()
        self._flush_topics()
        return make_checkpoint(self.path, dest, catalog=self.catalog, fs=self.fs)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every open tracker, the catalog and the lock. Idempotent.

        :raises MaintenanceError: the first background failure no call had raised yet,
            once everything is closed (see :meth:`BucketTracker.close`).
        """
        failure: MaintenanceError | None = None
        with self._lock:
            if self._closed:
                return
            for tracker in list(self._trackers.values()):
                try:
                    tracker.close()  # drains its seals and merges
                except MaintenanceError as exc:
                    failure = failure or exc  # the other trackers, and the store, still close
            topics_failure = self._close_topics()
            self.budget.close()  # an add still waiting (another thread's) finds the store closed
            self.maintenance.stop()
            if self.segment_reader is not None:
                self.segment_reader.stop()
            self.catalog.close()
            os.close(self._lock_fd)
            self._closed = True
        if failure is not None:
            raise failure
        if topics_failure is not None:
            raise topics_failure

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        close_on_exit(self.close, block_raised=exc_type is not None)


def _rows_in(path: str) -> int | str:
    """How many rows a bucket file's entry 0 records (``"?"`` when it cannot be read): for the log."""
    try:
        with BucketFile(path) as bf:
            return sum(s.count for s in bf.metadata.segments)
    except (CorruptLedgerError, OSError, ValueError):
        return "?"


def _holds_files(store_path: str) -> bool:
    """Whether the store directory holds any sealed ledger file or journal file."""
    ledgers = os.path.join(store_path, "ledgers")
    if os.path.isdir(ledgers) and any(_LEDGER_NAME.match(n) for n in os.listdir(ledgers)):
        return True
    journal = os.path.join(store_path, "journal")
    if os.path.isdir(journal):
        for sub in os.listdir(journal):
            d = os.path.join(journal, sub)
            if os.path.isdir(d) and any(n.endswith(".journal") for n in os.listdir(d)):
                return True
    return False


@overload
def open_store(path: str | os.PathLike[str], durability: str = ..., *, repair: bool = ...,
               sync_interval_ms: int = ..., delivery: str = ..., background: bool = ...,
               max_pending_maintenance: int = ..., read_ahead: bool | None = ...,
               confirm_sync_ms: int = ..., max_backlog_bytes: int = ...,
               read_only: Literal[False] = ...) -> Store: ...


@overload
def open_store(path: str | os.PathLike[str], durability: str = ..., *, repair: bool = ...,
               sync_interval_ms: int = ..., delivery: str = ..., background: bool = ...,
               max_pending_maintenance: int = ..., read_ahead: bool | None = ...,
               confirm_sync_ms: int = ..., max_backlog_bytes: int = ...,
               read_only: Literal[True]) -> ReadOnlyStore: ...


def open_store(path: str | os.PathLike[str], durability: str = "journal", *, repair: bool = False,
               sync_interval_ms: int = 0, delivery: str = "at-least-once", background: bool = True,
               max_pending_maintenance: int = 2, read_ahead: bool | None = None,
               confirm_sync_ms: int = CONFIRM_SYNC_MS, max_backlog_bytes: int = DEFAULT_BUDGET_BYTES,
               read_only: bool = False) -> Store | ReadOnlyStore:
    """Open (creating if missing) the store at ``path``.

    :param durability: ``"journal"`` (the default) — every add, untrack and delivery is
        written to a write-ahead journal, durable when the call returns (or within
        ``sync_interval_ms``, and at ``flush()``): an acknowledged add survives a restart.
        ``"sealed"`` — Pulsar's mode, for embedders that replay their log: an index is
        durable once its bucket is sealed, and recovery skips what is already due (the
        replay re-adds it; see :meth:`BucketTracker.replay_done`).
    :param sync_interval_ms: journal group-commit interval (0: every call is durable).
    :param confirm_sync_ms: (journal mode, at-least-once) the group-commit interval of
        delivery confirmations alone (default 100): a crash may bring back the batches
        confirmed by calls in the last ``max(confirm_sync_ms, sync_interval_ms)`` ms since
        the last commit, besides the unconfirmed one; never loses one. 0 with
        ``sync_interval_ms=0``: a confirmed batch never comes back.
    :param delivery: (journal mode) ``"at-least-once"``, the default: a batch returned by
        ``get_scheduled_messages`` is durably delivered only once confirmed (the next
        ``get_scheduled_messages``, ``flush()`` or ``confirm_delivered()``), so a crash
        may deliver the unconfirmed batches again but never loses them.
        ``"at-most-once"``: durably delivered when returned, so a crash between the
        return and the embedder's use of the batch loses it (never repeats it).
    :param repair: drop catalog keys whose ledger file is missing or damaged, and
        report them in the tracker's ``recovery_report``, instead of raising.
    :param background: True (the default): seals and merges run on the store's
        maintenance thread, off the tracker's lock (``tracker.wait_for_maintenance()``
        waits for them; ``flush()`` and ``close()`` do too); False: the synchronous
        design, where they run on the calling thread under the tracker's lock.
    :param max_pending_maintenance: per tracker, how many seals/merges may be pending
        before a batch add (``add_messages``) waits for the worker.
    :param max_backlog_bytes: the store's memory budget for rows not yet in a sealed
        bucket (mutable buckets, seals and merges in flight; 24 bytes a row; default
        256 MiB). A batch that would exceed it waits, before taking its tracker's lock,
        for seals and merges to finish; single adds and batches of up to 64 rows wait only
        past twice the budget. See docs/maintenance.md.
    :param read_ahead: read a sealed bucket's next segment on the store's reader thread
        once its loaded segment runs low (None, the default: on when ``background``).
    :param read_only: look without changing anything (see
        :mod:`~bucketstore.engine.store.read_only`): no lock is taken, nothing in the store
        directory is created, written or deleted, a missing store is a
        :class:`CatalogError`, and it works beside the live writer. Returns a
        :class:`~bucketstore.engine.store.read_only.ReadOnlyStore`, whose trackers answer
        questions (and ``peek_scheduled``) and raise :class:`~bucketstore.ReadOnlyError`
        on every change. Each tracker is replayed by the durability it has on disk (a
        journal directory: journal mode), so ``durability`` and the writer's tuning
        arguments are not used; ``repair=True`` (which drops keys) is refused.
    :raises StoreLockedError: another process or handle has the store open.
    """
    if read_only:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if repair:
            raise ValueError("repair=True drops damaged catalog keys: it cannot be combined with read_only=True")
        return ReadOnlyStore(path)
    return Store(path, durability, repair=repair, sync_interval_ms=sync_interval_ms, delivery=delivery,
                 confirm_sync_ms=confirm_sync_ms, background=background, max_pending_maintenance=max_pending_maintenance, read_ahead=read_ahead,
                 max_backlog_bytes=max_backlog_bytes)
