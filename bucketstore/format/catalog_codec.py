"""The catalog's records as bytes: key layout and value encodings (``formats/catalog.md``).

The catalog is an LMDB environment; opening it, its transactions and its file checks are the
engine's (:mod:`bucketstore.engine.catalog.catalog`). What a reader in another language needs to make
sense of the records it finds there is here: how a record's key names its tracker and bucket,
and how each value is encoded. A bucket's summary has a codec of its own
(:mod:`bucketstore.format.bucket_summary`).

Every decoder raises :class:`CatalogRecordError` (a ``ValueError``) saying what is wrong with
the bytes; the engine adds the catalog's path and the record's key.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from typing import Any

import msgpack

__all__ = ["validate_name", "CATALOG_FORMAT", "READABLE_FORMATS", "MAX_NAME_BYTES", "FORMAT_KEY", "NEXT_LEDGER_ID_KEY",
           "STORE_ID_KEY", "CatalogRecordError", "validate_tracker_name", "tracker_prefix", "bucket_record_key",
           "split_record_key", "encode_ledger_id", "decode_ledger_id", "encode_state", "decode_state",
           "encode_u64", "decode_u64", "is_store_id", "decode_store_id"]

#: The catalog format this code writes (``meta`` / ``format``).
CATALOG_FORMAT = b"2"
#: Formats a catalog may have on disk: version 1 lacks the summaries (opened, then upgraded).
READABLE_FORMATS = (b"1", CATALOG_FORMAT)
#: The longest tracker name, in UTF-8 bytes.
MAX_NAME_BYTES = 200
#: The ``meta`` database's keys.
FORMAT_KEY, NEXT_LEDGER_ID_KEY, STORE_ID_KEY = b"format", b"next_ledger_id", b"store_id"

_U64 = struct.Struct("<Q")
_STORE_ID = re.compile(r"^[0-9a-f]{32}$")


class CatalogRecordError(ValueError):
    """A catalog record's value that does not decode as its format says."""


def validate_tracker_name(name: object) -> bytes:
    """The UTF-8 bytes of a valid tracker name (1..200 bytes, no NUL): the key of its record in
    ``trackers`` and the start of its records' keys in ``buckets`` and ``summaries``.

    :raises TypeError: not a str. :raises ValueError: empty, too long, or holding a NUL.
    """
    return validate_name(name, "tracker")


def validate_name(name: object, what: str) -> bytes:
    """The UTF-8 bytes of a valid ``what`` name (tracker, topic, subscription): 1..200 bytes, no
    NUL, so that it can end a key prefix with a NUL. :raises TypeError, ValueError: as above."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, not {type(name).__name__}")
    raw = name.encode("utf-8")
    if not raw or b"\x00" in raw or len(raw) > MAX_NAME_BYTES:
        raise ValueError(f"{what} name must be 1..{MAX_NAME_BYTES} UTF-8 bytes without NUL: {name!r}")
    return raw


def tracker_prefix(name: object) -> bytes:
    """What every ``buckets``/``summaries`` key of tracker ``name`` starts with: its name, NUL."""
    return validate_tracker_name(name) + b"\x00"


def bucket_record_key(prefix: bytes, bucket_key: str) -> bytes:
    """The ``buckets``/``summaries`` key of a bucket: the tracker's :func:`tracker_prefix`, then
    the bucket key (``#pulsar.internal.delayed.bucket_<start>_<end>``) in UTF-8."""
    return prefix + bucket_key.encode("utf-8")


def split_record_key(raw: bytes) -> tuple[bytes, str]:
    """A ``buckets``/``summaries`` key as (the tracker name's bytes, the bucket key); an
    undecodable bucket key is shown with replacement characters (a reader reports, never fails)."""
    name, _, key = raw.partition(b"\x00")
    return name, key.decode("utf-8", "replace")


def encode_ledger_id(ledger_id: int) -> bytes:
    """A ``buckets`` value: the ledger id in ASCII decimal, as Pulsar keeps its cursor properties."""
    return str(int(ledger_id)).encode("ascii")


def decode_ledger_id(raw: bytes) -> int:
    """:raises CatalogRecordError: not ASCII decimal digits."""
    text = raw.decode("ascii", "replace")
    if not text.isdigit() or not text.isascii():
        raise CatalogRecordError(f"{raw!r} is not a ledger id (ASCII decimal)")
    return int(text)


def encode_state(state: Mapping[str, Any]) -> bytes:
    """A ``trackers`` value: the tracker's durable state as a msgpack map (str keys)."""
    return msgpack.packb(dict(state), use_bin_type=True)


def decode_state(raw: bytes) -> dict[str, Any]:
    """:raises CatalogRecordError: not msgpack, or not a map."""
    try:
        state = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise CatalogRecordError(f"not valid msgpack: {exc}") from None
    if not isinstance(state, dict):
        raise CatalogRecordError("not a msgpack map")
    return state


def encode_u64(value: int) -> bytes:
    """``next_ledger_id``: an unsigned 64-bit little-endian integer."""
    return _U64.pack(value)


def decode_u64(raw: bytes) -> int:
    """:raises CatalogRecordError: not 8 bytes."""
    if len(raw) != 8:
        raise CatalogRecordError(f"{len(raw)} bytes, not 8")
    return _U64.unpack(raw)[0]


def is_store_id(text: str) -> bool:
    """Whether ``text`` is a store identity: 32 lowercase hex digits."""
    return bool(_STORE_ID.match(text))


def decode_store_id(raw: bytes) -> str:
    """``store_id``: 32 lowercase hex digits in ASCII. :raises CatalogRecordError: anything else."""
    text = raw.decode("ascii", "replace")
    if not is_store_id(text):
        raise CatalogRecordError(f"{raw!r} is not 32 hex digits")
    return text
