"""``bucketstore.open(path, read_only=True)``: looking changes nothing, and sees what a writer would.

The reference for every answer is a writable open of a copy of the same bytes
(what a restart, or a crash at that moment, would recover), with the same clock.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import lmdb
import pytest

import bucketstore
from bucketstore import CatalogError, ReadOnlyError, StaleSnapshotError, StoreClosedError, TrackerConfig
from bucketstore.engine.durability.journal import journal_directory

from helpers import FakeClock, as_format1_catalog
from repo_paths import SUPPORT

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=20, max_indexes_per_segment=7,
                    max_time_step_per_segment_ms=400)
WRITER = str(SUPPORT / "live_writer.py")
#: live_writer.py's configuration (a writable twin must recover with the same one).
LIVE_CFG = TrackerConfig(min_index_count_per_bucket=20, max_indexes_per_segment=8,
                         max_time_step_per_segment_ms=500, max_num_buckets=3, tick_time_ms=0)


def _fill(path: str, durability: str, *, deliver: int = 40, ack: tuple[int, int] | None = (1, 12),
          tail: int = 15) -> FakeClock:
    """A store of several sealed buckets of several segments, some delivered, an
    acknowledgement that cuts a bucket, and (journal mode) indexes held only in the journal."""
    clock = FakeClock(1_000)
    with bucketstore.open(path, durability=durability) as store:
        t = store.tracker("t", config=CFG, clock=clock)
        for ledger in range(8):
            t.add_messages([(ledger, e, 2_000 + (e * 37 + ledger * 11) % 3_000) for e in range(30)])
        t.add_messages([(8, e, 2_500 + e * 7) for e in range(tail)])  # the mutable bucket's
        t.wait_for_maintenance()
        clock.now = 2_600
        t.get_scheduled_messages(deliver)
        if ack is not None:
            t.mark_delete(*ack)
        if durability == "journal":
            t.flush()
    return clock


def _fingerprint(root: str) -> dict[str, tuple]:
    """Every file's bytes and mtime and every directory's listing and mtime, by relative path."""
    seen: dict[str, tuple] = {}
    for here, dirs, files in os.walk(root):
        st = os.stat(here)
        seen[os.path.relpath(here, root) + "/"] = (sorted(dirs), sorted(files), st.st_mtime_ns)
        for name in files:
            path = os.path.join(here, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                seen[os.path.relpath(path, root)] = (hashlib.sha256(f.read()).hexdigest(), st.st_mtime_ns, st.st_size)
    return seen


def _look(path: str, clock) -> dict:
    """Everything a read-only handle answers, twice (asking must not change the answers)."""
    answers = []
    for _ in range(2):
        with bucketstore.open(path, read_only=True) as store:
            seen = {"trackers": store.trackers(), "stats": store.stats()}
            for name in store.trackers():
                t = store.tracker(name, clock=clock)
                seen[name] = (t.number_of_delayed_messages, t.next_delivery_time(), t.has_message_available(),
                              t.peek_scheduled(25), t.peek_scheduled(25), t.stats()["skipped_due_indexes"])
            answers.append(seen)
    assert answers[0] == answers[1]
    return answers[0]


# -- stores a writable open would change -------------------------------------------------------
def _orphans_and_leftovers(path: str) -> None:
    """Unreferenced ledger files (a key removed by hand: a crash between a delete's commit
    and its unlink looks the same) and a seal's leftover ``*.ledger.tmp``."""
    env = lmdb.open(os.path.join(path, "catalog"), max_dbs=4, subdir=True)
    try:
        with env.begin(write=True) as txn:
            buckets, summaries = env.open_db(b"buckets", txn=txn), env.open_db(b"summaries", txn=txn)
            key = next(iter(txn.cursor(db=buckets)))[0]
            txn.delete(key, db=buckets)
            txn.delete(key, db=summaries)
    finally:
        env.close()
    with open(os.path.join(path, "ledgers", "00000000000000009999.ledger.tmp"), "wb") as f:
        f.write(b"half a seal")


def _torn_journal_tail(path: str) -> None:
    """A group frame whose body never reached the disk: replay cuts it off."""
    directory = journal_directory(path, "t")
    last = sorted(n for n in os.listdir(directory) if n.endswith(".journal"))[-1]
    with open(os.path.join(directory, last), "ab") as f:
        f.write(struct.pack("<II", 1000, 12345) + b"\x01" * 10)


