"""The adds of new positions a topic writes by whole columns (engine/topics/topic_fresh.py): the
numpy judgement of a long run of waiting adds answers as the one-by-one loop does, on random
runs with due adds, repeated or falling positions, a mark-delete and positions with several rows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bucketstore.engine.topics import topic_fresh
from bucketstore.engine.topics.topic_fresh import fresh_adds, fresh_adds_loop

BIG = 2**64 - 1


def _plain(out):
    n, ledgers, entries, times, last = out
    return n, ledgers.tolist(), entries.tolist(), times.tolist(), last


@pytest.mark.parametrize("seed", range(40))
def test_columns_judge_as_the_loop_does(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([topic_fresh.COLUMNS_FROM, 100, 300])
    ledger, entry, rows = rng.randrange(3), 0, []
    for _ in range(n):
        if rng.random() < 0.1:
            ledger += 1
            entry = 0
        entry += 1 if rng.random() < 0.97 else rng.choice([0, -1])  # now and then not growing
        ts = rng.randrange(0, 5_000)
        cutoff = rng.choice([-1, 10, 100]) if rng.random() < 0.99 else ts  # now and then due
        rows.append((ledger if rng.random() < 0.999 else BIG, max(entry, 0), ts, cutoff))
    start = rng.randrange(3)
    last = rng.choice([(-1, -1), (0, 0), (1, 5)])
    mark = rng.choice([None, None, (0, 3), (1, 0)])
    multi = set(rng.sample([(lg, en) for lg, en, _, _ in rows], 1)) if rng.random() < 0.3 else set()
    want = fresh_adds_loop(rows, start, last, mark, multi)
    assert _plain(fresh_adds(rows, start, last, mark, multi)) == _plain(want)
    assert want[0] >= 0


def test_a_run_of_new_positions_is_taken_whole() -> None:
    rows = [(1, e, 1_000 + e, 10) for e in range(200)]
    n, ledgers, entries, times, last = fresh_adds(rows, 0, (0, 5), None, set())
    assert n == 200 and last == (1, 199) and times.dtype == np.uint64 and entries[-1] == 199
    assert fresh_adds(rows, 0, (1, 0), None, set())[0] == 0  # not after the topic's last position
    assert fresh_adds(rows, 0, (0, 5), (1, 50), set())[0] == 0  # behind a mark-delete
    assert fresh_adds(rows, 0, (0, 5), None, {(1, 120)})[0] == 120  # a position with several rows
