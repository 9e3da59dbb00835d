"""``format.journal_codec``: the journal's bytes alone, without a file (formats/journal.md).

The engine's journal tests write and replay real files; these hold that what the encoders
write is what the parser reads back, and the layout the spec gives.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bucketstore.errors import JournalError
from bucketstore.format.journal_codec import (CHECKPOINT_END, CHECKPOINT_START, MAGIC, MAX_HEADER_SIZE,
                                              encode_add, encode_add_one, encode_frontier, encode_header,
                                              encode_untrack, frame_group, header_size, parse_file, parse_header)

STORE_ID = "00112233445566778899aabbccddeeff"


def test_header_round_trips_with_its_identity() -> None:
    head = encode_header(7, (STORE_ID, "orders"))
    # magic | version 2 | reserved 0 | file number | store id | name length | name | crc
    assert head[:8] == MAGIC and struct.unpack_from("<HHQ", head, 8) == (2, 0, 7)
    assert len(head) == 20 + 18 + len("orders") + 4 <= MAX_HEADER_SIZE
    assert parse_header(head, "f", 7, last=False) == (len(head), (STORE_ID, "orders"))
    assert header_size(head, "f", 7) == len(head)
    v1 = encode_header(7, None)
    assert struct.unpack_from("<H", v1, 8) == (1,) and parse_header(v1, "f", 7, last=False) == (24, None)
    with pytest.raises(JournalError) as err:
        parse_header(head, "f", 8, last=False)  # the name says another file
    assert err.value.offset == 12


def test_records_round_trip_through_a_framed_group() -> None:
    ledgers, entries, ts = (np.array(c, dtype=np.uint64) for c in ([1, 2], [3, 4], [500, 600]))
    assert encode_add_one(9, 8, 7) == encode_add(np.array([9]), np.array([8]), np.array([7]))
    checkpoint = frame_group(3, CHECKPOINT_START + encode_frontier((5, 1, 0)) + CHECKPOINT_END)
    adds = frame_group(3, encode_add(ledgers, entries, ts) + encode_untrack(1, 3))
    data = encode_header(3, (STORE_ID, "t")) + checkpoint + adds
    parsed = parse_file(data, "f", 3, last=True, identity=(STORE_ID, "t"))
    assert parsed.torn_at is None
    kinds = [r[0] for r in parsed.records]
    assert kinds == ["c", "f", "e", "a", "x"] and parsed.records[1] == ("f", 5, 1, 0)
    assert [list(c) for c in parsed.records[3][1:]] == [[1, 2], [3, 4], [500, 600]]
    # A group's CRC is seeded with its file's number: the same group in file 4 is damage.
    with pytest.raises(JournalError, match="group CRC mismatch"):
        parse_file(encode_header(4, None) + adds + checkpoint, "f", 4, last=True)
    # The last group cut short is a torn tail, reported where it starts.
    torn = data[:-3]
    assert parse_file(torn, "f", 3, last=True).torn_at == len(data) - len(adds)
