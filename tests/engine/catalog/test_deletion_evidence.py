"""No bucket file is deleted on the word of its catalog summary alone (issue 29, item 2).

A tracker opens lazily: each bucket is known from its catalog summary until it is
first needed. A summary rewritten well-formed but wrong (no segment, or every
segment due or behind the journal's frontier) used to make the open delete that
bucket's file unread. Now a deletion that relies on a bucket's summary (at open, by
``replay_done`` for rows skipped as due, by a mark-delete passing an unopened
bucket) reads its entry 0 first; a disagreement is damage, raised as
``CorruptLedgerError`` at entry 0's offset before anything is deleted, and
``repair=True`` re-derives the summary from the file.

The sweep applies every case of the damaged-summary corpus (tests/corpus/summary_damage.py)
to a live store whose damaged bucket is never due, and walks the destructive paths
twice over (open, replay_done, deliveries and confirmation, a mark-delete, reopen):
the bucket's file and key are never removed, and the error, if any, is typed.
"""

from __future__ import annotations

import shutil

import lmdb
import pytest

import bucketstore
from bucketstore import BucketStoreError, CatalogError, CorruptLedgerError, LedgerIdentityError, TrackerConfig
from bucketstore.cli.commands import main
from bucketstore.engine.catalog.catalog import Catalog
from bucketstore.format import bucket_summary
from bucketstore.format.bucket_summary import decode_summary
from bucketstore.format.ledger_file import ledger_file_name
from bucketstore.format.snapshot import BucketFile, bucket_key
from corpus.summary_damage import CAUGHT_AT, SUMMARY_CASES
from helpers import FakeClock

# The damaged-summary corpus edits a prefix of at least two rows, with room after it in the
# victim's 40-row segment 1 (checked from 2 to the shipped 32): BUCKETSTORE_TEST_PREFIX_ROWS=1
# leaves nothing to edit, 40 or more no prefix at all.
pytestmark = pytest.mark.skipif(not 2 <= bucket_summary.PREFIX_ROWS <= 32,
                                reason="the corpus needs a prefix of 2 to 32 rows")

#: Segments of 40 rows (segment 1 longer than the summary's 32-row prefix); no merging.
CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=40, max_num_buckets=-1)
FUTURE = 10**7
#: Ledger 0: 10 rows, never due (a mark-delete passes it). Ledger 1, the victim: 50 rows never
#: due, in segments of 40 and 10. Ledger 2: 10 rows due at 2_000 (journal mode delivers and
#: confirms them: the frontier). Ledger 3 rolls the others into buckets.
VICTIM = bucket_key(1, 1)
VICTIM_ROWS = [(1, e) for e in range(50)]
NOW = 5_000


def _held(durability: str) -> int:
    """What the tracker holds at a reopen: ledgers 0 and 1 (and ledger 3's row, kept by the journal)."""
    return 60 + (durability == "journal")


