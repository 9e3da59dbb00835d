"""The shared queue's merge of several runs' rows (the frontier's one sort), against a plain sort."""

from __future__ import annotations

import numpy as np
from helpers import example_count
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.engine.shared_queue import _merge, sorted_run

rows = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3), st.integers(0, 200)), min_size=1, max_size=300)
wide = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                min_size=1, max_size=40)


@settings(max_examples=example_count(300))
@given(st.lists(st.one_of(rows, wide), min_size=2, max_size=6))
def test_merge_equals_sorting_everything(run_rows):
    runs = [sorted_run(*(np.array(c, dtype=np.uint64) for c in zip(*rs))) for rs in run_rows]
    parts = [run.rest() for run in runs]
    ts, ledgers, entries, src = _merge(parts, [len(p[0]) for p in parts])
    merged = list(zip(ts.tolist(), ledgers.tolist(), entries.tolist()))
    assert merged == sorted(r for rs in run_rows for r in rs)
    # Each row's run: every run's rows come out in its own order, all of them.
    for i, run in enumerate(runs):
        mine = [m for m, s in zip(merged, src.tolist()) if s == i]
        assert mine == list(zip(run.ts.tolist(), run.ledgers.tolist(), run.entries.tolist()))
