"""What a tracker records about how it was written, and what a reopen does with it.

* durability: a journal tracker is refused by a sealed store (its journal would be hidden,
  then contradicted), a sealed tracker opened in journal mode becomes a journal one, and
  journal files that are not the tracker's never come back;
* config: an open without ``config`` uses the recorded one, an explicit one is recorded;
* ``delete_tracker`` of a name the store does not hold raises ``KeyError``, like the topics' deletes.

Each reopen sequence is held to a model: the set of positions the tracker must hold.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

import bucketstore
from bucketstore import DurabilityMismatchError, TrackerConfig
from bucketstore.engine.catalog.catalog import Catalog
from bucketstore.engine.durability.journal import journal_directory, list_files
from bucketstore.engine.store.store import Store
from bucketstore.testing.faults import DAMAGES, FaultyFileSystem, SimulatedCrash, abandon_store

from helpers import FakeClock

CFG = TrackerConfig(min_index_count_per_bucket=10, tick_time_ms=0)
T0 = 100_000


def _rows(ledger: int, n: int = 10) -> list[tuple[int, int, int]]:
    return [(ledger, e, T0 + ledger * 1_000 + e) for e in range(n)]


def _drain(tracker: bucketstore.BucketTracker, clock: FakeClock) -> set[tuple[int, int]]:
    clock.now = T0 + 1_000_000
    out = set(tracker.get_scheduled_messages(10_000))
    tracker.confirm_delivered()
    return out


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under the store but LMDB's lock file, with its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "lock.mdb"}


def _state(path: Path, name: str) -> dict:
    with Catalog(path / "catalog") as catalog:
        return catalog.tracker_state(name) or {}


def test_a_journal_tracker_is_refused_in_sealed_mode_and_nothing_changes(tmp_path: Path) -> None:
    """Its journal-only rows would be invisible there, and what a sealed session then did
    (deliveries, seals) would be contradicted by the stale journal at the next journal open."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", CFG, clock)
        t.add_messages(_rows(1) + _rows(2))  # ledger 1 sealed (ledger 2 rolled it), ledger 2 journal-only
        assert t.stats()["immutable_buckets"] == 1
        clock.now = T0 + 1_004
        delivered = set(t.get_scheduled_messages(100))
        t.confirm_delivered()
    assert delivered == {(1, e) for e in range(5)}
    before = _tree(tmp_path)
    assert _state(tmp_path, "t")["durability"] == "journal"
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        with pytest.raises(DurabilityMismatchError, match='durability="journal"') as err:
            store.tracker("t", clock=clock)
        assert (err.value.tracker, err.value.recorded, err.value.requested) == ("t", "journal", "sealed")
        assert store.trackers() == ["t"]
    assert _tree(tmp_path) == before  # refused before anything was read or written
    with bucketstore.open(tmp_path, read_only=True) as ro:
        assert ro.tracker("t", clock=clock).number_of_delayed_messages == 15
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == 15
        assert _drain(t, clock) == {(1, e) for e in range(5, 10)} | {(2, e) for e in range(10)}


