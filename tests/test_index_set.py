"""DelayedIndexSet.present_mask: the seal's and merge's filter of live rows."""

from __future__ import annotations

import numpy as np

from bucketstore.engine.index_set import DelayedIndexSet

U = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731


def test_present_mask_keeps_only_the_current_row_of_a_retimed_position() -> None:
    index = DelayedIndexSet()
    index.add(1, 5, 100)
    index.expire(1, 5)  # re-added already due: its old row may linger
    index.add(1, 5, 200)  # tracked again, due at 200: only that row is live
    # Every entry of the input is tracked (the fast path), yet the stale row must go.
    assert index.present_mask(U(1, 1), U(5, 5), U(100, 200)).tolist() == [False, True]
    index.add(2, 7, 300)
    assert index.present_mask(U(2, 1, 1, 2), U(7, 5, 5, 8), U(300, 100, 200, 9)).tolist() == [True, False, True, False]


def test_present_mask_over_many_ledgers_matches_contains() -> None:
    rng = np.random.default_rng(1)
    index = DelayedIndexSet()
    ledgers = rng.integers(0, 300, 5_000).astype(np.uint64)
    entries = rng.integers(0, 1_000, 5_000).astype(np.uint64)
    for ledger, entry in zip(ledgers[::2].tolist(), entries[::2].tolist()):
        index.add(ledger, entry)
    want = [index.contains(l, e) for l, e in zip(ledgers.tolist(), entries.tolist())]
    assert index.present_mask(ledgers, entries).tolist() == want