def _no_lock_mdb(path: str) -> None:
    os.unlink(os.path.join(path, "catalog", "lock.mdb"))


STORES = {
    # name: (durability, what to do to the closed store, the clock of the look)
    "journal": ("journal", None, 2_700),
    "journal-torn-tail": ("journal", _torn_journal_tail, 2_700),
    "sealed-due-buckets": ("sealed", None, 10_000),  # every segment due: a writable open skips them all
    "sealed-orphans": ("sealed", _orphans_and_leftovers, 2_700),
    "sealed-format-1": ("sealed", as_format1_catalog, 2_700),  # a writable open backfills the summaries
    "journal-no-lock-mdb": ("journal", _no_lock_mdb, 2_700),
}


@pytest.mark.parametrize("kind", sorted(STORES))
def test_looking_changes_no_byte_no_mtime_no_listing(tmp_path, kind):
    durability, damage, now = STORES[kind]
    path = str(tmp_path / "store")
    _fill(path, durability)
    if damage is not None:
        damage(path)
    twin = str(tmp_path / "twin")
    shutil.copytree(path, twin)
    before = _fingerprint(path)
    seen = _look(path, FakeClock(now))
    assert _fingerprint(path) == before, "a read-only open changed the store"
    # The fixture is one a writable open does change (else the check above proves nothing).
    if kind != "sealed-due-buckets":  # (whether opening deletes due buckets is sealed mode's policy)
        reference = _fingerprint(twin)
        with bucketstore.open(twin, durability=durability) as store:
            store.tracker("t", config=CFG, clock=FakeClock(now))
        assert _fingerprint(twin) != reference
    assert seen["trackers"] == ["t"] and seen["stats"]["read_only"] is True


def test_a_journal_replay_that_would_seal_seals_nothing(tmp_path):
    """Opened with a smaller bucket size than it was written with, a writable open's replay
    seals the journal's indexes into ledger files; a read-only one keeps them in memory."""
    path = str(tmp_path / "store")
    clock = FakeClock(1_000)
    with bucketstore.open(path, durability="journal") as store:
        t = store.tracker("t", config=TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10_000), clock=clock)
        for ledger in range(6):
            t.add_messages([(ledger, e, 5_000 + e) for e in range(30)])
    before = _fingerprint(path)
    with bucketstore.open(path, read_only=True) as ro:
        t = ro.tracker("t", config=CFG, clock=clock)
        assert t.number_of_delayed_messages == 180 and t.stats()["immutable_buckets"] == 0
        assert t.peek_scheduled(3) == [] and t.next_delivery_time() == 5_000
    assert _fingerprint(path) == before
    with bucketstore.open(path, durability="journal", background=False) as rw:
        assert rw.tracker("t", config=CFG, clock=clock).stats()["immutable_buckets"] >= 1  # the twin seals


@pytest.mark.parametrize("durability", ["journal", "sealed"])
@pytest.mark.parametrize("now", [2_600, 3_500, 10_000])
def test_answers_equal_a_writable_open_of_a_copy(tmp_path, durability, now):
    path = str(tmp_path / "store")
    _fill(path, durability)
    clock = FakeClock(now)
    for n in (1, 7, 60, 1_000):
        twin = str(tmp_path / f"twin-{n}")
        shutil.copytree(path, twin)
        with bucketstore.open(path, read_only=True) as ro, bucketstore.open(twin, durability=durability) as rw:
            r, w = ro.tracker("t", clock=clock), rw.tracker("t", config=CFG, clock=clock)
            assert r.number_of_delayed_messages == w.number_of_delayed_messages
            assert r.next_delivery_time() == w.next_delivery_time()
            assert r.has_message_available() == w.has_message_available()
            assert all(r.contains_message(ledger, e) == w.contains_message(ledger, e)
                       for ledger in range(10) for e in range(31))
            peeked = r.peek_scheduled(n)
            assert peeked == r.peek_scheduled(n)  # looking delivers nothing
            assert peeked == w.get_scheduled_messages(n)
            assert r.number_of_delayed_messages == w.number_of_delayed_messages + len(peeked)
            stats = r.stats()
            assert stats["read_only"] is True
            if durability == "journal":
                assert stats["immutable_buckets"] >= 1
                assert stats["skipped_due_indexes"] == 0  # journal mode skips only what was delivered


