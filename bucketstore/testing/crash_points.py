"""Deterministic crash workloads and the runner that crashes them: shared by the crash-point
enumerations of both durability modes (``test_crash_points.py``, ``test_crash_points_journal.py``).

A :class:`Workload` is a named sequence of tracker calls. :class:`Run` executes it
on a fresh store through a :class:`~bucketstore.testing.faults.FaultyFileSystem`, which may
crash it before any numbered call; :func:`reference` runs it once uncrashed to learn
its calls and the catalog state after each commit.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.store import Store
from bucketstore.testing.clock import FakeClock
from bucketstore.testing.faults import DAMAGES, DataLoss, FaultyFileSystem, SimulatedCrash, abandon_store
from bucketstore.testing.oracle import CatalogState

TRACKER = "sub"


@dataclass(frozen=True)
class Workload:
    """A named, deterministic sequence of tracker calls and the config it runs under."""

    name: str
    config: TrackerConfig
    steps: tuple[tuple[str, Callable[..., object]], ...]

    def universe(self) -> set[tuple[int, int]]:
        """Every position the workload adds (found by running it on an in-memory tracker)."""
        recorder = _Recorder()
        clock = FakeClock(1_000)
        tracker = bucketstore.InMemoryTracker(self.config, clock)
        for _, step in self.steps:
            if step is not REOPEN:
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


@dataclass
class Reference:
    """What the uncrashed run did: its calls, and the committed state after each commit."""

    root: Path
    calls: list[tuple[str, str]]
    states: list[CatalogState]  # states[i]: after the i-th commit (states[0]: nothing committed)
    commit_kinds: list[str]


class Run:
    """One run of a workload on a fresh store through a faulty file layer.

    :param durability: the store's durability mode.
    :param wrap: called with each tracker the run opens; the steps get what it
        returns (the journal enumeration wraps the tracker in a model-checking proxy).
    """

    def __init__(self, workload: Workload, path: Path, fs: FaultyFileSystem, *, durability: str = "sealed",
                 wrap: Callable[[Any], Any] | None = None) -> None:
        self.workload = workload
        self.path = path
        self.fs = fs
        self.durability = durability
        self.wrap = wrap or (lambda t: t)
        self.clock = FakeClock(1_000)
        self.store: Store | None = None
        self.crashed_in = "end"

    def _open(self) -> object:
        self.store = Store(self.path, durability=self.durability, fs=self.fs)
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


def reference(workload: Workload, path: Path, *, durability: str = "sealed") -> Reference:
    """Run the workload uncrashed; record its numbered calls and the catalog after each commit."""
    fs = FaultyFileSystem()
    run = Run(workload, path, fs, durability=durability)
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
    return Reference(path, calls, states, kinds)


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
    store = Store(probe, durability=durability, fs=fs)
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
            store = Store(again, durability=durability, fs=fs)
            fs.attach(store.catalog)
            store.tracker(TRACKER, config, clock)
        except SimulatedCrash:
            pass
        abandon_store(store)
        fs.materialize(damage, random.Random(seed + j))
        yield j, again
        shutil.rmtree(again)
