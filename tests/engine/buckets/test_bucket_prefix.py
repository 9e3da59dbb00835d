"""A bucket's first rows kept in its catalog summary (summary version 2, ``bucket_prefix``).

The first batch after a restart is taken from the summaries' prefixes without opening
any bucket file while the batch stays within them; everything a tracker answers stays
what an eager open (entry 0 of every bucket read at the open) answers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import struct

import numpy as np
import pytest

import bucketstore
from bucketstore import CatalogError, CorruptLedgerError, TrackerConfig
from bucketstore.cli.commands import main
from bucketstore.engine.queue import shared_queue
from bucketstore.format import bucket_summary
from bucketstore.format.bucket_summary import decode_summary, encode_summary
from bucketstore.format.snapshot import build_bucket

from helpers import FakeClock, as_format1_catalog, example_count
import repo_paths
import test_lazy_open as lazy_open

LEDGERS = 24
PER_LEDGER = 300
#: Segments longer than the prefix (the default config's are 5,000 rows).
CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=PER_LEDGER, max_indexes_per_segment=120)
WINDOW = (2_000, 12_000)
#: The prefix this module's figures are written for (the shipped PREFIX_ROWS): 50 rows of 24
#: buckets come from the prefixes alone, 120-row segments are longer than it. Pinned, so that
#: BUCKETSTORE_TEST_PREFIX_ROWS (which other modules run under) does not change what these test.
PREFIX_ROWS = 32


@pytest.fixture(autouse=True)
def _shipped_prefix(monkeypatch):
    monkeypatch.setattr(bucket_summary, "PREFIX_ROWS", PREFIX_ROWS)


def _build(path, durability: str = "sealed", seed: int = 1) -> dict[tuple[int, int], int]:
    """One bucket per ledger, every bucket's delays spread over one window (they all overlap)."""
    rng = random.Random(seed)
    rows = {}
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", CFG, FakeClock(1_000))
        for ledger in range(LEDGERS):
            for entry in range(PER_LEDGER):
                rows[(ledger, entry)] = at = rng.randrange(*WINDOW)
                t.add_message(ledger, entry, at)
        t.add_message(LEDGERS, 0, 90_000)  # roll: the last full ledger is sealed (this row is not
        t.flush()                           # in ``rows``: sealed mode does not keep it)
        assert len(t.buckets()) == LEDGERS
    return rows


def _first(rows: dict[tuple[int, int], int], n: int, cutoff: int) -> list[tuple[int, int]]:
    due = sorted((at, ledger, entry) for (ledger, entry), at in rows.items() if at <= cutoff)[:n]
    return sorted((ledger, entry) for _, ledger, entry in due)


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_the_first_batch_after_a_restart_opens_no_bucket_file(tmp_path, durability):
    rows = _build(tmp_path / "s", durability)
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", durability, background=False) as store:
        t = store.tracker("t", CFG, clock)
        extra = t.number_of_delayed_messages - len(rows)  # the journal keeps the last add
        assert extra == (durability == "journal")
        assert t.stats()["unopened_buckets"] == LEDGERS
        assert t.next_delivery_time() == min(rows.values())  # from the summaries: nothing opened
        clock.now = WINDOW[0] + 1_000  # every bucket has rows due
        batch = t.get_scheduled_messages(50)
        assert batch == _first(rows, 50, clock.now)
        # 50 rows of 24 buckets, 32 rows of each in the catalog: no bucket's file was read.
        assert t.stats()["unopened_buckets"] == LEDGERS
        assert t.number_of_delayed_messages == len(rows) + extra - 50
        for ledger, entry in batch[:3]:
            del rows[(ledger, entry)]
        # A membership test answers without opening the bucket (the spilled copy of entry 0), but a
        # prefix position is the index's to answer: delivered, it is not tracked, though entry 0 has it.
        assert not any(t.contains_message(*p) for p in batch)
        held = [p for p in rows if p not in set(batch)]
        assert all(t.contains_message(*p) for p in held[:100] + held[-100:])
        assert t.stats()["unopened_buckets"] == LEDGERS
        t._check()
        rest = t.get_scheduled_messages(10**6)
        for ledger, entry in batch[3:]:
            del rows[(ledger, entry)]
        assert rest == _first(rows, 10**6, clock.now)
        assert t.number_of_delayed_messages == len(rows) + extra - len(rest)
        t._check()


