"""SIGKILL a process working on a topic with several subscriptions, then check every subscription.

The writer (a forked child, as in ``test_sigkill.py``) adds batches to a topic in journal mode
(``sync_interval_ms=0``): two subscriptions that keep up, one far behind (it rarely takes a
batch), and subscriptions created (``start="latest"``) and deleted as it goes; it confirms,
takes batches (which confirm the ones before) and acknowledges at random. Its side log records
each call's intent before it and its result after it. The child is killed at a random moment
and restarted on the same store; after each kill a copy of the store is opened and each
subscription drained, and held to the log:

* nothing lost: every index added (and tracked) after the subscription's creation, not
  acknowledged and not possibly confirmed, is delivered (in sealed mode: every one added
  before a ``flush()`` that returned);
* nothing confirmed comes back; nothing never added appears; a deleted subscription is gone.

In journal mode the adds wait in the topic's journal (formats/journal.md) until a seal's worth or
a call that reads moves them into the index: the journal runs count the adds each killed store
held only there (its reopen replays them), and the "journal" run asserts that some kill left
such adds.

A third run ("grouped") has deliveries and confirmations wait for the group commit
(``confirm_sync_ms=50``): a batch confirmed after the last call that surely committed (an add,
a subscription created or deleted, a flush) may come back or not, nothing is lost, and the run
asserts that some did come back (the window is real).

``BUCKETSTORE_KILLS`` sets the number of kills (default 8).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli.side_log import SideLog, read_side_log

from crash_writer import fork_child
from helpers import FakeClock

KILLS = int(os.environ.get("BUCKETSTORE_KILLS", "8"))
CONFIG = TrackerConfig(tick_time_ms=10)
FIXED = ("a", "b", "far")


def _open(path: Path):
    # The mode is in the store's directory name: both modes promise the same against a
    # process kill (a committed transaction is in the OS's cache), they differ on power loss.
    # "grouped": journal mode whose deliveries and confirmations wait for the group commit.
    durability = "sealed" if "/sealed/" in str(path) else "journal"
    grouped = "/grouped/" in str(path)
    return bucketstore.open(path, durability=durability, sync_interval_ms=0, confirm_sync_ms=50 if grouped else 0)


def topic_writer(path: Path, log_path: Path, seed: int, *, ready: int) -> None:
    records = read_side_log(log_path) if log_path.exists() else []
    rng = random.Random(seed)
    ledger = 1 + max([r["add"][0][0] for r in records if "add" in r and r["add"]], default=0)
    now = max([1_000] + [r["clock"] for r in records if "clock" in r])
    serial = 1 + max([int(r["creating"][1:]) for r in records if "creating" in r and r["creating"][0] == "d"],
                     default=0)
    log = SideLog(log_path)
    grouped = "/grouped/" in str(path)
    clock = FakeClock(now)
    with _open(path) as store:
        topic = store.topic("t", config=CONFIG, clock=clock)
        subs = {name: topic.subscription(name) for name in topic.subscriptions()}
        for name in FIXED:
            if name not in subs:
                log.write({"creating": name})
                subs[name] = topic.subscription(name)
        log.write({"start": seed})  # the batches not confirmed before are delivered again from here
        os.write(ready, b"r")
        while True:
            roll = rng.random()
            name = rng.choice(sorted(subs))
            if roll < 0.35:
                if grouped and rng.random() < 0.7:
                    continue  # an add commits every progress: fewer, so that kills land in windows
                rows = [[ledger, e, clock() + rng.randint(-20, 300)] for e in range(rng.randint(1, 8))]
                ledger += 1
                log.write({"add": rows})
                via = topic if rng.random() < 0.5 else subs[name]
                if len(rows) == 1:
                    via.add_message(*rows[0])
                else:
                    via.add_messages([tuple(r) for r in rows])
                log.write({"added": rows})
            elif roll < 0.55:
                clock.advance(rng.randint(1, 60))
                log.write({"clock": clock()})
            elif roll < 0.75:
                if name == "far" and rng.random() < 0.9:
                    continue
                log.write({"getting": name})
                got = subs[name].get_scheduled_messages(rng.randint(1, 12))
                log.write({"got": name, "rows": [list(p) for p in got]})
            elif roll < 0.78:
                topic.flush()  # sealed mode's "seal": the adds before it are durable
                log.write({"flushed": True})
            elif roll < 0.82:
                log.write({"confirming": name})
                subs[name].confirm_delivered()
                log.write({"confirmed": name})
            elif roll < 0.88 and ledger > 3:
                pos = [rng.randint(0, ledger - 3), rng.randint(0, 8)]
                log.write({"marking": name, "pos": pos})
                subs[name].mark_delete(*pos)
                log.write({"marked": name, "pos": pos})
            elif roll < 0.94:
                new = f"d{serial}"
                serial += 1
                log.write({"creating": new})
                subs[new] = topic.subscription(new, start="latest")
                log.write({"created": new})
            else:
                gone = [n for n in subs if n.startswith("d")]
                if gone:
                    victim = rng.choice(gone)
                    log.write({"deleting": victim})
                    del subs[victim]
                    topic.delete_subscription(victim)
                    log.write({"deleted": victim})


#: Records of calls whose return proves a transaction of the topic committed (journal mode; not
#: "marked": a mark-delete behind the last one writes nothing):
#: with it, every subscription's progress before it was written.
SURE_COMMITS = ("added", "created", "deleted", "flushed")


def check(path: Path, log_path: Path, sealed: bool, grouped: bool = False) -> tuple[int, int]:
    """(rows delivered at the check, rows among them confirmed after the last sure commit)."""
    records = read_side_log(log_path)
    # Sealed mode promises an add once flushed (Pulsar's: once its bucket is sealed; the
    # embedder replays the rest from its log); journal mode with sync_interval_ms=0 at its return.
    # A flush covers the adds before it in the same writer run (a kill loses the rest).
    durable, flushed = [False] * len(records), not sealed
    for i in range(len(records) - 1, -1, -1):
        if sealed and "start" in records[i]:
            flushed = False
        flushed = flushed or "flushed" in records[i]
        durable[i] = flushed
    now = max([1_000] + [r["clock"] for r in records if "clock" in r])
    intents = {}                                   # position -> index of the add's intent
    for i, r in enumerate(records):
        for lg, en, _ in r.get("add", []):
            intents[(lg, en)] = i
    with _open(path) as store:
        topic = store.topic("t", config=CONFIG, clock=FakeClock(now + 10_000_000))
        present = set(topic.subscriptions())
        created = {r["creating"]: i for i, r in reversed(list(enumerate(records))) if "creating" in r}
        for name in FIXED:
            created.setdefault(name, 0)
        deleted = {r["deleted"] for r in records if "deleted" in r}
        maybe_deleted = {r["deleting"] for r in records if "deleting" in r}
        assert not (present & deleted), present & deleted
        assert set(FIXED) <= present
        sure = {r["created"] for r in records if "created" in r}
        assert not (sure - maybe_deleted - present), f"subscriptions created and gone: {sure - maybe_deleted - present}"
        checked = back = 0
        for name in sorted(present):
            start = created[name]
            must: set[tuple[int, int]] = set()
            forbidden: set[tuple[int, int]] = set()
            maybe: set[tuple[int, int]] = set()      # delivered, then possibly confirmed
            pending: list[tuple[int, int]] = []      # the last batch returned, not yet confirmed
            # Grouped: batches confirmed since the last sure commit may come back, or not.
            unsure: set[tuple[int, int]] = set()
            acked = (-1, -1)
            clock = 1_000
            for i, r in enumerate(records):
                clock = r.get("clock", clock)
                if i < start:
                    continue
                if grouped and any(k in r for k in SURE_COMMITS):
                    forbidden.update(unsure)
                    unsure = set()
                confirmed_now = forbidden if not grouped else unsure
                if "start" in r:
                    pending = []  # a restart: the unconfirmed batch is to be delivered again
                    # Confirmed in the window before the kill: they came back in the run that
                    # starts here (its "got" records say so) or they are gone; either is right.
                    maybe.update(unsure)
                    unsure = set()
                elif "added" in r and durable[i]:
                    # An add due at its call (deliver_at at or before the cutoff) is never tracked.
                    must.update((lg, en) for lg, en, t in r["added"]
                                if (lg, en) > acked and t > clock + CONFIG.tick_time_ms)
                elif r.get("getting") == name or r.get("confirming") == name:
                    maybe.update(pending)
                elif r.get("got") == name:
                    confirmed_now.update(pending)
                    pending = [tuple(p) for p in r["rows"]]
                elif r.get("confirmed") == name:
                    confirmed_now.update(pending)
                    pending = []
                elif r.get("marking") == name:
                    acked = max(acked, tuple(r["pos"]))
            sub = topic.subscription(name)
            delivered = sub.get_scheduled_messages(10**6)
            assert len(delivered) == len(set(delivered))
            got = set(delivered)
            assert not (got & forbidden), (name, sorted(got & forbidden)[:5])
            assert all(p in intents and intents[p] > start for p in got), name
            lost = {p for p in must - got - forbidden - maybe - unsure if p > acked}
            assert not lost, (name, sorted(lost)[:5])
            checked += len(got)
            back += len(got & unsure)
        return checked, back


def journal_backlog(store: Path) -> int:
    """Adds of topic "t" that a killed store holds only in its journal: numbered at or after
    the index's count of adds it holds (``applied``), what its reopen replays."""
    import lmdb

    from bucketstore.engine.topics import topic_journal
    from bucketstore.engine.topics.topic_file import MAX_DBS
    from bucketstore.format.topic_codec import decode_topic
    env = lmdb.open(str(store / "topics"), readonly=True, lock=False, max_dbs=MAX_DBS)
    try:
        with env.begin(db=env.open_db(b"topics", create=False)) as txn:
            record = decode_topic(txn.get(b"t"))
    finally:
        env.close()
    return topic_journal.journal_backlog(str(store / "topics"), record["id"], record.get("applied", 0))


