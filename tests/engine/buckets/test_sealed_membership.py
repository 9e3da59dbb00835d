"""contains_message on an unopened sealed bucket answers from disk and leaves the bucket unopened.

The reference is the same store opened eagerly (a format-1 catalog: every bucket's
entry 0 read and its positions put in the index at open), as in test_lazy_open. The
lazily opened tracker asks the same questions with a directory budget so small that
at most one bucket's directory is kept: every answer must be the same, no bucket may
be opened by a question, and the index must hold nothing of them.
"""

from __future__ import annotations

import os
import random

import pytest

import bucketstore
from bucketstore.engine.buckets import sealed_membership
from bucketstore.engine.buckets.sealed_membership import SpilledMembership

from helpers import FakeClock, example_count
from test_lazy_open import CFG, LATE, LEDGERS, PER_LEDGER, _pair, _step

# Wider than any bucket's range: questions about ledgers in gaps and past the end too.
QUESTIONS = [(ledger, entry) for ledger in (*range(LEDGERS + 1), *LATE, 150) for entry in range(PER_LEDGER + 2)]


@pytest.fixture
def tiny_budget(monkeypatch):
    """One bucket's directory at most (each is over 200 bytes): every other question re-reads."""
    monkeypatch.setattr(sealed_membership, "DIRECTORY_BUDGET", 1)
    monkeypatch.setattr(sealed_membership, "_COMPACT_MIN", 0)  # compact as soon as dropped regions dominate


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_questions_leave_buckets_unopened_and_answer_exactly(tmp_path, durability, tiny_budget):
    lazy, eager = _pair(tmp_path, durability, 3)
    with bucketstore.open(lazy, durability, background=False, read_ahead=False) as sl, \
            bucketstore.open(eager, durability, background=False) as se:
        tl, te = sl.tracker("t", CFG, FakeClock(1_000)), se.tracker("t", CFG, FakeClock(1_000))
        unopened = tl.stats()["unopened_buckets"]
        assert unopened >= 2
        in_memory = tl._index.memory_bytes(), len(tl._index)  # journal mode: the replay's, opened buckets'
        expected = [te.contains_message(*q) for q in QUESTIONS]
        assert any(expected) and not all(expected)
        for _ in range(2):  # the second round re-reads the buckets whose directories were dropped
            assert [tl.contains_message(*q) for q in QUESTIONS] == expected
        stats = tl.stats()
        assert stats["unopened_buckets"] == unopened  # no question opened a bucket
        assert (tl._index.memory_bytes(), len(tl._index)) == in_memory  # nor put its positions in memory
        m = stats["membership"]
        assert m["spilled_buckets"] == 1 and m["evictions"] >= 2 * unopened - 1
        assert m["spills"] >= 2 * unopened and m["resident_bytes"] < 1_000
        assert m["failures"] == 0
        assert tl.number_of_delayed_messages == te.number_of_delayed_messages
        tl._check()


@pytest.mark.parametrize("read_ahead", [False, True])
@pytest.mark.parametrize("durability", ["sealed", "journal"])
@pytest.mark.parametrize("seed", range(example_count(3)))
def test_asked_buckets_answer_like_an_eager_open_through_changes(tmp_path, durability, seed, read_ahead,
                                                                  tiny_budget):
    """Questions spill buckets (and drop their directories), then adds, expiries, trims and
    deliveries open them (read_ahead: from an entry 0 the reader thread read ahead): every
    answer, count and batch stays the eager open's."""
    lazy, eager = _pair(tmp_path, durability, seed)
    start = 2_000 + random.Random(seed).randrange(3_000)
    clock_l, clock_e = FakeClock(start), FakeClock(start)
    rng_l, rng_e = random.Random(seed), random.Random(seed)
    universe = [(ledger, entry) for ledger in (*range(LEDGERS), *LATE) for entry in range(PER_LEDGER)]
    with bucketstore.open(lazy, durability, background=False, read_ahead=read_ahead) as sl, \
            bucketstore.open(eager, durability, background=False) as se:
        tl, te = sl.tracker("t", CFG, clock_l), se.tracker("t", CFG, clock_e)
        assert [tl.contains_message(*q) for q in QUESTIONS] == [te.contains_message(*q) for q in QUESTIONS]
        assert tl.stats()["membership"]["spills"] >= 2
        for _ in range(150):
            if rng_l.random() < 0.5:  # (both generators stay in step: same draws on both sides)
                rng_e.random()
                q = rng_l.choice(QUESTIONS)
                assert q == rng_e.choice(QUESTIONS)
                assert tl.contains_message(*q) == te.contains_message(*q)
            else:
                rng_e.random()
                assert _step(rng_l, tl, clock_l, universe) == _step(rng_e, te, clock_e, universe)
            tl._check()
        clock_l.now = clock_e.now = 10**9
        assert sorted(tl.get_scheduled_messages(10**6)) == sorted(te.get_scheduled_messages(10**6))
        assert tl.number_of_delayed_messages == te.number_of_delayed_messages == 0


