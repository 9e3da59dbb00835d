"""A big bucket's segments encoded in two halves, one on a thread beside the caller: the same
bytes as one pass, and a failure on either side reaches the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bucketstore.engine.threads.side_thread import run_beside
from bucketstore.format import shared_work, snapshot
from bucketstore.format.row_sort import sort_rows
from bucketstore.format.snapshot import build_bucket, encode_metadata


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    ledgers = 1 + np.arange(n, dtype=np.uint64) // np.uint64(n // 3 + 1)
    entries = np.arange(n, dtype=np.uint64)
    return sort_rows(1_000 + rng.integers(0, 50_000, n).astype(np.uint64), ledgers, entries)


def _recording_beside(threads: list[str]):
    """``run_beside``, noting in ``threads`` the name of the thread each call ran on."""
    def beside(fn):
        def named():
            threads.append(threading.current_thread().name)
            return fn()
        return run_beside(named)
    return beside


@pytest.mark.parametrize("seed", [1, 2])
def test_split_encode_is_byte_identical(monkeypatch, seed) -> None:
    monkeypatch.setattr(snapshot, "SPLIT_ROWS", 1_000)
    monkeypatch.setattr(shared_work, "ENCODE_PIECE_ROWS", 700)  # several pieces, taken by either thread
    rows = _rows(5_000, seed)
    threads: list[str] = []
    beside = _recording_beside(threads)

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


def _sorted_parts(sizes: list[int], seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Sorted runs (a seal's, a merge's sources) over shared ledgers, with equal timestamps across runs."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, n in enumerate(sizes):
        ledgers = 1 + rng.integers(0, 3, n).astype(np.uint64)
        entries = np.uint64(100_000 * k) + rng.permutation(n).astype(np.uint64)
        parts.append(sort_rows(1_000 + rng.integers(0, 2_000, n).astype(np.uint64), ledgers, entries))
    return parts


@pytest.mark.parametrize("sizes", [[3_000, 2_500, 1_000, 4_000], [6_000], [2_000] * 12])
def test_split_sort_is_the_whole_sort(monkeypatch, sizes) -> None:
    """Sorted parts of SPLIT_ROWS rows or more are sorted as ranges of timestamps by the caller
    and a thread beside it: the same columns as one sort of their concatenation."""
    from bucketstore.format import row_sort
    from bucketstore.format.row_sort import sort_row_parts

    monkeypatch.setattr(row_sort, "SPLIT_ROWS", 1_000)
    monkeypatch.setattr(row_sort, "RANGE_ROWS", 1_500)  # several ranges, taken by either thread
    parts = _sorted_parts(sizes, len(sizes))
    threads: list[str] = []
    beside = _recording_beside(threads)

    got = sort_row_parts(parts, sorted_parts=True, run_beside=beside)
    assert threads == ["bucketstore-encode"]
    whole = [np.concatenate(c) for c in zip(*parts)]
    order = np.lexsort((whole[2], whole[1], whole[0]))
    for g, c in zip(got, whole):
        assert g.dtype == np.uint64 and np.array_equal(g, c[order])


def test_a_sort_failure_beside_reaches_the_caller(monkeypatch) -> None:
    from bucketstore.format import row_sort

    monkeypatch.setattr(row_sort, "SPLIT_ROWS", 1_000)

    def failing(fn):
        def boom():
            raise MemoryError("sort failed beside")
        return run_beside(boom)

    with pytest.raises(MemoryError, match="sort failed beside"):
        row_sort.sort_row_parts(_sorted_parts([3_000, 3_000], 5), sorted_parts=True, run_beside=failing)


def _merged_entries(path: str, split: bool, monkeypatch) -> tuple[list[bytes], list[str]]:
    """Four sealed buckets with delivered rows, merged; the merged file's entries, and the names
    of the threads the merge's reads ran beside on."""
    from bucketstore import TrackerConfig, open as open_store
    from bucketstore.engine.maintenance import merge_pipeline
    from bucketstore.format import row_sort
    from bucketstore.format.snapshot import BucketFile

    rows = 1_000 if split else 1 << 62
    for module in (merge_pipeline, row_sort, snapshot):
        monkeypatch.setattr(module, "SPLIT_ROWS", rows)
    for module, piece in ((merge_pipeline, "PIECE_ROWS"), (row_sort, "RANGE_ROWS"), (shared_work, "ENCODE_PIECE_ROWS")):
        monkeypatch.setattr(module, piece, 1_500)  # several pieces of each step
    threads: list[str] = []
    beside = _recording_beside(threads)

    monkeypatch.setattr(merge_pipeline, "run_beside", beside)
    epoch = 1_700_000_000_000
    now = [epoch]
    rng = np.random.default_rng(9)
    cfg = TrackerConfig(min_index_count_per_bucket=3_000, max_num_buckets=4, max_indexes_per_segment=500)
    with open_store(path, durability="sealed", background=False) as store:
        t = store.tracker("t", cfg, lambda: now[0])
        for ledger in range(1, 6):
            # (The fifth ledger's rows fall due after the deliveries: it is sealed whole.)
            at = epoch + (50_000 if ledger == 5 else 1_000) + rng.integers(0, 100_000, 3_000).astype(np.uint64)
            t.add_messages((np.full(3_000, ledger, np.uint64), np.arange(3_000, dtype=np.uint64), at))
            if ledger == 5:  # four buckets sealed: some of their rows fall due and go
                now[0] = epoch + 20_000
                while t.get_scheduled_messages(500):
                    pass
        t.add_message(6, 0, epoch + 10 ** 8)  # the fifth seal, then the merge of four
        assert t.stats()["merge"]["succeeded"] == 1
        merged = [b for b in t.buckets() if b.start_ledger == 1][0]
        with BucketFile(merged.path) as bf:
            assert 3_000 < bf.metadata.count < 12_000  # the delivered rows were left out
            entries = [bytes(bf.ledger.read_entry(k)) for k in range(bf.ledger.entry_count)]
    return entries, threads