@pytest.mark.parametrize("durability", ["journal", "sealed", "grouped"])
def test_killed_topic_writer_loses_nothing_and_repeats_nothing_confirmed(tmp_path: Path, durability: str) -> None:
    tmp_path = tmp_path / durability
    tmp_path.mkdir()
    store, log_path = tmp_path / "store", tmp_path / "side.log"
    rng = random.Random(2532)
    delivered = came_back = replayed = 0
    k = 0
    # Whether a kill lands inside a window (grouped: a group commit's; journal: adds held only in
    # the topic's journal) is timing: kill on (up to four times as often) until one did, so that
    # the window's check below is never vacuous.
    while k < KILLS or (k < 4 * KILLS and ((durability == "grouped" and came_back == 0)
                                           or (durability == "journal" and replayed == 0))):
        pid, ready = fork_child(topic_writer, store, log_path, rng.randrange(1 << 30))
        got = os.read(ready, 1)
        os.close(ready)
        assert got, "the writer died before it was ready"
        time.sleep(rng.uniform(0.02, 0.3))
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the writer stopped on its own"
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        copy = tmp_path / f"copy{k}" / "store"
        shutil.copytree(store, copy)
        if durability != "sealed":
            replayed += journal_backlog(copy)
        got, back = check(copy, log_path, durability == "sealed", durability == "grouped")
        delivered, came_back = delivered + got, came_back + back
        shutil.rmtree(copy.parent)
        k += 1
    assert delivered > 0
    if durability != "sealed":
        print(f"{replayed} adds replayed from the topic journal after {k} kills")
    if durability == "journal":  # some kill left acknowledged adds only in the topic's journal
        # (grouped: a group commit with progress not synced syncs the index instead, so seldom)
        assert replayed > 0
    if durability == "grouped":  # the window is real: a confirmed batch came back
        print(f"{came_back} rows confirmed in the group-commit window came back after {k} kills")
        assert came_back > 0