def test_sealed_mode_reports_what_the_files_hold_but_recovery_skips(tmp_path):
    """Due segments are left out of the view (a writable open skips them: PIP-195), and
    stats() says how many indexes the files still hold for that reason."""
    path = str(tmp_path / "store")
    _fill(path, "sealed", deliver=0, ack=None)
    with bucketstore.open(path, read_only=True) as ro:
        early = ro.tracker("t", clock=FakeClock(1_500))
        held = early.number_of_delayed_messages
        assert early.stats()["skipped_due_indexes"] == 0
    with bucketstore.open(path, read_only=True) as ro:
        late = ro.tracker("t", clock=FakeClock(100_000))
        assert late.number_of_delayed_messages == 0 and late.peek_scheduled(10) == []
        assert late.stats()["skipped_due_indexes"] == held


def test_every_change_is_refused_and_close_works(tmp_path):
    path = str(tmp_path / "store")
    _fill(path, "journal")
    before = _fingerprint(path)
    store = bucketstore.open(path, read_only=True)
    t = store.tracker("t", clock=FakeClock(2_700))
    count = t.number_of_delayed_messages
    changes = [lambda: t.add_message(50, 1, 9_000), lambda: t.add_messages([(50, 1, 9_000)]),
               lambda: t.get_scheduled_messages(5), lambda: t.wait_scheduled(5, timeout=0),
               lambda: t.mark_delete(3, 3), lambda: t.clear(), lambda: t.replay_done(), lambda: t.flush(),
               lambda: t.confirm_delivered(),
               lambda: store.delete_tracker("t"), lambda: store.tracker("new")]
    for change in changes:
        with pytest.raises(ReadOnlyError, match="read_only|creates nothing"):
            change()
    assert issubclass(ReadOnlyError, bucketstore.BucketStoreError)
    assert t.number_of_delayed_messages == count
    assert t.wait_for_maintenance() is True
    store.close()
    with pytest.raises(StoreClosedError):
        t.peek_scheduled(1)
    with pytest.raises(StoreClosedError):
        store.tracker("t")
    store.close()  # idempotent
    assert _fingerprint(path) == before