def test_a_journal_tracker_from_before_the_mode_was_recorded_is_refused_by_its_files(tmp_path: Path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        store.tracker("t", CFG, clock).add_messages(_rows(1, 3))
    state = _state(tmp_path, "t")
    del state["durability"]
    with Catalog(tmp_path / "catalog") as catalog:
        catalog.commit("t", state=state)  # as an older version left it
    with bucketstore.open(tmp_path, durability="sealed") as store:
        with pytest.raises(DurabilityMismatchError):
            store.tracker("t", clock=clock)
    with bucketstore.open(tmp_path, durability="journal") as store:
        assert store.tracker("t", clock=clock).number_of_delayed_messages == 3
    assert _state(tmp_path, "t")["durability"] == "journal"  # recorded by that open


def test_a_journal_open_that_only_looked_does_not_lock_a_sealed_tracker_out(tmp_path: Path) -> None:
    """``bucketstore.open(path)`` (journal, the default) of a sealed store, to look: its empty
    journal hides nothing, so the sealed writer opens it again; the files are not replayed later."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        store.tracker("t", CFG, clock).add_messages(_rows(1) + _rows(2, 1))
    with bucketstore.open(tmp_path) as store:
        assert store.tracker("t", clock=clock).number_of_delayed_messages == 10
    assert _state(tmp_path, "t")["durability"] == "journal"
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        t = store.tracker("t", clock=clock)
        t.add_messages(_rows(3) + _rows(4, 1))  # ledger 3 sealed
    assert _state(tmp_path, "t")["durability"] == "sealed"
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        assert _drain(store.tracker("t", clock=clock), clock) == {(ledger, e) for ledger in (1, 3) for e in range(10)}


def test_sealed_then_journal_then_sealed_refused_then_journal_against_a_model(tmp_path: Path) -> None:
    """add, close, reopen in the other mode, add, deliver, close, reopen: the model is what
    each mode promises (sealed: sealed buckets survive; journal: every acknowledged add)."""
    clock = FakeClock(1_000)
    model: set[tuple[int, int]] = set()
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)
        t.add_messages(_rows(1) + _rows(2))  # ledger 1 sealed; ledger 2 only in memory (sealed mode)
        model |= {(1, e) for e in range(10)}
    assert _state(tmp_path, "t")["durability"] == "sealed"
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)  # becomes a journal tracker
        assert t.config == CFG and t.number_of_delayed_messages == len(model)
        t.add_messages(_rows(3))  # journal-only from now on: acknowledged
        model |= {(3, e) for e in range(10)}
        clock.now = T0 + 1_003
        got = set(t.get_scheduled_messages(100))
        t.confirm_delivered()
        assert got == {(1, e) for e in range(4)}
        model -= got
    assert _state(tmp_path, "t")["durability"] == "journal"
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        with pytest.raises(DurabilityMismatchError):
            store.tracker("t", clock=clock)
    with bucketstore.open(tmp_path, read_only=True) as ro:
        view = ro.tracker("t", clock=clock)
        assert view.number_of_delayed_messages == len(model)
        assert all(view.contains_message(*p) for p in model)
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == len(model)
        assert _drain(t, clock) == model


def test_rows_a_sealed_recovery_held_for_replay_are_delivered_once_the_tracker_is_a_journal_one(
        tmp_path: Path) -> None:
    """Sealed mode skips due segments at open and keeps their bucket for the embedder's replay;
    the same tracker opened in journal mode (no frontier yet) delivers them instead: nothing is
    deleted unread, nothing lost."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        store.tracker("t", CFG, clock).add_messages(_rows(1) + _rows(2, 1))  # ledger 1 sealed
    clock.now = T0 + 5_000  # every row of ledger 1 is due
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.stats()["held_for_replay_indexes"] == 10 and t.number_of_delayed_messages == 0
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == 10
        assert set(t.get_scheduled_messages(100)) == {(1, e) for e in range(10)}
        t.confirm_delivered()
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == 0 and t.get_scheduled_messages(100) == []


def _stale_journal_store(path: Path, clock: FakeClock) -> None:
    """Tracker ``t`` in journal mode, then deleted half-way (its catalog entry gone, its
    journal left: a crash between the two steps of ``delete_tracker``), then created
    again in sealed mode with one sealed bucket of ledger 7."""
    with bucketstore.open(path, durability="journal", background=False) as store:
        store.tracker("t", CFG, clock).add_messages(_rows(1, 4))
        store.catalog.delete_tracker("t")
    assert list_files(journal_directory(str(path), "t"))[0]
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, clock)  # a new tracker of that name: nothing to refuse
        t.add_messages(_rows(7) + _rows(8, 1))
        assert t.stats()["immutable_buckets"] == 1
    assert _state(path, "t")["durability"] == "sealed"


def test_journal_files_beside_a_sealed_tracker_never_come_back(tmp_path: Path) -> None:
    clock = FakeClock(1_000)
    _stale_journal_store(tmp_path, clock)
    sealed = {(7, e) for e in range(10)}
    with bucketstore.open(tmp_path, read_only=True) as ro:  # looks as its writer would recover it
        view = ro.tracker("t", clock=clock)
        assert view.number_of_delayed_messages == 10 and not view.contains_message(1, 0)
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", clock=clock)
        assert t.number_of_delayed_messages == 10 and not t.contains_message(1, 0)
        t.add_message(9, 0, T0 + 50_000)
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        assert _drain(store.tracker("t", clock=clock), clock) == sealed | {(9, 0)}


