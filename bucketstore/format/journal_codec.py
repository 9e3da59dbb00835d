"""The journal file's bytes: its header, its group framing and its records (``formats/journal.md``).

Pure functions of bytes, no file handling: :mod:`bucketstore.engine.durability.journal` writes, fsyncs,
lists, cuts and replays the files; this module is what a reader in another language
reimplements. :func:`parse_file` reads one file's bytes as replay and ``verify`` do, and says
where a torn tail starts without deciding what to do with it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import numpy as np
from crc32c import crc32c as crc32c_of

from ..errors import JournalError
from .ledger_file import masked_crc32c

__all__ = ["MAGIC", "VERSION", "MAX_HEADER_SIZE", "ParsedFile", "parse_file", "parse_header", "header_size",
           "encode_header", "frame_group", "encode_add", "encode_add_one", "encode_untrack", "encode_frontier",
           "encode_topic_adds", "CHECKPOINT_START", "CHECKPOINT_END"]

MAGIC = b"BKTJRNL\n"
VERSION = 2
_HEADER = struct.Struct("<8sHHQ")
_HEADER_SIZE = _HEADER.size + 4  # version 1: no identity
_IDENTITY = struct.Struct("<16sH")  # version 2: store id, tracker name length (the name follows)
_MAX_NAME = 1 << 10
_GROUP = struct.Struct("<II")
_U64 = struct.Struct("<Q")
_MAX_GROUP = 1 << 30
_LE = np.dtype("<u8")
#: The longest header a file can have (version 2 with the longest tracker name): enough to read its identity.
MAX_HEADER_SIZE = _HEADER.size + _IDENTITY.size + _MAX_NAME + 4

#: The records that open and close a checkpoint (the first group of every file).
CHECKPOINT_START = msgpack.packb(["c"])
CHECKPOINT_END = msgpack.packb(["e"])


def encode_header(number: int, identity: tuple[str, str] | None) -> bytes:
    """File ``number``'s header: version 2 carrying ``(store id, tracker name)``, or version 1
    without an identity (``None``: tests of the file format alone)."""
    if identity is None:
        head = _HEADER.pack(MAGIC, 1, 0, number)
    else:
        store_id, tracker = identity
        name = tracker.encode("utf-8")
        head = _HEADER.pack(MAGIC, VERSION, 0, number) + _IDENTITY.pack(bytes.fromhex(store_id), len(name)) + name
    return head + struct.pack("<I", masked_crc32c(head))


def encode_add(ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray) -> bytes:
    """An ``a`` record: indexes tracked, as three little-endian uint64 columns."""
    return msgpack.packb(["a", np.asarray(ledgers, _LE).tobytes(), np.asarray(entries, _LE).tobytes(),
                          np.asarray(ts, _LE).tobytes()])


def encode_add_one(ledger_id: int, entry_id: int, ts: int) -> bytes:
    """An ``a`` record of one index (the same bytes as :func:`encode_add` of one row, without numpy)."""
    return msgpack.packb(["a", _U64.pack(ledger_id), _U64.pack(entry_id), _U64.pack(ts)])


def encode_untrack(ledger_id: int, entry_id: int) -> bytes:
    """An ``x`` record: a position untracked by an expired re-add."""
    return msgpack.packb(["x", ledger_id, entry_id])


def encode_frontier(key: tuple[int, int, int]) -> bytes:
    """An ``f`` record: the delivery frontier ``(timestamp, ledger_id, entry_id)``."""
    return msgpack.packb(["f", *key])


def encode_topic_adds(first: int, ledgers: np.ndarray, entries: np.ndarray, ts: np.ndarray,
                      cutoffs: np.ndarray) -> bytes:
    """A ``t`` record of a topic's journal: adds numbered from ``first`` (the topic counts every
    add it answers), each with the cutoff of its call, as four little-endian uint64 columns."""
    return msgpack.packb(["t", first, np.asarray(ledgers, _LE).tobytes(), np.asarray(entries, _LE).tobytes(),
                          np.asarray(ts, _LE).tobytes(), np.asarray(cutoffs, _LE).tobytes()])


@dataclass(frozen=True)
class ParsedFile:
    """One journal file, parsed: its whole groups' records, and where a torn tail starts.

    :ivar torn_at: the offset from which the file is a torn tail (0: the whole
        file, whose header never became durable), or None when it ends cleanly.
    """

    records: list[tuple]
    torn_at: int | None


def parse_file(data: bytes, path: str, number: int, *, last: bool,
               identity: tuple[str, str] | None = None, topic: bool = False) -> ParsedFile:
    """Parse one journal file's bytes; a pure function (the caller decides what to do with a torn tail).

    :param path: named in errors only.
    :param number: the file number its name gives (the header must agree; it also seeds group CRCs).
    :param last: whether it is the newest file: only that one may have a torn tail.
    :param identity: ``(store id, tracker name)`` the header must carry (version 2);
        None accepts any. Version-1 files carry none and are accepted.
    :param topic: a topic's journal, whose records are ``t`` (and a checkpoint's ``c``, ``e``);
        a tracker's journal holds ``a``, ``x``, ``f``, ``c``, ``e``. Any other is damage.
    :raises JournalError: damage that is not a torn tail, or a file of another
        tracker or store, naming the file and offset.
    """
    size = len(data)
    header = parse_header(data, path, number, last=last)
    if header is None:
        return ParsedFile([], 0)  # a new file whose header never became durable
    header_size, owner = header
    if identity is not None and owner is not None and owner != identity:
        raise JournalError(path, _HEADER.size, f"journal of tracker {owner[1]!r} of store {owner[0]}, "
                                               f"not of tracker {identity[1]!r} of store {identity[0]}: "
                                               "a foreign journal is never replayed")
    records: list[tuple] = []
    pos = header_size
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
            elif length == 0:
                # The writer never commits an empty group: a body holds at least one record.
                bad = "group of 0 bytes"
            elif length > _MAX_GROUP or end > size:
                bad = f"group of {length} bytes runs past the end of the file"
            elif masked_crc32c(data[pos + _GROUP.size:end], crc32c_of(prefix)) != crc:
                bad = "group CRC mismatch"
        if bad is not None:
            # Only the last group of the last file can be torn: the next group
            # is written only after the previous one's fsync returned. A bad
            # group with data after it is damage, not a crash.
            if bad in ("group CRC mismatch", "group of 0 bytes"):
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
                records.append(_validate(rec, path, pos, topic))
        except ValueError as exc:
            raise JournalError(path, pos, f"group does not decode: {exc}") from None
        pos = end
    return ParsedFile(records, None)


def parse_header(data: bytes, path: str, number: int, *, last: bool
                 ) -> tuple[int, tuple[str, str] | None] | None:
    """The header's size and its (store id, tracker) (None for version 1); None for a
    torn header of the newest file."""
    size = len(data)
    if size < _HEADER_SIZE:
        if last:  # a new file whose header never became durable
            return None
        raise JournalError(path, 0, "journal file is shorter than its header")
    magic, version, reserved, stored_number = _HEADER.unpack_from(data)
    header_size, owner = _HEADER_SIZE, None
    if magic == MAGIC and version not in (1, VERSION):
        # Before the CRC: another version may lay out (or checksum) its header differently.
        raise JournalError(path, 8, f"journal version {version} is not supported (this reader knows 1..{VERSION})")
    if magic == MAGIC and version == 2:
        fixed = _HEADER.size + _IDENTITY.size
        name_len = _IDENTITY.unpack_from(data, _HEADER.size)[1] if size >= fixed else 0
        header_size = fixed + name_len + 4
        if name_len > _MAX_NAME and not (last and not any(data[_HEADER.size:])):
            raise JournalError(path, _HEADER.size, f"tracker name of {name_len} bytes in the journal header")
        if name_len > _MAX_NAME or header_size > size:
            if last:  # a new file whose header never became durable
                return None
            raise JournalError(path, _HEADER.size, "journal header runs past the end of the file")
    (crc,) = struct.unpack_from("<I", data, header_size - 4)
    if magic != MAGIC or masked_crc32c(data[:header_size - 4]) != crc:
        if last and not any(data[_HEADER.size:]) and magic != MAGIC:
            return None
        raise JournalError(path, 0, "bad journal header (magic or CRC)")
    if reserved != 0:
        raise JournalError(path, 10, f"reserved header field is {reserved}, not 0")
    if stored_number != number:
        raise JournalError(path, 12, f"header says file {stored_number}, name says {number}")
    if version == 2:
        store_id, name_len = _IDENTITY.unpack_from(data, _HEADER.size)
        at = _HEADER.size + _IDENTITY.size
        try:
            owner = (store_id.hex(), data[at:at + name_len].decode("utf-8"))
        except UnicodeDecodeError:
            raise JournalError(path, at, "tracker name in the journal header is not UTF-8") from None
    return header_size, owner


def _unpack_all(body: bytes) -> Iterator[object]:
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    try:
        yield from unpacker
    except Exception as exc:  # msgpack raises several types on garbage
        raise ValueError(str(exc)) from None


def _validate(rec: object, path: str, at: int, topic: bool = False) -> tuple:
    if not isinstance(rec, tuple) or not rec or not isinstance(rec[0], str):
        raise JournalError(path, at, "journal record is not a tagged array")
    kind = rec[0]
    if kind in ("c", "e") and len(rec) == 1:
        return rec
    if topic:
        if kind == "t" and len(rec) == 6 and isinstance(rec[1], int) and not isinstance(rec[1], bool) \
                and rec[1] >= 0 and all(isinstance(c, bytes) and len(c) % 8 == 0 for c in rec[2:]) \
                and len(rec[2]) == len(rec[3]) == len(rec[4]) == len(rec[5]) > 0:
            return ("t", rec[1], *[np.frombuffer(c, dtype=_LE) for c in rec[2:]])
        raise JournalError(path, at, f"malformed topic journal record of kind {kind!r}")
    if kind == "a" and len(rec) == 4 and all(isinstance(c, bytes) and len(c) % 8 == 0 for c in rec[1:]) \
            and len(rec[1]) == len(rec[2]) == len(rec[3]):
        cols = [np.frombuffer(c, dtype=_LE) for c in rec[1:]]
        return ("a", *cols)
    if kind == "x" and len(rec) == 3 and all(isinstance(v, int) and v >= 0 for v in rec[1:]):
        return rec
    if kind == "f" and len(rec) == 4 and all(isinstance(v, int) and v >= 0 for v in rec[1:]):
        return rec
    raise JournalError(path, at, f"malformed journal record of kind {kind!r}")


def frame_group(number: int, body: bytes) -> bytes:
    """One group of file ``number`` as :meth:`Journal.commit` writes it: length, CRC, body."""
    return _GROUP.pack(len(body), masked_crc32c(body, crc32c_of(_U64.pack(number)))) + body


def header_size(data: bytes, path: str, number: int) -> int:
    """The size of a journal file's (intact) header: where its first group starts."""
    header = parse_header(data, path, number, last=False)
    assert header is not None
    return header[0]
