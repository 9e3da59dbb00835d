"""A call that fails half-way leaves the tracker as before the call or with its full effect, and a
retry does the right thing (issue 29, item 1: adds that roll, seal and merge, ``mark_delete``
that trims, ``clear``).

Each case runs a call once to count its file-layer calls, then again on a fresh store with
one transient fault (:meth:`FaultyFileSystem.fail`, ``times=1``) at each of those calls in
turn, in both durability modes and both designs (seals and merges on the calling thread, or
on the maintenance worker: a failed background job must leave its rows where they were).

* Right after the fault, if the call raised: the tracker holds the state before the call or
  after it (positions and the acknowledged position), nothing in between.
* After a retry of a call that raised (the fault is spent): exactly the call's full effect,
  counted, ``contains_message`` and delivered when due (the drain).
* The store's files as they were before the drain (copied once every job has ended) recover
  no row the call removed, and in journal mode every row it holds.
* A journal write that fails poisons the journal (never written again: see
  test_io_errors_journal): the process gives up, and a reopen must find the state before or
  after the call; for a batch spanning several ledgers, the row is the unit (the ledgers that
  sealed before the failure are durable in their buckets).

``BUCKETSTORE_FAULT_STRIDE`` (default 1: every call) sweeps every n-th call only.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

import bucketstore
from bucketstore import BucketStoreError, JournalError, TrackerConfig
from bucketstore.engine.durability.journal import journal_directory
from bucketstore.engine.store.store import Store
from bucketstore.errors import MaintenanceError
from bucketstore.testing.faults import FaultyFileSystem, SimulatedCrash, abandon_store

from helpers import FakeClock

STRIDE = int(os.environ.get("BUCKETSTORE_FAULT_STRIDE", "1"))
CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2,
                       max_num_buckets=3)
PREFILL = 7  # ledgers filled before the call: max_num_buckets sealed buckets, the mutable one open
FAR = 10**9  # delivery times: nothing is due until the final drain
Position = tuple[int, int]


def _rows(ledger: int, count: int = 5) -> dict[Position, int]:
    return {(ledger, e): FAR + 97 * ledger + 13 * e for e in range(count)}


_TEMPLATES: dict[str, Path] = {}


def _template(root: Path, durability: str) -> Path:
    """A closed store whose tracker holds ``max_num_buckets`` sealed (and merged) buckets and
    the mutable bucket's ledger, built once per mode: each case starts from a copy of it."""
    if durability not in _TEMPLATES:
        path = root / f"template-{durability}"
        with bucketstore.open(path, durability=durability, background=False) as store:
            tracker = store.tracker("t", CONFIG, FakeClock(1_000))
            for ledger in range(PREFILL):
                tracker.add_messages([(l, e, t) for (l, e), t in _rows(ledger).items()])
        _TEMPLATES[durability] = path
    return _TEMPLATES[durability]


class Case:
    """A store on a faulty file layer, opened from the template: one tracker with sealed buckets."""

    def __init__(self, path: Path, durability: str, background: bool) -> None:
        self.path, self.durability, self.background = path, durability, background
        shutil.copytree(_template(path.parent, durability), path / "store")
        self.fs = FaultyFileSystem()
        self.store = Store(path / "store", durability=durability, fs=self.fs, background=background,
                           confirm_sync_ms=0)
        self.fs.attach(self.store.catalog)
        self.clock = FakeClock(1_000)
        self.tracker = self.store.tracker("t", CONFIG, self.clock)
        self.state = {p: t for ledger in range(PREFILL) for p, t in _rows(ledger).items()}
        if durability == "sealed":
            # Sealed mode kept only the sealed buckets: the embedder's replay re-adds the rest.
            self.tracker.add_messages([(l, e, t) for (l, e), t in _rows(PREFILL - 1).items()])
        assert len(self.tracker.buckets()) == CONFIG.max_num_buckets
        _holds(self.tracker, self.state, "the case's start")


