"""Ledger files: bucketstore's file-backed imitation of a BookKeeper ledger.

A ledger file is written once, sealed, and never modified. Its layout (the
byte-level specification is ``formats/ledger_file.md``)::

    header    magic, format version, flags, ledger id, properties (msgpack), header CRC
    entry 0   length, masked CRC32C(ledger id || entry id || payload), payload
    ...
    entry N-1
    trailer   N offsets (u64 LE), one per entry frame
    footer    trailer offset, entry count, trailer CRC, end magic      (32 bytes)

The reader checks the header and the footer/trailer on open, without scanning
the entries; then entry ``k`` costs one ``pread`` of exactly its frame and one
CRC check. Every length and offset is checked against the file size *before*
anything is allocated, so a hostile file cannot make the reader allocate more
than the file's own size.

The writer makes a file durable in the classic order: write under a temporary
name, fsync the file, rename it to its final name, fsync the directory. A crash
before the rename leaves only a ``*.tmp`` file, which the store removes on open;
a crash after it leaves a complete, sealed file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Union

import crc32c
import msgpack
import numpy as np

from ..errors import CorruptLedgerError
from .fs import REAL_FS, FileSystem

__all__ = [
    "MAGIC",
    "END_MAGIC",
    "FORMAT_VERSION",
    "LedgerWriter",
    "LedgerReader",
    "write_ledger",
    "ledger_file_name",
    "masked_crc32c",
    "PropertyValue",
]

MAGIC = b"\x89BKTLDG\n"
END_MAGIC = b"BKTLEND\n"
FORMAT_VERSION = 1

PropertyValue = Union[str, int]

_HEADER_FIXED = struct.Struct("<8sHHQI")  # magic, version, flags, ledger id, properties length
_FRAME = struct.Struct("<II")  # payload length, masked crc
_FOOTER = struct.Struct("<QQII8s")  # trailer offset, entry count, trailer crc, reserved, end magic
_U64 = struct.Struct("<Q")
_LEDGER_ENTRY = struct.Struct("<QQ")  # ledger id, entry id: the CRC's prefix

HEADER_FIXED_SIZE = _HEADER_FIXED.size  # 24
FRAME_HEADER_SIZE = _FRAME.size  # 8
FOOTER_SIZE = _FOOTER.size  # 32
MAX_PROPERTIES_SIZE = 1 << 16
MAX_ENTRY_SIZE = (1 << 32) - 1

_MASK_DELTA = 0xA282EAD8
_WRITE_BUFFER = 1 << 20


def masked_crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, masked as LevelDB masks stored CRCs.

    Masking (rotate right by 15, add a constant) keeps a CRC computed over bytes
    that themselves contain CRCs from being trivially zero or self-consistent.
    """
    crc = crc32c.crc32c(data, value)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _entry_crc(ledger_id: int, entry_id: int, payload: bytes | memoryview) -> int:
    # The ledger id and entry id are part of the checksum so that a frame copied
    # from another file, or from another position in this one, does not verify.
    return masked_crc32c(payload, crc32c.crc32c(_LEDGER_ENTRY.pack(ledger_id, entry_id)))


def _trailer_crc(ledger_id: int, offsets: bytes, trailer_offset: int, count: int) -> int:
    crc = crc32c.crc32c(_U64.pack(ledger_id))
    crc = crc32c.crc32c(offsets, crc)
    return masked_crc32c(_LEDGER_ENTRY.pack(trailer_offset, count), crc)


def ledger_file_name(ledger_id: int) -> str:
    """The file name of ledger ``ledger_id`` (zero-padded so names sort by id)."""
    return f"{ledger_id:020d}.ledger"


def _encode_properties(properties: Mapping[str, PropertyValue]) -> bytes:
    for key, value in properties.items():
        if not isinstance(key, str):
            raise TypeError(f"ledger property names must be str, not {type(key).__name__}")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"ledger property {key!r} must be str or int, not {type(value).__name__}")
        if isinstance(value, int) and not 0 <= value < 1 << 64:
            raise ValueError(f"ledger property {key!r} must be an unsigned 64-bit int")
    # Sorted keys make the encoding canonical: the same properties give the same bytes.
    packed = msgpack.packb(dict(sorted(properties.items())), use_bin_type=True)
    if len(packed) > MAX_PROPERTIES_SIZE:
        raise ValueError(f"ledger properties take {len(packed)} bytes; at most {MAX_PROPERTIES_SIZE} are allowed")
    return packed


