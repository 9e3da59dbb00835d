"""The topic index's records as bytes: key layouts and value encodings (``formats/topics.md``).

A store's topics live in one LMDB environment of their own (``STORE/topics/``), apart from the
catalog, so a store without topics is byte for byte what it was. Its named databases:

``topics``    topic name (UTF-8) -> :func:`encode_topic` (msgpack map: id, seq counters, cutoff, config)
``subs``      u32 topic id, subscription name -> :func:`encode_subscription` (msgpack map)
``rows``      u32 topic id, u64 deliver_at >> 12 -> many u16 deliver_at & 0xfff, u64 ledger, u64 entry, u64 seq
``positions`` u32 topic id, u64 ledger -> many u64 entry, u64 seq, u64 deliver_at
``multi``     u32 topic id, u64 ledger, u64 entry -> empty (positions with more than one row)
``meta``      ``format`` -> ``b"1"``, ``next_topic_id`` -> u64
``runs``      u32 topic id, u64 run id -> :func:`encode_run_record` (a sealed run's entry; its file in ``runs/``)
``dead``      u32 topic id, u64 ledger, u64 entry -> u64 seq (rows of sealed runs gone since)

``rows`` and ``positions`` are ``MDB_DUPSORT | MDB_DUPFIXED``: a key holds many fixed-size
values, sorted by their bytes. Integers are big-endian so that LMDB's byte order is the numeric
order: ``rows`` is the topic's delivery order (deliver_at, ledger, entry, seq), ``positions`` its
acknowledgement order (ledger, entry, seq). ``seq`` numbers a topic's rows
in the order they were added (a position added again at another time gets a second row).

Every decoder raises :class:`TopicRecordError` (a ``ValueError``) saying what is wrong with the
bytes; the engine adds the file's path and the record's key.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np

from .catalog_codec import validate_name  # topic and subscription names follow the tracker names' rule

__all__ = ["TOPICS_FORMAT", "TopicRecordError", "ROW_KEY", "ROW_DUP", "POS_KEY", "POS_DUP", "MULTI", "TOPIC_ID",
           "U64", "row_parts", "row_from", "position_parts", "records_of", "split_position", "multi_key", "sub_key", "split_sub_key",
           "encode_topic", "decode_topic", "encode_subscription", "decode_subscription", "validate_name",
           "MAX_KEY", "topic_prefix", "WINDOW_BITS", "ROW_QUAD", "pack_rows", "RUN_KEY", "DEAD_KEY",
           "encode_run_record", "decode_run_record"]

TOPICS_FORMAT = b"1"
TOPIC_ID = struct.Struct(">I")
ROW_KEY = struct.Struct(">IQ")       # topic, deliver_at >> 12
ROW_DUP = struct.Struct(">HQQQ")     # deliver_at & 0xfff, ledger, entry, seq
POS_KEY = struct.Struct(">IQ")       # topic, ledger
POS_DUP = struct.Struct(">QQQ")      # entry, seq, deliver_at
_WINDOW_BITS = 12
#: A ``rows`` key holds the rows of one window of ``2 ** WINDOW_BITS`` ms.
WINDOW_BITS = _WINDOW_BITS
MULTI = struct.Struct(">IQQ")        # topic, ledger, entry
U64 = struct.Struct(">Q")
_MAX = (1 << 64) - 1
#: A row key greater than every row of its topic (as a tuple: deliver_at, ledger, entry, seq).
MAX_KEY = (_MAX, _MAX, _MAX, _MAX)


class TopicRecordError(ValueError):
    """A topic record whose bytes do not decode as its format says."""


def topic_prefix(topic_id: int) -> bytes:
    return TOPIC_ID.pack(topic_id)


def row_parts(topic_id: int, ts: int, ledger: int, entry: int, seq: int) -> tuple[bytes, bytes]:
    """The ``rows`` key and value of a row."""
    return (ROW_KEY.pack(topic_id, ts >> _WINDOW_BITS),
            ROW_DUP.pack(ts & ((1 << _WINDOW_BITS) - 1), ledger, entry, seq))


_ROW_KEY_DT = np.dtype([("topic", ">u4"), ("high", ">u8")])
_ROW_DUP_DT = np.dtype([("low", ">u2"), ("ledger", ">u8"), ("entry", ">u8"), ("seq", ">u8")])
_POS_KEY_DT = np.dtype([("topic", ">u4"), ("ledger", ">u8")])
_POS_DUP_DT = np.dtype([("entry", ">u8"), ("seq", ">u8"), ("ts", ">u8")])


def _split(arr: np.ndarray) -> list[bytes]:
    raw, size = arr.tobytes(), arr.dtype.itemsize
    return [raw[i:i + size] for i in range(0, len(raw), size)]


def records_of(topic_id: int, ts: list[int], ledger: list[int], entry: list[int],
               first_seq: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The ``rows`` and ``positions`` records (as :func:`row_parts` and :func:`position_parts`
    give them one at a time) of a batch of rows numbered from ``first_seq``: packed by numpy
    a column at a time, an add's record costs a slice instead of two struct packs."""
    n = len(ts)
    t, lg, en = (np.asarray(c, dtype=np.uint64) for c in (ts, ledger, entry))
    seq = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    rk = np.empty(n, dtype=_ROW_KEY_DT)
    rk["topic"], rk["high"] = topic_id, t >> np.uint64(_WINDOW_BITS)
    rd = np.empty(n, dtype=_ROW_DUP_DT)
    rd["low"], rd["ledger"], rd["entry"], rd["seq"] = t & np.uint64((1 << _WINDOW_BITS) - 1), lg, en, seq
    pk = np.empty(n, dtype=_POS_KEY_DT)
    pk["topic"], pk["ledger"] = topic_id, lg
    pd = np.empty(n, dtype=_POS_DUP_DT)
    pd["entry"], pd["seq"], pd["ts"] = en, seq, t
    return list(zip(_split(rk), _split(rd))), list(zip(_split(pk), _split(pd)))


