"""The topic run file (``formats/topic_runs.md``): the golden file reads back as its JSON says
and today's writer gives its bytes; random runs round-trip; damage is a ``TopicRunError``
naming the offset, never a crash or a wrong row."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.format import topic_run as tr
from repo_paths import GOLDEN

sys.path.insert(0, str(GOLDEN))
from make_topic_run_golden import golden_rows  # noqa: E402


def decode(data: bytes) -> tuple[tr.RunDirectory, np.ndarray, dict]:
    """Every part of a run file, as an engine reads it (trailer, directory, segments, bitmaps)."""
    trailer = tr.decode_trailer(data[-tr.TRAILER.size:], len(data))
    d = tr.decode_directory(data[:tr.HEADER.size], data[trailer[0]:trailer[0] + trailer[1]], trailer)
    rows = np.concatenate([tr.decode_segment(data[s.offset:s.offset + s.length], s) for s in d.segments])
    offset, length, crc = d.bitmaps
    return d, rows, tr.decode_bitmaps(data[offset:offset + length], offset, crc)


def sorted_rows(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))]


def test_golden_run_reads_back_and_is_written_again_byte_for_byte() -> None:
    with open(os.path.join(GOLDEN, "topic_run.run"), "rb") as f:
        data = f.read()
    with open(os.path.join(GOLDEN, "topic_run.json"), encoding="utf-8") as f:
        want = json.load(f)
    d, rows, bitmaps = decode(data)
    assert (d.topic_id, d.run_id, d.rows) == (want["topic_id"], want["run_id"], want["rows"])
    assert hashlib.sha256(np.ascontiguousarray(rows, dtype="<u8").tobytes()).hexdigest() == want["sha256"]
    assert rows[:3].tolist() == want["first_rows"] and rows[-3:].tolist() == want["last_rows"]
    assert [{"rows": s.rows, "first_ts": s.first_ts, "last_ts": s.last_ts} for s in d.segments] == want["segments"]
    assert {lg: sorted(bm) for lg, bm in bitmaps.items()} == {
        lg: sorted(rows[rows[:, 1] == lg, 2].tolist()) for lg in set(rows[:, 1].tolist())}
    assert type(bitmaps[12]).__name__ == "BitMap64"  # entry ids past 2**32
    again = golden_rows()
    assert tr.encode_run(7, 3, again[:, 0], again[:, 1], again[:, 2], again[:, 3]) == data


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                          st.integers(0, 2**64 - 1)), min_size=1, max_size=300, unique=True))
def test_random_runs_round_trip(rows) -> None:
    cols = sorted_rows(np.array(rows, dtype=np.uint64))
    data = tr.encode_run(1, 2, cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
    d, back, bitmaps = decode(data)
    assert np.array_equal(back, cols) and d.rows == len(cols)
    assert sum(len(bm) for bm in bitmaps.values()) == len({(r[1], r[2]) for r in rows})


def test_unsorted_or_empty_rows_are_refused() -> None:
    with pytest.raises(ValueError):
        tr.encode_run(0, 0, *[np.array([], dtype=np.uint64)] * 4)
    with pytest.raises(ValueError):
        tr.encode_run(0, 0, np.array([2, 1], dtype=np.uint64), *[np.array([0, 0], dtype=np.uint64)] * 3)


def test_every_damaged_byte_is_an_error_naming_its_offset_or_reads_the_same() -> None:
    cols = sorted_rows(np.array([(1_000 + 7 * i, i % 3, i, 50 - i) for i in range(40)], dtype=np.uint64))
    data = tr.encode_run(4, 5, cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
    for at in range(len(data)):
        bad = bytearray(data)
        bad[at] ^= 0x41
        try:
            d, rows, _ = decode(bytes(bad))
        except tr.TopicRunError as exc:
            assert "offset" in str(exc)
            continue
        # Only the reserved, id fields of the header decode differently without a checksum.
        assert np.array_equal(rows, cols) and at < tr.HEADER.size, at
    for cut in range(0, len(data), 7):
        with pytest.raises(tr.TopicRunError):
            decode(data[:cut])