def _build(path, durability: str) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", CFG, clock)
        t.add_messages([(0, e, FUTURE // 2 + e) for e in range(10)])
        t.add_messages([(1, e, FUTURE + 10 * e) for e in range(50)])
        t.add_messages([(2, e, 2_000 + e) for e in range(10)])
        t.add_message(3, 0, 2 * FUTURE)
        t.flush()
        clock.now = 3_000
        assert len(t.get_scheduled_messages(100)) == 10
        t.flush()  # journal mode: confirmed, the frontier is ledger 2's last row
        assert t.stats()["immutable_buckets"] == 2  # ledger 2's bucket went once delivered


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    out = {}
    for durability in ("sealed", "journal"):
        out[durability] = tmp_path_factory.mktemp("evidence") / durability
        _build(out[durability], durability)
    return out


def _store(templates, tmp_path, durability: str):
    path = tmp_path / durability
    shutil.copytree(templates[durability], path)
    return path


def _rewrite(path, key: str, change) -> str:
    """Replace bucket ``key``'s summary by ``change(raw)``; return its ledger file."""
    env = lmdb.open(str(path / "catalog"), max_dbs=4, subdir=True)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"summaries", txn=txn)
            name = b"t\x00" + key.encode()
            raw = txn.get(name, db=db)
            txn.put(name, change(raw), db=db)
    finally:
        env.close()
    return str(path / "ledgers" / ledger_file_name(decode_summary(raw, path="", key="").ledger_id))


def _keys(path) -> dict[str, int]:
    with Catalog(str(path / "catalog"), readonly=True) as catalog:
        return catalog.keys_and_summaries("t")[0]


def _entry0_offset(file: str) -> int:
    with BucketFile(file) as bf:
        return bf.ledger.entry_payload_offset(0)


def _looks_due(raw: bytes) -> bytes:
    return SUMMARY_CASES["summary_all_due"](raw)


def _looks_empty(raw: bytes) -> bytes:
    return SUMMARY_CASES["summary_no_segments"](raw)


@pytest.mark.parametrize("change", [_looks_due, _looks_empty], ids=["every_segment_due", "no_segment"])
@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_summary_that_makes_a_bucket_look_done_deletes_nothing(templates, tmp_path, durability, change):
    """The issue's case: the summary says the bucket holds nothing (or, journal mode, that every
    segment is behind the confirmed frontier; sealed mode, that every segment is due, which
    ``replay_done`` would then delete). Its 50 rows were never delivered."""
    path = _store(templates, tmp_path, durability)
    victim = _rewrite(path, VICTIM, change)
    with bucketstore.open(path, durability, background=False) as store:
        with pytest.raises(CorruptLedgerError, match="catalog summary") as info:
            t = store.tracker("t", CFG, FakeClock(NOW))
            # Only sealed mode's "every segment due" opens: the bucket is held at open...
            assert durability == "sealed" and change is _looks_due
            assert t.recovery_report["deleted_due"] == 0 and t.recovery_report["held_for_replay_indexes"] == 50
            t.replay_done()  # ...and not deleted once the embedder's replay is done
    assert (info.value.path, info.value.offset) == (victim, _entry0_offset(victim))
    assert VICTIM in _keys(path)
    with BucketFile(victim) as bf:
        assert bf.metadata.count == 50
    # repair re-derives the summary from the file: every row is still there, and stays.
    with bucketstore.open(path, durability, background=False, repair=True) as store:
        t = store.tracker("t", CFG, FakeClock(NOW))
        assert t.recovery_report["dropped"] == [] and t.recovery_report["deleted_due"] == 0
        assert all(t.contains_message(*p) for p in VICTIM_ROWS)
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", CFG, FakeClock(NOW))
        t.replay_done()
        assert t.number_of_delayed_messages == _held(durability) and all(t.contains_message(*p) for p in VICTIM_ROWS)


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_mark_delete_past_an_unopened_bucket_checks_its_summary_first(templates, tmp_path, durability):
    """A mark-delete deletes the buckets it passes unopened, each after one entry 0 read: a
    summary that disagrees refuses the mark-delete before it is recorded."""
    path = _store(templates, tmp_path, durability)
    victim = _rewrite(path, VICTIM, SUMMARY_CASES["summary_size"])
    files = sorted((path / "ledgers").iterdir())
    assert len(files) == 2
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", CFG, FakeClock(NOW))
        assert t.recovery_report["unopened"] == 2
        with pytest.raises(CorruptLedgerError, match="catalog summary") as info:
            t.mark_delete(2, 0)
        assert (info.value.path, info.value.offset) == (victim, _entry0_offset(victim))
        assert t.mark_delete_position is None and t.number_of_delayed_messages == _held(durability)
    assert set(_keys(path)) == {bucket_key(0, 0), VICTIM}
    # With the summary re-derived (repair), the same mark-delete deletes both buckets.
    with bucketstore.open(path, durability, background=False, repair=True) as store:
        store.tracker("t", CFG, FakeClock(NOW))
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", CFG, FakeClock(NOW))
        t.mark_delete(2, 0)
        assert t.stats()["immutable_buckets"] == 0
    assert _keys(path) == {} and not any(f.exists() for f in files)


def _walk(path, durability: str, errors: list[BaseException]) -> None:
    """Open, replay_done, deliver and confirm what is due, mark-delete into the victim, close;
    each step's typed error is collected and ends the walk of that open."""
    try:
        with bucketstore.open(path, durability, background=False) as store:
            clock = FakeClock(NOW)
            t = store.tracker("t", CFG, clock)
            t.replay_done()
            for _ in range(3):
                t.get_scheduled_messages(100)
                t.flush()
                clock.now += 1_000
            t.mark_delete(1, 0)  # passes ledger 0's bucket, cuts into the victim (opens it)
            t.flush()
    except BucketStoreError as exc:
        errors.append(exc)


@pytest.mark.parametrize("name", sorted(SUMMARY_CASES))
@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_damaged_summary_is_refused_or_read_past_never_a_deletion(templates, tmp_path, durability, name):
    path = _store(templates, tmp_path, durability)
    victim = _rewrite(path, VICTIM, SUMMARY_CASES[name])
    assert main(["verify", str(path)]) == 1  # verify finds every case, as the engine must
    errors: list[BaseException] = []
    for _ in range(2):  # the second open sees what the first one recorded (a frontier, a mark-delete)
        _walk(path, durability, errors)
        assert VICTIM in _keys(path), errors
        with BucketFile(victim) as bf:
            assert bf.metadata.count == 50
    where = CAUGHT_AT[name]
    if where == "refused":
        assert errors and all(isinstance(e, CatalogError) and e.key == VICTIM for e in errors), errors
    elif where == "entry 0":
        assert errors and all(isinstance(e, CorruptLedgerError) and (e.path, e.offset) == (victim, _entry0_offset(victim))
                              for e in errors), errors
    else:
        assert errors == []  # the prefix of a bucket never due is never used: read past


def _segment1_offset(file: str) -> int:
    with BucketFile(file) as bf:
        return bf.ledger.entry_payload_offset(1)


@pytest.mark.parametrize("name", sorted(n for n, where in CAUGHT_AT.items() if where == "segment 1"))
def test_a_wrong_prefix_delivered_and_confirmed_is_damage_at_the_reopen(templates, tmp_path, name):
    """Journal mode: the first batch after a restart is the summary's prefix, delivered before
    the file is read. When one of its rows is wrong and the batch is confirmed, the frontier
    lands on it; the reopen untracks segment 1's rows up to the frontier as delivered, and
    with a forged position would so drop the real row it stood for, never delivered (the
    case summary_prefix_entry). Segment 1 is compared with the prefix there too."""
    path = _store(templates, tmp_path, "journal")
    victim = _rewrite(path, VICTIM, SUMMARY_CASES[name])
    with Catalog(str(path / "catalog"), readonly=True) as catalog:
        k = decode_summary(catalog.keys_and_summaries("t")[1][VICTIM], path="", key="").prefix_rows
    with bucketstore.open(path, "journal", background=False) as store:
        clock = FakeClock(2 * FUTURE)
        t = store.tracker("t", CFG, clock)
        batch = t.get_scheduled_messages(10 + k)  # ledger 0's bucket, then the victim's prefix only
        assert len(batch) == 10 + k
        if name == "summary_prefix_entry":
            # the corpus forges the prefix's last row: entry k - 1 (31 at the shipped 32 rows)
            assert (1, 1_000_000 + k - 1) in batch and (1, k - 1) not in batch
        t.confirm_delivered()
        t.flush()
        with pytest.raises(CorruptLedgerError, match="prefix") as live:  # the batch reaching segment 1
            t.get_scheduled_messages(100)
        assert (live.value.path, live.value.offset) == (victim, _segment1_offset(victim))
    with bucketstore.open(path, "journal", background=False) as store:
        with pytest.raises(CorruptLedgerError, match="prefix") as info:
            store.tracker("t", CFG, FakeClock(2 * FUTURE))
    assert (info.value.path, info.value.offset) == (victim, _segment1_offset(victim))
    assert VICTIM in _keys(path)


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_merge_opens_its_sources_first_and_a_damaged_one_is_not_merged_away(templates, tmp_path, durability):
    """A merge deletes its sources' files once the merged one is in the catalog; it opens each
    source first (entry 0 against the summary), so a disagreeing summary stops the merge.
    (This held before issue 29; pinned here with the other destructive paths.)"""
    path = _store(templates, tmp_path, durability)
    victim = _rewrite(path, VICTIM, SUMMARY_CASES["summary_counts_moved"])
    merging = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=40,
                            max_num_buckets=1)
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", merging, FakeClock(NOW))
        t.add_messages([(5, e, FUTURE + e) for e in range(10)])
        t.add_message(6, 0, FUTURE)  # seals ledger 5: three buckets, one allowed, a merge
        maintenance = t.stats()["maintenance"]
        # Not retried in a loop; the delivery that reaches the bucket raises it.
        assert maintenance["failed"] == 1 and victim in maintenance["last_error"]
        assert "catalog summary" in maintenance["last_error"] and t.stats()["immutable_buckets"] == 3
    assert VICTIM in _keys(path)
    with BucketFile(victim) as bf:
        assert bf.metadata.count == 50


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_wider_key_deletes_the_buckets_it_encloses_only_once_its_file_agrees(templates, tmp_path, durability):
    """A range that encloses others makes the open delete them as a merge's leftovers. The
    newest key rewritten as [1, 4] (same file, same summary) would so delete the victim's
    bucket [1, 1], 50 rows never delivered; the wider key's file is read first, and its header
    names other ledgers: nothing is deleted. (This guard is about the key, not the summary.)"""
    path = _store(templates, tmp_path, durability)
    build = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=40, max_num_buckets=-1)
    with bucketstore.open(path, durability, background=False) as store:
        t = store.tracker("t", build, FakeClock(NOW))
        t.add_messages([(4, e, FUTURE + e) for e in range(10)])
        t.add_message(5, 0, FUTURE)  # seals ledger 4
        t.flush()
    (newest,) = set(_keys(path)) - {bucket_key(0, 0), VICTIM}  # [4, 4] ([3, 4] in journal mode)
    env = lmdb.open(str(path / "catalog"), max_dbs=4, subdir=True)
    try:
        with env.begin(write=True) as txn:
            for name in (b"buckets", b"summaries"):
                db = env.open_db(name, txn=txn)
                value = txn.pop(b"t\x00" + newest.encode(), db=db)
                txn.put(b"t\x00" + bucket_key(1, 4).encode(), value, db=db)
    finally:
        env.close()
    before = sorted((path / "ledgers").iterdir())
    with bucketstore.open(path, durability, background=False) as store:
        with pytest.raises(LedgerIdentityError, match="holds ledgers"):
            store.tracker("t", CFG, FakeClock(NOW))
    assert sorted((path / "ledgers").iterdir()) == before
    assert set(_keys(path)) == {bucket_key(0, 0), VICTIM, bucket_key(1, 4)}