def _three() -> dict[Position, int]:
    return {p: t for ledger in range(PREFILL, PREFILL + 3) for p, t in _rows(ledger).items()}


#: Each operation: (do it, the state after its full effect).
OPERATIONS = {
    # Three new ledgers in one batch: two rolls, two seals and their merges in one call.
    "add-batch-rolls": (lambda c: c.tracker.add_messages([(l, e, t) for (l, e), t in _three().items()]),
                        lambda c: {**c.state, **_three()}),
    # One row of a new ledger: it rolls.
    "add-one-roll": (lambda c: c.tracker.add_message(PREFILL, 0, FAR), lambda c: {**c.state, (PREFILL, 0): FAR}),
    # A trim through the sealed buckets: keys out, files unlinked.
    "mark-delete": (lambda c: c.tracker.mark_delete(5, 2),
                    lambda c: {p: t for p, t in c.state.items() if p > (5, 2)}),
    "clear": (lambda c: c.tracker.clear(), lambda c: {}),
}
MODES = [pytest.param(d, b, id=f"{d}-{'background' if b else 'synchronous'}")
         for d in ("sealed", "journal") for b in (False, True)]


def _run(case: Case, op: str) -> BaseException | None:
    """The call, and the jobs it started; what it raised (a failure of its jobs, or of the journal
    checkpoint after a seal, is raised by the next call: here ``wait_for_maintenance``)."""
    do = OPERATIONS[op][0]
    try:
        do(case)
        case.tracker.wait_for_maintenance()
    except (OSError, BucketStoreError) as exc:
        return exc
    return None


def _holds(tracker, expected: dict[Position, int], where: str) -> None:
    assert tracker.number_of_delayed_messages == len(expected), where
    for position in expected:
        assert tracker.contains_message(*position), f"{where}: {position} is lost"


def _signature(tracker, positions: dict[Position, int]) -> tuple[set[Position], list[int] | None]:
    """What the tracker holds of ``positions``, and its acknowledged position."""
    return {p for p in positions if tracker.contains_message(*p)}, tracker.stats()["mark_delete"]


def _count_calls(tmp_path: Path, durability: str, background: bool, op: str) -> int:
    """How many file-layer calls the operation makes (and that it does what the sweep is for)."""
    case = Case(tmp_path / "count", durability, background)
    start = case.fs.calls
    before = case.tracker.operation_metrics()["operations"]
    assert _run(case, op) is None
    calls = case.fs.calls - start
    if op == "mark-delete":
        assert case.tracker.operation_metrics()["operations"]["delete"]["ok"] == 1  # it deletes buckets
    if op.startswith("add"):  # the call seals, and the seal starts a merge
        now = case.tracker.operation_metrics()["operations"]
        seals, merges = (now[k]["ok"] - before[k]["ok"] for k in ("create", "merge"))
        assert seals >= (2 if op == "add-batch-rolls" else 1) and merges >= 1, now
    case.store.close()
    return calls


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize(("durability", "background"), MODES)
def test_a_transient_fault_anywhere_in_the_call(tmp_path: Path, durability: str, background: bool, op: str) -> None:
    calls = _count_calls(tmp_path, durability, background, op)
    assert calls > 0
    problems: list[str] = []
    for k in range(0, calls, STRIDE):
        where = f"{op}, {durability}, background={background}, fault at call {k} of {calls}"
        try:
            _one_fault(tmp_path / f"k{k}", durability, background, op, k, where)
        except AssertionError as exc:
            problems.append(str(exc).splitlines()[0])
    assert not problems, f"{len(problems)} of {len(range(0, calls, STRIDE))} faults broke the call:\n" \
                         + "\n".join(problems)


