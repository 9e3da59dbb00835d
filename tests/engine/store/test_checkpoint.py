"""Online checkpoints (issue 24, item 8): ``store.checkpoint(dest)`` and ``bucketstore checkpoint``.

* a quiet store, sealed buckets and journal: the copy reopens with the same contents
  (counts, ``contains_message``, the whole drain);
* the writer's steps that race a copy, made to happen exactly between the journal's
  first image and the catalog copy (a seal that moves rows from the journal into a new
  bucket, the deletion of a bucket read to its end whose last batch is not confirmed):
  nothing is lost, nothing is counted twice;
* beside a real writer process adding, sealing, merging, delivering and trimming
  without pause, repeated: every copy opens and holds every add acknowledged before it
  started (by the writer's fsynced side log) that was not delivered with a
  confirmation under way or acknowledged, and nothing that was never added;
* hard links on one file system, copies across devices; a bad destination is a
  ``ValueError`` (exit 2 from the CLI) and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bucketstore
from bucketstore.engine.store.checkpoint import make_checkpoint
from crash_writer import JOURNAL_CONFIG, NAME, fork_child, run_journal_writer
from helpers import FakeClock

#: One bucket per ledger or two, never merged: the steps below count buckets (the live writer merges).
CONFIG = bucketstore.TrackerConfig(min_index_count_per_bucket=20, max_indexes_per_segment=8,
                                   max_time_step_per_segment_ms=500, tick_time_ms=0)
FAR = 10**12
CHECKPOINTS = int(os.environ.get("BUCKETSTORE_CHECKPOINTS", "6"))
KILLS = int(os.environ.get("BUCKETSTORE_CHECKPOINT_KILLS", "12"))


def _fill(tracker, ledgers: range, base: int = 10_000) -> None:
    for ledger in ledgers:
        tracker.add_messages([(ledger, e, base + (e * 37 + ledger * 11) % 4_000) for e in range(24)])


def _contents(path: Path, durability: str, name: str = "t") -> tuple[int, list[bool], list[tuple[int, int]]]:
    """Count, membership of every position ever added, and the whole drain, of a closed store
    (which the drain empties)."""
    clock = FakeClock(5_000)
    with bucketstore.open(path, durability=durability, background=False) as store:
        tracker = store.tracker(name, config=CONFIG, clock=clock)
        count = tracker.number_of_delayed_messages
        member = [tracker.contains_message(ledger, e) for ledger in range(1, 40) for e in range(24)]
        clock.now = FAR
        drained: list[tuple[int, int]] = []
        while batch := tracker.get_scheduled_messages(1_000):
            drained += batch
    return count, member, drained


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below ``root`` with its size and mtime, but LMDB's reader table (``lock.mdb``),
    where every reader of the catalog registers."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.name != "lock.mdb"}


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_quiet_store_reopens_with_the_same_contents(tmp_path: Path, durability: str) -> None:
    src = tmp_path / "src"
    clock = FakeClock(5_000)
    with bucketstore.open(src, durability=durability, background=False) as store:
        tracker = store.tracker("t", config=CONFIG, clock=clock)
        _fill(tracker, range(1, 30))
        tracker.mark_delete(3, 5)
        assert tracker.stats()["immutable_buckets"] >= 1  # sealed buckets, and (journal) memory rows
        if durability == "journal":
            clock.now = 11_000
            assert tracker.get_scheduled_messages(30)  # delivered, then confirmed by flush
            tracker.flush()
        report = store.checkpoint(tmp_path / "online")
    assert report.ledger_files >= 1 and report.trackers == ["t"]
    assert (report.journal_files > 0) == (durability == "journal")
    before = _tree(src)
    offline = subprocess.run([sys.executable, "-m", "bucketstore", "checkpoint", str(src), str(tmp_path / "cli")],
                             capture_output=True, text=True, timeout=120)
    assert offline.returncode == 0 and "hard-linked" in offline.stdout, offline.stderr
    assert _tree(src) == before  # nothing written into the source
    expected = _contents(src, durability)
    assert expected[0] > 0 and expected[2]
    assert _contents(tmp_path / "online", durability) == expected
    assert _contents(tmp_path / "cli", durability) == expected


class _Between:
    """The writer's catalog, with one writer step run just before the checkpoint copies it:
    after the journals' first image, before the catalog's transaction."""

    def __init__(self, store: bucketstore.Store, step) -> None:
        self.store, self.step = store, step

    def copy_to(self, dest: str):
        self.step()
        self.step = lambda: None
        return self.store.catalog.copy_to(dest)


def _journal_store(path: Path) -> tuple[bucketstore.Store, object, FakeClock]:
    clock = FakeClock(5_000)
    store = bucketstore.open(path, durability="journal", background=False, confirm_sync_ms=0)
    return store, store.tracker("t", config=CONFIG, clock=clock), clock


def test_a_seal_between_the_journal_and_the_catalog_loses_nothing_and_counts_nothing_twice(tmp_path: Path) -> None:
    store, tracker, _ = _journal_store(tmp_path / "src")
    # Rows of ledger 4 live only in the journal; ledger 5 rolls the mutable bucket: the seal
    # commits its key, then the journal's checkpoint drops those rows from the journal.
    _fill(tracker, range(1, 5))
    before = tracker.stats()["immutable_buckets"]
    report = make_checkpoint(store.path, tmp_path / "cp", catalog=_Between(store, lambda: _fill(tracker, range(5, 6))))
    assert tracker.stats()["immutable_buckets"] > before, "the step did not seal"
    count = tracker.number_of_delayed_messages
    store.close()
    assert report.ledger_files == before + 1
    held, _, drained = _contents(tmp_path / "cp", "journal")
    # The journal's first image is from before the seal, the catalog from after it: ledger 4
    # is both in the journal and in a bucket, and counted once. (The catalog first would
    # have lost it: in neither.) Ledger 5, journaled after the seal, is in the second image.
    assert held == count == len(drained) == len(set(drained)) == 5 * 24


def test_a_bucket_read_to_its_end_with_its_batch_unconfirmed_is_not_lost(tmp_path: Path) -> None:
    store, tracker, clock = _journal_store(tmp_path / "src")
    _fill(tracker, range(1, 6), base=6_000)
    assert tracker.stats()["immutable_buckets"] >= 1
    clock.now = FAR
    first = tracker.get_scheduled_messages(10)
    unconfirmed: list[tuple[int, int]] = []

    def drain_the_rest() -> None:
        # Confirms `first`, hands on the rest: buckets read to their end are deleted, their
        # unconfirmed rows journaled first (the one journal-then-catalog step of the writer).
        unconfirmed.extend(tracker.get_scheduled_messages(10_000))

    buckets = tracker.stats()["immutable_buckets"]
    make_checkpoint(store.path, tmp_path / "cp", catalog=_Between(store, drain_the_rest))
    assert tracker.stats()["immutable_buckets"] < buckets, "no bucket was read to its end"
    store._trackers["t"]._journal.close()  # a crash: the last batch is never confirmed
    store._trackers.clear()
    store.close()
    assert first and unconfirmed
    count, _, drained = _contents(tmp_path / "cp", "journal")
    # A crash at that moment would deliver the unconfirmed batch again: so must the copy.
    assert sorted(drained) == sorted(unconfirmed) and count == len(unconfirmed)


def _records(data: bytes) -> list[dict]:
    out = []
    for line in data.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a record cut by the size snapshot: its call had not started
    return out


def _must_hold(start: list[dict], end: list[dict]) -> set[tuple[int, int]]:
    """Adds acknowledged before the checkpoint started, less what the writer may legitimately
    have let go before it ended: batches whose confirming call had begun, and acknowledged
    positions (mark-delete)."""
    acked: set[tuple[int, int]] = set()
    pending: list = []
    for r in start:
        if "add" in r:
            pending = r["add"]
        elif "added" in r:
            acked |= {(l, e) for l, e, _ in pending}
    confirming = {n for r in end if "confirming" in r for n in r["confirming"]}
    gone = {(l, e) for r in end if "got" in r and r["batch"] in confirming for l, e in r["got"]}
    acks = [tuple(r["ack"]) for r in end if "ack" in r]
    mark = max(acks) if acks else (-1, -1)
    return {p for p in acked - gone if p > mark}


def test_checkpoints_beside_a_live_writer_hold_every_acknowledged_add(tmp_path: Path) -> None:
    store_path, log_path = tmp_path / "store", tmp_path / "side.log"
    pid, ready = fork_child(lambda *a, ready: run_journal_writer(*a, ready=ready, background=True), store_path,
                       log_path, 7)
    try:
        assert os.read(ready, 1) == b"r"
        os.close(ready)
        time.sleep(0.3)  # buckets sealed, merged and deleted already
        checked = 0
        for i in range(CHECKPOINTS):
            start = log_path.read_bytes()
            dest = tmp_path / f"cp{i}"
            if i == 0:  # the command line once, as an operator runs it
                run = subprocess.run([sys.executable, "-m", "bucketstore", "checkpoint", str(store_path), str(dest)],
                                     capture_output=True, text=True, timeout=120)
                assert run.returncode == 0, run.stderr
                check = subprocess.run([sys.executable, "-m", "bucketstore", "verify", str(dest)],
                                       capture_output=True, text=True, timeout=120)
                assert check.returncode == 0 and check.stdout.rstrip().endswith("ok"), check.stdout + check.stderr
            elif i == 1:  # once from a read-only handle, as an embedder's backup job takes it
                with bucketstore.open(store_path, read_only=True) as looking:
                    report = looking.checkpoint(dest)
                assert report.ledger_files == report.linked
            else:
                report = make_checkpoint(store_path, dest)
                assert report.copied == 0 and report.linked == report.ledger_files  # one file system
            end = log_path.read_bytes()
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the writer died"
            must = _must_hold(_records(start), _records(end))
            with bucketstore.open(dest, durability="journal", background=False) as copy:
                tracker = copy.tracker(NAME, JOURNAL_CONFIG, FakeClock(FAR))
                missing = sorted(p for p in must if not tracker.contains_message(*p))
                drained = []
                while batch := tracker.get_scheduled_messages(10_000):
                    drained += batch
            assert not missing, f"checkpoint {i} lost {len(missing)} acknowledged adds: {missing[:5]}"
            assert len(drained) == len(set(drained))
            checked += len(must)
            time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    announced = {(l, e) for r in _records(log_path.read_bytes()) if "add" in r for l, e, _ in r["add"]}
    for i in range(CHECKPOINTS):  # nothing that was never added (phantoms), in any copy
        with bucketstore.open(tmp_path / f"cp{i}", durability="journal", background=False) as copy:
            tracker = copy.tracker(NAME, JOURNAL_CONFIG, FakeClock(FAR))
            while batch := tracker.get_scheduled_messages(10_000):
                assert set(batch) <= announced
    assert checked > 100, "the checkpoints ran before the writer had acknowledged much"


def _store_with_buckets(path: Path) -> bucketstore.Store:
    store = bucketstore.open(path, durability="sealed", background=False)
    _fill(store.tracker("t", config=CONFIG, clock=FakeClock(5_000)), range(1, 12))
    return store


def test_ledger_files_are_hard_links_on_one_file_system(tmp_path: Path) -> None:
    with _store_with_buckets(tmp_path / "src") as store:
        report = store.checkpoint(tmp_path / "cp")
        sources = {f: os.stat(tmp_path / "src" / "ledgers" / f) for f in os.listdir(tmp_path / "src" / "ledgers")}
    copies = {f: os.stat(tmp_path / "cp" / "ledgers" / f) for f in os.listdir(tmp_path / "cp" / "ledgers")}
    assert copies and report.linked == len(copies) and report.copied == 0
    for name, st in copies.items():
        assert st.st_ino == sources[name].st_ino and st.st_nlink >= 2


def test_ledger_files_are_copied_across_devices(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to copy to")
    dest = shm / f"bucketstore-checkpoint-{os.getpid()}"
    try:
        with _store_with_buckets(tmp_path / "src") as store:
            report = store.checkpoint(dest)
        copies = os.listdir(dest / "ledgers")
        assert copies and report.copied == len(copies) and report.linked == 0 and report.copied_bytes > 0
        assert all(os.stat(dest / "ledgers" / f).st_nlink == 1 for f in copies)
        assert _contents(dest, "sealed") == _contents(tmp_path / "src", "sealed")
    finally:
        import shutil
        shutil.rmtree(dest, ignore_errors=True)


def test_a_bad_destination_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep")
    a_file = tmp_path / "a.txt"
    a_file.write_text("keep")
    empty = tmp_path / "empty"
    empty.mkdir()
    with _store_with_buckets(tmp_path / "src") as store:
        for bad in (full, a_file, tmp_path / "src" / "inside"):
            with pytest.raises(ValueError, match="checkpoint destination"):
                store.checkpoint(bad)
        store.checkpoint(empty)  # an empty directory is fine
    for bad in (full, a_file):
        run = subprocess.run([sys.executable, "-m", "bucketstore", "checkpoint", str(tmp_path / "src"), str(bad)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and run.stdout == "" and len(run.stderr.splitlines()) == 1, run.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "empty", "full", "src"]  # no temporary left
    assert os.listdir(full) == ["mine.txt"] and a_file.read_text() == "keep"
    assert not (tmp_path / "src" / "inside").exists()
    assert os.listdir(empty / "ledgers")


def test_adds_waiting_for_their_group_commit_are_in_an_in_process_checkpoint(tmp_path: Path) -> None:
    with bucketstore.open(tmp_path / "src", durability="journal", background=False, sync_interval_ms=60_000) as store:
        tracker = store.tracker("t", config=CONFIG, clock=FakeClock(5_000))
        tracker.add_message(1, 1, 9_000)  # returned; durable within the minute, or at flush()
        store.checkpoint(tmp_path / "cp")
        assert _contents(tmp_path / "cp", "journal")[0] == 1


def test_a_checkpoint_killed_midway_leaves_nothing_at_its_destination(tmp_path: Path) -> None:
    """SIGKILL a checkpointing process at random moments (copies across devices when there is a
    second file system: the slow case): the destination is absent or a whole store."""
    import random
    shm = Path("/dev/shm")
    parent = shm / f"bucketstore-kill-{os.getpid()}" if shm.is_dir() else tmp_path / "copies"
    with _store_with_buckets(tmp_path / "src") as store:
        _fill(store.tracker("t", config=CONFIG, clock=FakeClock(5_000)), range(12, 40))
    make_checkpoint(tmp_path / "src", tmp_path / "reference")
    expected = _contents(tmp_path / "reference", "sealed")  # draining is a change: never the source
    assert expected[0] == 38 * 24  # ledgers 1..38 sealed (sealed mode: the mutable 39th is not kept)
    rng = random.Random(24)
    outcomes = set()
    try:
        for i in range(KILLS):
            dest = parent / f"cp{i}"
            pid, ready = fork_child(lambda src, dst, ready: (os.write(ready, b"r"), make_checkpoint(src, dst)),
                               tmp_path / "src", dest)
            os.read(ready, 1)
            os.close(ready)
            time.sleep(rng.uniform(0, 0.02))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if dest.exists():
                outcomes.add("whole")
                assert _contents(dest, "sealed") == expected
            else:
                outcomes.add("absent")
                assert not any(parent.glob(f"cp{i}")), "no half store under the destination's name"
    finally:
        import shutil
        shutil.rmtree(parent, ignore_errors=True)
    print(f"\ncheckpoints killed at random: {sorted(outcomes)}")


def test_a_journal_started_over_during_the_copy_is_refused_not_mixed(tmp_path: Path) -> None:
    from bucketstore.engine.durability.journal import journal_directory
    from bucketstore.engine.durability.journal_copy import combine, read_journal

    with bucketstore.open(tmp_path / "a", durability="journal", background=False) as store:
        _fill(store.tracker("t", config=CONFIG, clock=FakeClock(5_000)), range(1, 2))
        first = read_journal(journal_directory(store.path, "t"))
        store.delete_tracker("t")
        _fill(store.tracker("t", config=CONFIG, clock=FakeClock(5_000)), range(7, 8))
        later = read_journal(journal_directory(store.path, "t"))
    assert first[-1].number == later[-1].number  # the same file name, another journal
    with pytest.raises(bucketstore.CheckpointError, match="run the checkpoint again"):
        combine(first, later)


class _Around:
    """The writer's catalog; around its first copy, a seal just before (a file the first
    directory listing missed) and a trim just after (which unlinks that file before it is pinned)."""

    def __init__(self, store: bucketstore.Store, before, after) -> None:
        self.store, self.before, self.after, self.copies = store, before, after, 0

    def copy_to(self, dest: str):
        self.copies += 1
        if self.copies > 1:
            return self.store.catalog.copy_to(dest)
        self.before()
        snapshot = self.store.catalog.copy_to(dest)
        self.after()
        return snapshot


def test_a_file_the_catalog_copy_names_but_the_writer_unlinked_takes_the_catalog_again(tmp_path: Path) -> None:
    store, tracker, _ = _journal_store(tmp_path / "src")
    _fill(tracker, range(1, 6))
    catalog = _Around(store, lambda: _fill(tracker, range(6, 7)), lambda: tracker.mark_delete(6, 0))
    report = make_checkpoint(store.path, tmp_path / "cp", catalog=catalog)
    count = tracker.number_of_delayed_messages
    store.close()
    assert report.catalog_copies == 2 and report.ledger_files == 0
    assert count == 23 and _contents(tmp_path / "cp", "journal")[0] == count