def test_a_foreign_journal_file_fails_the_switch_and_leaves_the_tracker_sealed(tmp_path: Path) -> None:
    """A journal file of another store beside a sealed tracker is damage: the journal open names
    it (JournalError) and records nothing, so the tracker still opens in sealed mode."""
    clock = FakeClock(1_000)
    other = tmp_path / "other"
    with bucketstore.open(other, durability="journal") as store:
        store.tracker("t", CFG, clock).add_message(5, 0, T0)
    here = tmp_path / "here"
    with bucketstore.open(here, durability="sealed", background=False) as store:
        store.tracker("t", CFG, clock).add_messages(_rows(1) + _rows(2, 1))
    (foreign,) = list_files(journal_directory(str(other), "t"))[0]
    directory = Path(journal_directory(str(here), "t"))
    directory.mkdir(parents=True)
    shutil.copy(foreign[1], directory / os.path.basename(foreign[1]))
    with bucketstore.open(here, durability="journal", background=False) as store:
        with pytest.raises(bucketstore.JournalError):
            store.tracker("t", clock=clock)
    assert _state(here, "t")["durability"] == "sealed"
    with bucketstore.open(here, durability="sealed", background=False) as store:
        assert store.tracker("t", clock=clock).number_of_delayed_messages == 10


def test_a_crash_while_a_sealed_tracker_becomes_a_journal_one(tmp_path: Path) -> None:
    """The switch removes the stale journal files, then records journal, then journals: a
    crash at any file or catalog step, under every damage mode, brings back neither the stale
    rows nor loses a sealed row or the add acknowledged after the switch."""
    clock = FakeClock(1_000)
    base = tmp_path / "base"
    _stale_journal_store(base, clock)
    sealed = {(7, e) for e in range(10)}
    points = 0
    for k in range(64):
        live = tmp_path / f"k{k}"
        shutil.copytree(base, live)
        fs = FaultyFileSystem(crash_at=k)
        store = Store(live, durability="journal", background=False, fs=fs)
        fs.attach(store.catalog)
        acknowledged = False
        try:
            t = store.tracker("t", clock=clock)
            acknowledged = t.add_message(9, 0, T0 + 50_000)
            store.close()
        except SimulatedCrash:
            pass
        finished = not fs.crashed
        abandon_store(store)
        if finished:
            break
        points += 1
        for i, damage in enumerate(DAMAGES):
            image = tmp_path / f"k{k}-{i}"
            shutil.copytree(live, image)
            fs.materialize(damage, random.Random(k), relocate=(str(live), str(image)))
            with bucketstore.open(image, durability="journal", background=False) as again:
                got = _drain(again.tracker("t", clock=clock), clock)
            where = f"crash before call {k} ({fs.log[k - 1] if k else 'start'}), {damage.name}"
            assert not any(ledger == 1 for ledger, _ in got), where
            assert sealed <= got and got <= sealed | {(9, 0)}, where
            if acknowledged:
                assert (9, 0) in got, where
            shutil.rmtree(image)
        shutil.rmtree(live)
    print(f"{points} crash points")
    assert points >= 4  # the unlink, its directory fsync, the state commit, the checkpoint


def test_an_open_without_config_uses_the_recorded_one_and_an_explicit_one_is_recorded(tmp_path: Path) -> None:
    other = TrackerConfig(min_index_count_per_bucket=3, tick_time_ms=0)
    with bucketstore.open(tmp_path, background=False) as store:
        store.tracker("t", CFG)
    with bucketstore.open(tmp_path, background=False) as store:
        t = store.tracker("t")
        assert t.config == CFG
        assert store.tracker("t") is t  # an open handle: no config asks for no change
        with pytest.raises(ValueError, match="different config"):
            store.tracker("t", other)
        t.close()
        assert store.tracker("t", other).config == other  # explicit: it governs from now on
    with bucketstore.open(tmp_path, background=False) as store:
        t = store.tracker("t", clock=lambda: 1_000)
        assert t.config == other
        t.add_messages(_rows(1, 3) + _rows(2, 1))  # min_index_count 3: ledger 1 seals as ledger 2 arrives
        assert t.stats()["immutable_buckets"] == 1


def test_deleting_a_tracker_the_store_does_not_hold_raises_key_error(tmp_path: Path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, background=False) as store:
        with pytest.raises(KeyError, match="no tracker 'missing'"):
            store.delete_tracker("missing")
        store.tracker("t", CFG, clock).add_message(1, 0, T0)
        store.catalog.delete_tracker("t")  # a deletion that stopped after its catalog commit
        store.tracker("u", CFG, clock).close()
        store.delete_tracker("u")
        with pytest.raises(KeyError):
            store.delete_tracker("u")
    directory = journal_directory(str(tmp_path), "t")
    assert os.path.isdir(directory)
    with bucketstore.open(tmp_path, background=False) as store:
        store.delete_tracker("t")  # what the half-way deletion left is something: removed now
        assert not os.path.exists(directory)
        with pytest.raises(KeyError):
            store.delete_tracker("t")


