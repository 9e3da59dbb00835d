"""Opening a store never deletes what no one received.

The default durability is ``journal``: an add the default store acknowledged survives a
restart. In ``sealed`` mode (Pulsar's) recovery skips the segments already due, because the
embedder replays its log; their buckets stay on disk until the embedder says its replay is
done (``replay_done``) or a mark-delete passes them. A clock stepped forward, a long stop, or
a newcomer who only looks at a store deletes nothing.
"""

from __future__ import annotations

import logging
import os
import time

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli.commands import main

from helpers import FakeClock

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4, max_num_buckets=100)


def _ledger_files(store_path) -> list[str]:
    return sorted(os.listdir(os.path.join(os.fspath(store_path), "ledgers")))


def _seal_buckets(path, clock: FakeClock, ledgers: int = 3, per_ledger: int = 12) -> int:
    """Seal one bucket per ledger (times 1_000 + 10 * entry); return how many indexes they hold."""
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        for ledger in range(ledgers + 1):
            for entry in range(per_ledger):
                t.add_message(ledger, entry, 1_000 + 10 * entry)
        assert len(t.buckets()) == ledgers
    return ledgers * per_ledger


def test_the_default_store_keeps_ten_adds_across_a_clean_close(tmp_path) -> None:
    far = int(time.time() * 1000) + 3_600_000
    with bucketstore.open(tmp_path / "s") as store:
        assert store.durability == "journal"
        t = store.tracker("t")
        for entry in range(10):
            assert t.add_message(7, entry, far + entry)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("t")
        assert t.number_of_delayed_messages == 10
        assert all(t.contains_message(7, entry) for entry in range(10))


def test_a_clock_stepped_forward_deletes_nothing_until_replay_done(tmp_path, caplog) -> None:
    path = tmp_path / "s"
    clock = FakeClock(0)
    sealed = _seal_buckets(path, clock)
    files = _ledger_files(path)
    clock.now = 10_000_000  # every sealed index is due: recovery skips them all
    for _ in range(2):  # a reopen before replay_done skips again, the same way
        with bucketstore.open(path, durability="sealed", background=False) as store, \
                caplog.at_level(logging.INFO, logger="bucketstore"):
            t = store.tracker("t", CFG, clock)
            assert any(f"recovery skipped {sealed} due indexes in 3 bucket(s)" in r.getMessage()
                       for r in caplog.records)
            assert t.number_of_delayed_messages == 0
            st = t.stats()
            assert (st["held_for_replay_buckets"], st["held_for_replay_indexes"]) == (3, sealed)
            assert t.recovery_report["deleted_due"] == 0
            assert t.get_scheduled_messages(100) == []
        assert _ledger_files(path) == files
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        with caplog.at_level(logging.INFO, logger="bucketstore"):
            t.replay_done()
        assert t.stats()["held_for_replay_buckets"] == 0
        assert not t.buckets()
    assert _ledger_files(path) == []
    logged = [r.getMessage() for r in caplog.records if "deleting bucket" in r.getMessage()]
    assert len(logged) == 3 and all("rows skipped at open" in m and ".ledger" in m for m in logged), logged


def test_metrics_show_what_is_held_for_replay(tmp_path) -> None:
    path = tmp_path / "s"
    clock = FakeClock(0)
    sealed = _seal_buckets(path, clock)
    clock.now = 10_000_000
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        held = {k: v for k, v in bucketstore.metrics.collect(store)["trackers"]["t"].items() if "held" in k}
        assert held == {"held_for_replay_buckets": 3, "held_for_replay_indexes": sealed}
        text = bucketstore.metrics.prometheus_text(store)
        assert 'bucketstore_tracker_held_for_replay_buckets{tracker="t"} 3\n' in text
        assert f'bucketstore_tracker_held_for_replay_indexes{{tracker="t"}} {sealed}\n' in text
        t.replay_done()
        text = bucketstore.metrics.prometheus_text(store)
        assert 'bucketstore_tracker_held_for_replay_buckets{tracker="t"} 0\n' in text


