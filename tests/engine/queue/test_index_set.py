"""DelayedIndexSet.present_mask: the seal's and merge's filter of live rows."""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap

from bucketstore.engine.queue import index_set
from bucketstore.engine.queue.index_set import DelayedIndexSet

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


def _slice(ledger: int, entries: list[int], ts: list[int] | None = None):
    n = len(entries)
    return (np.array(ts if ts is not None else range(n), dtype=np.uint64), np.full(n, ledger, dtype=np.uint64),
            np.array(entries, dtype=np.uint64))


def test_all_claimable_only_when_every_row_would_deliver_its_position():
    """The frontier's cheap liveness check says True only when claimable_mask would say every
    row is claimable; each case it must refuse (a position twice, a ledger in two slices, a
    mixed slice, an untracked position, a re-added expired position) says False."""
    s = DelayedIndexSet()
    for ledger in (1, 2, 3):
        for e in range(10):
            s.add(ledger, e, 100)
    def agrees(parts) -> bool:
        got = s.all_claimable(parts)
        ts, ledgers, entries = (np.concatenate(cols) for cols in zip(*parts))
        if got:
            assert s.claimable_mask(ledgers, entries, ts).all()
        return got
    assert agrees([_slice(1, [5, 2, 9]), _slice(2, [0, 1]), _slice(3, [7])])
    assert not agrees([_slice(1, [5, 2, 5])])  # a position twice
    assert not agrees([_slice(1, [5, 2]), _slice(1, [3])])  # a ledger in two slices
    mixed = _slice(1, [1, 2, 3])
    mixed[1][1] = 2
    assert not agrees([mixed])
    assert not agrees([_slice(1, [5, 11])])  # 11 is not tracked
    s.deliver(np.array([2], dtype=np.uint64), np.array([4], dtype=np.uint64))
    assert not agrees([_slice(2, [4, 5])])  # delivered (pending) is not claimable
    assert agrees([_slice(2, [5, 6])])
    assert s.expire(3, 1) and s.add(3, 1, 50) is True
    s.add_ghosts(3, s._ghosts[3])  # (expire already made it a ghost: re-added, it is retimed)
    assert not agrees([_slice(3, [1, 2], [100, 100])])  # its old row is not at its live time


def test_changed_ledgers_are_named_up_to_a_bound_then_any_may_have(monkeypatch) -> None:
    """A publishing run between deliveries touches ledger after ledger: past the bound, the
    index stops naming them (and holds none) and says any may have changed."""
    monkeypatch.setattr(index_set, "_DIRTY_MAX", 3)
    index = DelayedIndexSet()
    index.changes()
    index.add(1, 0)
    index.add(2, 0)
    index.discard(1, 0)
    assert index.changes() == {1, 2}
    for ledger in range(10, 20):
        index.add_bitmap(ledger, BitMap([1, 2]))
    assert len(index._dirty) == 0 and index.changes() is None
    index.take(10, U(1))
    assert index.changes() == {10}


def test_delivery_stays_exact_when_more_ledgers_change_than_are_named(tmp_path, monkeypatch) -> None:
    """Expiries on many ledgers between two delivery calls, past the bound: the frontier checks
    all its rows again and delivers none of the expired positions."""
    import bucketstore
    from bucketstore import TrackerConfig
    monkeypatch.setattr(index_set, "_DIRTY_MAX", 3)
    now = [0]
    with bucketstore.open(tmp_path / "s", "sealed", background=False) as store:
        t = store.tracker("t", TrackerConfig(tick_time_ms=0), lambda: now[0])
        t.add_messages([(ledger, entry, 100 + 10 * ledger + entry) for ledger in range(1, 9) for entry in range(4)])
        now[0] = 1_000
        first = t.get_scheduled_messages(3)
        expired = [(ledger, 3) for ledger in range(2, 9)]  # re-added already due: untracked
        for ledger, entry in expired:
            assert not t.add_message(ledger, entry, 500)
        rest = t.get_scheduled_messages(1_000)
        assert not set(rest) & set(expired) and not set(rest) & set(first)
        assert len(first) + len(rest) == 32 - len(expired) and t.number_of_delayed_messages == 0


def test_present_mask_of_a_fully_tracked_span_builds_no_bitmap(monkeypatch) -> None:
    """A ledger that tracks every id of the rows' span (a merge's source nothing was taken from)
    answers without a bitmap of the rows' entries; a hole in the span, a retimed position, a
    64-bit ledger and ids at the top of the 32-bit range still answer as contains does."""
    rng = np.random.default_rng(4)
    index = DelayedIndexSet()
    index.add_many(np.full(1_000, 3, np.uint64), np.arange(1_000, dtype=np.uint64), np.arange(1_000, dtype=np.uint64))
    entries = rng.permutation(1_000).astype(np.uint64)[:600]

    def no_bitmap(*args, **kwargs):
        raise AssertionError("a bitmap of the rows was built")

    with monkeypatch.context() as m:
        m.setattr(index_set, "bitmap_of", no_bitmap)
        assert index.present_mask(np.full(600, 3, np.uint64), entries).all()
    index.discard(3, int(entries[5]))  # a hole in the span: the rows' bitmap decides
    assert index.present_mask(np.full(600, 3, np.uint64), entries).tolist() == [i != 5 for i in range(600)]
    index.expire(3, int(entries[7]))
    index.add(3, int(entries[7]), 5_000)  # retimed: only its row at 5,000 is live
    ts = np.arange(600, dtype=np.uint64)
    got = index.present_mask(np.full(600, 3, np.uint64), entries, ts).tolist()
    assert got == [i not in (5, 7) for i in range(600)]
    top = (1 << 32) - 3
    wide = [top, top + 1, top + 2, top + 3, top + 4]  # across 2**32: a 64-bit ledger
    for e in wide:
        index.add(9, e)
    assert index.present_mask(np.full(5, 9, np.uint64), np.array(wide, dtype=np.uint64)).all()
    for e in (top, top + 1, top + 2):
        index.add(10, e)
    assert index.present_mask(np.full(3, 10, np.uint64), np.array([top, top + 2, top + 1], np.uint64)).all()
