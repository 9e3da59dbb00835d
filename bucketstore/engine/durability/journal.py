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
(:func:`parse_file`) but none of its repairs; it lives, with the files' names, in
:mod:`~bucketstore.engine.durability.journal_files` (re-exported here).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...errors import JournalError
from ...format.fs import REAL_FS, FileSystem
from ...format.journal_codec import (CHECKPOINT_END, CHECKPOINT_START, ParsedFile, encode_add, encode_add_one,
                                    encode_frontier, encode_header, encode_topic_adds, encode_untrack, frame_group,
                                    parse_file)
# The files' names and the read side (another process, a read-only handle) live in journal_files.
from .journal_files import (JournalState, _fold, _list_files, _newest_checkpoint, has_journal, journal_directory,
                            list_files, newest_checkpoint, read_frontier, read_identity, read_journal)

__all__ = ["CheckpointWrite", "Journal", "concat_rows", "JournalState", "FdPool", "journal_directory", "has_journal", "read_frontier",
           "read_identity", "read_journal", "list_files", "newest_checkpoint"]

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


_EMPTY = np.zeros(0, dtype=np.dtype("<u8"))


def concat_rows(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ledgers, entries, ts) parts as three columns, in part order."""
    if not parts:
        return _EMPTY, _EMPTY, _EMPTY
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(cols) for cols in zip(*parts))  # type: ignore[return-value]


@dataclass
class _Taken:
    """A group taken from the pending records (:meth:`Journal.take`), bound for file ``number``."""

    seq: int
    number: int
    body: bytes
    frontier: tuple[int, int, int] | None


@dataclass
class CheckpointWrite:
    """A checkpoint begun under the tracker's lock (:meth:`Journal.begin_checkpoint`), to be
    written without it (:meth:`Journal.write_checkpoint`): its file number and its records,
    but the memory-only rows, as (ledgers, entries, ts) parts that nobody changes (views of
    runs' columns, or copies), joined and encoded by the write."""

    number: int
    head: list[bytes]
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
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
        #: The file ``_fd`` is open on (appends go to ``_number``; a group taken earlier may
        #: still be bound for an older file, which the writer then reopens).
        self._fd_number = -1
        #: Files reserved, not created yet: number -> whether it starts with an (empty)
        #: checkpoint group (the first file) or is a tail a begun checkpoint reserved. Created
        #: by the write of their first group (``dict`` items: set and popped atomically).
        self._fresh: dict[int, bool] = {}
        #: Groups taken (:meth:`take`) and not written yet, in order, each bound for its file;
        #: written by :meth:`write_taken` (without the tracker's lock) or by the next commit.
        self._taken: list[_Taken] = []
        #: Guards ``_taken`` itself: a take (under the tracker's lock) appends while a writer
        #: (without it) swaps the list out or puts back what it could not write.
        self._taken_lock = threading.Lock()
        self._taken_seq = 0
        self._written_seq = 0
        #: Orders the writers (a commit under the tracker's lock, a taker writing its group
        #: without it, a checkpoint's write): groups reach the files in the order they were taken.
        self._io_lock = threading.Lock()

    def discard_deleted(self) -> int:
        """Remove the files a deleted tracker of this name left here; how many.

        Called only for a tracker the catalog has no state for: every tracker commits its
        state at its first open, before anything is journaled, and ``delete_tracker`` removes
        the state before the files, so files here belong to a deleted tracker (a crash or an
        I/O error stopped the deletion half-way). Also for a tracker whose state records
        sealed durability, opened in journal mode: it journaled nothing since (a journal
        open records journal before it journals), so the files are such a deleted tracker's too. Replayed, they would bring its indexes back
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
        """Whether records wait for their group commit (pending, or taken and not written)."""
        return bool(self._pending or self._taken)

    @property
    def urgent(self) -> bool:
        """Whether the pending group must be committed within the add window
        (``sync_interval_ms``); False when it holds only lazy frontiers, which may wait
        for the confirmation window (``confirm_sync_ms``)."""
        return self._urgent

    def commit(self) -> None:
        """Write the groups taken before (see :meth:`take`), then the pending records as one
        group, and fsync. A failed write or fsync poisons the journal (:class:`JournalError`);
        a failure to open the file (to create the first one, or to reopen the one the
        descriptor pool closed) writes nothing and is raised as the ``OSError``: the group
        stays pending for the next commit (a delivery that raises may then drop its records)."""
        with self._io_lock:
            self._write_taken_locked()
            if not self._pending:
                return
            self._check_usable()
            first = self._number < 0
            if first:
                self._number, self._fresh[0] = 0, True
            try:
                self._write_body(self._number, b"".join(self._pending))
            except OSError:
                if first and 0 in self._fresh:  # nothing named: the next commit starts afresh
                    self._number = -1
                    del self._fresh[0]
                raise
            self._pending.clear()
            self._urgent = self._lazy_last = False
            self.groups += 1
            if self._pending_frontier is not None:
                self.durable_frontier, self._pending_frontier = self._pending_frontier, None

    def take(self) -> int:
        """Take the pending records as a group to write later, without the tracker's lock: under
        it, this only moves them out of the pending group (the file they go to is bound now, so
        a checkpoint begun later comes after them); :meth:`write_taken` writes them. Returns the
        group's number for :meth:`write_taken` (0: nothing was pending). Taken records are past
        :meth:`rewind` (as committed ones are)."""
        if not self._pending:
            return 0
        self._check_usable()  # (a write that failed beside the caller is raised by the next take)
        if self._number < 0:
            self._number, self._fresh[0] = 0, True
        with self._taken_lock:
            self._taken_seq += 1
            self._taken.append(_Taken(self._taken_seq, self._number, b"".join(self._pending), self._pending_frontier))
        self._pending.clear()
        self._urgent = self._lazy_last = False
        self._pending_frontier = None
        self.groups += 1
        return self._taken_seq

    def write_taken(self, seq: int) -> None:
        """Make the taken groups up to ``seq`` durable (needs no tracker lock): this writer writes
        every group taken so far, in order, those bound for one file as one group (one write,
        one fsync), unless another writer did already. Failures as for :meth:`commit`: a failed
        write or fsync poisons the journal; a failure to create or open a file writes nothing
        and leaves the groups taken, for the next writer."""
        if seq <= self._written_seq:
            return
        with self._io_lock:
            self._write_taken_locked()

    def _write_taken_locked(self) -> None:
        if not self._taken:
            return
        self._check_usable()
        with self._taken_lock:
            groups, self._taken = self._taken, []
        i = 0
        try:
            while i < len(groups):
                number = groups[i].number
                j = i + 1
                while j < len(groups) and groups[j].number == number:
                    j += 1
                # One file's groups as one: a group is all or nothing, and so is their union.
                self._write_body(number, b"".join(g.body for g in groups[i:j]))
                frontiers = [g.frontier for g in groups[i:j] if g.frontier is not None]
                if frontiers:
                    self.durable_frontier = frontiers[-1]
                self._written_seq = groups[j - 1].seq
                i = j
        except BaseException:
            with self._taken_lock:  # not written: the next writer tries (a poisoned one never)
                self._taken[:0] = groups[i:]
            raise

    def _check_usable(self) -> None:
        if self._poisoned:
            raise JournalError(self._current_path(), 0, f"journal is unusable after an earlier failure: "
                                                        f"{self._poisoned}")

    def _write_body(self, number: int, body: bytes) -> None:
        """Write one group to file ``number`` (under ``_io_lock``), creating the file if reserved."""
        fresh = self._fresh.get(number)
        if fresh is None:
            self._append(number, body)
        elif fresh:  # the first file: an empty checkpoint, then the group
            self._create(number, [])
            self._append(number, body)
        else:
            self._open_tail(number, frame_group(number, body))

    def _append(self, number: int, body: bytes) -> None:
        with self._fd_lock:  # the pool must not close the descriptor mid-write
            # Reopening the file the pool closed (EMFILE, ENFILE) writes nothing: the group stays
            # pending and the next commit tries again, as after a failed first file's creation.
            fd = self._ensure_fd(number)
            try:
                self._fs.write(fd, frame_group(number, body))
                # Never retried: after a failed fsync the kernel may have dropped the
                # dirty pages, and a second fsync could report success for lost data.
                self._fs.fsync(fd)
            except OSError as exc:
                self._poisoned = f"{type(exc).__name__}: {exc}"
                raise JournalError(self._path(number), 0, f"journal write failed: {exc}") from exc

    def _open_tail(self, number: int, group: bytes) -> None:
        """Create the tail file a begun checkpoint reserved, holding its first group, durably
        before it is named (a named journal file always has a whole header). A failure before
        the rename names nothing: the group stays pending (raised as the ``OSError``); after
        it, the group may be durable or not, so the journal is poisoned."""
        fd = self._write_named(self._path(number), encode_header(number, self.identity) + group, keep_open=True)
        self._adopt_fd(fd, number)

    def _adopt_fd(self, fd: int, number: int) -> None:
        """Make ``fd`` (file ``number``, just created) the one appends use."""
        with self._fd_lock:
            old_fd, self._fd, self._fd_number = self._fd, fd, number
            self._fresh.pop(number, None)
            if old_fd >= 0:
                self._fs.close(old_fd)
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

    def _ensure_fd(self, number: int) -> int:
        """File ``number``'s descriptor, reopened for appending if the pool closed it (or it is
        open on another file: a group taken before a checkpoint began goes to the file before)."""
        if self._fd >= 0 and self._fd_number != number:
            self._close_fd()
        if self._fd < 0:
            self._fd = self._fs.open_append(self._path(number))
            self._fd_number = number
        if self._pool is not None:
            self._pool.admit(self)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._fs.close(fd)

    def _current_path(self) -> str:
        return self._path(self._number)

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, f"{number:020d}.journal")

    def _create(self, number: int, checkpoint: list[bytes]) -> None:
        """Create file ``number`` starting with a checkpoint group, durable before anything else uses it."""
        body = b"".join([CHECKPOINT_START, *checkpoint, CHECKPOINT_END])
        fd = self._write_named(self._path(number), encode_header(number, self.identity) + frame_group(number, body),
                               keep_open=True, what="checkpoint")
        self._adopt_fd(fd, number)

    def _open_new(self, checkpoint: list[bytes]) -> None:
        """Start the next file with a checkpoint group (under ``_io_lock``); files reserved
        before it are never created (nothing is bound for them: the checkpoint holds it all)."""
        number = self._number + 1
        self._create(number, checkpoint)
        self._number = number
        self._fresh.clear()

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
        # The pending group and the taken ones are in ``records`` (the tracker's state): they are
        # dropped only once the new file holds them. A checkpoint that fails first leaves them
        # for the next commit.
        with self._io_lock:
            self._open_new(records)
            with self._taken_lock:
                self._taken = []
                self._written_seq = self._taken_seq
        self._pending.clear()
        self._urgent = self._lazy_last = False
        self._pending_frontier = None
        self.groups += 1
        self.durable_frontier = frontier
        for number, path in _list_files(self.directory)[0]:
            if number < self._number:
                self._fs.unlink(path)
        self._fs.fsync_dir(self.directory)

    def begin_checkpoint(self, rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                         frontier: tuple[int, int, int] | None,
                         untracked: list[tuple[int, int]] = (),
                         redeliver: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> CheckpointWrite:
        """:meth:`checkpoint`'s first step, under the tracker's lock: the state (as for
        :meth:`checkpoint`, the memory-only rows as (ledgers, entries, ts) parts of arrays nobody
        changes, joined by the write) gets the next file number, and appends move on to the
        number after it (the tail), so every record journaled from now on lands after the
        checkpoint. A pending group is taken first
        (:meth:`take`), bound for the current file: the state holds it, and so must the log it
        replaces until the checkpoint is durable. :meth:`write_checkpoint` writes the taken
        groups, then the checkpoint, without the lock; nothing here writes or waits for a file."""
        self._check_usable()
        self.take()
        head = [encode_untrack(ledger, entry) for ledger, entry in untracked]
        if redeliver is not None and len(redeliver[0]):
            head.append(encode_add(*redeliver))
        number = self._number + 1
        self._fresh[number + 1] = False
        self._number = number + 1
        self.groups += 1  # as a checkpoint: a mark taken before the state is stale (see rewind)
        return CheckpointWrite(number, head, list(rows),
                               [encode_frontier(frontier)] if frontier is not None else [])

    def write_checkpoint(self, begun: CheckpointWrite) -> None:
        """Write a begun checkpoint, then delete the files before it; needs no tracker lock (it
        touches only its own file and older ones, never the tail appends go to).

        A failure leaves the journal whole and usable: before the rename nothing is named; after
        it, whether the checkpoint survives a crash or not, replay folds it or the older files,
        and then the tail, so nothing is poisoned. The older files are deleted only once the
        checkpoint's name is durable.
        """
        # The groups taken before the state are bound for the files this checkpoint replaces:
        # they are written first (and so are any taken since, bound for the tail).
        with self._io_lock:
            self._write_taken_locked()
        records = list(begun.head)
        ledgers, entries, ts = concat_rows(begun.rows)
        if len(ledgers):
            records.append(encode_add(ledgers, entries, ts))
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
        with self._io_lock, self._fd_lock:
            self._close_fd()
        if self._pool is not None:
            self._pool.forget(self)