def test_a_batch_past_the_prefixes_opens_a_few_buckets_at_a_time(tmp_path, monkeypatch):
    """Once the prefixes no longer serve a batch, a build opens the buckets whose rest comes first
    (half of those waiting, at least FRONTIER_OPENS), not every overlapping bucket (the others
    wait for later builds); every call stays exact."""
    monkeypatch.setattr(shared_queue, "FRONTIER_OPENS", 4)
    rows = _build(tmp_path / "s")
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, clock)
        clock.now = WINDOW[1]
        taken: list[tuple[int, int]] = []
        seen = [LEDGERS]
        while seen[-1] > 0:
            taken += t.get_scheduled_messages(40)
            t._check()
            assert t.number_of_delayed_messages == len(rows) - len(taken)
            seen.append(t.stats()["unopened_buckets"])
        assert sorted(taken) == _first(rows, len(taken), clock.now)
        # Half the waiting ones (at least 4) per build; a call may build more than once, and a
        # prefix read to its end opens its bucket: over several calls, never all at once.
        assert max(a - b for a, b in zip(seen, seen[1:])) <= LEDGERS // 2 + 4, seen
        assert len(set(seen)) > 3, seen


def test_delivered_prefix_rows_stay_delivered_whatever_reaches_their_bucket(tmp_path):
    """Re-adds, expiries, membership and mark-delete after prefix rows were delivered from
    unopened buckets: each opens the bucket, which must not track those rows again."""
    rows = _build(tmp_path / "s")
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, clock)
        clock.now = WINDOW[1]
        batch = t.get_scheduled_messages(LEDGERS * 4)
        assert t.stats()["unopened_buckets"] == LEDGERS
        for p in batch:
            del rows[p]
        a, b, c = batch[0], batch[len(batch) // 2], batch[-1]
        assert t.add_message(*a, clock.now + 500)  # delivered: tracked again, at its new time only
        rows[a] = clock.now + 500
        assert not t.add_message(*b, 5)  # already due: dispatch now (nothing tracked)
        assert not t.contains_message(*c)
        t.mark_delete(2, 10)  # buckets 0 and 1 go, bucket 2 is cut through
        rows = {p: at for p, at in rows.items() if p > (2, 10)}
        assert t.number_of_delayed_messages == len(rows)
        t._check()
        got = t.get_scheduled_messages(10**6)
        assert got == _first(rows, 10**6, clock.now)
        clock.now += 500
        assert t.get_scheduled_messages(10**6) == ([a] if a > (2, 10) else [])


@pytest.mark.parametrize("durability", ["sealed", "journal"])
@pytest.mark.parametrize("seed", range(example_count(4)))
def test_prefixes_answer_like_an_eager_open(tmp_path, monkeypatch, durability, seed):
    """test_lazy_open's comparison with summaries that keep a prefix of 3 rows (its segments
    hold 7): the tracker opened from the catalog answers every call as the one that read
    every bucket's entry 0 at the open."""
    monkeypatch.setattr(bucket_summary, "PREFIX_ROWS", 3)
    lazy, eager = lazy_open._pair(tmp_path, durability, seed)
    rng_l, rng_e = random.Random(seed), random.Random(seed)
    start = 1_000 + random.Random(seed).randrange(1_000)  # (later, sealed mode may skip every segment 1)
    clock_l, clock_e = FakeClock(start), FakeClock(start)
    universe = [(ledger, entry) for ledger in (*range(lazy_open.LEDGERS), *lazy_open.LATE)
                for entry in range(lazy_open.PER_LEDGER)]
    with bucketstore.open(lazy, durability, background=False) as sl, \
            bucketstore.open(eager, durability, background=False) as se:
        tl, te = sl.tracker("t", lazy_open.CFG, clock_l), se.tracker("t", lazy_open.CFG, clock_e)
        assert any(b.head is not None for b in tl.buckets()), "no prefix queued: the test tests nothing"
        assert tl.number_of_delayed_messages == te.number_of_delayed_messages
        for _ in range(150):
            assert lazy_open._step(rng_l, tl, clock_l, universe) == lazy_open._step(rng_e, te, clock_e, universe)
            tl._check()
        clock_l.now = clock_e.now = 10**9
        assert sorted(tl.get_scheduled_messages(10**6)) == sorted(te.get_scheduled_messages(10**6))
        assert tl.number_of_delayed_messages == te.number_of_delayed_messages == 0


def _rewrite_summaries(path, change) -> None:
    store = bucketstore.open(path)
    try:
        _, summaries = store.catalog.keys_and_summaries("t")
        store.catalog.commit("t", summaries={key: change(raw) for key, raw in summaries.items()})
    finally:
        store.close()


def _as_version1(raw: bytes) -> bytes:
    n = struct.unpack_from("<I", raw, 25)[0]
    return b"\x01" + raw[1:29 + 24 * n]


def test_a_version_1_summary_opens_the_bucket_for_its_first_rows(tmp_path):
    """What the previous release wrote: no prefix, so the first batch reads the files (as before)."""
    rows = _build(tmp_path / "s")
    _rewrite_summaries(tmp_path / "s", _as_version1)
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, clock)
        assert t.stats()["unopened_buckets"] == LEDGERS
        assert all(b.head is None for b in t.buckets())
        clock.now = WINDOW[0] + 1_000
        assert t.get_scheduled_messages(50) == _first(rows, 50, clock.now)
        assert t.stats()["unopened_buckets"] < LEDGERS