def test_merge_read_in_halves_writes_the_same_bucket(tmp_path, monkeypatch) -> None:
    """A merge of SPLIT_ROWS rows or more reads and filters its sources' segments, sorts and
    encodes in pieces on its own thread and one beside it: the merged file's entries are those
    of a merge on one thread."""
    split, threads = _merged_entries(str(tmp_path / "split"), True, monkeypatch)
    one, none = _merged_entries(str(tmp_path / "one"), False, monkeypatch)
    assert threads == ["bucketstore-encode"] * 2 and none == []  # the reads', then the sort's
    assert len(split) > 3 and split == one


def test_share_returns_the_pieces_results_in_order_and_raises_a_failure() -> None:
    """Both threads take pieces as they come (here the thread beside is slowed at first), the
    results come back in piece order, and a failing piece's error reaches the caller once every
    other piece is done."""
    import time

    from bucketstore.format.shared_work import share

    ran: list[tuple[int, str]] = []

    def piece(k: int):
        def run():
            time.sleep(0.05 if k == 0 and threading.current_thread().name == "bucketstore-encode" else 0.002)
            ran.append((k, threading.current_thread().name))
            return k * k
        return run

    assert share([piece(k) for k in range(12)], run_beside, first=lambda: ran.append((-1, "first"))) == \
        [k * k for k in range(12)]
    assert sorted(k for k, _ in ran) == list(range(-1, 12))
    assert {name for _, name in ran} == {"first", "MainThread", "bucketstore-encode"}

    done: list[int] = []

    def failing(k: int):
        def run():
            if k == 3:
                raise OSError("piece 3 failed")
            done.append(k)
        return run

    with pytest.raises(OSError, match="piece 3 failed"):
        share([failing(k) for k in range(8)], run_beside)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]


def test_piece_bounds_cut_at_whole_items() -> None:
    from bucketstore.format.shared_work import piece_bounds

    starts = np.array([0, 10, 20, 30, 40], dtype=np.int64)
    assert piece_bounds(starts, 50, 20) == [0, 2, 4, 5]  # three pieces of about 17 rows
    assert piece_bounds(starts, 50, 1_000) == [0, 3, 5]  # at least two (the first item at or past row 25)
    assert piece_bounds(starts, 50, 1, most=4) == [0, 2, 3, 4, 5]  # at most four
    assert piece_bounds(np.array([0]), 50, 10) == [0, 1]  # one item: one piece