def _one_fault(path: Path, durability: str, background: bool, op: str, k: int, where: str) -> None:
    case = Case(path, durability, background)
    tracker, fs = case.tracker, case.fs
    after = OPERATIONS[op][1](case)
    before = _signature(tracker, {**case.state, **after})
    mark_after = [5, 2] if op == "mark-delete" else before[1]
    rule = fs.fail(errno.EIO, first_call=fs.calls + k, times=1)
    error = _run(case, op)
    assert rule.fired == 1, f"{where}: the fault never fired (the call's I/O changed)"
    poisoned = isinstance(error, JournalError) or (
        isinstance(error, MaintenanceError) and isinstance(error.__cause__, JournalError))
    if error is not None and not poisoned:
        # Before the retry: as before the call, or its full effect (the acknowledged position
        # included: one recorded in memory only would refuse re-adds it still delivers).
        now = _signature(tracker, {**case.state, **after})
        assert now in (before, (set(after), mark_after)), \
            f"{where}: {error!r} left neither the state before the call nor after it"
        retry = _run(case, op)  # the fault is spent: the retry must complete the call
        if isinstance(retry, MaintenanceError):
            retry = _run(case, op)  # (the first failure raised once by the next call)
        assert retry is None, f"{where}: the retry raised {retry!r} (first: {error!r})"
    if poisoned:
        # A failed journal write is never written again: the process gives up; a reopen
        # must find the state before the call or after it.
        abandon_store(case.store)
        with bucketstore.open(path / "store", durability=durability) as again:
            t = again.tracker("t", CONFIG, case.clock)
            found = {p for p in {**case.state, **after} if t.contains_message(*p)}
            # A batch's unit is the row (adds are idempotent: the embedder re-adds what raised):
            # ledgers sealed before its journal failed are durable in their buckets, the rest not.
            partial = op == "add-batch-rolls" and set(case.state) <= found <= set(after)
            assert partial or found in (set(case.state), set(after)), \
                f"{where}: after {error!r} the reopened store holds neither the state before nor after " \
                f"(missing {sorted(set(after) - found)[:4]}, extra {sorted(found - set(after))[:4]})"
        return
    try:
        tracker._check()
    except AssertionError as exc:
        raise AssertionError(f"{where}: invariants broken after {error!r}: {exc}") from None
    try:
        _holds(tracker, after, where)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (after {error!r})") from None
    # The store's image now, before the drain changes it (nothing is writing: every job ended,
    # every call's journal group is committed).
    image = path / "image"
    shutil.copytree(path / "store", image)
    # Everything held is delivered once due, nothing else.
    case.clock.now = FAR * 2
    delivered = set()
    while batch := tracker.get_scheduled_messages(1000):
        delivered.update(batch)
    assert delivered == set(after), f"{where}: after {error!r} the drain delivered " \
                                    f"{len(delivered)} rows, missing {sorted(set(after) - delivered)[:4]}, " \
                                    f"extra {sorted(delivered - set(after))[:4]}"
    case.store.close()
    with bucketstore.open(image, durability=durability) as reopened:
        t = reopened.tracker("t", CONFIG, FakeClock(1_000))
        removed = set(case.state) - set(after)
        back = sorted(p for p in removed if t.contains_message(*p))
        assert not back, f"{where}: after {error!r} the durable image brings back removed rows {back[:4]}"
        if durability == "journal":
            _holds(t, after, f"{where}: durable image after {error!r}")


class _FailJournalCheckpoint(FaultyFileSystem):
    """Fails the creation of the next journal checkpoint file, once."""

    armed = False

    def create(self, path: str) -> int:
        if self.armed and path.endswith(".journal.tmp"):
            self.armed = False
            raise OSError(errno.EIO, "injected: checkpoint file not created", path)
        return super().create(path)


