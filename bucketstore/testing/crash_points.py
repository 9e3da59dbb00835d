"""Crash-point enumeration: run a workload, crash it before each numbered I/O call, hand back the reopened store.

For embedders, :func:`crash_each_point` does the whole loop over a workload function
they write: it runs the workload once through a counting
:class:`~bucketstore.testing.faults.FaultyFileSystem`, then once per crash point, dying
before that call; it applies each damage mode a crash could do to the disk, reopens the
store with the real file layer and yields a :class:`CrashState` to check. ::

    def workload(store, acknowledged):
        tracker = store.tracker("orders", CONFIG, FakeClock(1_000))
        tracker.add_message(7, 1, 5_000)
        acknowledged.append((7, 1))  # journal mode: durable once add_message returns

    for state in crash_each_point(workload, tmp_path, durability="journal"):
        tracker = state.store.tracker("orders", CONFIG, FakeClock(1_000))
        assert all(tracker.contains_message(*p) for p in state.acknowledged), state

The engine's own enumerations (``tests/crash/test_crash_points*.py``) use the lower-level
pieces: a :class:`Workload` is a named sequence of tracker calls; :class:`Run`
executes it on a fresh store through a faulty file layer; :func:`reference` runs it
once uncrashed to learn its calls and the catalog state after each commit;
:func:`damaged_images` and :func:`crashed_recoveries` fan one crash out into the
distinct disks it can leave and into crashes of the recovery itself.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing.clock import FakeClock
from bucketstore.testing.faults import DAMAGES, Damage, DataLoss, FaultyFileSystem, SimulatedCrash, abandon_store
from bucketstore.testing.oracle import CatalogState
from bucketstore.testing.stepped_worker import SteppedWorker

__all__ = ["CrashState", "crash_each_point", "Workload", "Run", "Reference", "reference", "DamagedImage",
           "damaged_images", "crashed_recoveries", "shape", "REOPEN", "BG_WORK", "BG_WORK_SECOND", "BG_INSTALL",
           "BG_COMMIT", "BG_ALL"]

TRACKER = "sub"


@dataclass(frozen=True)
class Workload:
    """A named, deterministic sequence of tracker calls and the config it runs under.

    ``background``: seals and merges run as background jobs on a
    :class:`~bucketstore.testing.stepped_worker.SteppedWorker`, driven by the ``BG_*``
    marker steps (and by the tracker's own waits), with ``max_pending_maintenance``.
    ``side_by_side``: the pairs ``(kind, oldest_kind)`` of jobs the workload holds in
    flight together (``BG_WORK_SECOND``), which an enumeration checks the run reached.
    """

    name: str
    config: TrackerConfig
    steps: tuple[tuple[str, Callable[..., object]], ...]
    background: bool = False
    max_pending_maintenance: int = 2
    side_by_side: frozenset[tuple[str, str]] = frozenset()

    def universe(self) -> set[tuple[int, int]]:
        """Every position the workload adds (found by running it on an in-memory tracker)."""
        recorder = _Recorder()
        clock = FakeClock(1_000)
        tracker = bucketstore.InMemoryTracker(self.config, clock)
        for _, step in self.steps:
            if step not in _MARKERS:
                step(_RecordingTracker(tracker, recorder), clock)
        return recorder.positions


class _Recorder:
    def __init__(self) -> None:
        self.positions: set[tuple[int, int]] = set()


class _RecordingTracker:
    """Forwards to a tracker and notes every position added (only for :meth:`Workload.universe`)."""

    def __init__(self, tracker: object, recorder: _Recorder) -> None:
        self._t = tracker
        self._r = recorder

    def add_message(self, ledger: int, entry: int, at: int) -> bool:
        self._r.positions.add((ledger, entry))
        return self._t.add_message(ledger, entry, at)  # type: ignore[attr-defined]

    def add_messages(self, rows: list[tuple[int, int, int]]) -> int:
        self._r.positions.update((ledger, entry) for ledger, entry, _ in rows)
        return self._t.add_messages(rows)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._t, name)


def ledger_rows(ledger: int, count: int, base: int, spread: int) -> list[tuple[int, int, int]]:
    """``count`` rows of one ledger. Later ledgers fall due later, and each ledger's times
    spread enough to cut its bucket into a few segments: deliveries exhaust whole buckets
    one after another and leave the next one half read."""
    return [(ledger, e, base + 60 * ledger + (37 * e) % spread) for e in range(count)]


def adds(first: int, last: int, base: int, count: int = 5, spread: int = 120) -> Callable[..., object]:
    """One batch per ledger ``first..last``: each new ledger seals the previous one."""
    def run(tracker, clock) -> None:
        for ledger in range(first, last + 1):
            tracker.add_messages(ledger_rows(ledger, count, clock.now + base, spread))
    return run


def deliver(advance: int, n: int) -> Callable[..., object]:
    """Move the clock by ``advance`` ms, then take up to ``n`` due indexes."""
    def run(tracker, clock) -> None:
        clock.advance(advance)
        tracker.get_scheduled_messages(n)
    return run


def single_adds(tracker, clock) -> None:
    """Adds one by one: a covered (old) ledger goes straight to the queue, a new one to the mutable bucket."""
    tracker.add_message(4, 100, clock.now + 500)
    tracker.add_message(11, 7, clock.now + 250)


def REOPEN(tracker, clock) -> None:  # noqa: N802 - a marker, run by Run itself
    """Marker step: close the store cleanly and open it again (a recovery mid-workload)."""
    raise AssertionError("REOPEN is handled by the runner")


def BG_WORK(tracker, clock) -> None:  # noqa: N802 - a marker, run by Run itself
    """Marker step (background runs): the oldest pending seal or merge does its off-lock part
    (sort, encode, write and fsync its ledger file) and stops before its install."""
    raise AssertionError("BG_WORK is handled by the runner")


def BG_WORK_SECOND(tracker, clock) -> None:  # noqa: N802
    """Marker step (background runs): the job behind the oldest pending one does its off-lock
    part while the oldest has not installed (the real worker's second thread); it installs
    after the oldest, at a later ``BG_INSTALL``."""
    raise AssertionError("BG_WORK_SECOND is handled by the runner")


def BG_INSTALL(tracker, clock) -> None:  # noqa: N802
    """Marker step (background runs): the oldest pending job finishes (its work if not yet
    done, then its install: catalog commit, queue swap, checkpoint, source deletion)."""
    raise AssertionError("BG_INSTALL is handled by the runner")


def BG_COMMIT(tracker, clock) -> None:  # noqa: N802
    """Marker step (background runs): the oldest pending job does its work if not done yet, then
    its install's catalog commit, made without the tracker's lock; the rest of its install
    waits for a later ``BG_INSTALL`` (tracker calls between run as if the lock were taken late)."""
    raise AssertionError("BG_COMMIT is handled by the runner")


def BG_ALL(tracker, clock) -> None:  # noqa: N802
    """Marker step (background runs): every pending job runs to its end."""
    raise AssertionError("BG_ALL is handled by the runner")


_BACKGROUND_MARKERS = (BG_WORK, BG_WORK_SECOND, BG_INSTALL, BG_COMMIT, BG_ALL)
_MARKERS = (REOPEN, *_BACKGROUND_MARKERS)


SMALL = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                      max_time_step_per_segment_ms=100)
MERGING = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                        max_time_step_per_segment_ms=100, max_num_buckets=2)

STEPS = (
    ("seal five buckets", adds(1, 6, 50)),
    ("deliver the first buckets", deliver(230, 9)),
    ("deliver more", deliver(60, 4)),
    ("mark-delete trims", lambda t, c: t.mark_delete(4, 1)),
    ("seal more", adds(7, 10, 100)),
    ("direct adds", single_adds),
    ("clear", lambda t, c: t.clear()),
    ("seal after clear", adds(11, 14, 100)),
    ("deliver after clear", deliver(1000, 100)),
)


#: The lifecycle with seals and merges in the background: jobs queue up (a backlog of three),
#: and tracker calls run between a job's write and its install — deliveries from frozen
#: buckets, a mark-delete that acknowledges a bucket being written, a clear that cancels
#: written jobs — and the process dies with work in flight at the end.
BACKGROUND_STEPS = (
    ("seal five buckets (queued; backpressure runs the oldest)", adds(1, 6, 50)),
    ("background: the next job writes its file", BG_WORK),
    ("deliver while it is not installed", deliver(230, 9)),
    ("background: it installs", BG_INSTALL),
    ("background: the next job writes", BG_WORK),
    ("deliver more", deliver(60, 4)),
    ("mark-delete trims, a job in flight", lambda t, c: t.mark_delete(4, 1)),
    ("background: everything pending runs", BG_ALL),
    ("seal more", adds(7, 10, 100)),
    ("background: the next job writes", BG_WORK),
    ("direct adds", single_adds),
    ("clear, a written job not installed", lambda t, c: t.clear()),
    ("background: the cancelled jobs end", BG_ALL),
    ("seal after clear", adds(11, 14, 100)),
    ("background: the next job writes", BG_WORK),
    ("deliver while it is not installed", deliver(1000, 100)),
    ("background: it installs", BG_INSTALL),
    ("seal the last ones, left in flight", adds(15, 17, 1200)),
    ("background: the next job writes", BG_WORK),
)


#: Merges in the background (with ``max_num_buckets=2``): a merge writes its file while
#: rows of its sources are delivered and trimmed (they must not come back at its install),
#: its install commits and then deletes the sources (crash points in between), a later
#: merge loses a source to a mark-delete while it is queued (cancelled at its install), and
#: another has every source read to its end between its catalog commit (made without the
#: lock) and the rest of its install, which then deletes the merged bucket.
BACKGROUND_MERGE_STEPS = (
    ("seal three buckets (queued)", adds(1, 4, 100)),
    ("background: a seal installs", BG_INSTALL),
    ("background: a seal installs", BG_INSTALL),
    ("background: a seal installs, starting a merge", BG_INSTALL),
    ("background: the merge writes its file", BG_WORK),
    ("deliver from the merge's sources", deliver(200, 4)),
    ("mark-delete trims a source's ledger", lambda t, c: t.mark_delete(1, 2)),
    ("background: the merge installs, then deletes its sources", BG_INSTALL),
    ("deliver more", deliver(40, 3)),
    ("seal more (queued)", adds(5, 8, 300)),
    ("background: a seal installs", BG_INSTALL),
    ("background: a seal installs, starting a merge", BG_INSTALL),
    ("background: the next seal writes", BG_WORK),
    ("mark-delete acknowledges a source of the queued merge", lambda t, c: t.mark_delete(5, 0)),
    ("background: everything pending runs (the merge is cancelled)", BG_ALL),
    ("a seal queued", adds(9, 9, 300)),
    ("background: the seal installs, starting a merge", BG_INSTALL),
    ("background: the merge writes and commits, not installed", BG_COMMIT),
    ("deliver every source of the merge to its end (each deleted)", deliver(2000, 200)),
    ("background: the merge installs; nothing in it live, it is deleted", BG_INSTALL),
    ("seal the last ones, left in flight", adds(9, 11, 300)),
    ("background: the next seal writes", BG_WORK),
)


def expire(ledger: int, entry: int, again_after: int | None = None) -> Callable[..., object]:
    """Re-add a tracked position with a time already due: the tracker untracks it (the embedder
    dispatches it itself); with ``again_after``, it is then tracked anew that much later. Its old
    row may sit in a file being written, which must neither bring it back nor shadow the new one."""
    def run(tracker, clock) -> None:
        tracker.add_message(ledger, entry, clock.now - 1)
        if again_after is not None:
            tracker.add_message(ledger, entry, clock.now + again_after)
    return run


#: Two background jobs in flight together (``max_num_buckets=2``), as the store's two
#: maintenance threads run them: the job behind the oldest writes its file first
#: (``BG_WORK_SECOND``), tracker calls run between the two jobs' steps, and the installs
#: keep submission order. Two seals (an untrack in the second one's ledger, then the first
#: one's install checkpoints the journal), a merge beside a seal whose bucket it does not
#: include (deliveries from its sources), a seal written beside a written merge that installs
#: first, a seal written before a merge that a mark-delete cancels, a clear with two written
#: jobs, and the process dies with two in flight.
SIDE_BY_SIDE_STEPS: tuple[tuple[str, Callable[..., object]], ...] = (
    ("two seals queued", adds(1, 3, 100)),
    ("background: the second seal writes first", BG_WORK_SECOND),
    ("untrack a position of the second seal's ledger", expire(2, 1)),
    ("untrack another, tracked again later", expire(2, 3, again_after=400)),
    ("background: the first seal writes", BG_WORK),
    ("background: the first seal installs (journal: checkpoints)", BG_INSTALL),
    ("deliver between the two installs", deliver(230, 2)),
    ("background: the second seal installs", BG_INSTALL),
    ("two more seals queued", adds(4, 5, 300)),
    ("background: a seal installs, starting a merge behind the other seal", BG_INSTALL),
    ("background: the merge writes beside the seal", BG_WORK_SECOND),
    ("deliver from the merge's sources", deliver(100, 3)),
    ("untrack a position of the seal's ledger", expire(4, 2)),
    ("background: the seal writes, then installs", BG_INSTALL),
    ("background: the merge installs, then deletes its sources", BG_INSTALL),
    ("a seal queued behind the next merge", adds(6, 6, 300)),
    ("background: the merge writes", BG_WORK),
    ("deliver", deliver(150, 3)),
    ("background: the seal writes beside the written merge", BG_WORK_SECOND),
    ("untrack a position of the seal's ledger", expire(5, 1)),
    ("background: the merge installs, deletes its sources", BG_INSTALL),
    ("background: the seal installs, starting a merge", BG_INSTALL),
    ("a seal queued behind the merge", adds(7, 7, 300)),
    ("background: the seal writes beside the merge", BG_WORK_SECOND),
    ("mark-delete acknowledges a source of the merge", lambda t, c: t.mark_delete(5, 0)),
    ("background: the merge is cancelled at its install, the seal installs", BG_ALL),
    ("two seals queued", adds(8, 10, 400)),
    ("background: the second seal writes first", BG_WORK_SECOND),
    ("background: the first seal writes", BG_WORK),
    ("clear, two written jobs not installed", lambda t, c: t.clear()),
    ("background: the cancelled jobs end", BG_ALL),
    ("two seals queued, left in flight", adds(11, 13, 1200)),
    ("background: the second seal writes first", BG_WORK_SECOND),
)


@dataclass
class Reference:
    """What the uncrashed run did: its calls, and the committed state after each commit."""

    root: Path
    calls: list[tuple[str, str]]
    states: list[CatalogState]  # states[i]: after the i-th commit (states[0]: nothing committed)
    commit_kinds: list[str]
    #: Background runs: the half-steps the stepped worker ran, in order, as
    #: ``(kind, phase, first, end)``: ``kind`` "create" or "merge", ``phase`` "work",
    #: "commit" or "install", and the numbered calls ``first <= k < end`` it made.
    background_steps: list[tuple[str, str, int, int | None]]
    #: Background runs: the stepped worker's ``side_by_side`` (the pairs of jobs held in flight together).
    side_by_side: list[tuple[str, str]] = field(default_factory=list)

    def background_step_at(self, k: int) -> str | None:
        """``"kind-phase"`` of the background half-step that made call ``k``, or None."""
        for kind, phase, first, end in self.background_steps:
            if first <= k < (end if end is not None else len(self.calls)):
                return f"{kind}-{phase}"
        return None


class Run:
    """One run of a workload on a fresh store through a faulty file layer.

    :param durability: the store's durability mode.
    :param wrap: called with each tracker the run opens; the steps get what it
        returns (the journal enumeration wraps the tracker in a model-checking proxy).
    Background workloads (``workload.background``) run seals and merges on a
    :class:`~bucketstore.testing.stepped_worker.SteppedWorker` (``run.worker``): they run
    at the workload's ``BG_WORK`` / ``BG_INSTALL`` / ``BG_ALL`` steps, or when a tracker
    waits for them (backpressure, flush, close).
    """

    def __init__(self, workload: Workload, path: Path, fs: FaultyFileSystem, *, durability: str = "sealed",
                 wrap: Callable[[Any], Any] | None = None, sync_interval_ms: int = 0,
                 confirm_sync_ms: int = 0) -> None:
        self.workload = workload
        # 0, not the store's default: a wall-clock confirmation window would make the
        # numbered calls differ from run to run; 10**9 enumerates the grouped frontier.
        self.confirm_sync_ms = confirm_sync_ms
        self.background = workload.background
        self.max_pending_maintenance = workload.max_pending_maintenance
        self.worker: SteppedWorker | None = None
        self.sync_interval_ms = sync_interval_ms
        self.path = path
        self.fs = fs
        self.durability = durability
        self.wrap = wrap or (lambda t: t)
        self.clock = FakeClock(1_000)
        self.store: Store | None = None
        self.crashed_in = "end"

    def _open(self) -> object:
        self.worker = SteppedWorker(calls=lambda: self.fs.calls) if self.background else None
        self.store = Store(self.path, durability=self.durability, fs=self.fs, sync_interval_ms=self.sync_interval_ms,
                           confirm_sync_ms=self.confirm_sync_ms,
                           background=self.background, maintenance=self.worker,
                           max_pending_maintenance=self.max_pending_maintenance,
                           read_ahead=False)  # the reader thread is not stepped: keep the run deterministic
        self.fs.attach(self.store.catalog)
        return self.wrap(self.store.tracker(TRACKER, self.workload.config, self.clock))

    def go(self) -> None:
        try:
            self.crashed_in = "open"
            tracker = self._open()
            for name, step in self.workload.steps:
                self.crashed_in = name
                if step is REOPEN:
                    assert self.store is not None
                    self.store.close()
                    self.clock.advance(20)
                    tracker = self._open()
                elif step in _BACKGROUND_MARKERS:
                    assert self.worker is not None, f"step {name!r} needs a background run"
                    {BG_WORK: self.worker.work, BG_WORK_SECOND: lambda: self.worker.work(1),
                     BG_INSTALL: self.worker.install, BG_COMMIT: self.worker.commit,
                     BG_ALL: self.worker.run_all}[step]()
                else:
                    step(tracker, self.clock)
            self.crashed_in = "end"
        except SimulatedCrash:
            return
        self.fs.crash()  # the process dies after its last call

    def committed(self) -> CatalogState:
        if self.store is None:
            return CatalogState((), None)
        return CatalogState.read(self.store.catalog, TRACKER)


def reference(workload: Workload, path: Path, *, durability: str = "sealed", sync_interval_ms: int = 0,
              confirm_sync_ms: int = 0) -> Reference:
    """Run the workload uncrashed; record its numbered calls and the catalog after each commit."""
    fs = FaultyFileSystem()
    run = Run(workload, path, fs, durability=durability, sync_interval_ms=sync_interval_ms,
              confirm_sync_ms=confirm_sync_ms)
    states = [CatalogState((), None)]
    seen_commits = 0
    # Record the catalog after each commit: at the start of the next call, or at the end.
    original = fs._call

    def observing_call(op: str, target: str, **kw: bool) -> object:
        nonlocal seen_commits
        commits = sum(1 for o, _ in fs.log if o == "catalog_commit")
        if commits > seen_commits and run.store is not None:
            states.append(run.committed())
            seen_commits = commits
        return original(op, target, **kw)

    fs._call = observing_call  # type: ignore[method-assign]
    run.go()
    if sum(1 for o, _ in fs.log if o == "catalog_commit") > seen_commits:
        states.append(run.committed())
    calls = list(fs.log)
    abandon_store(run.store)
    kinds = [after.diff_kind(before) for before, after in zip(states, states[1:])]
    worker = run.worker
    return Reference(path, calls, states, kinds, list(worker.spans) if worker is not None else [],
                     list(worker.side_by_side) if worker is not None else [])


def shape(log: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    """A call log with the store's path (and its parent's) taken out, to compare runs in different places."""
    return [(op, target.replace(str(root), "<store>").replace(str(root.parent), "<parent>")) for op, target in log]


@dataclass
class DamagedImage:
    """One distinct on-disk state a crash can leave: a copy of the store with one damage applied."""

    damage: Any
    seed: int  # the index of the tear point (0 for the modes that do not tear)
    rng_seed: int
    case: Path
    context: str


def damaged_images(fs: FaultyFileSystem, live: Path, k: int, tmp_path: Path, where: str, scale: int,
                   skipped: list[int]) -> Iterator[DamagedImage]:
    """Materialize each damage mode of the crash image at ``live`` into its own copy, once per
    distinct resulting disk (modes that leave identical bytes are counted in ``skipped[0]``).
    The copy is removed once the caller has checked it."""
    seen: set[object] = set()
    for damage in DAMAGES:
        for s in range(scale if damage.data is DataLoss.TORN else 1):
            rng_seed = k * 1000 + s
            signature = fs.state_signature(damage, random.Random(rng_seed), str(live))
            if signature in seen:
                skipped[0] += 1  # this mode leaves the same disk as one already checked
                continue
            seen.add(signature)
            case = tmp_path / f"k{k}" / f"{damage.name}-{s}"
            shutil.copytree(live, case)
            fs.materialize(damage, random.Random(rng_seed), relocate=(str(live), str(case)))
            yield DamagedImage(damage, s, rng_seed, case, f"{where}, damage {damage}, seed {s}")
            shutil.rmtree(case)


def crashed_recoveries(path: Path, config: TrackerConfig, clock: FakeClock, damage: Any, seed: int, *,
                       durability: str = "sealed") -> Iterator[tuple[int, Path]]:
    """Crash the recovery of the store at ``path`` before each of its numbered calls in turn.

    A probe run counts the recovery's calls; then for each call ``j`` a copy of the store
    is reopened through the faulty layer, crashed before call ``j``, damaged with
    ``damage`` and yielded as ``(j, copy)`` for the caller to reopen and check. The copy
    is removed afterwards.
    """
    probe = path.parent / f"{path.name}-probe"
    shutil.copytree(path, probe)
    fs = FaultyFileSystem()
    store = Store(probe, durability=durability, fs=fs, background=False)
    fs.attach(store.catalog)
    store.tracker(TRACKER, config, clock)
    calls = fs.calls
    store.close()
    shutil.rmtree(probe)
    for j in range(calls):
        again = path.parent / f"{path.name}-again{j}"
        shutil.copytree(path, again)
        fs = FaultyFileSystem(crash_at=j)
        store = None
        try:
            store = Store(again, durability=durability, fs=fs, background=False)
            fs.attach(store.catalog)
            store.tracker(TRACKER, config, clock)
        except SimulatedCrash:
            pass
        abandon_store(store)
        fs.materialize(damage, random.Random(seed + j))
        yield j, again
        shutil.rmtree(again)


# -- the embedder's enumeration ----------------------------------------------------------------------
@dataclass
class CrashState:
    """One crash of an embedder's workload, reopened: what :func:`crash_each_point` yields.

    :ivar point: the workload died just before its ``point``-th numbered I/O call
        (0-based); ``point == calls`` means it died after returning, before closing.
    :ivar call: ``(operation, path)`` of that call, None for the final point.
    :ivar calls: how many numbered calls the uncrashed workload makes.
    :ivar damage: what the crash did to the bytes and directory entries never synced.
    :ivar store: the store reopened from the crash image with the real file layer;
        recovery happens as the caller opens its trackers. Closed for the caller.
    :ivar acknowledged: the list the workload appended to, as it stood when it died.
    :ivar path: the store directory (a copy, removed once the caller moves on).
    """

    point: int
    call: tuple[str, str] | None
    calls: int
    damage: Damage
    store: Store
    acknowledged: list[Any]
    path: Path

    def __str__(self) -> str:
        where = f"{self.call[0]} {self.call[1]}" if self.call else "after the last call"
        return f"crash before call {self.point} of {self.calls} ({where}), damage {self.damage}"


def _run_workload(workload: Callable[[Store, list[Any]], object], path: Path, fs: FaultyFileSystem,
                  durability: str, sync_interval_ms: int, background: bool,
                  confirm_sync_ms: int = 0) -> tuple[Store | None, list[Any]]:
    """Run ``workload`` on a fresh store through ``fs`` until it returns or the simulated process dies."""
    acknowledged: list[Any] = []
    store = None
    try:
        store = Store(path, durability=durability, sync_interval_ms=sync_interval_ms, fs=fs, background=background,
                      confirm_sync_ms=confirm_sync_ms,
                      maintenance=SteppedWorker() if background else None, read_ahead=False)
        fs.attach(store.catalog)
        workload(store, acknowledged)
        fs.crash()  # the process dies after its last call, without closing
    except SimulatedCrash:
        pass
    abandon_store(store)
    return store, acknowledged


def crash_each_point(workload: Callable[[Store, list[Any]], object], root: str | Path, *,
                     durability: str = "journal", sync_interval_ms: int = 0,
                     damages: Sequence[Damage] = DAMAGES, seed: int = 0,
                     background: bool = False, confirm_sync_ms: int = 0) -> Iterator[CrashState]:
    """Crash ``workload`` before each of its numbered I/O calls; yield each crash image, reopened.

    The workload is a function ``workload(store, acknowledged)`` that opens trackers on
    ``store`` (pass them a :class:`~bucketstore.testing.clock.FakeClock`) and drives
    them, appending to ``acknowledged`` whatever it has promised its own clients (in
    ``durability="journal"`` with ``sync_interval_ms=0``, a position whose
    ``add_message`` returned). It must be deterministic: same calls, same order, every
    run (checked; a mismatch raises ``AssertionError``).

    A first run through a counting :class:`~bucketstore.testing.faults.FaultyFileSystem`
    learns the number of calls N. Then, for each point k in 0..N, the workload runs on a
    fresh store and dies before call k (at N: after returning, before ``close``); for each
    damage mode in ``damages`` the crash image is copied, damaged as that mode says a
    power loss could (modes that leave identical bytes are tried once), reopened with
    the real file layer and yielded. The store is closed and its directory removed when
    the caller asks for the next state, so check each state inside the loop.

    Runtime: N + 1 workload runs plus one recovery per distinct image: keep workloads
    to a few dozen durable calls (``len(state.calls)`` tells how many).

    >>> import bucketstore, tempfile
    >>> from bucketstore.testing import FakeClock, crash_each_point
    >>> def workload(store, acknowledged):
    ...     tracker = store.tracker("t", None, FakeClock(0))
    ...     tracker.add_message(1, 1, 10_000)
    ...     acknowledged.append((1, 1))
    >>> states = crash_each_point(workload, tempfile.mkdtemp(), durability="journal")
    >>> all(s.store.tracker("t", None, FakeClock(0)).contains_message(*p)
    ...     for s in states for p in s.acknowledged)
    True

    :param workload: ``workload(store, acknowledged)``, run once per crash point.
    :param root: a directory for the runs' stores (each removed after use).
    :param durability: the store's durability mode, ``"journal"`` (the default, as for
        :func:`bucketstore.open`) or ``"sealed"``.
    :param sync_interval_ms: the store's journal group-commit interval.
    :param confirm_sync_ms: the store's confirmation window. 0 here (not the store's
        default): a wall-clock window would make the numbered calls differ between runs;
        a window longer than the run (e.g. ``10**9``) enumerates confirmations that wait
        for the next commit.
    :param damages: the damage modes to apply (default: every mode in :data:`DAMAGES`).
    :param seed: seeds the torn-tail cut points.
    :param background: run seals and merges as background jobs on a
        :class:`~bucketstore.testing.stepped_worker.SteppedWorker` (``store.maintenance``):
        they run when the workload says (``store.maintenance.work()``, ``.work(1)`` for the
        job behind the oldest, ``.install()``, ``.run_all()``) or when a tracker waits for
        them (a full backlog, ``flush``),
        so the calls stay deterministic. False (the default): the synchronous design.
    :return: an iterator of :class:`CrashState`.
    """
    root = Path(root)
    reference_path = root / "reference"
    fs = FaultyFileSystem()
    _run_workload(workload, reference_path, fs, durability, sync_interval_ms, background, confirm_sync_ms)
    calls = list(fs.log)
    shutil.rmtree(reference_path, ignore_errors=True)
    for k in range(len(calls) + 1):
        live = root / f"crash-{k}"
        fs = FaultyFileSystem(crash_at=k)
        _, acknowledged = _run_workload(workload, live, fs, durability, sync_interval_ms, background,
                                        confirm_sync_ms)
        # The run must repeat the first one's calls up to and including the one it died at.
        assert shape(fs.log, live) == shape(calls[:k + 1], reference_path), \
            f"the workload is not deterministic: its calls up to call {k} differ from the first run's"
        seen: set[object] = set()
        for damage in damages:
            rng_seed = seed + k
            if live.is_dir():
                signature = fs.state_signature(damage, random.Random(rng_seed), str(live))
                if signature in seen:
                    continue  # this mode leaves the same disk as one already yielded
                seen.add(signature)
            case = root / f"crash-{k}-{damage.name}"
            if live.is_dir():
                shutil.copytree(live, case)
                fs.materialize(damage, random.Random(rng_seed), relocate=(str(live), str(case)))
            store = Store(case, durability=durability, sync_interval_ms=sync_interval_ms,
                          confirm_sync_ms=confirm_sync_ms)
            try:
                yield CrashState(k, calls[k] if k < len(calls) else None, len(calls), damage, store,
                                 list(acknowledged), case)
            finally:
                store.close()
                shutil.rmtree(case, ignore_errors=True)
            if not live.is_dir():
                break  # died before the store existed: one (empty) state is enough
        shutil.rmtree(live, ignore_errors=True)
