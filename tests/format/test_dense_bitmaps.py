"""The bitmaps of dense positions (a grid of bytes, whole ranges, pyroaring fed in chunks) are
byte for byte pyroaring's for the same positions, as entry 0 has always stored them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from bucketstore.format import bucket_bitmaps
from bucketstore.format.bucket_bitmaps import ledger_bitmaps, serialized_bitmaps


def _reference(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, bytes]:
    """Per ledger, pyroaring's bitmap of its ids built in one call from the sorted set."""
    out: dict[int, bytes] = {}
    for ledger in sorted(set(ledgers.tolist())):
        bm = BitMap(sorted(set(entries[ledgers == ledger].tolist())))
        bm.run_optimize()
        bm.shrink_to_fit()
        out[ledger] = bm.serialize()
    return out


# Ranges whose first or last container holds 1..5 ids, and whole containers, around 65,536.
_EDGES = [0, 1, 2, 3, 4, 5, 65_530, 65_532, 65_533, 65_534, 65_535, 65_536, 65_537, 65_539, 65_540, 131_072]


@settings(max_examples=200, deadline=None)
@given(spans=st.lists(st.tuples(st.sampled_from(_EDGES), st.integers(1, 140_000), st.sampled_from([0, 0, 1, 3, 50])),
                      min_size=1, max_size=4),
       gap=st.integers(0, 2), repeats=st.integers(0, 20), seed=st.integers(0, 2**32 - 1))
def test_dense_positions_serialize_as_pyroaring_does(spans, gap, repeats, seed) -> None:
    """Ledgers holding whole ranges (some with holes, some repeated positions) in random order:
    every ledger's bitmap is pyroaring's, whichever path made it."""
    rng = np.random.default_rng(seed)
    ledgers, entries = [], []
    for k, (first, count, holes) in enumerate(spans):
        ids = np.arange(first, first + count, dtype=np.uint64)
        if holes and count > 2 * holes:
            ids = np.delete(ids, rng.integers(0, count, holes))
        ledgers.append(np.full(len(ids), 7 + k * (1 + gap), np.uint64))
        entries.append(ids)
    ledgers_a, entries_a = np.concatenate(ledgers), np.concatenate(entries)
    if repeats:
        again = rng.integers(0, len(ledgers_a), repeats)
        ledgers_a, entries_a = np.append(ledgers_a, ledgers_a[again]), np.append(entries_a, entries_a[again])
    order = rng.permutation(len(ledgers_a))
    ledgers_a, entries_a = ledgers_a[order], entries_a[order]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bucket_bitmaps, "_BUILD_CHUNK", int(rng.choice([3, 1000, 1 << 17])))
        got = ledger_bitmaps(ledgers_a, entries_a)
        flat = serialized_bitmaps(ledgers_a, entries_a)
    want = _reference(ledgers_a, entries_a)
    assert {ledger: bm.serialize() for ledger, bm in got.items()} == want
    assert flat.flat()[2::3] == list(want.values())
    assert flat.cardinality == len(set(zip(ledgers_a.tolist(), entries_a.tolist())))


def test_dense_path_is_taken_and_sparse_is_not() -> None:
    """The grid is used for dense positions only (its bytes stay within a few per position)."""
    dense = bucket_bitmaps._dense_ledger_bitmaps(np.repeat(np.arange(3, dtype=np.uint64), 1000),
                                                 np.tile(np.arange(1000, dtype=np.uint64), 3))
    assert dense is not None and sorted(dense) == [0, 1, 2] and all(len(bm) == 1000 for bm in dense.values())
    sparse = bucket_bitmaps._dense_ledger_bitmaps(np.array([1, 2], dtype=np.uint64),
                                                  np.array([0, 10**6], dtype=np.uint64))
    assert sparse is None
