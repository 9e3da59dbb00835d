"""SealedBucket.read_segments: several segments with one open of the file (a merge's reads), the
same runs as one read_segment call each, and the same checks."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bucketstore.engine.buckets.sealed_bucket import SealedBucket
from bucketstore.errors import CorruptLedgerError
from bucketstore.format.row_sort import sort_rows
from bucketstore.format.snapshot import build_bucket, write_bucket


def _bucket(directory: str, ledger_id: int = 7) -> SealedBucket:
    rng = np.random.default_rng(3)
    n = 5_000
    rows = sort_rows(1_000 + rng.integers(0, 60_000, n).astype(np.uint64), 1 + rng.integers(0, 3, n).astype(np.uint64),
                     rng.permutation(n).astype(np.uint64))
    meta, payloads = build_bucket(1, 3, *rows, time_step_ms=10_000, max_indexes_per_segment=700)
    path = write_bucket(directory, ledger_id, meta, payloads)
    return SealedBucket(path, ledger_id, meta, os.path.getsize(path))


def test_read_segments_are_read_segment_each(tmp_path) -> None:
    bucket = _bucket(str(tmp_path))
    numbers = [3, 1, bucket.segment_count, 2]
    assert bucket.segment_count > 4
    for run, number in zip(bucket.read_segments(numbers), numbers, strict=True):
        one = bucket.read_segment(number)
        assert run.owner is bucket
        for got, want in zip((run.ts, run.ledgers, run.entries), (one.ts, one.ledgers, one.entries)):
            assert np.array_equal(got, want)
    assert bucket.read_segments([]) == []


def test_read_segments_check_the_file_and_the_numbers(tmp_path) -> None:
    bucket = _bucket(str(tmp_path))
    with pytest.raises(CorruptLedgerError, match="segment 99 is missing"):
        bucket.read_segments([1, 99])
    (tmp_path / "other").mkdir()
    other = _bucket(str(tmp_path / "other"), ledger_id=8)
    os.replace(other.path, bucket.path)  # another ledger's file in its place
    with pytest.raises(CorruptLedgerError, match="header says ledger 8"):
        bucket.read_segments([1, 2])