def test_the_backfill_of_a_format_1_catalog_writes_the_prefix(tmp_path):
    """The upgrade path: the first open summarises every bucket from its file, prefix included,
    so the next restart's first batch opens no file."""
    rows = _build(tmp_path / "s")
    as_format1_catalog(tmp_path / "s")
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, FakeClock(1_000))
        assert t.recovery_report["summaries_backfilled"] == LEDGERS
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, clock)
        clock.now = WINDOW[0] + 1_000
        assert t.get_scheduled_messages(50) == _first(rows, 50, clock.now)
        assert t.stats()["unopened_buckets"] == LEDGERS


def test_a_prefix_that_disagrees_with_its_file_is_damage(tmp_path, capsys):
    _build(tmp_path / "s")

    def damage(raw: bytes) -> bytes:
        s = decode_summary(raw, path="", key="")
        k = s.prefix_rows
        at = len(raw) - 8 * k  # the entry ids column: the first row's entry id, changed
        return raw[:at] + struct.pack("<Q", struct.unpack_from("<Q", raw, at)[0] ^ 1 << 40) + raw[at + 8:]

    _rewrite_summaries(tmp_path / "s", damage)
    assert main(["verify", str(tmp_path / "s")]) == 1
    assert "disagree with the catalog summary's prefix" in capsys.readouterr().out
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, clock)
        clock.now = WINDOW[1]
        with pytest.raises(CorruptLedgerError, match="prefix") as info:
            for _ in range(100):
                t.get_scheduled_messages(10**6)
        assert str(info.value.path).endswith(".ledger")


def _meta_and_rows(n: int = 200):
    rng = np.random.default_rng(3)
    ts = np.sort(rng.integers(1_000, 5_000, n)).astype(np.uint64)
    ledgers = np.full(n, 7, dtype=np.uint64)
    entries = np.arange(n, dtype=np.uint64)
    meta, _ = build_bucket(7, 7, ts, ledgers, entries, time_step_ms=10**6, max_indexes_per_segment=100)
    return meta, (ts, ledgers, entries)