class _Model:
    """What each mode promises, position by position.

    ``sure``: must be tracked (journal adds, and sealed buckets' rows not yet due at a sealed
    open); ``maybe``: may be tracked (sealed mode's memory-only rows, rows a sealed recovery
    skips as due, sealed deliveries that may come again); ``never``: must never be tracked
    or delivered again (confirmed in journal mode, or acknowledged by mark-delete)."""

    def __init__(self) -> None:
        self.due_at: dict[tuple[int, int], int] = {}
        self.sure: set[tuple[int, int]] = set()
        self.maybe: set[tuple[int, int]] = set()
        self.never: set[tuple[int, int]] = set()

    def opened_sealed(self, now: int) -> None:
        skipped = {p for p in self.sure if self.due_at[p] <= now}
        self.sure -= skipped
        self.maybe |= skipped

    def delivered(self, batch: list[tuple[int, int]], mode: str, where: str) -> None:
        for p in batch:
            assert p in self.sure or p in self.maybe, f"{where}: phantom delivery {p}"
            assert p not in self.never, f"{where}: {p} delivered again"
        self.sure -= set(batch)
        if mode == "journal":
            self.maybe -= set(batch)
            self.never |= set(batch)
        else:
            self.maybe |= set(batch)  # sealed mode keeps no delivery progress: it may come again

    def acknowledged(self, upto: tuple[int, int]) -> None:
        gone = {p for p in self.due_at if p <= upto}
        self.sure -= gone
        self.maybe -= gone
        self.never |= gone

    def check(self, tracker: object, where: str) -> None:
        for p in self.sure:
            assert tracker.contains_message(*p), f"{where}: {p} lost"
        for p in self.never:
            assert not tracker.contains_message(*p), f"{where}: {p} came back"


SEQUENCES = int(os.environ.get("BUCKETSTORE_MODE_SEQUENCES", "12"))


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_random_sessions_in_either_mode_against_a_model(tmp_path: Path, seed: int) -> None:
    """Sessions in a random mode (add, deliver, acknowledge, close), each open and each
    read-only look held to the model; a sealed open of a journal tracker either is refused or
    hides nothing; the last open, in journal mode, drains everything the model holds sure."""
    rng = random.Random(seed)
    clock = FakeClock(1_000)
    model = _Model()
    ledger = 0
    refused = 0
    for session in range(8):
        mode = rng.choice(["journal", "sealed"])
        where = f"seed {seed} session {session} ({mode})"
        with bucketstore.open(tmp_path, durability=mode, background=False, confirm_sync_ms=0) as store:
            try:
                t = store.tracker("t", CFG, clock)
            except DurabilityMismatchError:
                refused += 1
                continue
            if mode == "sealed":
                model.opened_sealed(clock.now)
            model.check(t, f"{where}, at open")
            for _ in range(rng.randint(1, 6)):
                op = rng.random()
                if op < 0.5:
                    ledger += 1
                    rows = [(ledger, e, clock.now + rng.randint(1, 3_000)) for e in range(rng.randint(1, 8))]
                    t.add_messages(rows)
                    for ledger_id, entry, at in rows:
                        model.due_at[(ledger_id, entry)] = at
                        (model.sure if mode == "journal" else model.maybe).add((ledger_id, entry))
                elif op < 0.75:
                    clock.advance(rng.randint(0, 1_500))
                    batch = t.get_scheduled_messages(rng.randint(1, 12))
                    t.confirm_delivered()
                    model.delivered(batch, mode, where)
                elif op < 0.85 and model.due_at:
                    upto = rng.choice(sorted(model.due_at))
                    t.mark_delete(*upto)
                    model.acknowledged(upto)
                else:
                    clock.advance(rng.randint(0, 800))
            model.check(t, f"{where}, before close")
        with bucketstore.open(tmp_path, read_only=True) as ro:
            view = ro.tracker("t", clock=clock)
            if ro.snapshot.tracker_state("t").get("durability") == "sealed":
                looking = _Model()
                looking.sure = {p for p in model.sure if model.due_at[p] > clock.now}
                looking.never = model.never
                looking.check(view, f"{where}, read-only")
            else:
                model.check(view, f"{where}, read-only")
    with bucketstore.open(tmp_path, durability="journal", background=False) as store:
        t = store.tracker("t", CFG, clock)
        model.check(t, f"seed {seed}: final journal open")
        clock.advance(10_000)
        drained: list[tuple[int, int]] = []
        while batch := t.get_scheduled_messages(1_000):
            drained += batch
        t.confirm_delivered()
    model.delivered(drained, "journal", f"seed {seed}: final drain")
    assert not model.sure, f"seed {seed}: never delivered: {sorted(model.sure)[:5]}"
    assert len(drained) == len(set(drained))