def row_from(key: bytes, value: bytes) -> tuple[int, int, int, int]:
    """(deliver_at, ledger, entry, seq) of a ``rows`` record."""
    if len(key) != ROW_KEY.size or len(value) != ROW_DUP.size:
        raise TopicRecordError(f"rows record of {len(key)}+{len(value)} bytes, not {ROW_KEY.size}+{ROW_DUP.size}")
    high = ROW_KEY.unpack(key)[1]
    low, ledger, entry, seq = ROW_DUP.unpack(value)
    if low >> _WINDOW_BITS or high >> (64 - _WINDOW_BITS):
        raise TopicRecordError(f"rows record with deliver_at parts {high}, {low} out of range")
    return high << _WINDOW_BITS | low, ledger, entry, seq


def position_parts(topic_id: int, ts: int, ledger: int, entry: int, seq: int) -> tuple[bytes, bytes]:
    """The ``positions`` key and value of a row."""
    return POS_KEY.pack(topic_id, ledger), POS_DUP.pack(entry, seq, ts)


def split_position(key: bytes, value: bytes) -> tuple[int, int, int, int, int]:
    """(topic, ledger, entry, seq, deliver_at) of a ``positions`` record."""
    if len(key) != POS_KEY.size or len(value) != POS_DUP.size:
        raise TopicRecordError(f"positions record of {len(key)}+{len(value)} bytes, not {POS_KEY.size}+{POS_DUP.size}")
    topic_id, ledger = POS_KEY.unpack(key)
    entry, seq, ts = POS_DUP.unpack(value)
    return topic_id, ledger, entry, seq, ts


def multi_key(topic_id: int, ledger: int, entry: int) -> bytes:
    return MULTI.pack(topic_id, ledger, entry)


def sub_key(topic_id: int, name: str) -> bytes:
    return TOPIC_ID.pack(topic_id) + validate_name(name, "subscription")