def test_summary_round_trip_and_malformed_prefixes():
    meta, rows = _meta_and_rows()
    raw = encode_summary(meta, 9, 1234, rows)
    s = decode_summary(raw, path="cat", key="k")
    assert (s.prefix_rows, s.prefix_next) == (PREFIX_ROWS, int(rows[0][PREFIX_ROWS]))
    for have, want in zip(s.prefix(), rows):
        assert have.tolist() == want[:PREFIX_ROWS].tolist()
    assert s.table()[2].tolist() == [100, 100]
    assert decode_summary(encode_summary(meta, 9, 1234), path="cat", key="k").prefix_rows == 0
    assert decode_summary(_as_version1(raw), path="cat", key="k").prefix_rows == 0
    n = 29 + 24 * 2
    bad = {
        "short": raw[:-8],
        "unsorted": raw[:n + 12] + raw[n + 20:n + 28] + raw[n + 12:n + 20] + raw[n + 28:],
        "next before the last row": raw[:n + 4] + struct.pack("<Q", int(rows[0][0])) + raw[n + 12:],
        "longer than segment 1": raw[:n] + struct.pack("<I", 100) + raw[n + 4:],
    }
    for why, blob in bad.items():
        if why == "unsorted" and int(rows[0][0]) == int(rows[0][1]):
            continue
        with pytest.raises(CatalogError, match="cat"):
            decode_summary(blob, path="cat", key="k")


GOLDEN = str(repo_paths.GOLDEN)


@pytest.mark.parametrize("version", [1, 2])
def test_golden_summaries_read_back_and_today_writes_the_same_bytes(version, monkeypatch):
    """``formats/golden/summary_v*.bin``: the committed bytes are the format (catalog.md)."""
    with open(os.path.join(GOLDEN, f"summary_v{version}.bin"), "rb") as f:
        raw = f.read()
    with open(os.path.join(GOLDEN, "summary.json"), encoding="utf-8") as f:
        doc = json.load(f)
    s = decode_summary(raw, path="golden", key="k")
    if version == 2:  # the prefix the golden bytes were written with (encode_summary re-encodes them)
        monkeypatch.setattr(bucket_summary, "PREFIX_ROWS", doc["prefix_rows"])
    assert (s.ledger_id, s.size, s.count) == (doc["ledger_id"], doc["size"], doc["count"])
    assert [list(map(int, row)) for row in zip(*s.table())] == doc["segments"]
    if version == 1:
        assert s.prefix_rows == 0
        return
    assert (s.prefix_rows, s.prefix_next) == (doc["prefix_rows"], doc["prefix_next"])
    assert [list(row) for row in zip(*(c.tolist() for c in s.prefix()))] == doc["prefix"]
    spec = importlib.util.spec_from_file_location("make_summary_golden",
                                                  os.path.join(GOLDEN, "make_summary_golden.py"))
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    meta, rows = maker.golden_bucket()
    assert encode_summary(meta, doc["ledger_id"], doc["size"], rows) == raw


def test_a_prefix_naming_a_ledger_outside_its_bucket_is_catalog_damage_at_the_open(tmp_path):
    _build(tmp_path / "s")

    def damage(raw: bytes) -> bytes:
        k = decode_summary(raw, path="", key="").prefix_rows
        at = len(raw) - 16 * k  # the ledger ids column: the first row's ledger, far outside
        return raw[:at] + struct.pack("<Q", 10**9) + raw[at + 8:]

    _rewrite_summaries(tmp_path / "s", damage)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        with pytest.raises(CatalogError, match="outside ledgers"):
            store.tracker("t", CFG, FakeClock(1_000))


def test_a_prefix_longer_than_the_shipped_one_is_kept_whole(tmp_path, monkeypatch):
    """The seal reads the prefix size when it runs, as the summary's encoder does (a copy taken
    at import kept 33 rows, and every seal failed once the size was raised past 32)."""
    monkeypatch.setattr(bucket_summary, "PREFIX_ROWS", 100)  # segments of 120 rows
    _build(tmp_path / "s")
    with bucketstore.open(tmp_path / "s", background=False) as store:
        t = store.tracker("t", CFG, FakeClock(1_000))
        assert {b.head.prefix_rows for b in t.buckets()} == {100}
