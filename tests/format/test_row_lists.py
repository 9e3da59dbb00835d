"""Snapshot version 5: entry 0 lists array-only ledgers with their counts only, their entry ids
being the segments' rows (``format/entry_lists.py``: ``decode_counts``, ``lists_from_rows``)."""

from __future__ import annotations

import gc
import os
import weakref

import msgpack
import numpy as np
import pytest
from pyroaring import BitMap, BitMap64

from bucketstore.checking.ledger_check import check_file
from bucketstore.errors import CorruptLedgerError
from bucketstore.format.entry_lists import EntryLists, ListsError, encode_lists, lists_from_rows
from bucketstore.format.segment_codec import encode_segment
from bucketstore.format.snapshot import (BucketFile, BucketMetadata, MetadataCodecError, SegmentMetadata,
                                         build_bucket, decode_metadata, encode_metadata, write_bucket)

from test_entry_lists import _sparse

_U64 = np.uint64


def _write(directory: str, ledger_id: int, *rows, version: int, start: int, end: int) -> str:
    meta, payloads = build_bucket(start, end, *rows, time_step_ms=300_000, max_indexes_per_segment=5_000,
                                  version=version)
    return write_bucket(directory, ledger_id, meta, payloads)


def _as_lists(bitmaps) -> dict[int, list[int]]:
    return {k: list(v) for k, v in bitmaps.items()}


def test_a_sparse_bucket_in_v5_drops_entry_0s_ids_and_reads_them_from_the_segments(tmp_path) -> None:
    """What version 5 is for: entry 0 of a sparse bucket goes from about 1 byte an index (version
    4's gaps) to the ledgers and their counts, the segments unchanged, and the bucket's bitmaps
    read back the same, from an open file or from one closed since (it is opened again)."""
    rows = _sparse(200)
    v4, v5 = (_write(str(tmp_path), v, *rows, version=v, start=0, end=199) for v in (4, 5))
    with BucketFile(v4) as old, BucketFile(v5) as new:
        n = new.metadata.count
        assert new.metadata.version == 5 and new.metadata_size < 0.05 * old.metadata_size, \
            (new.metadata_size, old.metadata_size)
        assert [new.ledger.read_entry(k) for k in range(1, new.segment_count + 1)] == \
            [old.ledger.read_entry(k) for k in range(1, old.segment_count + 1)]
        assert os.path.getsize(v4) - os.path.getsize(v5) > 0.9 * n  # a byte an index, about
        want = _as_lists(old.metadata.bitmaps)
        assert list(new.metadata.bitmaps) == list(want) and new.metadata.bitmaps.cardinality == n
        assert _as_lists(new.metadata.bitmaps) == want
    closed = BucketFile(v5)
    closed.close()
    assert _as_lists(closed.metadata.bitmaps) == want


def test_the_metadata_does_not_keep_its_bucket_file_alive(tmp_path) -> None:
    """The metadata's way to its segments holds the reader, not the BucketFile (which holds the
    metadata): a dropped BucketFile goes at once, not at the next cycle collection (a spill reads
    every bucket's entry 0 once and drops it)."""
    path = _write(str(tmp_path), 1, *_sparse(3, seed=4), version=5, start=0, end=2)
    gc.disable()
    try:
        with BucketFile(path) as bf:
            meta, ref = bf.metadata, weakref.ref(bf)
        del bf
        assert ref() is None
    finally:
        gc.enable()
    assert sum(map(len, _as_lists(meta.bitmaps).values())) == meta.bitmaps.cardinality  # read after all


def test_a_mixed_bucket_keeps_its_bitmaps_and_lists_the_rest(tmp_path) -> None:
    """Run, bitset and 64-bit ledgers stay bitmaps in the table; only the array-only ones are
    listed, and gathering their rows leaves the others' rows out."""
    sets = {3: list(range(100, 5_000)), 4: [1, 7, 9, 70_000, 200_000], 5: [3, 1 << 40],
            6: list(range(0, 20_000, 3)), 9: [0]}
    ledgers = np.concatenate([np.full(len(v), k, _U64) for k, v in sets.items()])
    entries = np.concatenate([np.array(v, dtype=_U64) for v in sets.values()])
    ts = np.arange(len(ledgers), dtype=_U64)[np.random.default_rng(1).permutation(len(ledgers))]
    order = np.lexsort((entries, ledgers, ts))
    path = _write(str(tmp_path), 1, ts[order], ledgers[order], entries[order], version=5, start=3, end=9)
    with BucketFile(path) as bf:
        payload = bf.ledger.read_entry(0)
        bitmaps = bf.metadata.bitmaps
        assert bitmaps.lists.ledgers.tolist() == [4, 9]
        assert _as_lists(bitmaps) == {k: sorted(v) for k, v in sets.items()}
        assert isinstance(bitmaps[5], BitMap64) and isinstance(bitmaps[4], BitMap)
    alone = decode_metadata(payload)
    assert list(alone.bitmaps) == [3, 4, 5, 6, 9] and alone.bitmaps.cardinality == len(ledgers)


def test_entry_0_decoded_alone_knows_the_ledgers_and_counts_but_not_the_ids(tmp_path) -> None:
    path = _write(str(tmp_path), 1, *_sparse(5, seed=3), version=5, start=0, end=4)
    with BucketFile(path) as bf:
        payload, want = bf.ledger.read_entry(0), _as_lists(bf.metadata.bitmaps)
    back = decode_metadata(payload)
    assert list(back.bitmaps) == list(want) and back.bitmaps.cardinality == sum(map(len, want.values()))
    with pytest.raises(ValueError, match="segments' rows"):
        back.bitmaps[0]
    assert encode_metadata(back) == payload  # re-encoding needs no ids