def test_opening_or_deleting_a_spilled_bucket_drops_its_copy(tmp_path):
    lazy, _ = _pair(tmp_path, "sealed", 5)
    with bucketstore.open(lazy, "sealed", background=False, read_ahead=False) as store:
        clock = FakeClock(1_000)
        t = store.tracker("t", CFG, clock)
        buckets = t.buckets()
        first, last = buckets[0], buckets[-1]
        t.contains_message(first.start_ledger, 0)
        t.contains_message(last.start_ledger, 0)
        assert t.stats()["membership"]["spilled_buckets"] == 2
        t.add_message(last.start_ledger, 10_000, 10**8)  # a change: the bucket is opened
        assert last.opened and t.stats()["membership"]["spilled_buckets"] == 1
        assert t.contains_message(last.start_ledger, 10_000)
        t.mark_delete(first.end_ledger + 1, 0)  # acknowledged: the bucket is deleted unopened
        assert first.dead and t.stats()["membership"]["spilled_buckets"] == 0
        assert not t.contains_message(first.start_ledger, 0)
        t._check()


def test_a_spill_file_that_cannot_be_written_opens_the_bucket_instead(tmp_path, monkeypatch):
    lazy, eager = _pair(tmp_path, "sealed", 2)

    def full_disk(self, blob):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpilledMembership, "_write", full_disk)
    with bucketstore.open(lazy, "sealed", background=False, read_ahead=False) as sl, \
            bucketstore.open(eager, "sealed", background=False) as se:
        tl, te = sl.tracker("t", CFG, FakeClock(1_000)), se.tracker("t", CFG, FakeClock(1_000))
        unopened = tl.stats()["unopened_buckets"]
        assert [tl.contains_message(*q) for q in QUESTIONS] == [te.contains_message(*q) for q in QUESTIONS]
        stats = tl.stats()
        assert stats["unopened_buckets"] == 0 < unopened  # as before spilling: each asked bucket opened
        assert stats["membership"]["failures"] == unopened
        tl._check()


def test_the_spill_file_has_no_name_and_a_read_only_store_gets_none(tmp_path):
    lazy, _ = _pair(tmp_path, "sealed", 4)
    before = sorted(os.listdir(lazy / "ledgers"))
    with bucketstore.open(lazy, "sealed", background=False, read_ahead=False) as store:
        t = store.tracker("t", CFG, FakeClock(1_000))
        assert [t.contains_message(*q) for q in QUESTIONS].count(True) > 0
        assert t.stats()["membership"]["spill_bytes"] > 0
        assert sorted(os.listdir(lazy / "ledgers")) == before
    with bucketstore.open(lazy, read_only=True) as ro:
        t = ro.tracker("t", clock=FakeClock(1_000))
        assert t._membership._directory is None  # never the store's directory: it is the writer's
        assert [t.contains_message(*q) for q in QUESTIONS].count(True) > 0
        assert t.stats()["unopened_buckets"] == t.stats()["immutable_buckets"]
    assert sorted(os.listdir(lazy / "ledgers")) == before