class LedgerWriter:
    """Writes one ledger file: entries are appended in order, then the file is sealed.

    Use as a context manager: leaving the block by an exception aborts the write
    and removes the temporary file; leaving it normally does *not* seal (sealing
    is an explicit, durable step)::

        with LedgerWriter(directory, ledger_id, {"kind": "bucket"}) as w:
            w.append(b"metadata")
            w.append(b"segment 1")
            path = w.seal()

    :param directory: where the sealed file will live.
    :param ledger_id: the ledger's id (an unsigned 64-bit int); it names the file.
    :param properties: str -> str | int, stored in the header.
    :param fs: the file layer (tests pass a fault-injecting one).
    """

    def __init__(self, directory: str | os.PathLike[str], ledger_id: int,
                 properties: Mapping[str, PropertyValue] | None = None, *,
                 fs: FileSystem = REAL_FS, file_name: str | None = None) -> None:
        if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
            raise TypeError("ledger_id must be an int")
        if not 0 <= ledger_id < 1 << 64:
            raise ValueError(f"ledger_id {ledger_id} is not an unsigned 64-bit int")
        self.directory = os.fspath(directory)
        self.ledger_id = ledger_id
        self.path = os.path.join(self.directory, file_name or ledger_file_name(ledger_id))
        self.temp_path = self.path + ".tmp"
        self._fs = fs
        props = _encode_properties(properties or {})
        head = _HEADER_FIXED.pack(MAGIC, FORMAT_VERSION, 0, ledger_id, len(props)) + props
        head += struct.pack("<I", masked_crc32c(head))
        self._offsets: list[int] = []
        self._position = 0
        self._buffer = bytearray()
        self._state = "open"
        self._renamed = False
        self._fd = fs.create(self.temp_path)
        self._put(head)

    @property
    def entry_count(self) -> int:
        """How many entries have been appended so far."""
        return len(self._offsets)

    @property
    def size(self) -> int:
        """Bytes written so far (the sealed file adds the trailer and footer)."""
        return self._position

    def _put(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data
        self._position += len(data)
        if len(self._buffer) >= _WRITE_BUFFER:
            self._drain()

    def _drain(self) -> None:
        if self._buffer:
            self._fs.write(self._fd, self._buffer)
            self._buffer = bytearray()

    def append(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one entry and return its entry id (0, 1, 2, ...)."""
        if self._state != "open":
            raise ValueError(f"ledger writer for {self.path} is {self._state}")
        if len(payload) > MAX_ENTRY_SIZE:
            raise ValueError(f"an entry holds at most {MAX_ENTRY_SIZE} bytes")
        entry_id = len(self._offsets)
        self._offsets.append(self._position)
        self._put(_FRAME.pack(len(payload), _entry_crc(self.ledger_id, entry_id, payload)))
        self._put(payload)
        return entry_id

    def seal(self) -> str:
        """Write the trailer, make the file durable under its final name, return the path.

        Order: trailer + footer, fsync(file), rename(temp -> final), fsync(directory).
        Until the directory fsync returns, a crash may leave either name (or none);
        both are handled on open: a ``.tmp`` file is an orphan, a final name is
        complete because it was fsynced before it was renamed.
        """
        if self._state != "open":
            raise ValueError(f"ledger writer for {self.path} is {self._state}")
        try:
            trailer_offset = self._position
            offsets = np.asarray(self._offsets, dtype="<u8").tobytes()
            count = len(self._offsets)
            self._put(offsets)
            self._put(_FOOTER.pack(trailer_offset, count,
                                   _trailer_crc(self.ledger_id, offsets, trailer_offset, count), 0, END_MAGIC))
            self._drain()
            self._fs.fsync(self._fd)
            self._fs.close(self._fd)
            self._fd = -1
            if os.path.exists(self.path):
                # A sealed ledger is immutable: never replace one silently.
                raise FileExistsError(f"ledger file {self.path} already exists")
            self._fs.rename(self.temp_path, self.path)
            self._renamed = True
            self._fs.fsync_dir(self.directory)
        except BaseException:
            self.abort()
            raise
        self._state = "sealed"
        return self.path

    def abort(self) -> None:
        """Give up on this ledger: close and remove the file (under its temporary name,
        or its final one if the rename happened before the failure). Idempotent."""
        if self._state == "sealed":
            return
        self._state = "aborted"
        if self._fd >= 0:
            try:
                self._fs.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        try:
            # A failed directory fsync comes after the rename: the file then sits
            # under its final name, which no catalog key references yet.
            self._fs.unlink(self.path if self._renamed else self.temp_path)
        except FileNotFoundError:
            pass
        except OSError:
            # Best effort: a leftover *.tmp file is removed when the store is next opened.
            pass

    def __enter__(self) -> "LedgerWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None or self._state == "open":
            self.abort()


def write_ledger(directory: str | os.PathLike[str], ledger_id: int,
                 properties: Mapping[str, PropertyValue], entries: Sequence[bytes], *,
                 fs: FileSystem = REAL_FS, file_name: str | None = None) -> str:
    """Write and seal a whole ledger in one call; return the sealed file's path."""
    with LedgerWriter(directory, ledger_id, properties, fs=fs, file_name=file_name) as writer:
        for payload in entries:
            writer.append(payload)
        return writer.seal()


class LedgerReader:
    """Reads a sealed ledger file.

    Opening validates the header (magic, version, CRC, properties) and the
    footer and trailer (CRC, offsets consistent with the file size); it does not
    read the entries. :meth:`read_entry` then reads and checks one entry.
    Any damage raises :class:`~bucketstore.CorruptLedgerError` with the path and
    the offset of the structure that failed. Thread-safe: reads use ``pread``.

    :param fs: the file layer the open and the reads go through (a test's fails them).

    :ivar ledger_id: the id stored in the header.
    :ivar version: the format version of the file.
    :ivar properties: the header's properties.
    :ivar entry_count: the number of entries.
    :ivar size: the file size in bytes.
    :raises CorruptLedgerError: the file's content is damaged.
    :raises OSError: the file cannot be opened or read (missing, permissions, I/O error).
    """

    def __init__(self, path: str | os.PathLike[str], *, fs: FileSystem = REAL_FS) -> None:
        self.path = os.fspath(path)
        self._fs = fs
        # An OSError (missing file, EACCES, EMFILE, EIO) says nothing about the file's
        # content, so it is not CorruptLedgerError: the caller must not treat it as damage.
        self._fd = fs.open_read(self.path)
        try:
            self.size = os.fstat(self._fd).st_size
            self._read_header()
            self._read_trailer()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # -- opening ---------------------------------------------------------------------------------
    def _damage(self, offset: int, reason: str) -> CorruptLedgerError:
        return CorruptLedgerError(self.path, offset, reason)

    def _pread(self, length: int, offset: int) -> bytes:
        # Callers have already checked offset + length <= size; a shorter read
        # means the file shrank under us, which is damage too.
        data = self._fs.pread(self._fd, length, offset)
        if len(data) != length:
            raise self._damage(offset, f"short read: wanted {length} bytes, file ends early")
        return data

    def _read_header(self) -> None:
        if self.size < HEADER_FIXED_SIZE + 4 + FOOTER_SIZE:
            raise self._damage(0, f"file of {self.size} bytes is too small to be a ledger")
        fixed = self._pread(HEADER_FIXED_SIZE, 0)
        magic, version, flags, ledger_id, props_len = _HEADER_FIXED.unpack(fixed)
        if magic != MAGIC:
            raise self._damage(0, "bad magic: not a bucketstore ledger file")
        if version != FORMAT_VERSION:
            raise self._damage(8, f"format version {version} is not supported (this reader knows {FORMAT_VERSION})")
        if flags != 0:
            raise self._damage(10, f"unknown header flags 0x{flags:04x}")
        if props_len > MAX_PROPERTIES_SIZE or HEADER_FIXED_SIZE + props_len + 4 + FOOTER_SIZE > self.size:
            raise self._damage(20, f"properties length {props_len} does not fit the file")
        rest = self._pread(props_len + 4, HEADER_FIXED_SIZE)
        (stored_crc,) = struct.unpack_from("<I", rest, props_len)
        if masked_crc32c(rest[:props_len], crc32c.crc32c(fixed)) != stored_crc:
            raise self._damage(0, "header CRC mismatch")
        try:
            props = msgpack.unpackb(rest[:props_len], raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise self._damage(HEADER_FIXED_SIZE, f"properties are not valid msgpack: {exc}") from None
        # The same rule the writer enforces: a value the writer could not have
        # produced (a negative int, a float, a nested map) is damage, not data.
        if not isinstance(props, dict) or not all(
                isinstance(k, str) and (isinstance(v, str) or (type(v) is int and 0 <= v < 1 << 64))
                for k, v in props.items()):
            raise self._damage(HEADER_FIXED_SIZE, "properties are not a map of str to str|uint64")
        self.version = version
        self.ledger_id: int = ledger_id
        self.properties: dict[str, PropertyValue] = props
        self.header_size = HEADER_FIXED_SIZE + props_len + 4

    def _read_trailer(self) -> None:
        footer_at = self.size - FOOTER_SIZE
        trailer_offset, count, stored_crc, reserved, end_magic = _FOOTER.unpack(self._pread(FOOTER_SIZE, footer_at))
        if end_magic != END_MAGIC:
            raise self._damage(footer_at, "bad end magic: the file is truncated or was never sealed")
        # Each entry needs at least a frame header and a trailer slot: this bounds
        # the count by the file size before the offsets are read.
        body = footer_at - self.header_size
        if count > body // (FRAME_HEADER_SIZE + 8) or trailer_offset != footer_at - 8 * count:
            raise self._damage(footer_at, f"footer claims {count} entries with a trailer at {trailer_offset}, "
                                          f"which does not fit a file of {self.size} bytes")
        raw = self._pread(8 * count, trailer_offset)
        if _trailer_crc(self.ledger_id, raw, trailer_offset, count) != stored_crc:
            raise self._damage(trailer_offset, "trailer CRC mismatch")
        if reserved != 0:
            raise self._damage(footer_at + 20, "reserved footer field is not zero")
        offsets = np.frombuffer(raw, dtype="<u8").astype(np.int64) if count else np.zeros(0, np.int64)
        if count:
            ends = np.append(offsets[1:], trailer_offset)
            if offsets[0] != self.header_size or np.any(ends - offsets < FRAME_HEADER_SIZE) \
                    or np.any(ends - offsets - FRAME_HEADER_SIZE > MAX_ENTRY_SIZE):
                raise self._damage(trailer_offset, "trailer offsets are not contiguous frames after the header")
        elif trailer_offset != self.header_size:
            raise self._damage(trailer_offset, "an empty ledger has bytes between header and trailer")
        self.entry_count: int = int(count)
        self.trailer_offset = trailer_offset
        self._offsets = offsets
        self._ends = np.append(offsets[1:], trailer_offset) if count else offsets

    # -- reading ---------------------------------------------------------------------------------
    def entry_offset(self, entry_id: int) -> int:
        """The file offset of entry ``entry_id``'s frame."""
        self._check_entry_id(entry_id)
        return int(self._offsets[entry_id])

    def entry_payload_offset(self, entry_id: int) -> int:
        """The file offset of entry ``entry_id``'s payload (its frame offset + 8)."""
        return self.entry_offset(entry_id) + FRAME_HEADER_SIZE

    def entry_size(self, entry_id: int) -> int:
        """The payload size of entry ``entry_id`` in bytes."""
        self._check_entry_id(entry_id)
        return int(self._ends[entry_id] - self._offsets[entry_id]) - FRAME_HEADER_SIZE

    def _check_entry_id(self, entry_id: int) -> None:
        if isinstance(entry_id, bool) or not isinstance(entry_id, (int, np.integer)):
            raise TypeError("entry_id must be an int")
        if not 0 <= entry_id < self.entry_count:
            raise IndexError(f"{self.path}: entry {entry_id} out of range (ledger has {self.entry_count} entries)")

    def read_entry(self, entry_id: int) -> bytes:
        """Read entry ``entry_id`` (one ``pread``), check its CRC, return its payload."""
        self._check_entry_id(entry_id)
        if self._fd < 0:
            raise ValueError(f"ledger reader for {self.path} is closed")
        start = int(self._offsets[entry_id])
        frame = self._pread(int(self._ends[entry_id]) - start, start)
        length, stored_crc = _FRAME.unpack_from(frame)
        if length != len(frame) - FRAME_HEADER_SIZE:
            raise self._damage(start, f"entry {entry_id} frame length {length} disagrees with the trailer "
                                      f"({len(frame) - FRAME_HEADER_SIZE})")
        payload = memoryview(frame)[FRAME_HEADER_SIZE:]
        if _entry_crc(self.ledger_id, entry_id, payload) != stored_crc:
            raise self._damage(start, f"entry {entry_id} CRC mismatch")
        return bytes(payload)

    def read_entries(self, first: int, last: int) -> list[bytes]:
        """Read entries ``first..last`` inclusive (as BookKeeper's readEntries does)."""
        if last < first:
            return []
        self._check_entry_id(first)
        self._check_entry_id(last)
        return [self.read_entry(k) for k in range(first, last + 1)]

    def __iter__(self) -> Iterator[bytes]:
        for k in range(self.entry_count):
            yield self.read_entry(k)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._fd >= 0:
            # Not through the file layer: closing a reader makes nothing durable, and a
            # crashed test file layer refuses every call, which would leak the descriptor.
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "LedgerReader":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort for forgotten readers
        try:
            self.close()
        except Exception:
            pass