def split_sub_key(key: bytes) -> tuple[int, str]:
    if len(key) <= TOPIC_ID.size:
        raise TopicRecordError(f"subscription key of {len(key)} bytes")
    try:
        return TOPIC_ID.unpack_from(key)[0], key[TOPIC_ID.size:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopicRecordError(f"subscription name is not UTF-8: {exc}") from None


def _pack(record: dict[str, Any]) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def _unpack(raw: bytes, what: str, fields: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    try:
        record = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad bytes
        raise TopicRecordError(f"{what} record does not decode: {type(exc).__name__}: {exc}") from None
    if not isinstance(record, dict):
        raise TopicRecordError(f"{what} record is a {type(record).__name__}, not a map")
    for field, kind in fields.items():
        if field not in record:
            raise TopicRecordError(f"{what} record lacks {field!r}")
        value = record[field]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TopicRecordError(f"{what} record field {field!r} is {value!r}")
    return record


_TOPIC_FIELDS: dict[str, Any] = {"id": int, "next_seq": int, "inserted": int, "rows": int, "cutoff": int,
                                  "config": dict}


def encode_topic(record: dict[str, Any]) -> bytes:
    return _pack(record)


def decode_topic(raw: bytes) -> dict[str, Any]:
    record = _unpack(raw, "topic", _TOPIC_FIELDS)
    if record["id"] < 0 or record["next_seq"] < 0 or record["rows"] < 0:
        raise TopicRecordError(f"topic record has a negative id or sequence: {record!r}")
    applied = record.get("applied", 0)  # absent before the topic journal: nothing journaled
    if not isinstance(applied, int) or isinstance(applied, bool) or applied < 0:
        raise TopicRecordError(f"topic record field 'applied' is {applied!r}")
    return record


_SUB_FIELDS: dict[str, Any] = {"frontier": (list, type(None)), "mark_delete": (list, type(None)),
                               "start_seq": int, "clear_seq": int, "count": int, "inserted_base": int,
                               "lost": list, "unconfirmed": (list, bytes), "redeliver": list}
#: ``unconfirmed`` as bytes: each row four big-endian u64 (deliver_at, ledger, entry, seq).
ROW_QUAD = struct.Struct(">QQQQ")


def pack_rows(rows: Any) -> bytes:
    """Rows as :data:`ROW_QUAD` records: a batch of a thousand written without an object per row
    (``rows``: an (n, 4) uint64 array, or a sequence of 4-tuples)."""
    return np.asarray(rows, dtype=np.uint64).reshape(-1, 4).astype(">u8").tobytes()


def _unpack_rows(raw: bytes, what: str) -> list[tuple[int, ...]]:
    if len(raw) % ROW_QUAD.size:
        raise TopicRecordError(f"subscription record field {what!r} holds {len(raw)} bytes, not a multiple of "
                               f"{ROW_QUAD.size}")
    return [ROW_QUAD.unpack_from(raw, i) for i in range(0, len(raw), ROW_QUAD.size)]


def _tuples(value: Any, width: int, what: str) -> list[tuple[int, ...]]:
    out = []
    for item in value:
        if not isinstance(item, list) or len(item) != width or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX for x in item):
            raise TopicRecordError(f"subscription record field {what!r} holds {item!r}")
        out.append(tuple(item))
    return out


def encode_subscription(record: dict[str, Any]) -> bytes:
    return _pack(record)


def decode_subscription(raw: bytes) -> dict[str, Any]:
    """A subscription record, its lists of rows and positions turned into tuples."""
    record = _unpack(raw, "subscription", _SUB_FIELDS)
    if record["frontier"] is not None:
        record["frontier"] = _tuples([record["frontier"]], 4, "frontier")[0]
    if record["mark_delete"] is not None:
        record["mark_delete"] = _tuples([record["mark_delete"]], 2, "mark_delete")[0]
    record["lost"] = _tuples(record["lost"], 3, "lost")
    unconfirmed = record["unconfirmed"]
    record["unconfirmed"] = (_unpack_rows(unconfirmed, "unconfirmed") if isinstance(unconfirmed, bytes)
                             else _tuples(unconfirmed, 4, "unconfirmed"))
    record["redeliver"] = _tuples(record["redeliver"], 4, "redeliver")
    return record


#: ``runs``: u32 topic id, u64 run id -> :func:`encode_run_record`; ``dead``: u32 topic id, u64
#: ledger, u64 entry -> u64 seq (the rows of the position in sealed runs with a seq up to it are gone).
RUN_KEY = struct.Struct(">IQ")
DEAD_KEY = MULTI
_RUN_FIELDS: dict[str, Any] = {"rows": int, "killed": int, "first": list, "last": list, "min_pos": list,
                               "max_pos": list, "seq": list}


def encode_run_record(record: dict[str, Any]) -> bytes:
    """A sealed run's catalog entry (``formats/topics.md``): its rows, the rows of it gone since
    (``killed``), its first and last row, least and greatest position and seq range."""
    return _pack(record)


def decode_run_record(raw: bytes) -> dict[str, Any]:
    record = _unpack(raw, "run", _RUN_FIELDS)
    for field, width in (("first", 4), ("last", 4), ("min_pos", 2), ("max_pos", 2), ("seq", 2)):
        record[field] = _tuples([record[field]], width, field)[0]
    if record["rows"] < 1 or not 0 <= record["killed"] <= record["rows"] or record["first"] > record["last"] \
            or record["min_pos"] > record["max_pos"] or record["seq"][0] > record["seq"][1]:
        raise TopicRecordError(f"run record does not hold together: {record!r}")
    return record
