"""Looking without changing: ``bucketstore.open(path, read_only=True)``.

A read-only handle takes no lock, creates, writes and deletes nothing in the
store directory, and may be opened beside the store's live writer:

- the catalog is read in one read transaction with LMDB's lock file left alone
  when no writer is running (nothing at all is written; see
  :func:`~bucketstore.engine.catalog.catalog.read_catalog_quietly`), registered in its
  reader table beside a live writer (the one thing written: the slot that keeps
  the writer from reusing the snapshot's pages while they are read);
- each tracker is recovered as a writable open would recover it, but only in
  memory: its journal is read without cutting a torn tail (a live writer may be
  writing it right now) and replayed in memory, nothing is sealed, merged,
  backfilled, compacted or deleted, and no maintenance or read-ahead thread runs;
- every change raises :class:`~bucketstore.ReadOnlyError`.

Each tracker's view is a snapshot taken when :meth:`ReadOnlyStore.tracker` opens
it: its catalog entries (one read transaction) and, in journal mode, its journal,
read between two reads of those entries that must agree, so the two belong to one
moment of the writer (what a crash at that moment would recover). A catalog commit
the writer is still inside (LMDB has written its meta page but not yet published it
to readers) is not seen: the view is the moment before that call, which a crash then
may also recover, while a fresh open of a copy of the files would pick the newer
meta page (e.g. an in-flight ``mark_delete``'s acknowledged rows are still in the
view). Sealed buckets
are opened lazily, as in a writable open; a ledger file the writer deletes after
the snapshot (a merge, a delivery, a mark-delete) then raises
:class:`~bucketstore.StaleSnapshotError` when the view needs it: never a crash
and never a silently wrong answer. Holding every file open from the start would
avoid that, but costs a descriptor per bucket for as long as the handle lives.

The durability each tracker was written with is the one its catalog state records
(:mod:`~bucketstore.engine.store.tracker_record`; for a tracker written before the mode
was recorded: journal files mean journal mode, none sealed mode). In
sealed mode the view is what a writable open would deliver: segments already due
at open are skipped, as PIP-195 recovery skips them (the embedder's replay brings
them back), so :meth:`ReadOnlyTracker.peek_scheduled` never names a position the
writer would not deliver; ``stats()["skipped_due_indexes"]`` says how many indexes
the files still hold that the view leaves out for that reason.
"""

from __future__ import annotations

import heapq
import os
import threading
from typing import Any, NoReturn

import numpy as np

from ...config import TrackerConfig, config_or_default
from ...cutoff import Clock, check_max
from ...errors import CatalogError, ReadOnlyError, StaleSnapshotError, StoreClosedError
from ...format.catalog_codec import validate_tracker_name
from ...format.fs import REAL_FS
from ...format.ledger_file import ledger_file_name
from ..buckets.sealed_bucket import SealedBucket
from ..catalog.catalog import CatalogSnapshot, read_catalog_quietly, read_catalog_snapshot
from ..directory.disk_usage import dir_usage
from ..directory.store_lock import writer_pid
from ..durability.journal import FdPool, JournalState, read_journal
from ..queue.shared_queue import Run
from ..topics.topic_reader import ReadOnlyTopics
from ..tracker.store_services import StoreServices
from ..tracker.tracker import BucketTracker
from .checkpoint import CheckpointReport, check_destination, make_checkpoint
from .tracker_record import recorded_config, recorded_durability
from .tracker_registry import TrackerRegistry

__all__ = ["ReadOnlyStore", "ReadOnlyTracker", "SNAPSHOT_ATTEMPTS"]

#: How often a tracker's snapshot is taken again when the writer changed its catalog
#: entries while its journal was read, or deleted a file the snapshot names meanwhile.
SNAPSHOT_ATTEMPTS = 5
_U64 = np.dtype("<u8")


class _ReplayedJournal:
    """Stands for the tracker's journal during recovery: hands over what was read, writes nothing."""

    def __init__(self, state: JournalState) -> None:
        self._state = state
        self.durable_frontier = state.frontier

    def replay(self) -> JournalState:
        return self._state