def test_a_missing_store_is_an_error_and_is_not_created(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(CatalogError, match="not a bucketstore store"):
        bucketstore.open(missing, read_only=True)
    assert not missing.exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    with pytest.raises(CatalogError, match="not a bucketstore store"):
        bucketstore.open(plain, read_only=True)
    assert sorted(os.listdir(plain)) == ["notes.txt"]
    with pytest.raises(CatalogError, match="not a bucketstore store"):
        bucketstore.open(plain / "notes.txt", read_only=True)
    with pytest.raises(ValueError, match="repair"):
        bucketstore.open(tmp_path / "store", read_only=True, repair=True)


def test_a_bucket_the_writer_retires_after_the_snapshot_is_a_typed_error(tmp_path):
    """Buckets are opened lazily: one deleted by a writer after the read-only snapshot was taken
    raises StaleSnapshotError when the view needs it; a file still named but missing is damage."""
    path = str(tmp_path / "store")
    _fill(path, "sealed", deliver=0, ack=None)
    clock = FakeClock(1_500)
    with bucketstore.open(path, read_only=True) as ro:
        t = ro.tracker("t", clock=clock)
        assert t.stats()["unopened_buckets"] >= 2
        with bucketstore.open(path, durability="sealed") as rw:  # no lock is held by the reader
            rw.tracker("t", config=CFG, clock=clock).mark_delete(6, 0)  # retires the buckets below ledger 6
        with pytest.raises(StaleSnapshotError, match="open the store read_only again") as info:
            t.contains_message(0, 3)
        assert info.value.path.endswith(".ledger")
        with pytest.raises(StaleSnapshotError):  # the view is incomplete now: no answer from the rest
            _ = t.number_of_delayed_messages
        t.close()
    with bucketstore.open(path, read_only=True) as ro:
        t = ro.tracker("t", clock=clock)
        assert not t.contains_message(0, 3)
        bucket = t.buckets()[-1]
        os.unlink(bucket.path)  # damage: the catalog still names it
        with pytest.raises(CatalogError, match="missing") as info:
            t.contains_message(bucket.end_ledger, 0)
        assert not isinstance(info.value, StaleSnapshotError)


def test_a_journal_tail_being_written_is_left_out(tmp_path):
    """A group whose frame is complete but whose body is still being written is not read
    (and not cut: it is the writer's)."""
    path = str(tmp_path / "store")
    clock = _fill(path, "journal", deliver=0, ack=None)
    with bucketstore.open(path, read_only=True) as ro:
        count = ro.tracker("t", clock=clock).number_of_delayed_messages
    _torn_journal_tail(path)
    with bucketstore.open(path, read_only=True) as ro:
        t = ro.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == count
        assert t.recovery_report["read_only"] is True


def _wait_until_stopped(pid: int) -> None:
    """Return once every thread of ``pid`` is stopped (state T in /proc), which SIGSTOP only requests."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def _inside_a_catalog_commit(store: str) -> bool:
    """Whether the (stopped) writer is inside an LMDB commit: its new meta page is written
    to ``data.mdb`` but not yet published in ``lock.mdb``.

    A reader beside the writer then sees the transaction before (LMDB hands readers the
    published id), while a fresh open of a copy picks the newest meta page: both are states
    a crash at that moment may recover (the commit has not returned; its meta may not be
    on disk yet), so the two recoveries may rightly differ, e.g. by the rows an in-flight
    mark-delete acknowledges.
    """
    env = lmdb.open(os.path.join(store, "catalog"), readonly=True, max_dbs=4, subdir=True)
    try:
        with env.begin() as txn:
            published = txn.id()
        return int(env.info()["last_txnid"]) != published  # info() reads the meta pages
    finally:
        env.close()


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_beside_a_live_writer(tmp_path, durability):
    """A writer process keeps sealing, merging, delivering and trimming, holding the LOCK.
    Read-only opens succeed all along (a retired bucket may only raise StaleSnapshotError);
    frozen (SIGSTOP) at any moment, the view equals a writable open of a copy of its bytes."""
    store = str(tmp_path / "store")
    writer = subprocess.Popen([sys.executable, WRITER, store, durability], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        with pytest.raises(bucketstore.StoreLockedError):
            bucketstore.open(store, durability=durability)
        # The writer's clock starts at 1,000,000 ms: the real clock makes everything due, so
        # journal mode shows every tracked index (and peeks the earliest), sealed mode none.
        looks = stale = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            with bucketstore.open(store, read_only=True) as ro:
                assert ro.stats()["writer_pid"] == str(writer.pid)
                for name in ("live-a", "live-b"):
                    t = ro.tracker(name)
                    try:
                        first = t.peek_scheduled(10)
                        assert first == t.peek_scheduled(10)
                        assert len(first) == min(10, t.number_of_delayed_messages)
                        assert t.has_message_available() == bool(first)
                    except StaleSnapshotError:
                        stale += 1
                    looks += 1
        assert writer.poll() is None, f"the writer died: {writer.stderr.read()}"
        assert looks >= 4 and stale < looks
        compared = frozen = 0
        mid_commit = False
        while compared < 3:
            if mid_commit:
                time.sleep(0.02)  # let the writer finish that commit
            frozen += 1
            assert frozen <= 30, "the writer was inside a catalog commit at every freeze"
            writer.send_signal(signal.SIGSTOP)
            try:
                _wait_until_stopped(writer.pid)  # the signal is delivered asynchronously
                mid_commit = _inside_a_catalog_commit(store)
                if mid_commit:
                    continue  # two right answers at this moment (see the helper): freeze again
                compared += 1
                twin = str(tmp_path / f"twin-{frozen}")
                shutil.copytree(store, twin)
                with bucketstore.open(store, read_only=True) as ro:
                    seen = {name: (t.number_of_delayed_messages, t.peek_scheduled(30), t.next_delivery_time())
                            for name in ("live-a", "live-b") for t in [ro.tracker(name)]}
                    assert all(t.recovery_report["snapshot"] == "one" for t in ro.open_trackers())
            finally:
                writer.send_signal(signal.SIGCONT)
            os.unlink(os.path.join(twin, "LOCK"))  # the copy's lock file records the writer's pid
            with bucketstore.open(twin, durability=durability) as rw:
                for name, (count, peeked, nxt) in seen.items():
                    w = rw.tracker(name, config=LIVE_CFG)
                    assert (w.number_of_delayed_messages, w.next_delivery_time()) == (count, nxt), name
                    assert w.get_scheduled_messages(30) == peeked, name
            time.sleep(0.2)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()


ROUNDS = int(os.environ.get("BUCKETSTORE_READ_ONLY_ROUNDS", "6"))


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_random_histories_peek_what_a_writable_copy_delivers(tmp_path, seed):
    """Random adds (ties of timestamps, re-adds at new times, expired re-adds, old ledgers),
    deliveries and acknowledgements; then the read-only view of the closed store against a
    writable open of a copy, at several clocks and batch sizes."""
    import random
    rng = random.Random(seed)
    durability = ("journal", "sealed")[seed % 2]
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=rng.choice([8, 20]),
                           max_indexes_per_segment=rng.choice([3, 5]), precision_bits=rng.choice([0, 0, 3]),
                           max_num_buckets=rng.choice([-1, 3]))
    path = str(tmp_path / "store")
    clock = FakeClock(1_000)
    ledger = 0
    with bucketstore.open(path, durability=durability, background=False) as store:
        t = store.tracker("t", config=config, clock=clock)
        for _ in range(rng.randrange(20, 50)):
            op = rng.random()
            if op < 0.6:
                ledger += rng.random() < 0.5
                rows = [(max(0, ledger - rng.choice([0, 0, 0, 1, 3])), rng.randrange(12),
                         clock.now + rng.choice([-5, 10, 10, 40, 40, 40, 200])) for _ in range(rng.randrange(1, 12))]
                t.add_messages(rows)
            elif op < 0.85:
                t.get_scheduled_messages(rng.randrange(1, 15))
            elif op < 0.92 and ledger > 2:
                t.mark_delete(ledger - 2, rng.randrange(12))
            else:
                clock.advance(rng.choice([5, 30, 100]))
        if durability == "journal":
            t.flush()
    for now in (clock.now, clock.now + 40, clock.now + 1_000):
        for n in (1, 4, 50):
            twin = str(tmp_path / f"twin-{now}-{n}")
            shutil.copytree(path, twin)
            look = FakeClock(now)
            with bucketstore.open(path, read_only=True) as ro, bucketstore.open(twin, durability=durability) as rw:
                r, w = ro.tracker("t", clock=look), rw.tracker("t", config=config, clock=look)
                assert r.number_of_delayed_messages == w.number_of_delayed_messages
                peeked = r.peek_scheduled(n)
                assert peeked == w.get_scheduled_messages(n), (now, n)
                assert r.peek_scheduled(n) == peeked


def test_the_spark_reader_plans_a_store_without_writing_to_it(tmp_path):
    """The Spark reader reads the catalog as a read-only open does: no lock.mdb slot, none created."""
    pytest.importorskip("pyarrow")
    from bucketstore.spark.scan import plan_scan
    path = str(tmp_path / "store")
    _fill(path, "journal")
    _no_lock_mdb(path)
    before = _fingerprint(path)
    parts = plan_scan(path)
    assert parts and _fingerprint(path) == before


def test_beside_a_writer_in_the_same_process(tmp_path):
    """LMDB allows one open of an environment per process: a read-only open beside a writable
    store of this process reads the catalog through that store's environment."""
    path = str(tmp_path / "store")
    _fill(path, "journal", deliver=0, ack=None)
    clock = FakeClock(1_500)
    with bucketstore.open(path, durability="journal") as rw:
        w = rw.tracker("t", config=CFG, clock=clock)
        w.add_messages([(9, e, 4_000 + e) for e in range(5)])
        with bucketstore.open(path, read_only=True) as ro:
            assert ro.stats()["writer_pid"] == str(os.getpid())
            r = ro.tracker("t", clock=clock)
            assert r.number_of_delayed_messages == w.number_of_delayed_messages
            assert r.contains_message(9, 4) and r.recovery_report["snapshot"] == "one"
            w.mark_delete(6, 0)  # retires the buckets below ledger 6 while the reader looks
            with pytest.raises(StaleSnapshotError):
                r.contains_message(0, 3)
        with bucketstore.open(path, read_only=True) as ro:
            assert ro.tracker("t", clock=clock).number_of_delayed_messages == w.number_of_delayed_messages