def test_a_merge_leftover_is_removed_once_the_wider_file_agrees(templates, tmp_path):
    """The case the enclosed-key rule is for: a source's key and file left beside the merged
    bucket that holds its rows. The merged file agrees with its key: the leftover goes."""
    path = _store(templates, tmp_path, "sealed")
    victim_file = path / "ledgers" / ledger_file_name(_keys(path)[VICTIM])
    saved_file = victim_file.read_bytes()
    with Catalog(str(path / "catalog"), readonly=True) as catalog:
        saved_summary = catalog.keys_and_summaries("t")[1][VICTIM]
    merging = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=40,
                            max_num_buckets=1)
    with bucketstore.open(path, "sealed", background=False) as store:
        t = store.tracker("t", merging, FakeClock(NOW))
        t.add_messages([(4, e, FUTURE + e) for e in range(10)])
        t.add_message(5, 0, FUTURE)  # seals ledger 4: three buckets, a merge
        t.flush()
        buckets = t.stats()["immutable_buckets"]
    assert buckets < 3 and VICTIM not in _keys(path) and not victim_file.exists()
    victim_file.write_bytes(saved_file)
    env = lmdb.open(str(path / "catalog"), max_dbs=4, subdir=True)
    try:
        with env.begin(write=True) as txn:
            name = b"t\x00" + VICTIM.encode()
            txn.put(name, str(int(victim_file.stem)).encode(), db=env.open_db(b"buckets", txn=txn))
            txn.put(name, saved_summary, db=env.open_db(b"summaries", txn=txn))
    finally:
        env.close()
    with bucketstore.open(path, "sealed", background=False) as store:
        t = store.tracker("t", CFG, FakeClock(NOW))
        assert t.recovery_report["enclosed_removed"] == 1 and t.recovery_report["unopened"] == buckets
        assert t.number_of_delayed_messages == 70 and all(t.contains_message(*p) for p in VICTIM_ROWS)
    assert not victim_file.exists() and VICTIM not in _keys(path)