def test_spilled_membership_keeps_each_width_and_compacts():
    """Entry ids of every width (u16, u32, u64) and ledgers far apart; dropped regions are
    reclaimed, and the remaining buckets still answer."""
    from pyroaring import BitMap, BitMap64
    m = SpilledMembership(None, budget=10**9)
    sealed_membership_min = sealed_membership._COMPACT_MIN
    sealed_membership._COMPACT_MIN = 0
    try:
        dense = BitMap(range(100, 9_000))  # one ledger of runs, kept in memory
        buckets = {
            1: (5, {5: BitMap([*range(0, 60_000, 3), 65_535]), 9: BitMap([3])}),
            5: (50, {50: dense, 51: BitMap([1, 2]), 52: BitMap(range(0, 200, 2))}),
            2: (100, {100: BitMap([70_000, 1 << 31]), (1 << 40): BitMap([1])}),
            3: (7, {7: BitMap64([1 << 40, 2]), 8: BitMap()}),
        }
        for bid, (start, positions) in buckets.items():
            assert m.add(bid, start, positions)
        m.forget(1)
        written = m.spill_bytes()
        m.add(4, 0, {0: BitMap(range(1000))})  # dropped regions now dominate: the file is rewritten
        assert m.spill_bytes() == m._live < written
        for bid, (start, positions) in buckets.items():
            for ledger, bm in positions.items():
                for entry in (*bm, 4, 1 << 33):
                    want = None if bid == 1 else entry in set(bm)
                    assert m.contains(bid, ledger, entry) == want, (bid, ledger, entry)
            assert m.contains(bid, start + 1, 3) in ((None,) if bid == 1 else (False,))
        assert m.contains(4, 0, 999) and not m.contains(4, 0, 1000)
        assert not m.add(6, 0, {0: BitMap(range(2_000)), 3: BitMap(range(5_000, 9_000))}) and m.dense == 1
        # Runs: a few bytes, in the spill (1,000 ids) or in memory (8,900 ids).
        assert m._by_bucket[4].roaring == {0: None}
        assert list(m._by_bucket[5].roaring) == [0] and m._by_bucket[5].roaring[0] == BitMap(range(100, 9_000))
        assert not m.contains(5, 50, 1 << 33) and not m.contains(5, 50, 99) and m.contains(5, 50, 8_999)
    finally:
        sealed_membership._COMPACT_MIN = sealed_membership_min
        m.close()


def test_a_dense_bucket_is_opened_by_a_question_rather_than_spilled(tmp_path):
    """Every ledger a few runs of consecutive entries: the index holds it in a few bytes and
    answers faster than a spill would, so the question opens it, as before."""
    cfg = CFG.__class__(tick_time_ms=0, min_index_count_per_bucket=20, max_indexes_per_segment=500)
    with bucketstore.open(tmp_path / "s", "sealed", background=False) as store:
        t = store.tracker("t", cfg, FakeClock(1_000))
        t.add_messages([(0, e, 5_000 + e) for e in range(3_000)])
        t.add_messages([(1, e, 9_000) for e in range(20, 40)])  # sparse: spilled
        t.add_message(2, 0, 50_000)  # roll: ledgers 0 and 1 are sealed
    with bucketstore.open(tmp_path / "s", "sealed", background=False, read_ahead=False) as store:
        t = store.tracker("t", cfg, FakeClock(1_000))
        assert t.stats()["unopened_buckets"] == 2
        assert t.contains_message(0, 2_999) and not t.contains_message(0, 3_000)
        assert t.contains_message(1, 20) and not t.contains_message(1, 19)
        stats = t.stats()
        assert stats["unopened_buckets"] == 1 and stats["membership"]["opened_dense"] == 1
        assert stats["membership"]["spilled_buckets"] == 1
        t._check()


def test_a_compaction_that_fails_halfway_leaves_every_bucket_answering(monkeypatch):
    from pyroaring import BitMap
    monkeypatch.setattr(sealed_membership, "_COMPACT_MIN", 0)
    m = SpilledMembership(None, budget=10**9)
    try:
        m.add(1, 0, {0: BitMap(range(0, 60_000, 3))})
        m.add(2, 10, {10: BitMap([1, 5]), 11: BitMap([7])})
        m.add(3, 20, {20: BitMap([2, 9])})
        m.forget(1)  # dropped regions dominate: the next spill compacts first
        real, calls = os.pwrite, []

        def second_write_fails(fd, data, offset):
            calls.append(offset)
            if len(calls) == 2:
                raise OSError(5, "Input/output error")
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", second_write_fails)
        assert not m.add(4, 30, {30: BitMap([3])}) and m.failures == 1
        monkeypatch.setattr(os, "pwrite", real)
        assert m.contains(2, 10, 5) and m.contains(2, 11, 7) and not m.contains(2, 11, 5)
        assert m.contains(3, 20, 9) and not m.contains(3, 20, 3) and m.contains(4, 30, 3) is None
    finally:
        m.close()


