"""A tracker's journal files as another process sees them: where they live, their names, and
reading them (:func:`read_journal`, :func:`read_frontier`, :func:`read_identity`) with replay's
parsing (:func:`~bucketstore.format.journal_codec.parse_file`) but none of its repairs. The
writer, :class:`~bucketstore.engine.durability.journal.Journal`, re-exports these names.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from ...errors import JournalError
from ...format.journal_codec import MAX_HEADER_SIZE, parse_file, parse_header

__all__ = ["JournalState", "journal_directory", "has_journal", "read_frontier", "read_identity", "read_journal",
           "list_files", "newest_checkpoint"]

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


@dataclass
class JournalState:
    """What a replay recovered: the frontier and the ordered add/untrack records."""

    frontier: tuple[int, int, int] | None
    records: list[tuple]
    files: int
    cut_bytes: int


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
