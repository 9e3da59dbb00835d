"""Membership of version-5/6 buckets gathered from their segments' rows without decoding them whole
(``format/listed_rows.py``): the same ids as the segments decoded row by row, for plain and grouped
segments, timestamps tied across ledgers, keys too wide for one word, unlisted and wide ledgers, and
damage named by segment."""

from __future__ import annotations

import numpy as np
import pytest
from pyroaring import BitMap, BitMap64

from bucketstore.errors import CorruptLedgerError
from bucketstore.format.entry_lists import lists_from_rows
from bucketstore.format.grouped_rows import group, read_directory
from bucketstore.format.listed_rows import RowsError, SegmentRows, listed_entries, segment_rows
from bucketstore.format.compression import ZSTD, compress
from bucketstore.format.segment_codec import FLAG_GROUPED, FLAG_ZSTD, SegmentCodecError, decode_segment, encode_segment
from bucketstore.format.snapshot import (BucketFile, BucketMetadata, SegmentMetadata, build_bucket,
                                         read_segment_entry, sort_indexes, write_bucket)

from test_grouped_segments import _directory, _small_grouped, _with_directory

_U64 = np.uint64
BASE = 1_700_000_000_000


def _sets(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for ledger, entry in zip(ledgers.tolist(), entries.tolist()):
        out.setdefault(ledger, []).append(entry)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _decoded_whole(bf: BucketFile) -> dict[int, list[int]]:
    """Every ledger's ids from the segments decoded row by row (what the gather replaces)."""
    segs = [read_segment_entry(bf.ledger, k, m.count, m.min_timestamp, m.max_timestamp,
                               snapshot_version=bf.metadata.version)
            for k, m in enumerate(bf.metadata.segments, start=1)]
    return _sets(np.concatenate([s.ledger_ids for s in segs]), np.concatenate([s.entry_ids for s in segs]))


def _rows(n_ledgers: int, per_ledger: int, seed: int, *, spread: int = 600_000, first: int = 1,
          entry_top: int = 10_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse rows: ``per_ledger`` random ids of each ledger, delayed by U[0, spread)."""
    rng = np.random.default_rng(seed)
    ledgers = np.repeat(np.arange(first, first + n_ledgers, dtype=_U64), per_ledger)
    entries = np.concatenate([np.sort(rng.choice(entry_top, per_ledger, replace=False)).astype(_U64)
                              for _ in range(n_ledgers)])
    published = (ledgers - _U64(first)) * _U64(10_000) + entries % _U64(10_000)
    return sort_indexes(_U64(BASE) + published + rng.integers(0, spread, len(ledgers)).astype(_U64),
                        ledgers, entries)


@pytest.mark.parametrize("version, seed", [(5, 1), (6, 1), (6, 2)])
def test_a_sparse_bucket_of_many_ledgers_gathers_what_its_segments_hold(tmp_path, version, seed) -> None:
    """Hundreds of ledgers over dozens of segments (most of them grouped in version 6): the listed
    ledgers' ids are every ledger's rows, in order, as the segments decoded whole say."""
    rows = _rows(300, 100, seed)  # (100 ids of 10,000: a sparse store's 1 %)
    meta, payloads = build_bucket(1, 300, *rows, time_step_ms=60_000, max_indexes_per_segment=2_000, version=version)
    grouped = sum(p[0] & FLAG_GROUPED != 0 for p in payloads)
    assert grouped > len(payloads) // 2 if version == 6 else grouped == 0
    with BucketFile(write_bucket(str(tmp_path), 1, meta, payloads)) as bf:
        assert len(bf.metadata.bitmaps.lists.ledgers) == 300  # every ledger listed (gathered)
        got = {k: list(v) for k, v in bf.metadata.bitmaps.items()}
        assert got == _sets(rows[1], rows[2]) == _decoded_whole(bf)


def _grouped(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> SegmentRows:
    """One segment's rows as a grouped body holds them (the writer's own grouping)."""
    made = group(ts, ledgers, np.zeros(1, dtype=np.int64), np.array([len(ts)], dtype=np.int64))
    directory, _ = read_directory(made.directories[0], len(ts))
    return SegmentRows(entries, None, directory, made.steps.copy())


def _plain(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> SegmentRows:
    return SegmentRows(entries, ledgers, None, None)


def _gathered(segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]], layouts: str,
              listed: list[int] | None = None) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The gather's answer over these segments (``layouts``: g or p for each) and the one made
    row by row (``lists_from_rows``), for the ``listed`` ledgers (default: every one)."""
    rows = [(_grouped if kind == "g" else _plain)(*seg) for seg, kind in zip(segments, layouts)]
    all_ledgers = np.concatenate([s[1] for s in segments])
    all_entries = np.concatenate([s[2] for s in segments])
    truth = _sets(all_ledgers, all_entries)
    keep = sorted(truth) if listed is None else listed
    ledgers = np.array(keep, _U64)
    counts = np.array([len(truth[k]) for k in keep], _U64)
    want = lists_from_rows(all_ledgers, all_entries, ledgers, counts)
    got = listed_entries(rows, ledgers, counts)
    assert np.array_equal(got.ledgers, want.ledgers) and np.array_equal(got.counts, want.counts)
    cuts = np.cumsum(got.counts.astype(np.int64))[:-1]
    return ({int(k): v.tolist() for k, v in zip(got.ledgers, np.split(got.entries, cuts))},
            {k: truth[k] for k in keep})


def _cut(rows: tuple[np.ndarray, np.ndarray, np.ndarray], size: int) -> list[tuple[np.ndarray, ...]]:
    return [tuple(c[a:a + size] for c in rows) for a in range(0, len(rows[0]), size)]


@pytest.mark.parametrize("layouts", ["gggg", "pppp", "gpgp", "g"])
def test_timestamps_tied_across_ledgers_pair_each_id_with_its_ledger(layouts) -> None:
    """Many ledgers' rows at the same few timestamps: in delivery order ties go by ledger, then by
    entry id, and the gather's key must break them the same way, or ids change ledgers."""
    rng = np.random.default_rng(7)
    n = 2_000
    ledgers = rng.integers(50, 90, n).astype(_U64)
    entries = rng.integers(0, 1 << 20, n).astype(_U64)
    ts = _U64(BASE) + rng.integers(0, 4, n).astype(_U64)
    rows = sort_indexes(ts, ledgers, entries)
    keep = np.unique(rows[1] * _U64(1 << 21) + rows[2], return_index=True)[1]  # positions once
    rows = tuple(c[np.sort(keep)] for c in rows)
    segments = _cut(rows, -(-len(rows[0]) // len(layouts)))
    got, want = _gathered(segments, layouts)
    assert got == want


def test_segments_whose_keys_do_not_fit_one_word_are_put_in_order_one_at_a_time() -> None:
    """Timestamps 2**63 apart in one segment: (segment, timestamp, rank) takes more than 64 bits,
    so each grouped segment is put in delivery order by itself, with the same answer."""
    rng = np.random.default_rng(3)
    n = 600
    ledgers = rng.integers(1, 30, n).astype(_U64)
    entries = rng.permutation(n).astype(_U64)
    ts = rng.integers(0, 1 << 63, n, dtype=np.uint64) + _U64(1 << 62)
    rows = sort_indexes(ts, ledgers, entries)
    got, want = _gathered(_cut(rows, 200), "ggg")
    assert got == want


def test_rows_of_unlisted_and_wide_ledgers_are_left_out() -> None:
    """Ledgers entry 0 keeps as bitmaps (runs, ids of 2**32 or more) are not listed: their rows are
    left out of the gather, whatever their ids, in grouped and plain segments alike."""
    rng = np.random.default_rng(11)
    sparse = _rows(20, 30, 5, first=100)
    wide_e = (rng.choice(1 << 20, 60, replace=False).astype(_U64) + _U64(1 << 40))
    wide = (np.sort(rng.integers(BASE, BASE + 600_000, 60).astype(_U64)), np.full(60, 105, _U64), wide_e)
    runs = (np.sort(rng.integers(BASE, BASE + 600_000, 500).astype(_U64)), np.full(500, 300, _U64),
            np.arange(500, dtype=_U64))
    rows = sort_indexes(*(np.concatenate(c) for c in zip(sparse, wide, runs)))
    listed = [k for k in range(100, 120) if k != 105]
    for layouts in ("gggg", "pgpg"):
        got, want = _gathered(_cut(rows, -(-len(rows[0]) // 4)), layouts, listed)
        assert got == want and 105 not in got and 300 not in got


def test_a_bucket_with_no_listed_ledger_and_one_with_wide_ids_read_back(tmp_path) -> None:
    """Entry 0 of a dense bucket lists no ledger (every one a run: a bitmap); a bucket of wide ids
    lists the narrow ledgers only: both read back every ledger's ids."""
    dense = sort_indexes(np.arange(3_000, dtype=_U64) + _U64(BASE), np.repeat(np.arange(1, 4, dtype=_U64), 1_000),
                         np.tile(np.arange(1_000, dtype=_U64), 3))
    narrow = _rows(12, 25, 9)
    wide = (narrow[0][:40] + _U64(7), np.full(40, 13, _U64), np.arange(40, dtype=_U64) * _U64(3) + _U64(1 << 33))
    mixed = sort_indexes(*(np.concatenate(c) for c in zip(narrow, wide)))
    for number, (rows, end, listed) in enumerate([(dense, 3, 0), (mixed, 13, 12)], start=1):
        meta, payloads = build_bucket(1, end, *rows, time_step_ms=100_000, max_indexes_per_segment=90)
        with BucketFile(write_bucket(str(tmp_path), number, meta, payloads)) as bf:
            assert len(bf.metadata.bitmaps.lists.ledgers) == listed
            got = {k: list(v) for k, v in bf.metadata.bitmaps.items()}
            assert got == _sets(rows[1], rows[2]) == _decoded_whole(bf)
            assert isinstance(bf.metadata.bitmaps[13 if listed else 1], BitMap64 if listed else BitMap)


@pytest.mark.parametrize("damage", ["step", "base"])
def test_a_grouped_step_that_wraps_is_named_by_its_segment(tmp_path, damage) -> None:
    """A timestamp taken past 2**64 by a step (a huge one, or a small one from a base near 2**64)
    would pair its ids with other ledgers: the gather refuses the bucket, naming the segment and
    where its entry starts."""
    good = _small_grouped()
    payload = bytearray(good)
    values, pos = _directory(bytes(payload))
    if damage == "step":
        payload[pos + 1:pos + 9] = ((1 << 64) - 3).to_bytes(8, "little")  # steps' base: every step 3 less
    else:
        payload = bytearray(_with_directory(good, [(1 << 64) - 10, *values[1:]]))
    ts = np.arange(8, dtype=_U64) + _U64(BASE)
    other = encode_segment(ts + _U64(100), np.full(8, 40, _U64), np.arange(8, dtype=_U64))
    rows = {10: [2, 4, 9], 20: [1, 3, 7], 30: [0, 5], 40: list(range(8))}
    meta = BucketMetadata(10, 40, 16, [SegmentMetadata(BASE, BASE + 20, 8), SegmentMetadata(BASE + 100, BASE + 107, 8)],
                          6, {k: BitMap(v) for k, v in rows.items()})
    for number, segments in [(1, [good, other]), (2, [bytes(payload), other])]:
        path = write_bucket(str(tmp_path), number, meta, segments)
        with BucketFile(path) as bf:
            if number == 1:  # sound: read back
                assert {k: list(v) for k, v in bf.metadata.bitmaps.items()} == rows
                continue
            at = bf.ledger.entry_payload_offset(1)
            wraps = r"segment 1: timestamp \d+ of the grouped body .* wraps"
            with pytest.raises(CorruptLedgerError, match=wraps) as caught:
                dict(bf.metadata.bitmaps.items())
        assert caught.value.path == path and caught.value.offset == at
    with pytest.raises(RowsError, match="segment 2"):
        listed_entries([segment_rows(other, 8), segment_rows(bytes(payload), 8)], np.array([10, 20, 30, 40], _U64),
                       np.array([3, 3, 2, 8], _U64))


def test_a_damaged_segment_is_named_at_its_offset_in_the_file(tmp_path) -> None:
    """A fault in a segment's columns, found while gathering, names the segment and the file offset
    (in a stored body) or the compressed stream's start with the offset in the inflated body,
    as reading the segment for delivery does."""
    ts = np.arange(6, dtype=_U64) + _U64(BASE)
    ledgers = np.array([1, 2, 1, 2, 1, 2], _U64)
    entries = np.array([0, 0, 1, 1, 2, 2], _U64) * _U64(1_000)
    meta = BucketMetadata(1, 2, 6, [SegmentMetadata(BASE, BASE + 5, 6)], 6, {1: BitMap([0, 1_000, 2_000]),
                                                                             2: BitMap([0, 1_000, 2_000])})
    stored = encode_segment(ts, ledgers, entries, compress=False, grouped=False)
    assert stored[0] == 0  # plain, stored as it is: its offsets are the file's
    body = bytearray(stored[5:])
    body[0] = 9  # the timestamps' column kind, which the gathering skips by its header
    packed = bytes([FLAG_ZSTD]) + stored[1:5] + len(body).to_bytes(4, "little") + compress(bytes(body), ZSTD)
    for number, (payload, message, offset) in enumerate([
            (stored + b"\x00", "segment 1: 1 unexpected bytes after the columns", len(stored)),
            (stored[:-3], "segment 1: column of 6 values at width 2 does not fit the segment", None),
            (packed, r"segment 1: unknown column kind 9 \(at byte 0 of the inflated body\)", 9),
    ], start=1):
        path = write_bucket(str(tmp_path), number, meta, [payload])
        with BucketFile(path) as bf:
            at = bf.ledger.entry_payload_offset(1)
            with pytest.raises(CorruptLedgerError, match=message) as caught:
                dict(bf.metadata.bitmaps.items())
        with pytest.raises(SegmentCodecError) as decoded:  # where delivery's reading says
            decode_segment(payload, 6, snapshot_version=6)
        assert caught.value.offset == at + decoded.value.offset
        assert offset is None or decoded.value.offset == offset
