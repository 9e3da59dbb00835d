"""What a checkpoint copies of a tracker's journal while its writer appends to it.

:func:`read_journal` takes an *image*: the files replay would use (from the newest
complete checkpoint on), each cut at its last whole group, read without changing
anything in the source. A group being written while it is read is a torn tail (the
kernel shows a reader a prefix of a ``write``), and it is cut: it was not durable, so
no call that returned relied on it. A file the writer removes while it is read (its
own checkpoint superseded it) makes the listing start again.

:func:`combine` joins two images of one journal, the *first* taken before the
catalog copy and the *later* one after it: the first image's files, plus one group
appended to its newest file holding every add, untrack and frontier record the later
image has beyond them (the newest file's new groups, and every record of newer files,
their checkpoint markers left out). Why both are needed is the argument in
:mod:`~bucketstore.engine.store.checkpoint`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgpack

from ...errors import CheckpointError, JournalError
from ...format.journal_codec import frame_group, header_size, parse_file
from .journal import list_files, newest_checkpoint

__all__ = ["JournalFile", "read_journal", "combine"]

_GROUP_FRAME = 8
#: A checkpoint's first and last records, as the writer packs them.
_MARKERS = (msgpack.packb(["c"]), msgpack.packb(["e"]))


@dataclass(frozen=True)
class JournalFile:
    """One journal file as copied: its number, its name and its bytes up to the last whole group."""

    number: int
    name: str
    data: bytes
    #: Where each group's body lies in ``data``: (start, end).
    groups: tuple[tuple[int, int], ...]


def read_journal(directory: str, *, attempts: int = 20) -> list[JournalFile]:
    """An image of the journal in ``directory`` (empty when there is none); reads only.

    :raises JournalError: damage that is not a torn tail, or files that keep vanishing.
    """
    for _ in range(attempts):
        try:
            files, _ = list_files(directory)
        except FileNotFoundError:
            return []
        image: list[JournalFile] = []
        records: list[list[tuple]] = []
        try:
            for i, (number, path) in enumerate(files):
                with open(path, "rb") as f:
                    data = f.read()
                parsed = parse_file(data, path, number, last=(i == len(files) - 1))
                if parsed.torn_at == 0:
                    continue  # a file whose header never became durable: replay removes it
                if parsed.torn_at is not None:
                    data = data[:parsed.torn_at]
                image.append(JournalFile(number, os.path.basename(path), data, _groups(data, path, number)))
                records.append(parsed.records)
        except FileNotFoundError:
            continue  # the writer's own checkpoint removed a superseded file: list again
        return image[newest_checkpoint(records):]
    raise JournalError(directory, 0, f"journal files kept vanishing while being copied ({attempts} attempts)")


def combine(first: list[JournalFile], later: list[JournalFile]) -> list[tuple[str, bytes]]:
    """The files of ``first`` with what ``later`` journaled beyond them appended, as (name, bytes).

    :raises CheckpointError: the newest file of ``first`` is not a prefix of the same file in
        ``later`` (a journal only grows between its checkpoints; it starts over only when its
        tracker is deleted and created again).
    """
    if not first:
        return [(f.name, f.data) for f in later]
    newest = first[-1]
    bodies: list[bytes] = []
    for f in later:
        if f.number < newest.number:
            continue
        if f.number == newest.number:
            if not f.data.startswith(newest.data):
                # Only a tracker deleted and created again during the copy starts its journal
                # over: which incarnation the catalog copy belongs to is unknown, so refuse.
                raise CheckpointError(os.path.join("journal", f.name), "the journal file was replaced instead of "
                                      "growing while it was copied (its tracker deleted and created again?); "
                                      "run the checkpoint again")
            bodies += [f.data[start:end] for start, end in f.groups if start >= len(newest.data)]
        else:
            bodies += [f.data[start:end] for start, end in f.groups]
    records = [raw for body in bodies for raw in _raw_records(body) if raw not in _MARKERS]
    files = [(f.name, f.data) for f in first]
    if records:
        files[-1] = (newest.name, newest.data + frame_group(newest.number, b"".join(records)))
    return files


def _groups(data: bytes, path: str, number: int) -> tuple[tuple[int, int], ...]:
    """The body spans of a file already parsed whole (every frame is known to be sound)."""
    spans = []
    pos = header_size(data, path, number)
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "little")
        spans.append((pos + _GROUP_FRAME, pos + _GROUP_FRAME + length))
        pos += _GROUP_FRAME + length
    return tuple(spans)


def _raw_records(body: bytes) -> list[bytes]:
    """The bytes of each msgpack record of a group body, as written (nothing re-encoded)."""
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    out, start = [], 0
    for _ in unpacker:
        end = unpacker.tell()
        out.append(body[start:end])
        start = end
    return out