def test_a_failed_journal_checkpoint_keeps_the_pending_group(tmp_path: Path) -> None:
    """Adds waiting for their group commit (``sync_interval_ms``) when a seal's journal checkpoint
    fails: they stay pending, and the next commit makes them durable. (They were dropped with the
    checkpoint's records: ``flush()`` then returned with them in memory only, lost by a crash.)"""
    fs = _FailJournalCheckpoint()
    store = Store(tmp_path / "s", durability="journal", fs=fs, sync_interval_ms=600_000)
    tracker = store.tracker("t", CONFIG, FakeClock(1_000))
    rows = {**_rows(0), **_rows(1)}
    tracker.add_messages([(l, e, t) for (l, e), t in _rows(0).items()])
    fs.armed = True
    # Ledger 1 rolls: ledger 0 seals on the worker, whose checkpoint fails while ledger 1's
    # rows wait in the pending group.
    tracker.add_messages([(l, e, t) for (l, e), t in _rows(1).items()])
    with pytest.raises(MaintenanceError, match="checkpoint file not created"):
        tracker.wait_for_maintenance()
    assert not fs.armed, "no checkpoint was attempted"
    tracker.flush()  # acknowledges every add so far
    abandon_store(store)
    with bucketstore.open(tmp_path / "s", durability="journal") as again:
        _holds(again.tracker("t", CONFIG, FakeClock(1_000)), rows, "after flush() and a crash")


@pytest.mark.parametrize("how", ["fault", "crash"])
def test_a_deleted_tracker_stays_deleted_whatever_stops_its_deletion(tmp_path: Path, how: str) -> None:
    """``delete_tracker`` stopped at any of its calls, by a transient fault (not retried) or a
    crash: a reopen finds the whole tracker or none of it. (Its catalog state went first and its
    journal files last, so a tracker opened again under the name replayed the deleted one's
    journal: its indexes came back.)"""
    count = Case(tmp_path / "count", "journal", False)
    start = count.fs.calls
    count.store.delete_tracker("t")
    calls = count.fs.calls - start
    count.store.close()
    problems = []
    for k in range(0, calls, STRIDE):
        path = tmp_path / f"k{k}"
        case = Case(path, "journal", False)
        if how == "crash":
            case.fs.crash_at = case.fs.calls + k
        else:
            case.fs.fail(errno.EIO, first_call=case.fs.calls + k, times=1)
        try:
            case.store.delete_tracker("t")
        except (OSError, BucketStoreError, SimulatedCrash):
            pass
        abandon_store(case.store)
        with bucketstore.open(path / "store", durability="journal") as again:
            listed = "t" in again.trackers()
            held = {p for p in case.state if again.tracker("t", CONFIG, FakeClock(1_000)).contains_message(*p)}
        if held not in (set(), set(case.state)) or listed != bool(held):
            problems.append(f"{how} at call {k} of {calls}: listed={listed}, {len(held)} of "
                            f"{len(case.state)} rows held")
    assert not problems, "\n".join(problems)


def test_a_foreign_journal_file_where_a_deleted_tracker_was_is_reported_not_removed(tmp_path: Path) -> None:
    """The deleted tracker's files go only when every one is its own: one of another tracker (a
    copy or a mix-up of directories; here its header's number disagrees with its name too) is
    damage, so nothing is removed and the replay reports it."""
    path = tmp_path / "store"
    with bucketstore.open(path, durability="journal") as store:
        store.tracker("t", CONFIG, FakeClock(1_000)).add_message(1, 1, FAR)
        store.tracker("u", CONFIG, FakeClock(1_000)).add_message(2, 2, FAR)
    t_dir, u_dir = (journal_directory(str(path), n) for n in ("t", "u"))
    own = sorted(os.listdir(t_dir))
    foreign = os.path.join(t_dir, "00000000000000000099.journal")
    shutil.copyfile(os.path.join(u_dir, sorted(os.listdir(u_dir))[-1]), foreign)
    with bucketstore.open(path, durability="journal") as store:
        store.catalog.delete_tracker("t")  # as a deletion stopped right after its commit leaves it
    with bucketstore.open(path, durability="journal") as store:
        with pytest.raises(JournalError, match="00000000000000000099.journal"):
            store.tracker("t", CONFIG, FakeClock(1_000))
    assert sorted(n for n in os.listdir(t_dir) if n.endswith(".journal")) == own + [os.path.basename(foreign)]