def _rows_file(tmp_path, segments: list[tuple[list[int], list[int], list[int]]], bitmaps: dict) -> str:
    """A version-6 bucket (version 5's entry 0; its segments of several ledgers may be grouped) whose
    entry 0 claims ``bitmaps`` over these segments' rows."""
    payloads = [encode_segment(np.array(t, _U64), np.array(l, _U64), np.array(e, _U64)) for t, l, e in segments]
    metas = [SegmentMetadata(t[0], t[-1], len(t)) for t, _, _ in segments]
    count = sum(m.count for m in metas)
    meta = BucketMetadata(1, 2, count, metas, 6, bitmaps)
    return write_bucket(str(tmp_path), 1, meta, payloads)


@pytest.mark.parametrize("segments, bitmaps, message", [
    # Entry 0 says ledger 1 has 1 id and ledger 2 has 2; the rows hold 2 and 1.
    ([([1, 2, 3], [1, 1, 2], [0, 2, 5])], {1: BitMap([0]), 2: BitMap([5, 7])}, "ledger 1: entry 0 lists 1 entry"),
    # The counts agree, but the rows repeat a position (in two segments).
    ([([1], [1], [0]), ([2], [1], [0])], {1: BitMap([0, 3])}, "more than one row"),
    # A listed ledger's row with an id entry 0 could not have listed (2**32 or more).
    ([([1], [1], [1 << 32])], {1: BitMap([0])}, "2\\*\\*32"),
])
def test_rows_that_disagree_with_entry_0_are_damage_where_read_and_in_verify(tmp_path, segments, bitmaps,
                                                                             message) -> None:
    path = _rows_file(tmp_path, segments, bitmaps)
    with BucketFile(path) as bf:  # opening reads entry 0 only
        at = bf.ledger.entry_payload_offset(0)
        with pytest.raises(CorruptLedgerError, match=message) as caught:
            dict(bf.metadata.bitmaps.items())
    assert caught.value.path == path and caught.value.offset == at
    report = check_file(path)
    assert any("listed ledgers and the segments disagree" in f.message and f.offset == at
               for f in report.findings), report.findings


def _v5_entry0(ledgers: list[int], counts: list[int], count: int, *, tail: bytes = b"", listed: int | None = None
               ) -> bytes:
    lists = EntryLists(np.array(ledgers, _U64), np.array(counts, _U64), np.zeros(0, _U64))
    pieces, _ = encode_lists(lists, gaps=False) if ledgers else ([], [])
    body = msgpack.packb([5, 1, 50, count, [5, 9, count], [], b"", len(ledgers) if listed is None else listed,
                          b"".join(pieces) + tail], use_bin_type=True)
    return bytes([0]) + len(body).to_bytes(4, "little") + body


def test_damaged_counts_are_refused_naming_what() -> None:
    meta = decode_metadata(_v5_entry0([2, 7], [3, 1], 4))
    assert list(meta.bitmaps) == [2, 7] and meta.bitmaps.cardinality == 4
    for payload, message in [
        (_v5_entry0([2, 7], [3, 1], 4, tail=b"\x00"), "unexpected bytes after the listed ledgers' counts"),
        (_v5_entry0([2, 7], [3, 1], 5), "bitmaps hold 4 entries"),
        (_v5_entry0([2, 7], [3, 0], 3), "number of entry ids is 0"),
        (_v5_entry0([7, 2], [3, 1], 4), "not strictly ascending"),
        (_v5_entry0([2, 51], [3, 1], 4), "outside"),
        (_v5_entry0([2, 7], [3, 1], 4, listed=3), "entry-id lists"),
        (_v5_entry0([2, 7], [3, 1], 4, listed=0), "malformed"),
    ]:
        with pytest.raises(MetadataCodecError, match=message):
            decode_metadata(payload)


@pytest.mark.parametrize("spread", [1, 1_000_000])
def test_lists_from_rows_gathers_each_listed_ledgers_ids_in_order(spread) -> None:
    """Ledgers close together (a rank table) or far apart (a binary search): the same answer,
    rows of unlisted ledgers (below, between and above the listed ones) left out."""
    rng = np.random.default_rng(spread)
    listed = np.array([10, 12, 13, 20], _U64) * _U64(spread)
    sets = {int(k): sorted(rng.choice(1 << 20, 30, replace=False).tolist()) for k in listed}
    other = [int(listed[0]) - 1, int(listed[0]) + 1, int(listed[-1]) + 5]
    ledgers = np.concatenate([np.full(30, k, _U64) for k in [*sets, *other]])
    entries = np.concatenate([np.array(v, _U64) for v in sets.values()] + [np.arange(30, dtype=_U64)] * 3)
    mix = rng.permutation(len(ledgers))
    got = lists_from_rows(ledgers[mix], entries[mix], listed, np.full(4, 30, _U64))
    assert got.ledgers.tolist() == listed.tolist() and got.counts.tolist() == [30] * 4
    assert got.entries.tolist() == [e for k in listed.tolist() for e in sets[k]]
    with pytest.raises(ListsError, match="entry 0 lists 31 entry ids, the segments' rows hold 30"):
        lists_from_rows(ledgers[mix], entries[mix], listed, np.array([30, 31, 30, 30], _U64))
