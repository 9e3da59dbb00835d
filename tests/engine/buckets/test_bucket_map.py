"""BucketMap.covering answers from lists rebuilt after every change (engine/buckets/sealed_bucket.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from bucketstore.engine.buckets.sealed_bucket import BucketMap


def _bucket(start: int, end: int) -> SimpleNamespace:
    return SimpleNamespace(start_ledger=start, end_ledger=end)


def test_covering_follows_every_add_remove_and_clear():
    rng = random.Random(5)
    m = BucketMap()
    held: dict[int, SimpleNamespace] = {}  # start -> bucket, ranges [10k, 10k + 5]
    for _ in range(400):
        k = rng.randrange(30)
        if k in held and rng.random() < 0.5:
            m.remove(held.pop(k))
        elif k not in held:
            held[k] = _bucket(10 * k, 10 * k + 5)
            m.add(held[k])
        if rng.random() < 0.02:
            m.clear()
            held.clear()
        for ledger in rng.sample(range(-1, 305), 20):
            want = held.get(ledger // 10) if ledger >= 0 and ledger % 10 <= 5 else None
            assert m.covering(ledger) is want, ledger
        assert m.newest_end == max((b.end_ledger for b in held.values()), default=-1)
