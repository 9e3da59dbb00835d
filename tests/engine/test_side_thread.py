"""A big bucket's segments encoded in two halves, one on a thread beside the caller: the same
bytes as one pass, and a failure on either side reaches the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bucketstore.engine.threads.side_thread import run_beside
from bucketstore.format import snapshot
from bucketstore.format.row_sort import sort_rows
from bucketstore.format.snapshot import build_bucket, encode_metadata


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    ledgers = 1 + np.arange(n, dtype=np.uint64) // np.uint64(n // 3 + 1)
    entries = np.arange(n, dtype=np.uint64)
    return sort_rows(1_000 + rng.integers(0, 50_000, n).astype(np.uint64), ledgers, entries)


@pytest.mark.parametrize("seed", [1, 2])
def test_split_encode_is_byte_identical(monkeypatch, seed) -> None:
    monkeypatch.setattr(snapshot, "SPLIT_ROWS", 1_000)
    rows = _rows(5_000, seed)
    threads: list[str] = []

    def beside(fn):
        def named():
            threads.append(threading.current_thread().name)
            return fn()
        return run_beside(named)

    kw = dict(time_step_ms=3_000, max_indexes_per_segment=400)
    one_meta, one = build_bucket(1, 3, *rows, **kw)
    two_meta, two = build_bucket(1, 3, *rows, **kw, run_beside=beside)
    assert threads == ["bucketstore-encode"]
    assert len(one) > 2 and two == one
    assert encode_metadata(two_meta) == encode_metadata(one_meta)


def test_a_failure_beside_reaches_the_caller(monkeypatch) -> None:
    monkeypatch.setattr(snapshot, "SPLIT_ROWS", 1_000)
    rows = _rows(5_000, 3)

    def failing(fn):
        def boom():
            raise OSError("encode failed beside")
        return run_beside(boom)

    with pytest.raises(OSError, match="encode failed beside"):
        build_bucket(1, 3, *rows, time_step_ms=3_000, max_indexes_per_segment=400, run_beside=failing)
    assert run_beside(lambda: 7)() == 7
