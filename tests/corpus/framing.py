"""Build ledger-file bytes from parts, written from ``formats/ledger_file.md``.

The damage tests need files whose framing is *valid* around a hostile payload
(a msgpack bomb in entry 0 with a correct CRC, say), so that the damage reaches
the decoders instead of being stopped by a checksum. Building the bytes here,
from the spec rather than with ``LedgerWriter``, also checks the spec: a file
framed by this module must open with the library's reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
import msgpack

from bucketstore.format.ledger_file import END_MAGIC, MAGIC, LedgerReader, masked_crc32c


def _crc(prefix: bytes, data: bytes) -> int:
    return masked_crc32c(data, crc32c.crc32c(prefix))


def frame_ledger(ledger_id: int, properties: dict | bytes, payloads: Sequence[bytes], *,
                 version: int = 1, flags: int = 0) -> bytes:
    """A complete ledger file: ``properties`` is a dict (packed here) or raw msgpack bytes."""
    props = properties if isinstance(properties, bytes) else msgpack.packb(dict(sorted(properties.items())),
                                                                          use_bin_type=True)
    head = MAGIC + struct.pack("<HHQI", version, flags, ledger_id, len(props)) + props
    out = bytearray(head + struct.pack("<I", masked_crc32c(head)))
    offsets = []
    for entry_id, payload in enumerate(payloads):
        offsets.append(len(out))
        out += struct.pack("<II", len(payload), _crc(struct.pack("<QQ", ledger_id, entry_id), payload))
        out += payload
    return bytes(out) + trailer(ledger_id, offsets, len(out))


def trailer(ledger_id: int, offsets: Sequence[int], trailer_offset: int, count: int | None = None) -> bytes:
    """Trailer and footer with a correct CRC for whatever (possibly absurd) values are given."""
    count = len(offsets) if count is None else count
    table = b"".join(struct.pack("<Q", o) for o in offsets)
    crc = _crc(struct.pack("<Q", ledger_id), table + struct.pack("<QQ", trailer_offset, count))
    return table + struct.pack("<QQII8s", trailer_offset, count, crc, 0, END_MAGIC)


def split_ledger(path: str) -> tuple[int, dict, list[bytes]]:
    """The ledger id, properties and entry payloads of a sound ledger file."""
    with LedgerReader(path) as reader:
        return reader.ledger_id, dict(reader.properties), list(reader)