@pytest.mark.parametrize("version", [4, 5])
def test_a_v4_entry0s_lists_are_spilled_without_making_bitmaps(tmp_path, version):
    """A version-4 entry 0 holds a sparse bucket's ids as lists: the spill takes them as they are
    (no roaring bitmap made, format/bucket_bitmaps.entry_columns) and answers as the bitmaps would,
    a ledger of every other id included (listed: an array even run-optimised, so never smaller as
    roaring than as its ids, which is what the spill decides from the bitmaps). Version 5's lists
    are gathered from the segments' rows, the same way."""
    import numpy as np
    from pyroaring import BitMap

    from bucketstore.format.snapshot import (BucketFile, build_bucket, decode_metadata, encode_metadata,
                                             sort_indexes, write_bucket)
    sets = {10: list(range(0, 400, 2)), 11: [3, 900, 9_999], 12: list(range(0, 3_000, 3))}
    ledgers = np.concatenate([np.full(len(v), k, np.uint64) for k, v in sets.items()])
    entries = np.concatenate([np.array(v, np.uint64) for v in sets.values()])
    rows = sort_indexes(np.arange(len(ledgers), dtype=np.uint64) + np.uint64(1_000), ledgers, entries)
    meta, payloads = build_bucket(10, 12, *rows, time_step_ms=1 << 40, max_indexes_per_segment=-1, version=version)
    if version == 4:
        positions = decode_metadata(encode_metadata(meta)).bitmaps
    else:
        with BucketFile(write_bucket(str(tmp_path), 1, meta, payloads)) as bf:
            positions = bf.metadata.bitmaps  # (read after the close: the file is opened again)
    m = SpilledMembership(None, budget=10**9)
    try:
        assert m.add(1, 10, positions)
        assert positions._loaded is None  # no bitmap was made
        for ledger, ids in sets.items():
            for entry in range(-1, 10_001):
                assert m.contains(1, ledger, entry) == (entry in set(ids)), (ledger, entry)
        assert m.add(2, 10, {k: BitMap(v) for k, v in sets.items()})
        assert m._by_bucket[1].roaring is m._by_bucket[2].roaring is None  # the same choice from bitmaps
        assert m.spill_bytes() == 2 * m._by_bucket[1].size
    finally:
        m.close()


def test_a_spilled_ledger_is_searched_at_whole_ids_and_a_full_stretch_keeps_no_keys():
    """The ids are searched as bytes: an entry whose encoding straddles two ids is not there,
    and one found past such a straddle is. A bucket whose ledgers are every ledger of their
    stretch keeps offsets only (half the directory) and still answers every ledger exactly."""
    from pyroaring import BitMap
    m = SpilledMembership(None, budget=10**9)
    try:
        # u16 ids 0x0102, 0x0304 are the bytes 02 01 04 03: 0x0401 straddles them.
        assert m.add(1, 0, {0: BitMap([0x0102, 0x0304]), 1: BitMap([0x0102, 0x0304, 0x0401]), 3: BitMap([9])})
        assert not m.contains(1, 0, 0x0401) and m.contains(1, 0, 0x0304) and m.contains(1, 0, 0x0102)
        assert m.contains(1, 1, 0x0401) and not m.contains(1, 1, 0x0403)
        assert m._by_bucket[1].ledgers is not None  # ledger 2 missing: keys kept
        assert not m.contains(1, 2, 9) and m.contains(1, 3, 9)
        stretch = {ledger: BitMap([ledger % 7, 100 + ledger]) for ledger in range(103, 160)}
        assert m.add(2, 100, stretch)
        rec = m._by_bucket[2]
        assert rec.ledgers is None and rec.start == 103
        assert rec.nbytes == 4 * (len(stretch) + 1) + 200  # offsets only
        for ledger in range(95, 165):
            for entry in (0, 3, 6, 203, 259, 1 << 20):
                want = ledger in stretch and entry in stretch[ledger]
                assert m.contains(2, ledger, entry) == want, (ledger, entry)
        assert {ledger: list(ids) for ledger, ids in m.positions(2).items()} == \
            {ledger: list(bm) for ledger, bm in stretch.items()}
    finally:
        m.close()


