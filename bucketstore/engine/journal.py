"""The write-ahead journal of one tracker (``durability="journal"``).

Everything a tracker holds only in memory — indexes in the mutable bucket,
indexes that went straight to the shared queue, untracking by expired
re-adds — and its *delivery frontier* are appended here, so that a crash loses
nothing that was acknowledged as durable.

Layout: ``journal/<tracker name as hex>/<file number, 20 digits>.journal``::

    file    := header group*
    header  := magic "BKTJRNL\\n" | version u16 | reserved u16 | file number u64 | masked crc32c u32 (of the above)
    group   := body length u32 | masked crc32c(file number u64 || body) u32 | body
    body    := msgpack record, msgpack record, ...

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

Records (msgpack arrays):

``["a", ledgers, entries, timestamps]``
    indexes tracked; three little-endian uint64 columns as bytes
``["x", ledger_id, entry_id]``
    a position untracked by an expired re-add
``["f", timestamp, ledger_id, entry_id]``
    the delivery frontier: every index at or before this key has been delivered
    and its delivery confirmed (see :mod:`bucketstore.engine.handoff`)
``["c"]``
    the start of a checkpoint (first record of a file); ``["e"]`` its end

:func:`read_frontier` reads the frontier from another process (the Spark
reader) with replay's parsing (:func:`parse_file`) but none of its repairs.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import numpy as np
from crc32c import crc32c as crc32c_of

from ..errors import JournalError
from ..format.fs import REAL_FS, FileSystem
from ..format.ledger_file import masked_crc32c

__all__ = ["Journal", "JournalState", "ParsedFile", "journal_directory", "has_journal", "parse_file", "read_frontier"]

MAGIC = b"BKTJRNL\n"
VERSION = 1
_HEADER = struct.Struct("<8sHHQ")
_HEADER_SIZE = _HEADER.size + 4
_GROUP = struct.Struct("<II")
_U64 = struct.Struct("<Q")
_FILE_NAME = re.compile(r"^(\d{20})\.journal$")
_MAX_GROUP = 1 << 30
_LE = np.dtype("<u8")


def journal_directory(store_path: str, tracker: str) -> str:
    """Where a tracker's journal files live (the name is hex so any tracker name is a safe path)."""
    return os.path.join(store_path, "journal", tracker.encode("utf-8").hex())


@dataclass
class JournalState:
    """What a replay recovered: the frontier and the ordered add/untrack records."""

    frontier: tuple[int, int, int] | None
    records: list[tuple]
    files: int
    cut_bytes: int