class ReadOnlyTracker(BucketTracker):
    """A tracker of a store opened with ``read_only=True``: answers questions, refuses changes.

    Answers :attr:`number_of_delayed_messages`, :meth:`contains_message`,
    :meth:`next_delivery_time`, :meth:`has_message_available`, :meth:`stats` and
    :meth:`peek_scheduled`; every call that would change the tracker raises
    :class:`~bucketstore.ReadOnlyError`. :meth:`close` releases it.

    ``recovery_report`` is a writable open's, where ``deleted_due``, ``enclosed_removed``
    and ``summaries_backfilled`` count what that open would delete or write and this one
    only leaves out of its view (or keeps in memory), plus ``read_only`` (True) and
    ``snapshot``: ``"one"`` when the catalog entries and the journal were read as one
    moment of the writer, ``"journal first"`` when the writer changed the entries during
    every attempt (the journal was then read before the entries: every index tracked
    when it was read is seen, unless the writer delivered it meanwhile).
    """

    _read_only = True

    def __init__(self, store: StoreServices, name: str, config: TrackerConfig, clock: Clock | None,
                 journal: JournalState | None) -> None:
        self._journal_state = journal
        self._skipped_due = 0
        #: Set once a file of the snapshot turned out retired: the view is then incomplete,
        #: so every later question raises it again rather than answer from what is left.
        self._gone: StaleSnapshotError | None = None
        self._recovering = True
        super().__init__(store, name, config, clock)
        self._recovering = False
        self._journal = None  # replayed in memory; nothing is ever appended
        if store.durability == "sealed":
            # Leading segments recovery skipped as due: still in the files, left out of the view.
            self._skipped_due += sum(int(b.counts[:b.current].sum()) for b in self._buckets.values() if b.current)
        self.recovery_report["read_only"] = True

    def _check_open(self) -> None:
        super()._check_open()
        self._check_snapshot()

    def _check_alive(self) -> None:
        super()._check_alive()
        self._check_snapshot()

    def _check_snapshot(self) -> None:
        """Once a file of the snapshot is found gone, the view is incomplete: no answer at all."""
        if self._gone is not None:
            raise StaleSnapshotError(str(self._gone), path=self._gone.path)

    # -- recovery without writing ---------------------------------------------------------------
    def _open_journal(self) -> Any:
        assert self._journal_state is not None
        return _ReplayedJournal(self._journal_state)

    def _start_seal(self, cutoff: int) -> None:
        """Never seal: a replayed journal's indexes all stay in memory."""

    def _checkpoint(self) -> None:
        """Never compact the journal: it is the writer's."""

    def _delete_buckets(self, buckets: list[SealedBucket]) -> None:
        """Leave buckets out of the view (recovery's due or acknowledged ones, read-out ones)
        without touching their keys or files."""
        first_live = self._mark_delete[0] if self._mark_delete else 0
        for b in buckets:
            if self._recovering and self._store.durability == "sealed" and b.end_ledger >= first_live:
                self._skipped_due += int(b.counts.sum())  # every segment was due at open
            b.dead = True
            self._buckets.remove(b)
            if not b.opened:
                self._forget_unopened(b)

    def _open_bucket(self, bucket: SealedBucket, meta: Any = None) -> None:
        try:
            super()._open_bucket(bucket, meta)
        except (CatalogError, OSError) as exc:
            self._raise_if_gone(bucket, exc)
            raise

    def _unopened_contains(self, bucket: SealedBucket, ledger_id: int, entry_id: int) -> bool:
        try:
            return super()._unopened_contains(bucket, ledger_id, entry_id)
        except (CatalogError, OSError) as exc:
            self._raise_if_gone(bucket, exc)
            raise

    def _load_segment(self, bucket: SealedBucket) -> Run:
        try:
            return super()._load_segment(bucket)
        except (CatalogError, OSError) as exc:
            self._raise_if_gone(bucket, exc)
            raise

    def _read_segment(self, bucket: SealedBucket, number: int) -> Run:
        try:
            return bucket.read_segment(number)
        except OSError as exc:
            self._raise_if_gone(bucket, exc)
            raise

    def _raise_if_gone(self, bucket: SealedBucket, exc: BaseException) -> None:
        """Raise :class:`StaleSnapshotError` if the bucket's file is missing because the writer
        retired the bucket after the snapshot (the catalog no longer names it); a file still
        named but missing is damage, and the original error stands."""
        if os.path.exists(bucket.path):
            return
        store = self._store
        now = read_catalog_quietly(os.path.join(store.path, "catalog"), lambda c: c.tracker_snapshot(self.name))
        if now.buckets(self.name).get(bucket.key) == bucket.ledger_id:
            return
        self._gone = StaleSnapshotError(
            f"{bucket.path}: tracker {self.name!r} bucket {bucket.key} (ledger {bucket.ledger_id}) was retired by "
            "the store's writer after this read-only snapshot was taken; open the store read_only again to look "
            "at a newer snapshot", path=bucket.path)
        raise self._gone from exc

    # -- refusals -------------------------------------------------------------------------------
    def _refuse(self, what: str) -> NoReturn:
        self._check_open()
        raise ReadOnlyError(f"tracker {self.name!r}: {what} would change the store {self._store.path}, "
                            "which was opened read_only")

    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        self._refuse("add_message")

    def add_messages(self, indexes: Any) -> int:
        self._refuse("add_messages")

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        self._refuse("get_scheduled_messages (use peek_scheduled to look)")

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *, cancel: Any = None
                       ) -> list[tuple[int, int]]:
        self._refuse("wait_scheduled")

    def confirm_delivered(self) -> None:
        self._refuse("confirm_delivered")

    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        self._refuse("mark_delete")

    def clear(self) -> None:
        self._refuse("clear")

    def replay_done(self) -> None:
        self._refuse("replay_done")

    def flush(self) -> None:
        self._refuse("flush")

    # -- looking --------------------------------------------------------------------------------
    def peek_scheduled(self, max_messages: int) -> list[tuple[int, int]]:
        """The positions :meth:`~BucketTracker.get_scheduled_messages` would return now, without
        delivering them: up to ``max_messages`` due indexes in index order (timestamp, ledger,
        entry), returned sorted by position. Nothing changes: asking twice gives the same
        answer (unless the clock has moved meanwhile). Sealed buckets' due segments are read
        from their files, in the order of their first timestamp, only as far as the answer needs.

        :raises StaleSnapshotError: a file the answer needs was deleted by the writer since
            the snapshot.
        """
        max_messages = check_max(max_messages)
        with self._lock:
            self._check_open()
            cutoff = self._cutoff.advance()
            if max_messages == 0:
                return []
            self._sync_queue()  # what is in memory and due is in the queue now (as for a delivery)
            found = _DueRows(cutoff, max_messages, self._index)
            for item in self._queue.items():
                if isinstance(item, Run) and not item.dead and item.remaining:
                    found.add(*item.rest())
            # The segments still on disk, earliest first; a segment whose first timestamp is
            # after the max_messages-th due index found so far cannot contribute.
            pending: list[tuple[int, int, int, SealedBucket]] = []
            for b in self._buckets.values():
                if not b.dead and b.has_next_segment() and b.next_segment_min_ts() <= cutoff:
                    pending.append((b.next_segment_min_ts(), b.start_ledger, b.current + 1, b))
            heapq.heapify(pending)
            while pending and pending[0][0] <= found.bound():
                _, _, number, bucket = heapq.heappop(pending)
                self._open_bucket(bucket)  # its positions must be in the index to count as live
                found.add(*self._read_segment(bucket, number).rest())
                if number < bucket.segment_count and int(bucket.min_ts[number]) <= cutoff:
                    heapq.heappush(pending, (int(bucket.min_ts[number]), bucket.start_ledger, number + 1, bucket))
            return found.positions()

    def stats(self) -> dict[str, Any]:
        """:meth:`BucketTracker.stats`, plus ``read_only`` (True) and ``skipped_due_indexes``:
        in sealed mode, the indexes the ledger files hold in segments that were already due
        at open, which the view leaves out as a writable open skips them (PIP-195: the
        embedder's replay brings them back); 0 in journal mode."""
        stats = super().stats()
        stats["read_only"] = True
        stats["skipped_due_indexes"] = self._skipped_due
        return stats