def test_the_last_ledger_read_answers_again_until_its_bucket_is_spilled_anew(monkeypatch):
    """Questions on one ledger in a row read its ids once; a bucket forgotten and spilled again
    with other positions (opened, changed, paged out again) is answered from its new ids."""
    from pyroaring import BitMap
    reads, real = [], os.pread

    def counted(fd, n, offset):
        reads.append(offset)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", counted)
    m = SpilledMembership(None, budget=10**9)
    try:
        assert m.add(1, 0, {5: BitMap([1, 2]), 6: BitMap([4])})
        assert m.contains(1, 6, 4) and len(reads) == 1
        assert [m.contains(1, 5, e) for e in range(4)] == [False, True, True, False] and len(reads) == 2
        m.forget(1)  # ledger 5 was the last read
        assert m.add(1, 0, {5: BitMap([3]), 6: BitMap([4])})
        assert [m.contains(1, 5, e) for e in range(4)] == [False, False, False, True] and len(reads) == 3
    finally:
        m.close()


@pytest.mark.parametrize("version, wide", [(5, False), (6, False), (6, True)])
def test_a_v5_or_v6_bucket_of_many_ledgers_spills_what_its_segments_hold(tmp_path, version, wide):
    """A sparse bucket of hundreds of ledgers over dozens of segments (most grouped in version 6),
    with or without a ledger of ids of 2**32 or more (kept as a bitmap by entry 0, its rows left
    out of the gathering): the spill made from the ids gathered from the segments' rows answers
    every position as the rows say, and misses (other ids, unknown and neighbouring ledgers) as
    absent."""
    import numpy as np

    from bucketstore.format.snapshot import BucketFile, build_bucket, sort_indexes, write_bucket
    rng = np.random.default_rng(version)
    ledgers = np.repeat(np.arange(1, 301, dtype=np.uint64), 100)
    entries = np.concatenate([np.sort(rng.choice(10_000, 100, replace=False)) for _ in range(300)]).astype(np.uint64)
    wide_ids = np.arange(1, 41, dtype=np.uint64) * np.uint64(7) + np.uint64(1 << 36) if wide else np.zeros(0, np.uint64)
    ledgers = np.append(ledgers, np.full(len(wide_ids), 301, np.uint64))
    entries = np.append(entries, wide_ids)
    ts = np.uint64(1_700_000_000_000) + ledgers * np.uint64(10_000) + rng.integers(0, 600_000, len(ledgers)).astype(
        np.uint64)
    rows = sort_indexes(ts, ledgers, entries)
    meta, payloads = build_bucket(1, 301, *rows, time_step_ms=60_000, max_indexes_per_segment=2_000, version=version)
    truth = {(int(k), int(e)) for k, e in zip(ledgers, entries)}
    with BucketFile(write_bucket(str(tmp_path), 1, meta, payloads)) as bf:
        positions = bf.metadata.bitmaps
        assert len(positions.lists.ledgers) == 300  # the wide ledger is entry 0's bitmap
    m = SpilledMembership(None, budget=10**9)
    try:
        assert m.add(1, 1, positions)
        for ledger, entry in truth:
            assert m.contains(1, ledger, entry)
        asked = list(zip(rng.integers(0, 303, 20_000).tolist(), rng.integers(0, 10_001, 20_000).tolist()))
        asked += [(301, int(e) + 1) for e in wide_ids] + [(301, int(e) - (1 << 36)) for e in wide_ids]
        for ledger, entry in asked:
            assert m.contains(1, ledger, entry) == ((ledger, entry) in truth), (ledger, entry)
    finally:
        m.close()
