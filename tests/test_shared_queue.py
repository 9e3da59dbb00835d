"""The shared queue's selection of the first due rows across runs, against a plain sort."""

from __future__ import annotations

import numpy as np
from helpers import example_count
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.engine.shared_queue import _select_first, sorted_run

rows = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3), st.integers(0, 200)), min_size=1, max_size=300,
                unique_by=lambda r: (r[1], r[2]))


@settings(max_examples=example_count(300))
@given(st.lists(rows, min_size=2, max_size=6), st.integers(1, 400), st.integers(0, 70))
def test_select_first_equals_sorting_everything(run_rows, need, cutoff):
    runs, counts, everything = [], [], []
    for i, rs in enumerate(run_rows):
        cols = [np.array(c, dtype=np.uint64) for c in zip(*rs)]
        run = sorted_run(*cols)
        runs.append(run)
        counts.append(min(run.due_count(cutoff), need))
        everything += [(int(t), int(l), int(e), i) for t, l, e in zip(run.ts, run.ledgers, run.entries)
                       if t <= cutoff]
    ts, ledgers, entries, taken = _select_first(runs, counts, need)
    expect = sorted(everything)[:need]
    assert sorted(zip(ts.tolist(), ledgers.tolist(), entries.tolist())) == [r[:3] for r in expect]
    assert taken == [sum(1 for r in expect if r[3] == i) for i in range(len(runs))]