def test_a_mark_delete_past_held_buckets_deletes_them(tmp_path, caplog) -> None:
    path = tmp_path / "s"
    clock = FakeClock(0)
    _seal_buckets(path, clock)
    clock.now = 10_000_000
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        with caplog.at_level(logging.INFO, logger="bucketstore"):
            t.mark_delete(2, 0)  # passes the buckets of ledgers 0 and 1, cuts through ledger 2's
        assert t.stats()["held_for_replay_buckets"] == 1
    assert len(_ledger_files(path)) == 1
    logged = [r.getMessage() for r in caplog.records if "mark-delete" in r.getMessage()]
    assert len(logged) == 2 and all("rows skipped at open" in m for m in logged), logged


def test_a_partly_skipped_bucket_is_kept_when_drained_until_replay_done(tmp_path) -> None:
    path = tmp_path / "s"
    clock = FakeClock(0)
    _seal_buckets(path, clock, ledgers=1)  # one bucket: 3 segments of times 1_000..1_110
    clock.now = 1_045  # its first segment (1_000..1_030) is due: skipped, the others are not
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        assert t.stats()["held_for_replay_indexes"] == 4
        assert t.number_of_delayed_messages == 8
        clock.now = 5_000
        assert len(t.get_scheduled_messages(100)) == 8  # the remaining segments, delivered
        assert t.number_of_delayed_messages == 0
        assert len(t.buckets()) == 1 and len(_ledger_files(path)) == 1  # drained, but held
        t.replay_done()
        assert not t.buckets()
    assert _ledger_files(path) == []


def test_a_bucket_drained_after_replay_done_goes_as_usual(tmp_path) -> None:
    path = tmp_path / "s"
    clock = FakeClock(0)
    _seal_buckets(path, clock, ledgers=1)
    clock.now = 1_045
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        t.replay_done()  # the skipped segment's rows are the replay's now; the rest is delivered
        assert len(_ledger_files(path)) == 1
        clock.now = 5_000
        assert len(t.get_scheduled_messages(100)) == 8
    assert _ledger_files(path) == []


def test_the_readme_demo_store_opened_with_defaults_keeps_every_ledger_file(tmp_path, capsys) -> None:
    """``bucketstore simulate`` leaves a sealed-mode store; opening it from Python with the
    defaults and the real clock (years after the simulated one) deletes nothing."""
    path = tmp_path / "demo"
    assert main(["simulate", str(path), "--messages", "30000", "--rate", "4000", "--delay-window-ms", "60000",
                 "--entries-per-ledger", "1000", "--deliver-for-ms", "30000", "--no-progress"]) == 0
    report = capsys.readouterr().out
    files = _ledger_files(path)
    assert files
    kept = int(next(line for line in report.splitlines() if "in the store" in line).split()[3].replace(",", ""))
    assert kept > 0
    with bucketstore.open(path) as store:  # journal, the default: nothing in the store was delivered
        t = store.tracker("simulate")
        total = t.number_of_delayed_messages
        assert total >= kept
        assert t.has_message_available()  # everything is due by the real clock: deliverable
    assert _ledger_files(path) == files
    with bucketstore.open(path, durability="sealed") as store:  # Pulsar's mode: skipped, and held
        t = store.tracker("simulate")
        assert t.number_of_delayed_messages == 0
        # rows in the files: a position delivered from one bucket and replayed into a later one
        # is in both, and the journal-mode open above counted it once
        assert t.stats()["held_for_replay_indexes"] >= total > 0
    assert _ledger_files(path) == files


