"""Crash-point enumeration: crash a fixed workload before every durable call, under every damage mode.

A workload (adds across rolling ledgers that seal buckets, deliveries that
exhaust and delete them, a mark-delete that trims, a clear, and merges when the
tracker merges) runs once through a counting :class:`FaultyFileSystem` to learn
its N numbered calls and the catalog state after each commit. Then, for every
k in 0..N and every damage mode, it runs again and dies before call k; the
model of the disk is damaged as that mode says a crash could; the store is
reopened with the real file layer and checked (see ``crash_oracle``):

(i)   recovery succeeds: every mode loses only what was never synced;
(ii)  no phantom and no loss against the committed catalog state;
(iii) the catalog and the files agree, every file verifies, no orphan or
      ``*.tmp`` remains;
(iv)  the committed state is the reference run's state after exactly the
      commits that preceded call k: each seal, delete, trim, clear or merge is
      one commit, so recovery sees it whole or not at all.

Crashing *before* a ``catalog_commit`` call aborts that transaction; crashing
before the next call models "committed, then died": both outcomes of every
commit are covered. A sample of the crashed states is then reopened through
the faulty layer and crashed again *during recovery*, before each of its calls.

``BUCKETSTORE_CRASH_SCALE`` (default 1) multiplies the torn-byte seeds tried per
crash point and the share of states whose recovery is crashed again.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.faults import DAMAGES, DataLoss, Damage, FaultyFileSystem, SimulatedCrash, abandon_store
from bucketstore.store import Store

from crash_oracle import CatalogState, Expectation, check_files, check_recovered, expect
from helpers import FakeClock

SCALE = int(os.environ.get("BUCKETSTORE_CRASH_SCALE", "1"))
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


def _ledger_rows(ledger: int, count: int, base: int, spread: int) -> list[tuple[int, int, int]]:
    # Later ledgers fall due later, and each ledger's times spread enough to cut
    # its bucket into a few segments: deliveries exhaust whole buckets one after
    # another and leave the next one half read.
    return [(ledger, e, base + 60 * ledger + (37 * e) % spread) for e in range(count)]


def _adds(first: int, last: int, base: int, count: int = 5, spread: int = 120) -> Callable[..., object]:
    def run(tracker, clock) -> None:
        for ledger in range(first, last + 1):
            tracker.add_messages(_ledger_rows(ledger, count, clock.now + base, spread))
    return run


def _deliver(advance: int, n: int) -> Callable[..., object]:
    def run(tracker, clock) -> None:
        clock.advance(advance)
        tracker.get_scheduled_messages(n)
    return run


def _single_adds(tracker, clock) -> None:
    tracker.add_message(4, 100, clock.now + 500)   # covered ledger or old: straight to the queue
    tracker.add_message(11, 7, clock.now + 250)


def REOPEN(tracker, clock) -> None:  # noqa: N802 - a marker, run by _Run itself
    """Marker step: close the store cleanly and open it again (a recovery mid-workload)."""
    raise AssertionError("REOPEN is handled by the runner")


SMALL = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                      max_time_step_per_segment_ms=100)

_STEPS = (
    ("seal five buckets", _adds(1, 6, 50)),
    ("deliver the first buckets", _deliver(230, 9)),
    ("deliver more", _deliver(60, 4)),
    ("mark-delete trims", lambda t, c: t.mark_delete(4, 1)),
    ("seal more", _adds(7, 10, 100)),
    ("direct adds", _single_adds),
    ("clear", lambda t, c: t.clear()),
    ("seal after clear", _adds(11, 14, 100)),
    ("deliver after clear", _deliver(1000, 100)),
)

WORKLOADS = [
    Workload("lifecycle", SMALL, _STEPS),
    # With at most two buckets, a tracker that merges does so after nearly every
    # seal; one that does not still runs the same seals, deletes and trims.
    Workload("merging", TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                                      max_time_step_per_segment_ms=100, max_num_buckets=2), _STEPS),
    # A clean close and reopen after the trim: the recovery (due buckets deleted,
    # a durable mark-delete applied) is itself crashed at every call.
    Workload("reopened", SMALL, _STEPS[:4] + (("reopen", REOPEN),) + _STEPS[4:]),
]


@dataclass
class Reference:
    """What the uncrashed run did: its calls, and the committed state after each commit."""

    root: Path
    calls: list[tuple[str, str]]
    states: list[CatalogState]  # states[i]: after the i-th commit (states[0]: nothing committed)
    commit_kinds: list[str]


class _Run:
    """One run of a workload on a fresh store through a faulty file layer."""

    def __init__(self, workload: Workload, path: Path, fs: FaultyFileSystem) -> None:
        self.workload = workload
        self.path = path
        self.fs = fs
        self.clock = FakeClock(1_000)
        self.store: Store | None = None
        self.crashed_in = "end"

    def _open(self) -> object:
        self.store = Store(self.path, fs=self.fs)
        self.fs.attach(self.store.catalog)
        return self.store.tracker(TRACKER, self.workload.config, self.clock)

    def go(self) -> None:
        try:
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


def _reference(workload: Workload, path: Path) -> Reference:
    fs = FaultyFileSystem()
    run = _Run(workload, path, fs)
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


def _shape(log: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    """A call log with the store's path (and its parent's) taken out, to compare runs in different places."""
    return [(op, target.replace(str(root), "<store>").replace(str(root.parent), "<parent>")) for op, target in log]


def _reopen_and_check(path: Path, workload: Workload, clock: FakeClock, exp: Expectation,
                      universe: set[tuple[int, int]], context: str) -> None:
    with bucketstore.open(path) as store:
        tracker = store.tracker(TRACKER, workload.config, clock)
        check_recovered(tracker, exp, universe, context)
        check_files(store, TRACKER, context)


def _crash_during_recovery(path: Path, workload: Workload, clock: FakeClock, exp: Expectation,
                           universe: set[tuple[int, int]], damage: Damage, seed: int, context: str) -> int:
    """Reopen through the faulty layer, crash before each recovery call in turn, reopen again.
    Each round works on a copy of the crashed store. Returns how many states it ran."""
    probe_dir = path.parent / f"{path.name}-probe"
    shutil.copytree(path, probe_dir)
    fs = FaultyFileSystem()
    store = Store(probe_dir, fs=fs)
    fs.attach(store.catalog)
    store.tracker(TRACKER, workload.config, clock)
    n = fs.calls
    store.close()
    shutil.rmtree(probe_dir)
    ran = 0
    for j in range(n):
        again = path.parent / f"{path.name}-again{j}"
        shutil.copytree(path, again)
        fs = FaultyFileSystem(crash_at=j)
        store = None
        try:
            store = Store(again, fs=fs)
            fs.attach(store.catalog)
            store.tracker(TRACKER, workload.config, clock)
        except SimulatedCrash:
            pass
        abandon_store(store)
        fs.materialize(damage, random.Random(seed + j))
        _reopen_and_check(again, workload, clock, exp, universe, f"{context}, recovery crashed before call {j}")
        shutil.rmtree(again)
        ran += 1
    return ran


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_crash_point_recovers(workload: Workload, tmp_path: Path) -> None:
    started = time.perf_counter()
    universe = workload.universe()
    ref = _reference(workload, tmp_path / "reference" / "store")
    n = len(ref.calls)
    kinds = Counter(ref.commit_kinds)
    # The workload must exercise what it claims to (merges only where the tracker merges).
    for kind in ("seal", "delete", "mark-delete"):
        assert kinds[kind], f"the reference run made no {kind} commit: {kinds}"
    commits_before = [0]
    for op, _ in ref.calls:
        commits_before.append(commits_before[-1] + (op == "catalog_commit"))

    states = skipped = recovery_states = 0
    per_kind: Counter[str] = Counter()
    for k in range(n + 1):
        # One run per crash point; each damage mode is then applied to its own copy.
        live = tmp_path / f"k{k}" / "live"
        fs = FaultyFileSystem(crash_at=k)
        run = _Run(workload, live, fs)
        run.go()
        assert _shape(fs.log[:k], live) == _shape(ref.calls[:k], ref.root), "the workload is not deterministic"
        where = f"{workload.name}: crash before call {k} ({ref.calls[k][0] if k < n else 'end'}, in '{run.crashed_in}')"
        committed = run.committed()
        assert committed == ref.states[commits_before[k]], \
            f"{where}: the catalog shows a state the uncrashed run never committed at this point"
        cutoff = run.clock.now + workload.config.tick_time_ms
        exp = expect(committed, live / "ledgers", cutoff) if live.is_dir() else Expectation()
        assert {(ledger, entry) for _, ledger, entry in exp.triples} <= universe, \
            f"{where}: a sealed bucket holds an index the workload never added"
        abandon_store(run.store)
        if not live.is_dir():
            continue  # died before the store directory existed: nothing to recover
        seen: set[object] = set()
        for damage in DAMAGES:
            for s in range(SCALE if damage.data is DataLoss.TORN else 1):
                rng_seed = k * 1000 + s
                signature = fs.state_signature(damage, random.Random(rng_seed), str(live))
                if signature in seen:
                    skipped += 1  # this mode leaves the same disk as one already checked
                    continue
                seen.add(signature)
                context = f"{where}, damage {damage}, seed {s}"
                case = tmp_path / f"k{k}" / f"{damage.name}-{s}"
                shutil.copytree(live, case)
                fs.materialize(damage, random.Random(rng_seed), relocate=(str(live), str(case)))
                # Crash the recovery too, for a rotating share of the states: on
                # copies of the crashed image, before the recovery below changes it.
                if (k + DAMAGES.index(damage)) % max(1, 6 // SCALE) == 0 and s == 0:
                    recovery_states += _crash_during_recovery(case, workload, run.clock, exp, universe,
                                                              damage, rng_seed, context)
                _reopen_and_check(case, workload, run.clock, exp, universe, context)
                shutil.rmtree(case)
                states += 1
                if 0 < commits_before[k] <= len(ref.commit_kinds):
                    per_kind[ref.commit_kinds[commits_before[k] - 1]] += 1
        shutil.rmtree(live)
    elapsed = time.perf_counter() - started
    print(f"\n{workload.name}: {n} numbered calls, commits {dict(kinds)}; ran {states} crash states "
          f"({skipped} duplicate images skipped) and {recovery_states} crashes during recovery "
          f"in {elapsed:.1f}s; states by last commit: {dict(per_kind)}")
    assert states >= n  # at least one distinct image per crash point


def test_old_ledger_after_recovery_does_not_widen_the_mutable_bucket_over_a_sealed_one(tmp_path: Path) -> None:
    """Found by the crash state machine. After a recovery the mutable bucket is empty;
    an index for a ledger *below* a recovered bucket must go straight to the queue.
    Put in the mutable bucket, it widened it across the sealed range [2, 2]; the
    next seal registered [1, 4], and the following recovery took [2, 2] for a
    merge leftover enclosed by [1, 4] and deleted it: six durable indexes lost."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        tracker.add_messages([(2, e, 5_000 + e) for e in range(6)])
        tracker.add_messages([(3, e, 5_000 + e) for e in range(6)])  # seals [2, 2]
    with bucketstore.open(tmp_path) as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        tracker.add_message(1, 0, 5_000)  # an old ledger, below the sealed bucket
        tracker.add_messages([(4, e, 5_000 + e) for e in range(3)])
        tracker.add_message(5, 0, 5_000)  # rolls over: seals the mutable bucket
        tracker._check()
    with bucketstore.open(tmp_path) as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        assert all(tracker.contains_message(2, e) for e in range(6)), "the sealed bucket [2, 2] was lost"