class Journal:
    """Append-only, group-committed journal of one tracker.

    Not thread-safe by itself: the tracker's lock guards it.
    """

    def __init__(self, directory: str, fs: FileSystem = REAL_FS) -> None:
        self.directory = directory
        self._fs = fs
        fs.makedirs(directory)
        self._pending: list[bytes] = []
        self._fd = -1
        self._number = -1
        self._poisoned: str | None = None
        #: The largest delivery frontier that is durable (fsynced, or replayed).
        self.durable_frontier: tuple[int, int, int] | None = None
        self._pending_frontier: tuple[int, int, int] | None = None

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
            result = parse_file(data, path, number, last=(i == len(files) - 1))
            if result.torn_at is not None:
                self._cut(path, result.torn_at)
                cut += len(data) - result.torn_at
            parsed.append((number, path, result))
        start = _newest_checkpoint([p.records for _, _, p in parsed])
        frontier, out = _fold([p.records for _, _, p in parsed[start:]])
        for _, path, _ in parsed[:start]:
            self._fs.unlink(path)
        self._number = files[-1][0] if files else -1
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
        self._pending.append(msgpack.packb(["a", np.asarray(ledgers, _LE).tobytes(),
                                            np.asarray(entries, _LE).tobytes(), np.asarray(ts, _LE).tobytes()]))

    def add_one(self, ledger_id: int, entry_id: int, ts: int) -> None:
        self._pending.append(msgpack.packb(["a", _U64.pack(ledger_id), _U64.pack(entry_id), _U64.pack(ts)]))

    def untrack(self, ledger_id: int, entry_id: int) -> None:
        self._pending.append(msgpack.packb(["x", ledger_id, entry_id]))

    def frontier(self, key: tuple[int, int, int]) -> None:
        self._pending.append(msgpack.packb(["f", *key]))
        self._pending_frontier = key

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def commit(self) -> None:
        """Write the pending records as one group and fsync it. A failure poisons the journal."""
        if not self._pending:
            return
        if self._poisoned:
            raise JournalError(self._current_path(), 0, f"journal is unusable after an earlier failure: "
                                                        f"{self._poisoned}")
        if self._fd < 0:
            self._open_new(checkpoint=[])
        body = b"".join(self._pending)
        try:
            self._fs.write(self._fd, _GROUP.pack(len(body), masked_crc32c(body, crc32c_of(_U64.pack(self._number))))
                           + body)
            # Never retried: after a failed fsync the kernel may have dropped the
            # dirty pages, and a second fsync could report success for lost data.
            self._fs.fsync(self._fd)
        except OSError as exc:
            self._poisoned = f"{type(exc).__name__}: {exc}"
            raise JournalError(self._current_path(), 0, f"journal write failed: {exc}") from exc
        self._pending.clear()
        if self._pending_frontier is not None:
            self.durable_frontier, self._pending_frontier = self._pending_frontier, None

    def _current_path(self) -> str:
        return os.path.join(self.directory, f"{self._number:020d}.journal")

    def _open_new(self, checkpoint: list[bytes]) -> None:
        """Start the next file with a checkpoint group, durable before anything else uses it."""
        number = self._number + 1
        path = os.path.join(self.directory, f"{number:020d}.journal")
        tmp = path + ".tmp"
        head = _HEADER.pack(MAGIC, VERSION, 0, number)
        head += struct.pack("<I", masked_crc32c(head))
        body = b"".join([msgpack.packb(["c"]), *checkpoint, msgpack.packb(["e"])])
        fd = self._fs.create(tmp)
        try:
            self._fs.write(fd, head + _GROUP.pack(len(body), masked_crc32c(body, crc32c_of(_U64.pack(number))))
                           + body)
            self._fs.fsync(fd)
            self._fs.rename(tmp, path)
            self._fs.fsync_dir(self.directory)
        except BaseException:
            try:
                self._fs.close(fd)
            finally:
                try:
                    self._fs.unlink(tmp)
                except OSError:
                    pass
            raise
        old_fd, self._fd, self._number = self._fd, fd, number
        if old_fd >= 0:
            self._fs.close(old_fd)

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
        records = [msgpack.packb(["x", ledger, entry]) for ledger, entry in untracked]
        # Unconfirmed deliveries after the untracks (one of them may be a ghost that the
        # replay must track again) and before the memory-only adds.
        if redeliver is not None and len(redeliver[0]):
            records.append(msgpack.packb(["a", *(np.asarray(c, _LE).tobytes() for c in redeliver)]))
        if len(ledgers):
            records.append(msgpack.packb(["a", np.asarray(ledgers, _LE).tobytes(),
                                          np.asarray(entries, _LE).tobytes(), np.asarray(ts, _LE).tobytes()]))
        if frontier is not None:
            records.append(msgpack.packb(["f", *frontier]))
        self._pending.clear()
        self._pending_frontier = None
        self._open_new(records)
        self.durable_frontier = frontier
        for number, path in _list_files(self.directory)[0]:
            if number < self._number:
                self._fs.unlink(path)
        self._fs.fsync_dir(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            self._fs.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class ParsedFile:
    """One journal file, parsed: its whole groups' records, and where a torn tail starts.

    :ivar torn_at: the offset from which the file is a torn tail (0: the whole
        file, whose header never became durable), or None when it ends cleanly.
    """

    records: list[tuple]
    torn_at: int | None


def parse_file(data: bytes, path: str, number: int, *, last: bool) -> ParsedFile:
    """Parse one journal file's bytes; a pure function (the caller decides what to do with a torn tail).

    :param path: named in errors only.
    :param number: the file number its name gives (the header must agree; it also seeds group CRCs).
    :param last: whether it is the newest file: only that one may have a torn tail.
    :raises JournalError: damage that is not a torn tail, naming the file and offset.
    """
    size = len(data)
    if size < _HEADER_SIZE:
        if last:  # a new file whose header never became durable
            return ParsedFile([], 0)
        raise JournalError(path, 0, "journal file is shorter than its header")
    magic, version, _, stored_number = _HEADER.unpack_from(data)
    (crc,) = struct.unpack_from("<I", data, _HEADER.size)
    if magic != MAGIC or masked_crc32c(data[:_HEADER.size]) != crc:
        if last and not any(data[_HEADER.size:]) and magic != MAGIC:
            return ParsedFile([], 0)
        raise JournalError(path, 0, "bad journal header (magic or CRC)")
    if version != VERSION:
        raise JournalError(path, 8, f"journal version {version} is not supported (this reader knows {VERSION})")
    if stored_number != number:
        raise JournalError(path, 12, f"header says file {stored_number}, name says {number}")
    records: list[tuple] = []
    pos = _HEADER_SIZE
    prefix = _U64.pack(number)
    while pos < size:
        bad = None
        if pos + _GROUP.size > size:
            bad = "truncated group frame"
        else:
            length, crc = _GROUP.unpack_from(data, pos)
            end = pos + _GROUP.size + length
            if length == 0 and crc == 0:
                bad = "zeroed group frame"
            elif length > _MAX_GROUP or end > size:
                bad = f"group of {length} bytes runs past the end of the file"
            elif masked_crc32c(data[pos + _GROUP.size:end], crc32c_of(prefix)) != crc:
                bad = "group CRC mismatch"
        if bad is not None:
            # Only the last group of the last file can be torn: the next group
            # is written only after the previous one's fsync returned. A bad
            # group with data after it is damage, not a crash.
            if bad == "group CRC mismatch":
                nothing_follows = not any(data[end:])
            elif bad == "zeroed group frame":
                nothing_follows = not any(data[pos:])
            else:
                nothing_follows = True
            if last and nothing_follows:
                return ParsedFile(records, pos)
            raise JournalError(path, pos, f"{bad}, and more data follows: not a torn tail")
        try:
            for rec in _unpack_all(data[pos + _GROUP.size:end]):
                records.append(_validate(rec, path, pos))
        except ValueError as exc:
            raise JournalError(path, pos, f"group does not decode: {exc}") from None
        pos = end
    return ParsedFile(records, None)


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
            elif rec[0] in ("a", "x"):
                out.append(rec)
    return frontier, out


def has_journal(store_path: str, tracker: str) -> bool:
    """Whether the tracker has a journal directory, i.e. has been opened in journal mode."""
    return os.path.isdir(journal_directory(store_path, tracker))


def read_frontier(store_path: str, tracker: str, *, attempts: int = 5) -> tuple[int, int, int] | None:
    """The tracker's durable delivery frontier, read without modifying anything.

    Replay's rules, without its repairs: files before the newest complete
    checkpoint are ignored (not removed), a torn tail of the last file is
    ignored (not cut), ``*.journal.tmp`` files are ignored (not removed). So a
    store in use, or one left by a crash, can be read by another process
    without the store lock, and its writer later repairs it as usual.

    :returns: the largest durable ``(timestamp, ledger_id, entry_id)`` delivered,
        or None when the tracker has no journal (sealed mode; see
        :func:`has_journal`) or its journal records no delivery yet.
    :param attempts: listings to try when a file vanishes while being read.
    :raises JournalError: damage that is not a torn tail, or files that keep vanishing.
    """
    directory = journal_directory(store_path, tracker)
    for _ in range(attempts):
        try:
            files, _ = _list_files(directory)
        except FileNotFoundError:
            return None  # no journal: sealed mode (or the tracker was deleted meanwhile)
        parsed: list[list[tuple]] = []
        try:
            for i, (number, path) in enumerate(files):
                with open(path, "rb") as f:
                    data = f.read()
                parsed.append(parse_file(data, path, number, last=(i == len(files) - 1)).records)
        except FileNotFoundError:
            # A live writer checkpointed between the listing and the read and removed
            # the superseded files: list again, the new checkpoint holds the frontier.
            continue
        frontier, _ = _fold(parsed[_newest_checkpoint(parsed):])
        return frontier
    raise JournalError(directory, 0, f"journal files kept vanishing while being read ({attempts} attempts)")


def _unpack_all(body: bytes) -> Iterator[object]:
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    try:
        yield from unpacker
    except Exception as exc:  # msgpack raises several types on garbage
        raise ValueError(str(exc)) from None


def _validate(rec: object, path: str, at: int) -> tuple:
    if not isinstance(rec, tuple) or not rec or not isinstance(rec[0], str):
        raise JournalError(path, at, "journal record is not a tagged array")
    kind = rec[0]
    if kind == "a" and len(rec) == 4 and all(isinstance(c, bytes) and len(c) % 8 == 0 for c in rec[1:]) \
            and len(rec[1]) == len(rec[2]) == len(rec[3]):
        cols = [np.frombuffer(c, dtype=_LE) for c in rec[1:]]
        return ("a", *cols)
    if kind == "x" and len(rec) == 3 and all(isinstance(v, int) and v >= 0 for v in rec[1:]):
        return rec
    if kind == "f" and len(rec) == 4 and all(isinstance(v, int) and v >= 0 for v in rec[1:]):
        return rec
    if kind in ("c", "e") and len(rec) == 1:
        return rec
    raise JournalError(path, at, f"malformed journal record of kind {kind!r}")