def test_a_bucket_holding_skipped_rows_is_not_merged(tmp_path) -> None:
    """A merge keeps only what the index tracks: the skipped rows would be lost with the sources."""
    path = tmp_path / "s"
    clock = FakeClock(0)
    _seal_buckets(path, clock)
    files = _ledger_files(path)
    clock.now = 1_045  # each bucket's first segment is skipped; the other two are still to come
    few = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4, max_num_buckets=2)
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", few, clock)
        assert t.stats()["held_for_replay_buckets"] == 3
        for ledger in (3, 4):  # seals a fourth bucket: too many, but none of the held ones may merge
            for entry in range(12):
                t.add_message(ledger, entry, 2_000 + entry)
        assert len(t.buckets()) == 4 and t.stats()["merge"]["succeeded"] == 0
        assert set(files) <= set(_ledger_files(path))
        t.replay_done()  # now they may: the next seal merges
        for entry in range(12):
            t.add_message(5, entry, 2_000 + entry)
        assert t.stats()["merge"]["succeeded"] >= 1


def test_what_an_open_deletes_is_logged_with_what_and_why(tmp_path, caplog) -> None:
    """A bucket a committed mark-delete passed (its delete cut by a crash) and an orphan file
    (its key gone, its unlink cut): both deleted at open, both logged with ledger, file and rows."""
    path = tmp_path / "s"
    clock = FakeClock(0)
    _seal_buckets(path, clock)
    with bucketstore.open(path, durability="sealed", background=False) as store:
        keys = store.catalog.buckets("t")
        first, second = sorted(keys, key=lambda k: keys[k])[:2]
        # What a crash leaves: the mark-delete state committed before its bucket's delete ran,
        # and a key removed whose file's unlink never happened.
        store.catalog.commit("t", state={"mark_delete": [1, 0]})
        store.catalog.commit("t", remove=[second])
    with caplog.at_level(logging.INFO, logger="bucketstore"):
        with bucketstore.open(path, durability="sealed", background=False) as store:
            store.tracker("t", CFG, clock)
    messages = [r.getMessage() for r in caplog.records]
    acked = [m for m in messages if f"deletes bucket {first}" in m]
    assert len(acked) == 1 and "acknowledged" in acked[0] and f"ledger {keys[first]}," in acked[0] \
        and "12 rows" in acked[0], messages
    orphan = [m for m in messages if "no catalog key names it" in m]
    assert len(orphan) == 1 and f"ledger {keys[second]}," in orphan[0] and "12 rows" in orphan[0], messages
    assert len(_ledger_files(path)) == 1


def test_every_tracker_takes_replay_done_and_keeps_what_it_tracks(make_tracker, clock) -> None:
    """The in-memory trackers hold nothing for a replay; the call is there so that an embedder
    calls every tracker the same way. On a journal store it holds nothing either."""
    t = make_tracker(CFG, clock)
    for entry in range(5):
        t.add_message(1, entry, clock.now + 100 + entry)
    t.replay_done()
    assert t.number_of_delayed_messages == 5
    clock.advance(1_000)
    assert t.get_scheduled_messages(10) == [(1, e) for e in range(5)]


def test_a_long_stop_of_a_default_store_deletes_nothing_undelivered(tmp_path) -> None:
    """Journal mode skips only what its confirmed frontier says was delivered: after a stop
    longer than every delay, every sealed index is still there, due, and delivered once."""
    path = tmp_path / "s"
    clock = FakeClock(0)
    with bucketstore.open(path, background=False) as store:
        t = store.tracker("t", CFG, clock)
        for ledger in range(4):
            for entry in range(12):
                t.add_message(ledger, entry, 1_000 + 10 * entry)
        clock.now = 1_015
        first = t.get_scheduled_messages(100)  # the first two times of each ledger
        t.confirm_delivered()
        assert len(first) == 8 and len(t.buckets()) == 3
    files = _ledger_files(path)
    clock.now = 10_000_000
    with bucketstore.open(path, background=False) as store:
        t = store.tracker("t", CFG, clock)
        assert t.recovery_report["deleted_due"] == 0 and _ledger_files(path) == files
        assert t.number_of_delayed_messages == 48 - 8
        got = t.get_scheduled_messages(100)
        assert len(got) == 40 and not set(got) & set(first)
