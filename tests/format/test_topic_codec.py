"""The topic index's records (``formats/topics.md``): round trips, order, and typed refusals."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.format.topic_codec import (TopicRecordError, decode_subscription, decode_topic, position_parts,
                                            pack_rows, records_of, row_from, row_parts, split_position, split_sub_key, sub_key,
                                            validate_name)

u64 = st.integers(0, 2**64 - 1)
rows = st.tuples(u64, u64, u64, u64)


@settings(max_examples=200)
@given(a=rows, b=rows, tid=st.integers(0, 2**32 - 1))
def test_rows_round_trip_and_sort_as_their_keys(a, b, tid) -> None:
    for row in (a, b):
        assert row_from(*row_parts(tid, *row)) == row
        assert split_position(*position_parts(tid, *row)) == (tid, row[1], row[2], row[3], row[0])
    # Byte order (key, then value: LMDB's order of a DUPSORT table) is the delivery order ...
    assert (row_parts(tid, *a) < row_parts(tid, *b)) == (a < b) or a == b
    # ... and the positions' byte order the acknowledgement order.
    pa, pb = position_parts(tid, *a), position_parts(tid, *b)
    assert ((pa[0], pa[1][:16]) < (pb[0], pb[1][:16])) == ((a[1], a[2], a[3]) < (b[1], b[2], b[3])) \
        or (a[1], a[2], a[3]) == (b[1], b[2], b[3])


@settings(max_examples=100)
@given(batch=st.lists(st.tuples(u64, u64, u64), max_size=20), tid=st.integers(0, 2**32 - 1),
       first=st.integers(0, 2**63))
def test_records_of_a_batch_are_each_rows_records(batch, tid, first) -> None:
    """The add path packs a batch's records by columns: byte for byte what a row at a time gives."""
    rows_, positions = records_of(tid, [t for t, _, _ in batch], [lg for _, lg, _ in batch],
                                  [en for _, _, en in batch], first)
    assert rows_ == [row_parts(tid, t, lg, en, first + i) for i, (t, lg, en) in enumerate(batch)]
    assert positions == [position_parts(tid, t, lg, en, first + i) for i, (t, lg, en) in enumerate(batch)]


def test_bad_records_are_typed_errors() -> None:
    key, value = row_parts(1, 5_000, 1, 2, 3)
    with pytest.raises(TopicRecordError):
        row_from(key[:-1], value)
    with pytest.raises(TopicRecordError):
        row_from(key, value + b"\x00")
    with pytest.raises(TopicRecordError):
        row_from(key, b"\xff\xff" + value[2:])  # the low part of deliver_at beyond 12 bits
    with pytest.raises(TopicRecordError):
        split_position(b"\x00" * 11, b"\x00" * 24)
    with pytest.raises(TopicRecordError):
        split_sub_key(b"\x00\x00\x00\x01")
    with pytest.raises(TopicRecordError):
        split_sub_key(b"\x00\x00\x00\x01\xff")  # not UTF-8
    assert split_sub_key(sub_key(7, "é")) == (7, "é")
    for raw in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"id": 1})):
        with pytest.raises(TopicRecordError):
            decode_topic(raw)
        with pytest.raises(TopicRecordError):
            decode_subscription(raw)
    good = {"frontier": [1, 2, 3, 4], "mark_delete": None, "start_seq": 0, "clear_seq": -1, "count": 0,
            "inserted_base": 0, "lost": [], "unconfirmed": [], "redeliver": []}
    assert decode_subscription(msgpack.packb(good))["frontier"] == (1, 2, 3, 4)
    for field, bad in (("frontier", [1, 2]), ("lost", [[1, 2]]), ("count", True), ("unconfirmed", [[-1, 0, 0, 0]])):
        with pytest.raises(TopicRecordError, match=field):
            decode_subscription(msgpack.packb({**good, field: bad}))
    # A batch not confirmed is written as big-endian u64 quadruples (a list still decodes).
    rows = [(5, 1, 2, 3), ((1 << 64) - 1, 0, 7, 9)]
    packed = {**good, "unconfirmed": pack_rows(rows)}
    assert decode_subscription(msgpack.packb(packed, use_bin_type=True))["unconfirmed"] == rows
    assert pack_rows(np.array(rows, dtype=np.uint64)) == packed["unconfirmed"]
    with pytest.raises(TopicRecordError, match="unconfirmed"):
        decode_subscription(msgpack.packb({**good, "unconfirmed": b"\x00" * 31}, use_bin_type=True))
    with pytest.raises(ValueError):
        validate_name("x" * 201, "topic")