class _DueRows:
    """The due rows met so far, from which the first ``need`` deliverable ones are taken
    (at most ``need`` are kept between reads, so a peek's memory is bounded by it and one segment)."""

    def __init__(self, cutoff: int, need: int, index: Any) -> None:
        self._cutoff = cutoff
        self._need = need
        self._index = index
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._bound = cutoff
        self._stale = False  # rows were added since the bound was taken

    def add(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> None:
        due = ts <= np.uint64(max(self._cutoff, 0)) if self._cutoff >= 0 else np.zeros(len(ts), bool)
        if due.any():
            self._parts.append((ts[due], ledgers[due], entries[due]))
            self._stale = True

    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The deliverable rows in delivery order (one per position: the first live row)."""
        if not self._parts:
            empty = np.zeros(0, dtype=_U64)
            return empty, empty, empty
        ts, ledgers, entries = (np.concatenate(cols) for cols in zip(*self._parts))
        order = np.lexsort((entries, ledgers, ts))
        ts, ledgers, entries = ts[order], ledgers[order], entries[order]
        keep = np.flatnonzero(self._index.claimable_mask(ledgers, entries, ts))[:self._need]
        # Rows past the need-th can no longer be in the answer: a row found later either
        # sorts after them too or takes the place of one that sorts before them.
        self._parts = [(ts[keep], ledgers[keep], entries[keep])]
        return self._parts[0]

    def bound(self) -> int:
        """The latest timestamp a row may have and still be among the first ``need``."""
        if self._stale:
            self._stale = False
            ts = self._rows()[0]
            self._bound = int(ts[self._need - 1]) if len(ts) >= self._need else self._cutoff
        return self._bound

    def positions(self) -> list[tuple[int, int]]:
        ts, ledgers, entries = self._rows()
        ledgers, entries = ledgers[:self._need], entries[:self._need]
        order = np.lexsort((entries, ledgers))
        return list(zip(ledgers[order].tolist(), entries[order].tolist()))


class ReadOnlyStore(TrackerRegistry[ReadOnlyTracker], ReadOnlyTopics):
    """A store opened with ``bucketstore.open(path, read_only=True)`` (see the module's docstring).

    :ivar path: the store directory.
    :ivar durability: ``"journal"`` when the store holds a ``journal/`` directory, else
        ``"sealed"`` (each tracker is replayed by what it has on disk).
    :ivar read_only: True.
    :ivar store_id: the store's identity, as the catalog records it.
    """

    read_only = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        raw_path = os.fspath(path)
        if isinstance(raw_path, bytes):
            raise TypeError("store path must be a str or os.PathLike[str], not bytes")
        if not raw_path:
            raise ValueError("store path is empty (give the store's directory)")
        self.path = os.path.abspath(raw_path)
        if not os.path.isdir(self.path):
            what = "no such directory" if not os.path.exists(self.path) else "not a directory"
            raise CatalogError(f"{self.path} is not a bucketstore store ({what}); a read-only open creates "
                               "nothing", path=self.path)
        self._catalog_dir = os.path.join(self.path, "catalog")
        if not os.path.isdir(self._catalog_dir):
            raise CatalogError(f"{self.path} is not a bucketstore store (it has no catalog/ directory)",
                               path=self.path)
        #: The catalog as of the open (tracker names, allocator, identity).
        self.snapshot: CatalogSnapshot = read_catalog_snapshot(self._catalog_dir, quiet=True)
        self.store_id = self.snapshot.store_id
        self.durability = "journal" if os.path.isdir(os.path.join(self.path, "journal")) else "sealed"
        self.ledgers_dir = os.path.join(self.path, "ledgers")
        self._lock = threading.Lock()
        self._trackers: dict[str, ReadOnlyTracker] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    def tracker(self, name: str, config: TrackerConfig | None = None, clock: Clock | None = None
                ) -> ReadOnlyTracker:
        """Open the existing tracker ``name`` read-only (see :class:`ReadOnlyTracker`).

        One handle per name at a time, as for a writable store. Its snapshot is taken now.

        :param config: the tracker's configuration; None (the default) uses the one the
            writer recorded in the catalog.
        :param clock: what "now" is for due-ness (default: the real clock).
        :raises ReadOnlyError: the store holds no tracker of that name (a read-only
            handle creates nothing).
        """
        validate_tracker_name(name)
        if config is not None:
            config = config_or_default(config)
        with self._lock:
            self._check_open()
            live = self._trackers.get(name)
            if live is not None:
                if config is not None and live.config != config:
                    raise ValueError(f"tracker {name!r} is already open with a different config")
                return live
            tracker = self._open_tracker(name, config, clock)
            self._trackers[name] = tracker
            return tracker

    def _open_tracker(self, name: str, config: TrackerConfig | None, clock: Clock | None) -> ReadOnlyTracker:
        for attempt in range(SNAPSHOT_ATTEMPTS):
            last = attempt == SNAPSHOT_ATTEMPTS - 1
            snapshot = self._tracker_snapshot(name)
            identity = (snapshot.store_id, name) if snapshot.store_id else None
            mode = recorded_durability(snapshot.tracker_state(name), self.path, name)
            # A tracker recorded as sealed is replayed as one: journal files beside it are a
            # deleted tracker's, which its writer's next journal open removes unread.
            journal = None if mode == "sealed" else read_journal(self.path, name, identity=identity)
            if journal is None and mode == "journal":
                journal = JournalState(None, [], 0, 0)  # recorded journal, its directory gone: nothing journaled
            moment = "one"
            if journal is not None:
                # The journal and the catalog must describe one moment: entries unchanged
                # across the journal's read. (If the writer keeps changing them, the last
                # try reads journal first, catalog second: every index tracked when the
                # journal was read is seen unless the writer delivered it meanwhile.)
                after = self._tracker_snapshot(name)
                if after != snapshot:
                    if not last:
                        continue
                    moment = "journal first"
                snapshot = after
            services = StoreServices(
                path=self.path, durability="sealed" if journal is None else "journal", repair=False,
                sync_interval_ms=0, fs=REAL_FS, catalog=snapshot,  # type: ignore[arg-type]
                ledgers_dir=self.ledgers_dir, next_ledger_id=snapshot.next_ledger_id(),
                store_id=snapshot.store_id or "", journal_fds=FdPool(1), tracker_closed=self._forget,
                background=False, segment_reader=None)
            try:
                tracker = ReadOnlyTracker(services, name, config or recorded_config(snapshot.tracker_state(name)),
                                          clock, journal)
            except StaleSnapshotError:
                if last:
                    raise
                continue
            tracker.recovery_report["snapshot"] = moment
            return tracker
        raise AssertionError("unreachable")  # pragma: no cover

    def _tracker_snapshot(self, name: str) -> CatalogSnapshot:
        snapshot = read_catalog_quietly(self._catalog_dir, lambda c: c.tracker_snapshot(name))
        if snapshot.tracker_state(name) is None:
            raise ReadOnlyError(f"tracker {name!r} does not exist in store {self.path}, and a store opened "
                                "read_only creates nothing")
        return snapshot

    def trackers(self) -> list[str]:
        """Names of every tracker in the store as of the open, sorted."""
        self._check_open()
        return self.snapshot.tracker_names()

    def ledger_path(self, ledger_id: int) -> str:
        """The path of ledger file ``ledger_id``."""
        return os.path.join(self.ledgers_dir, ledger_file_name(ledger_id))

    def delete_tracker(self, name: str) -> None:
        """Refused: :class:`~bucketstore.ReadOnlyError`."""
        self._check_open()
        raise ReadOnlyError(f"delete_tracker({name!r}) would change the store {self.path}, which was opened read_only")

    def stats(self) -> dict[str, Any]:
        """Store-level figures: trackers (as of the open), ledger files and bytes (now), the writer's pid."""
        self._check_open()
        # A file the live writer retires between the listing and its stat is in neither figure.
        ledgers = dir_usage(self.ledgers_dir, lambda n: n.endswith(".ledger"))
        return {"path": self.path, "durability": self.durability, "read_only": True,
                "trackers": len(self.snapshot.tracker_names()), "ledger_files": ledgers.files,
                "ledger_bytes": ledgers.bytes,
                "next_ledger_id": self.snapshot.next_ledger_id(), "writer_pid": writer_pid(self.path)}

    def checkpoint(self, dest: str | os.PathLike[str]) -> CheckpointReport:
        """Copy the store into ``dest``: a consistent crash image holding every index its writer
        acknowledged before the call, also while that writer runs (in another process or this
        one). What ``bucketstore checkpoint`` does (see :mod:`~bucketstore.engine.store.checkpoint`):
        ledger files hard-linked (or copied), the catalog in one read transaction, each journal
        read before and after it. Unlike the writer's :meth:`Store.checkpoint`, adds waiting for
        their group commit (``sync_interval_ms > 0``) are not in the copy: they are not durable.
        Nothing is written into the store but the reader slot LMDB takes in ``lock.mdb``.

        :param dest: a path that does not exist, or an empty directory, outside the store.
        :raises ValueError: a bad ``dest`` (exists and not an empty directory; inside the store).
        :raises CheckpointError: the writer kept retiring files faster than they were pinned.
        """
        self._check_open()
        check_destination(dest, self.path)
        return make_checkpoint(self.path, dest)

    def close(self) -> None:
        """Close every tracker opened on this handle. Idempotent."""
        with self._lock:
            if self._closed:
                return
            trackers = list(self._trackers.values())
        for tracker in trackers:
            tracker.close()
        with self._lock:
            self._closed = True

    def __enter__(self) -> "ReadOnlyStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

