"""The write-ahead journal of one tracker (``durability="journal"``).

Everything a tracker holds only in memory — indexes in the mutable bucket,
indexes that went straight to the shared queue, untracking by expired
re-adds — and its *delivery frontier* are appended here, so that a crash loses
nothing that was acknowledged as durable.

Layout: ``journal/<readable prefix>-<hash of the tracker name>/<file number, 20 digits>.journal``
(stores written before version 2 keep their ``<tracker name as hex>`` directories)::

    file    := header group*
    header  := magic "BKTJRNL\\n" | version u16 (2) | reserved u16 | file number u64
               | store id 16 bytes | tracker name length u16 | tracker name (UTF-8)
               | masked crc32c u32 (of the above)
    group   := body length u32 | masked crc32c(file number u64 || body) u32 | body
    body    := msgpack record, msgpack record, ...

The header ties the file to its tracker and store: replay refuses a file whose
header names another tracker or store (a journal copied or moved by hand), so
it never replays another subscription's positions. Version-1 headers (no
identity) are still read.

One *group* is written by one ``write`` and made durable by one ``fsync``
(group commit): a group is all or nothing. The next group is written only
after the previous fsync returned, so a crash can damage only the last group
of the last file: a group whose frame runs past the end of the file, fails
its CRC and is followed only by zeros, is a torn tail and is cut off. Damage
followed by more data is not a torn tail: it raises
:class:`~bucketstore.JournalError` naming the file and offset.

A new file starts with a *checkpoint*: the tracker's whole in-memory-only
state at that moment. Once it is durable, older files are deleted; on replay,
files before the newest complete checkpoint are ignored (and removed).

A seal's checkpoint is written without the tracker's lock, in two steps
(:meth:`Journal.begin_checkpoint` under it, :meth:`Journal.write_checkpoint`
without it): the state is taken under the lock and the checkpoint gets file
number ``n``, while appends move on at once to a *tail* file ``n + 1``, created
by the next commit (named only once its header and first group are durable,
as every journal file). Replay folds every file from the newest complete
checkpoint on, so the log stays whole at every moment: before checkpoint ``n``
is durable, the older files and the tail (everything before the state, then
everything after it); after, the checkpoint and the tail. The records of the
older files the state already holds may come back as duplicates only if the
checkpoint is lost, as between a seal's catalog commit and its checkpoint.

Records (msgpack arrays):

``["a", ledgers, entries, timestamps]``
    indexes tracked; three little-endian uint64 columns as bytes
``["x", ledger_id, entry_id]``
    a position untracked by an expired re-add
``["f", timestamp, ledger_id, entry_id]``
    the delivery frontier: every index at or before this key has been delivered
    and its delivery confirmed (see :mod:`bucketstore.engine.durability.handoff`). A group
    holding only confirmations (lazy ``f`` records) may wait for the confirmation
    window (:attr:`Journal.urgent`); replay keeps the largest ``f``
``["c"]``
    the start of a checkpoint (first record of a file); ``["e"]`` its end

The bytes (header, group framing, records) are encoded and parsed by
:mod:`bucketstore.format.journal_codec`; this module owns the files: appending, fsync, the
checkpoint's rename, cutting a torn tail, and replay.

:func:`read_journal` reads a journal from another process or a read-only handle (and
:func:`read_frontier` its frontier, for the Spark reader) with replay's parsing
(:func:`parse_file`) but none of its repairs.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...errors import JournalError
from ...format.fs import REAL_FS, FileSystem
from ...format.journal_codec import (CHECKPOINT_END, CHECKPOINT_START, MAX_HEADER_SIZE, ParsedFile, encode_add,
                                    encode_add_one, encode_frontier, encode_header, encode_topic_adds,
                                    encode_untrack, frame_group, parse_file, parse_header)

__all__ = ["CheckpointWrite", "Journal", "JournalState", "FdPool", "journal_directory", "has_journal", "read_frontier",
           "read_identity", "read_journal", "list_files", "newest_checkpoint"]

_DIR_PREFIX = 48
_FILE_NAME = re.compile(r"^(\d{20})\.journal$")


def journal_directory(store_path: str, tracker: str) -> str:
    """Where a tracker's journal files live.

    A readable prefix of the name (letters, digits, ``._-``; at most 48) and 16 hex
    digits of its SHA-256: bounded at 65 bytes whatever the name, and safe as a
    path. A directory of an older store, named by the whole name in hex, is used
    while it exists.
    """
    raw = tracker.encode("utf-8")
    legacy = os.path.join(store_path, "journal", raw.hex())
    if len(raw) * 2 <= 255 and os.path.isdir(legacy):
        return legacy
    prefix = re.sub(r"[^A-Za-z0-9._-]", "_", tracker)[:_DIR_PREFIX].lstrip(".") or "t"
    return os.path.join(store_path, "journal", f"{prefix}-{hashlib.sha256(raw).hexdigest()[:16]}")


class FdPool:
    """A bounded set of open journal file descriptors, shared by a store's journals.

    A journal keeps its file open between commits; with thousands of trackers
    that would exhaust the process's descriptors. Past ``capacity`` open files,
    the least recently used journal that is not in the middle of a write closes
    its descriptor, and reopens it (``O_APPEND``) at its next commit.
    """

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[int, "Journal"] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, journal: "Journal") -> None:
        """Record that ``journal`` (whose ``_fd_lock`` the caller holds) has a descriptor open."""
        with self._lock:
            self._open[id(journal)] = journal
            self._open.move_to_end(id(journal))
            if len(self._open) <= self.capacity:
                return
            for key, victim in list(self._open.items()):
                if len(self._open) <= self.capacity:
                    break
                # Never wait: the victim may be writing (its owner holds the lock), and a
                # journal admitting itself holds its own lock, so skip it either way.
                if victim is journal or not victim._fd_lock.acquire(blocking=False):
                    continue
                try:
                    victim._close_fd()
                finally:
                    victim._fd_lock.release()
                del self._open[key]

    def forget(self, journal: "Journal") -> None:
        with self._lock:
            self._open.pop(id(journal), None)


@dataclass
class JournalState:
    """What a replay recovered: the frontier and the ordered add/untrack records."""

    frontier: tuple[int, int, int] | None
    records: list[tuple]
    files: int
    cut_bytes: int


@dataclass
class CheckpointWrite:
    """A checkpoint begun under the tracker's lock (:meth:`Journal.begin_checkpoint`), to be
    written without it (:meth:`Journal.write_checkpoint`): its file number and its records,
    but the memory-only rows, encoded by the write (fresh arrays, never changed)."""

    number: int
    head: list[bytes]
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    tail: list[bytes]


class Journal:
    """Append-only, group-committed journal of one tracker.

    Not thread-safe by itself: the tracker's lock guards it.
    """

    def __init__(self, directory: str, fs: FileSystem = REAL_FS, *, tracker: str | None = None,
                 store_id: str | None = None, pool: FdPool | None = None, topic: bool = False) -> None:
        self.directory = directory
        #: A topic's journal (engine/topics/topic_journal.py): ``t`` records, no ``a``/``x``/``f``.
        self.topic = topic
        self._fs = fs
        fs.makedirs(directory)
        self._pending: list[bytes] = []
        #: Whether the pending group holds a record a crash must not lose (an add, an untrack,
        #: an at-most-once frontier): only a group of lazy frontiers may wait for its window.
        self._urgent = False
        #: Whether the last pending record is a lazy frontier (the next one may replace it).
        self._lazy_last = False
        self._fd = -1
        self._number = -1
        self._poisoned: str | None = None
        #: Groups made durable so far (commits and checkpoints): a :meth:`mark` is stale after one.
        self.groups = 0
        #: The largest delivery frontier that is durable (fsynced, or replayed).
        self.durable_frontier: tuple[int, int, int] | None = None
        self._pending_frontier: tuple[int, int, int] | None = None
        #: (store id, tracker name) written into every header and required of every file read;
        #: None (tests of the file format alone) writes version-1 headers and checks nothing.
        self.identity: tuple[str, str] | None = None
        if tracker is not None and store_id is not None:
            self.identity = (store_id, tracker)
        self._pool = pool
        self._fd_lock = threading.Lock()
        #: Whether file ``_number`` is a tail a begun checkpoint reserved, not created yet.
        self._tail_fresh = False

    def discard_deleted(self) -> int:
        """Remove the files a deleted tracker of this name left here; how many.

        Called only for a tracker the catalog has no state for: every tracker commits its
        state at its first open, before anything is journaled, and ``delete_tracker`` removes
        the state before the files, so files here belong to a deleted tracker (a crash or an
        I/O error stopped the deletion half-way). Replayed, they would bring its indexes back
        under the new tracker. Only when every file's header names this tracker of this store
        (or no one: version 1): a file of another store or tracker, or one whose header cannot
        be read (a named journal file always has a whole header: it is renamed into place after
        its fsync), is damage, and then nothing is removed and the replay reports it.
        """
        files, leftovers = _list_files(self.directory)
        for _, path in files:
            try:
                owner = read_identity(path)
            except (JournalError, OSError):
                return 0
            if owner is not None and owner != self.identity:
                return 0
        for path in [p for _, p in files] + leftovers:
            self._fs.unlink(path)
        if files or leftovers:
            self._fs.fsync_dir(self.directory)
        return len(files)

    # -- replay ---------------------------------------------------------------------------------
    def replay(self) -> JournalState:
        """Read every file from the newest checkpoint on; cut a torn tail of the last file.

        Unlike :func:`read_frontier`, this repairs the directory for the writer
        that will append to it: leftover ``*.journal.tmp`` files and superseded
        files are removed and a torn tail is cut off (a new group must not land
        after garbage).
        """
        files, leftovers = _list_files(self.directory)
        for path in leftovers:
            self._fs.unlink(path)
        parsed: list[tuple[int, str, ParsedFile]] = []
        cut = 0
        for i, (number, path) in enumerate(files):
            with open(path, "rb") as f:
                data = f.read()
            result = parse_file(data, path, number, last=(i == len(files) - 1), identity=self.identity,
                                topic=self.topic)
            if result.torn_at is not None:
                self._cut(path, result.torn_at)
                cut += len(data) - result.torn_at
            parsed.append((number, path, result))
        start = _newest_checkpoint([p.records for _, _, p in parsed])
        frontier, out = _fold([p.records for _, _, p in parsed[start:]])
        for _, path, _ in parsed[:start]:
            self._fs.unlink(path)
        # Appends go to the newest file that still exists (a torn file with nothing durable
        # was removed above); with none, the next commit starts file 0 with a checkpoint.
        kept = [number for number, path, result in parsed[start:] if result.torn_at != 0]
        self._number = kept[-1] if kept else -1
        self.durable_frontier = frontier
        return JournalState(frontier, out, len(parsed) - start, cut)

    def _cut(self, path: str, at: int) -> None:
        """Remove a torn tail: the whole file when nothing of it became durable, else truncate at ``at``."""
        if at == 0:
            self._fs.unlink(path)
            return
        # Through the file layer like every other durable change (the fault tests count,
        # crash and model it); O_APPEND does not affect ftruncate.
        fd = self._fs.open_append(path)
        try:
            self._fs.truncate(fd, at)
            self._fs.fsync(fd)
        finally:
            self._fs.close(fd)

    # -- appending ------------------------------------------------------------------------------
    def add_rows(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray) -> None:
        self._urgent = True
        self._lazy_last = False
        self._pending.append(encode_add(ledgers, entries, ts))

    def add_one(self, ledger_id: int, entry_id: int, ts: int) -> None:
        self._urgent = True
        self._lazy_last = False
        self._pending.append(encode_add_one(ledger_id, entry_id, ts))

    def add_topic_rows(self, first: int, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray,
                       cutoffs: np.ndarray) -> None:
        """A topic's adds numbered from ``first``, each with its call's cutoff (a ``t`` record)."""
        self._urgent = True
        self._lazy_last = False
        self._pending.append(encode_topic_adds(first, ledgers, entries, ts, cutoffs))

    def discard(self) -> None:
        """Drop the pending group unwritten: the caller made what it records durable elsewhere
        (a topic that synced its index with these adds in it)."""
        self._pending.clear()
        self._urgent = self._lazy_last = False
        self._pending_frontier = None

    def untrack(self, ledger_id: int, entry_id: int) -> None:
        self._urgent = True
        self._lazy_last = False
        self._pending.append(encode_untrack(ledger_id, entry_id))

    def frontier(self, key: tuple[int, int, int], *, lazy: bool = False) -> None:
        """Append a frontier record.

        :param lazy: the record only confirms deliveries (at-least-once): losing it makes a
            crash deliver them again, never lose anything, so it may wait for the confirmation
            window (see :attr:`urgent`). An at-most-once frontier is not lazy: losing it would
            deliver a batch twice.
        """
        if not lazy:
            self._urgent = True
        # Consecutive lazy frontiers in one pending group: only the largest matters (replay
        # keeps the maximum), so a drain that commits once per window writes one record.
        record = encode_frontier(key)
        if lazy and self._lazy_last and self._pending:
            self._pending[-1] = record
        else:
            self._pending.append(record)
        self._lazy_last = lazy
        self._pending_frontier = key

    def mark(self) -> tuple:
        """The pending group as it is now: what :meth:`rewind` goes back to."""
        return len(self._pending), self._urgent, self._lazy_last, self._pending_frontier, self.groups

    def rewind(self, mark: tuple) -> bool:
        """Drop the records appended since ``mark``, not committed: the call that appended them
        raised and undid what they record. False (nothing dropped) when a group was made durable
        since: the records are on disk or in a checkpoint, past undoing."""
        n, urgent, lazy_last, pending_frontier, groups = mark
        if groups != self.groups:
            return False
        del self._pending[n:]
        self._urgent, self._lazy_last, self._pending_frontier = urgent, lazy_last, pending_frontier
        return True

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def urgent(self) -> bool:
        """Whether the pending group must be committed within the add window
        (``sync_interval_ms``); False when it holds only lazy frontiers, which may wait
        for the confirmation window (``confirm_sync_ms``)."""
        return self._urgent

    def commit(self) -> None:
        """Write the pending records as one group and fsync it. A failed write or fsync poisons
        the journal (:class:`JournalError`); a failure to open the file (to create the first
        one, or to reopen the one the descriptor pool closed) writes nothing and is raised as
        the ``OSError``: the group stays pending for the next commit."""
        if not self._pending:
            return
        if self._poisoned:
            raise JournalError(self._current_path(), 0, f"journal is unusable after an earlier failure: "
                                                        f"{self._poisoned}")
        if self._number < 0:
            self._open_new(checkpoint=[])
        body = b"".join(self._pending)
        if self._tail_fresh:
            self._open_tail(frame_group(self._number, body))
        else:
            self._append(body)
        self._pending.clear()
        self._urgent = self._lazy_last = False
        self.groups += 1
        if self._pending_frontier is not None:
            self.durable_frontier, self._pending_frontier = self._pending_frontier, None

    def _append(self, body: bytes) -> None:
        with self._fd_lock:  # the pool must not close the descriptor mid-write
            # Reopening the file the pool closed (EMFILE, ENFILE) writes nothing: the group stays
            # pending and the next commit tries again, as after a failed first file's creation.
            fd = self._ensure_fd()
            try:
                self._fs.write(fd, frame_group(self._number, body))
                # Never retried: after a failed fsync the kernel may have dropped the
                # dirty pages, and a second fsync could report success for lost data.
                self._fs.fsync(fd)
            except OSError as exc:
                self._poisoned = f"{type(exc).__name__}: {exc}"
                raise JournalError(self._current_path(), 0, f"journal write failed: {exc}") from exc

    def _open_tail(self, group: bytes) -> None:
        """Create the tail file a begun checkpoint reserved, holding its first group, durably
        before it is named (a named journal file always has a whole header). A failure before
        the rename names nothing: the group stays pending (raised as the ``OSError``); after
        it, the group may be durable or not, so the journal is poisoned."""
        path = self._current_path()
        fd = self._write_named(path, encode_header(self._number, self.identity) + group, keep_open=True)
        with self._fd_lock:
            self._fd, self._tail_fresh = fd, False
            if self._pool is not None:
                self._pool.admit(self)

    def _write_named(self, path: str, data: bytes, keep_open: bool, what: str = "file creation") -> int:
        """Write ``data`` as a new file ``path``: a temporary file, fsync, rename, directory fsync.
        Returns the descriptor if ``keep_open`` (else -1). A failure after the rename poisons
        the journal unless ``keep_open`` is False (a checkpoint written beside a tail): the new
        file is complete under its final name, its entry perhaps durable, so a replay starts
        from it and would skip whatever this journal appended to the current file from then on.
        Unlinking it could be undone by a crash as well, so no more appends: a reopen replays.
        ``what`` names the write in that error."""
        tmp = path + ".tmp"
        fd = self._fs.create(tmp)
        renamed = False
        try:
            self._fs.write(fd, data)
            self._fs.fsync(fd)
            if not keep_open:
                fd, closing = -1, fd
                self._fs.close(closing)
            self._fs.rename(tmp, path)
            renamed = True
            self._fs.fsync_dir(self.directory)
        except BaseException as exc:
            try:
                if fd >= 0:
                    self._fs.close(fd)
            finally:
                if not renamed:
                    try:
                        self._fs.unlink(tmp)
                    except OSError:
                        pass
            if renamed and keep_open and isinstance(exc, OSError):
                self._poisoned = f"{type(exc).__name__}: {exc}"
                raise JournalError(path, 0, f"journal {what} failed after its rename: {exc}") from exc
            raise
        return fd

    def _ensure_fd(self) -> int:
        """The current file's descriptor, reopened for appending if the pool closed it."""
        if self._fd < 0:
            self._fd = self._fs.open_append(self._current_path())
        if self._pool is not None:
            self._pool.admit(self)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._fs.close(fd)

    def _current_path(self) -> str:
        return os.path.join(self.directory, f"{self._number:020d}.journal")

    def _open_new(self, checkpoint: list[bytes]) -> None:
        """Start the next file with a checkpoint group, durable before anything else uses it."""
        number = self._number + 1
        path = os.path.join(self.directory, f"{number:020d}.journal")
        body = b"".join([CHECKPOINT_START, *checkpoint, CHECKPOINT_END])
        fd = self._write_named(path, encode_header(number, self.identity) + frame_group(number, body),
                               keep_open=True, what="checkpoint")
        with self._fd_lock:
            old_fd, self._fd, self._number = self._fd, fd, number
            self._tail_fresh = False
            if old_fd >= 0:
                self._fs.close(old_fd)
            if self._pool is not None:
                self._pool.admit(self)

    def checkpoint(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray,
                   frontier: tuple[int, int, int] | None,
                   untracked: list[tuple[int, int]] = (),
                   redeliver: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """Start a new file holding exactly this state, then delete every older file.

        The new file is durable (fsync, rename, directory fsync) before any old
        file is unlinked, so a crash in between leaves both, and replay starts
        from the newest complete checkpoint.

        :param redeliver: (ledgers, entries, ts) of delivered rows after ``frontier``
            whose delivery is not confirmed: tracked again by a replay.
        """
        if self._poisoned:
            raise JournalError(self._current_path(), 0, f"journal is unusable after an earlier failure: "
                                                        f"{self._poisoned}")
        # Untracks first: they cancel rows of sealed buckets, which replay loads before
        # the records; the memory-only adds that follow may track a position anew.
        records = [encode_untrack(ledger, entry) for ledger, entry in untracked]
        # Unconfirmed deliveries after the untracks (one of them may be a ghost that the
        # replay must track again) and before the memory-only adds.
        if redeliver is not None and len(redeliver[0]):
            records.append(encode_add(*redeliver))
        if len(ledgers):
            records.append(encode_add(ledgers, entries, ts))
        if frontier is not None:
            records.append(encode_frontier(frontier))
        # The pending group is in ``records`` (the tracker's state): it is dropped only once the
        # new file holds it. A checkpoint that fails first leaves it pending for the next commit.
        self._open_new(records)
        self._pending.clear()
        self._urgent = self._lazy_last = False
        self._pending_frontier = None
        self.groups += 1
        self.durable_frontier = frontier
        for number, path in _list_files(self.directory)[0]:
            if number < self._number:
                self._fs.unlink(path)
        self._fs.fsync_dir(self.directory)

    def begin_checkpoint(self, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray,
                         frontier: tuple[int, int, int] | None,
                         untracked: list[tuple[int, int]] = (),
                         redeliver: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> CheckpointWrite:
        """:meth:`checkpoint`'s first step, under the tracker's lock: the state (as for
        :meth:`checkpoint`; ``ledgers``, ``entries``, ``ts`` must be arrays nobody changes) gets
        the next file number, and appends move on to the number after it (the tail), so every
        record journaled from now on lands after the checkpoint. A pending group is committed
        first, to the current file: the state holds it, and so must the log it replaces until
        the checkpoint is durable. :meth:`write_checkpoint` writes it, without the lock."""
        if self._poisoned:
            raise JournalError(self._current_path(), 0, f"journal is unusable after an earlier failure: "
                                                        f"{self._poisoned}")
        self.commit()
        head = [encode_untrack(ledger, entry) for ledger, entry in untracked]
        if redeliver is not None and len(redeliver[0]):
            head.append(encode_add(*redeliver))
        number = self._number + 1
        with self._fd_lock:
            self._close_fd()
            self._number, self._tail_fresh = number + 1, True
        self.groups += 1  # as a checkpoint: a mark taken before the state is stale (see rewind)
        return CheckpointWrite(number, head, (ledgers, entries, ts),
                               [encode_frontier(frontier)] if frontier is not None else [])

    def write_checkpoint(self, begun: CheckpointWrite) -> None:
        """Write a begun checkpoint, then delete the files before it; needs no tracker lock (it
        touches only its own file and older ones, never the tail appends go to).

        A failure leaves the journal whole and usable: before the rename nothing is named; after
        it, whether the checkpoint survives a crash or not, replay folds it or the older files,
        and then the tail, so nothing is poisoned. The older files are deleted only once the
        checkpoint's name is durable.
        """
        records = list(begun.head)
        if len(begun.rows[0]):
            records.append(encode_add(*begun.rows))
        body = b"".join([CHECKPOINT_START, *records, *begun.tail, CHECKPOINT_END])
        path = os.path.join(self.directory, f"{begun.number:020d}.journal")
        self._write_named(path, encode_header(begun.number, self.identity) + frame_group(begun.number, body),
                          keep_open=False)
        older = [p for number, p in _list_files(self.directory)[0] if number < begun.number]
        for p in older:
            self._fs.unlink(p)
        if older:
            self._fs.fsync_dir(self.directory)

    def close(self) -> None:
        with self._fd_lock:
            self._close_fd()
        if self._pool is not None:
            self._pool.forget(self)


def read_identity(path: str) -> tuple[str, str] | None:
    """The (store id, tracker name) a journal file's header carries; None for version 1.

    :raises JournalError: the header is damaged or torn.
    :raises OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_HEADER_SIZE)
    m = _FILE_NAME.match(os.path.basename(path))
    # A file under another name (a copy, a golden file) is judged by its own header's number.
    number = int(m.group(1)) if m else int.from_bytes(data[12:20], "little")
    header = parse_header(data, path, number, last=False)
    assert header is not None
    return header[1]


def list_files(directory: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The journal files of ``directory`` as sorted (number, path), and its ``*.journal.tmp`` leftovers."""
    return _list_files(directory)


def newest_checkpoint(files: list[list[tuple]]) -> int:
    """Index of the newest file (of records per file) starting with a complete checkpoint; replay starts there."""
    return _newest_checkpoint(files)


def _list_files(directory: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The journal files as sorted (number, path), and the ``*.journal.tmp`` leftovers of an interrupted checkpoint."""
    files: list[tuple[int, str]] = []
    leftovers: list[str] = []
    for name in os.listdir(directory):
        m = _FILE_NAME.match(name)
        if m:
            files.append((int(m.group(1)), os.path.join(directory, name)))
        elif name.endswith(".journal.tmp"):
            leftovers.append(os.path.join(directory, name))
    return sorted(files), leftovers


def _newest_checkpoint(files: list[list[tuple]]) -> int:
    """Index of the newest file that starts with a complete checkpoint (0 if none): replay starts there."""
    start = 0
    for i, records in enumerate(files):
        if records and records[0] == ("c",) and ("e",) in records:
            start = i
    return start


def _fold(files: list[list[tuple]]) -> tuple[tuple[int, int, int] | None, list[tuple]]:
    """The largest frontier and the ordered add/untrack records of the files replay keeps."""
    frontier: tuple[int, int, int] | None = None
    out: list[tuple] = []
    for records in files:
        for rec in records:
            if rec[0] == "f":
                frontier = max(frontier, rec[1:]) if frontier else rec[1:]
            elif rec[0] in ("a", "x", "t"):
                out.append(rec)
    return frontier, out


def has_journal(store_path: str, tracker: str) -> bool:
    """Whether the tracker has a journal directory, i.e. has been opened in journal mode."""
    return os.path.isdir(journal_directory(store_path, tracker))


def read_frontier(store_path: str, tracker: str, *, attempts: int = 5) -> tuple[int, int, int] | None:
    """The tracker's durable delivery frontier, read without modifying anything (see :func:`read_journal`).

    :returns: the largest durable ``(timestamp, ledger_id, entry_id)`` delivered,
        or None when the tracker has no journal (sealed mode; see
        :func:`has_journal`) or its journal records no delivery yet.
    :raises JournalError: damage that is not a torn tail, or files that keep vanishing.
    """
    state = read_journal(store_path, tracker, attempts=attempts)
    return state.frontier if state is not None else None


def read_journal(store_path: str, tracker: str, *, identity: tuple[str, str] | None = None,
                 attempts: int = 5) -> JournalState | None:
    """What a replay would recover from the tracker's journal, read without modifying anything.

    Replay's rules, without its repairs: files before the newest complete
    checkpoint are ignored (not removed), a torn tail of the last file is
    ignored (not cut: it may be a group its live writer is writing right now),
    ``*.journal.tmp`` files are ignored (not removed). So a store in use, or one
    left by a crash, can be read by another process without the store lock, and
    its writer later repairs it as usual.

    :param identity: ``(store id, tracker name)`` every file must carry (see :func:`parse_file`).
    :param attempts: listings to try when a file vanishes while being read (a live
        writer's checkpoint removes the files it supersedes).
    :returns: the frontier and the ordered add/untrack records (``cut_bytes``: the torn
        tail left out), or None when the tracker has no journal directory.
    :raises JournalError: damage that is not a torn tail, a foreign file, or files that keep vanishing.
    """
    directory = journal_directory(store_path, tracker)
    for _ in range(attempts):
        try:
            files, _ = _list_files(directory)
        except FileNotFoundError:
            return None  # no journal: sealed mode (or the tracker was deleted meanwhile)
        parsed: list[list[tuple]] = []
        torn = 0
        try:
            for i, (number, path) in enumerate(files):
                with open(path, "rb") as f:
                    data = f.read()
                result = parse_file(data, path, number, last=(i == len(files) - 1), identity=identity)
                parsed.append(result.records)
                if result.torn_at is not None:
                    torn += len(data) - result.torn_at
        except FileNotFoundError:
            # A live writer checkpointed between the listing and the read and removed
            # the superseded files: list again, the new checkpoint holds the state.
            continue
        start = _newest_checkpoint(parsed)
        frontier, records = _fold(parsed[start:])
        return JournalState(frontier, records, len(parsed) - start, torn)
    raise JournalError(directory, 0, f"journal files kept vanishing while being read ({attempts} attempts)")
