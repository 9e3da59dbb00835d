"""Crash-point enumeration in ``durability="journal"``: crash before every durable call, under every damage mode.

Each workload (adds across rolling ledgers that seal buckets and checkpoint the
journal, deliveries that move the frontier and exhaust and delete buckets,
re-adds of delivered positions, a flush, a mark-delete that trims, a clear,
merges with ``max_num_buckets=2``, and a clean reopen mid-way) runs once to
count its numbered calls (journal group writes and fsyncs, checkpoint
create/write/fsync/rename/directory fsync/unlinks, ledger writes, catalog
commits). Then for every k it runs again with ``sync_interval_ms=0`` and dies
before call k; every call that returned is applied to a :class:`Model` (and its
result compared), and the call in flight is remembered. The disk is damaged six
ways (``bucketstore.testing.faults.DAMAGES``), the store reopened with the real file
layer, and checked against :class:`bucketstore.testing.oracle.JournalBounds`:

(i)   recovery succeeds under every damage mode (each loses only unsynced data);
(ii)  nothing acknowledged is lost: every index whose add returned and that no
      returned delivery or mark-delete removed is tracked, due or not;
(iii) the delivery handoff is at-least-once (``delivery="at-least-once"``): a
      delivery confirmed by a returned call (the next delivery call, ``flush``,
      ``confirm_delivered``) never comes back, and every unconfirmed one does
      (unless its position was tracked again: then at its new time);
(iv)  no phantom: every tracked index was added, at its time;
(v)   the catalog and the files agree (no orphan, no ``*.tmp``, every key's file
      verifies), and the journal is exactly one complete checkpoint file;
(vi)  delivery after recovery: what is due now comes out (and nothing early, as
      a re-added position's old row would), then everything else.

A rotating share of the crash images is reopened through the faulty layer and
crashed again before each call of its recovery (journal replay, tail cut,
checkpoint, bucket deletes), then recovered and checked the same way.

``BUCKETSTORE_CRASH_SCALE`` (default 1) multiplies the tear points tried per
unsynced tail and the share of recoveries crashed.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bucketstore.testing.faults import DAMAGES, Damage, FaultyFileSystem, SimulatedCrash, abandon_store
from bucketstore.engine.store.store import Store

from bucketstore.testing.oracle import (JournalBounds, Model, check_deliveries, check_files, check_journal_files,
                          check_journal_recovered, reseed)
from bucketstore.testing.crash_points import (BACKGROUND_MERGE_STEPS, BACKGROUND_STEPS, BG_INSTALL, BG_WORK, MERGING,
                                              REOPEN, SIDE_BY_SIDE_STEPS, SMALL, STEPS, TRACKER, Run, Workload,
                                              crashed_recoveries, damaged_images, reference, shape)
from helpers import FakeClock

SCALE = int(os.environ.get("BUCKETSTORE_CRASH_SCALE", "1"))
JOURNAL = "journal"
#: One crash image in this many (divided by SCALE) also has its recovery crashed at every call;
#: fewer for the longest workload, whose recoveries the others' already cover, to keep CI short.
RECOVERY_CRASH_EVERY = {"journal-side-by-side": 120}


class ModelTracker:
    """A tracker proxy that checks every returned call against a :class:`Model`.

    Before a call it computes the model's outcome on a copy; if the call returns,
    the results must agree and the copy becomes the model; if the process dies
    inside it, ``in_flight`` keeps the (before, after) pair for the oracle.
    """

    def __init__(self, tracker: Any, holder: "ModelHolder") -> None:
        self._t = tracker
        self._h = holder

    def _op(self, apply: Callable[[Model], object], call: Callable[[], object]) -> object:
        after = self._h.model.copy()
        expected = apply(after)
        self._h.in_flight = after
        before = self._h.model
        result = call()
        assert result == expected, f"tracker returned {result!r}, the model {expected!r}"
        self._h.model, self._h.in_flight = after, None
        self._h.returned(before, after)
        return result

    def add_message(self, ledger: int, entry: int, at: int) -> bool:
        return self._op(lambda m: m.add(ledger, entry, at), lambda: self._t.add_message(ledger, entry, at))

    def add_messages(self, rows: list[tuple[int, int, int]]) -> int:
        return self._op(lambda m: m.add_batch(rows), lambda: self._t.add_messages(rows))

    def get_scheduled_messages(self, n: int) -> list[tuple[int, int]]:
        return self._op(lambda m: m.pop(n), lambda: self._t.get_scheduled_messages(n))

    def mark_delete(self, ledger: int, entry: int) -> None:
        return self._op(lambda m: m.mark_delete(ledger, entry), lambda: self._t.mark_delete(ledger, entry))

    def clear(self) -> None:
        return self._op(lambda m: m.clear(), self._t.clear)

    def flush(self) -> None:
        return self._op(lambda m: m.flush(), self._t.flush)

    def confirm_delivered(self) -> None:
        return self._op(lambda m: m.confirm(), self._t.confirm_delivered)


class ModelHolder:
    """The model of one run, shared by the proxies of its successive trackers."""

    def __init__(self, clock: FakeClock, tick_ms: int) -> None:
        self.model = Model(clock, tick_ms)
        self.in_flight: Model | None = None

    def wrap(self, tracker: Any) -> ModelTracker:
        # A clean reopen must recover exactly the model (nothing in flight, nothing lost): what
        # was tracked, and the deliveries nobody confirmed (a close does not confirm).
        expected = self.model.recoverable
        got = {p for p in expected if tracker.contains_message(*p)}
        assert got == expected.keys() and tracker.number_of_delayed_messages == len(got), \
            "a clean reopen did not recover exactly what was tracked and not confirmed"
        self.model.reopened()
        self.model.advance()
        return ModelTracker(tracker, self)

    def bounds(self) -> JournalBounds:
        return JournalBounds(self.model, self.in_flight or self.model)

    def returned(self, before: Model, after: Model) -> None:
        """A call returned, taking the model from ``before`` to ``after``."""


class WindowHolder(ModelHolder):
    """The model of a run with ``sync_interval_ms > 0``: what is durable lags behind.

    The journal is synced only at a flush, a checkpoint (every seal, clear and
    recovery) and a clean close; with an interval longer than the run, never by
    the clock, so the run is deterministic. ``window`` holds every model state
    since the state before the last call that touched the journal durably: the
    durable state is one of them (or in between), so a recovery must hold what
    every one of them holds and nothing none of them holds.
    """

    def __init__(self, clock: FakeClock, tick_ms: int, fs: FaultyFileSystem) -> None:
        super().__init__(clock, tick_ms)
        self.fs = fs
        self.window: list[Model] = [self.model]
        self._synced_at = 0

    def _synced_since(self) -> bool:
        log = self.fs.log
        synced = any(op in ("fsync", "rename") and "journal" in target for op, target in log[self._synced_at:])
        self._synced_at = len(log)
        return synced

    def wrap(self, tracker: Any) -> ModelTracker:
        proxy = super().wrap(tracker)  # a clean close syncs: the reopened tracker is exact
        self.window = [self.model]
        self._synced_at = len(self.fs.log)
        return proxy

    def returned(self, before: Model, after: Model) -> None:
        self.window = [before, after] if self._synced_since() else self.window + [after]

    def window_bounds(self) -> tuple[set[tuple[int, int]], set[tuple[int, int]], Model]:
        """(must, may, oldest): positions recoverable (tracked, or delivered unconfirmed) in
        every state since the last sync (and the call in flight), positions recoverable in any
        of them, and the oldest such state."""
        states = self.window + ([self.in_flight] if self.in_flight is not None else [])
        must = set.intersection(*(set(m.recoverable) for m in states))
        may = set.union(*(set(m.recoverable) for m in states))
        return must, may, self.window[0]


def _redeliver_later(tracker: Any, clock: FakeClock) -> None:
    """Re-add positions delivered by the previous step with later times: the old rows stay in
    their sealed segments and must never deliver them early, after a crash or a merge. (3, 0)
    was the last delivered (the frontier); (2, 0) sits in a segment wholly before it."""
    tracker.add_message(3, 0, clock.now + 700)
    tracker.add_message(2, 0, clock.now + 650)


JOURNAL_STEPS = (
    STEPS[:2]
    + (("re-add delivered positions", _redeliver_later),
       ("flush", lambda t, c: t.flush()))
    + STEPS[2:3]  # deliver more: a batch left unconfirmed while ...
    + STEPS[4:5]  # ... the seals that follow checkpoint the journal
    + (("confirm", lambda t, c: t.confirm_delivered()),)
    + STEPS[3:4]  # mark-delete
    + STEPS[5:]
)

def _redeliver_merged(tracker: Any, clock: FakeClock) -> None:
    """Re-add positions of the merge's sources, delivered while it writes, with later times."""
    tracker.add_message(1, 4, clock.now + 650)
    tracker.add_message(2, 1, clock.now + 700)


_FLUSH = ("flush (waits for the pending jobs)", lambda t, c: t.flush())
_CONFIRM = ("confirm", lambda t, c: t.confirm_delivered())

#: BACKGROUND_STEPS with the journal's own calls between a job's write and its install: a
#: delivered position re-added while its seal is in flight, a confirmation, a flush.
JOURNAL_BACKGROUND_STEPS = (
    BACKGROUND_STEPS[:3]
    + (("re-add delivered positions, their seal in flight", _redeliver_later),)
    + BACKGROUND_STEPS[3:10]
    + (_CONFIRM,)
    + BACKGROUND_STEPS[10:15]
    + (_FLUSH,)
    + BACKGROUND_STEPS[15:]
)
JOURNAL_BACKGROUND_MERGE_STEPS = (
    BACKGROUND_MERGE_STEPS[:6]
    + (("re-add delivered positions of the merge's sources", _redeliver_merged),)
    + BACKGROUND_MERGE_STEPS[6:12]
    + (_CONFIRM,)
    + BACKGROUND_MERGE_STEPS[12:15]
    + (("seal more", BACKGROUND_MERGE_STEPS[9][1]), ("background: the next seal writes", BG_WORK),
       ("background: it installs", BG_INSTALL), _FLUSH)
    + BACKGROUND_MERGE_STEPS[15:]
)

def _re_add_beside_seal(tracker: Any, clock: FakeClock) -> None:
    """Re-add, with later times, (1, 4), just delivered and not confirmed, and (2, 0), whose old
    row is in the written file of the seal not installed yet."""
    tracker.add_message(1, 4, clock.now + 700)
    tracker.add_message(2, 0, clock.now + 650)


#: SIDE_BY_SIDE_STEPS with a batch left unconfirmed across the two seals' installs (the first
#: one checkpoints the journal holding it) and confirmed while a merge and a seal are in flight.
JOURNAL_SIDE_BY_SIDE_STEPS = (
    SIDE_BY_SIDE_STEPS[:7]
    + (("re-add a delivered position, and one of the seal in flight, later", _re_add_beside_seal),)
    + SIDE_BY_SIDE_STEPS[7:12]
    + (_CONFIRM,)
    + SIDE_BY_SIDE_STEPS[12:]
)

WORKLOADS = [
    Workload("journal-lifecycle", SMALL, JOURNAL_STEPS),
    Workload("journal-merging", MERGING, JOURNAL_STEPS),
    # Reopened cleanly right after a delivery nobody confirmed (a close does not confirm):
    # the batch comes back on the reopen.
    Workload("journal-reopened", SMALL, JOURNAL_STEPS[:6] + (("reopen", REOPEN),) + JOURNAL_STEPS[7:]),
    # Seals and merges as background jobs on a stepped worker (see test_crash_points.py):
    # among the crash points, those between a seal's catalog commit and the journal
    # checkpoint that retires its rows.
    Workload("journal-background", SMALL, JOURNAL_BACKGROUND_STEPS, background=True, max_pending_maintenance=3),
    Workload("journal-background-merging", MERGING, JOURNAL_BACKGROUND_MERGE_STEPS, background=True,
             max_pending_maintenance=4),
    # Two jobs in flight together (see test_crash_points.py), with the journal's checkpoints: a
    # seal's install checkpoints while the next seal's file already holds untracked positions.
    Workload("journal-side-by-side", MERGING, JOURNAL_SIDE_BY_SIDE_STEPS, background=True,
             max_pending_maintenance=4, side_by_side=frozenset({("create", "create"), ("merge", "create"),
                                                                ("create", "merge")})),
]


def _recover_and_check(path: Path, workload: Workload, clock: FakeClock, bounds: JournalBounds,
                       universe: set[tuple[int, int]], context: str, *, deliver_all: bool) -> None:
    store = Store(path, durability=JOURNAL)
    try:
        tracker = store.tracker(TRACKER, workload.config, clock)
        got = check_journal_recovered(tracker, bounds, universe, context)
        check_files(store, TRACKER, context)
        check_journal_files(path, TRACKER, context)
        if deliver_all:
            model = reseed(bounds, got, tracker)
            check_deliveries(tracker, model, context + ", due now")
            clock.advance(10_000)  # everything else falls due: it all comes out, once
            check_deliveries(tracker, model, context + ", all")
            clock.advance(-10_000)
    finally:
        store.close()


def _crash_during_recovery(path: Path, workload: Workload, clock: FakeClock, bounds: JournalBounds,
                           universe: set[tuple[int, int]], damage: Damage, seed: int, context: str) -> int:
    """Reopen copies of the crashed image through the faulty layer, crash the recovery before
    each of its calls in turn, damage, reopen and check. Returns how many states ran."""
    ran = 0
    for j, again in crashed_recoveries(path, workload.config, clock, damage, seed, durability=JOURNAL):
        _recover_and_check(again, workload, clock, bounds, universe, f"{context}, recovery crashed before call {j}",
                           deliver_all=False)
        ran += 1
    return ran


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_journal_crash_point_recovers(workload: Workload, tmp_path: Path) -> None:
    started = time.perf_counter()
    universe = workload.universe()
    ref = reference(workload, tmp_path / "reference" / "store", durability=JOURNAL)
    n = len(ref.calls)
    kinds = Counter(ref.commit_kinds)
    ops = Counter(op for op, _ in ref.calls)
    journal_renames = sum(1 for op, target in ref.calls if op == "rename" and target.endswith(".journal"))
    # The workload must exercise what it claims to: seals that checkpoint the journal,
    # deletes of exhausted buckets, a trim, merges where the tracker merges.
    for kind in ("seal", "delete", "mark-delete") + (("merge",) if workload.config.max_num_buckets > 0 else ()):
        assert kinds[kind], f"the reference run made no {kind} commit: {kinds}"
    assert journal_renames >= kinds["seal"], "a seal did not checkpoint the journal"
    # Background runs: the crash points inside each kind of background half-step, and those
    # after a seal's catalog commit and before the checkpoint that retires its journal rows.
    in_background: Counter[str] = Counter()
    for k in range(n):
        step = ref.background_step_at(k)
        if step is not None:
            in_background[step] += 1
    committed_not_checkpointed = 0
    for kind, phase, first, end in ref.background_steps:
        if (kind, phase) == ("create", "install"):
            ops_in = [op for op, _ in ref.calls[first:end]]
            if "catalog_commit" in ops_in:
                committed_not_checkpointed += len(ops_in) - 1 - ops_in.index("catalog_commit")
    if workload.background:
        assert committed_not_checkpointed, "no crash point between a seal's commit and its checkpoint"
        if workload.config is MERGING:
            assert in_background["merge-work"] and in_background["merge-install"], dict(in_background)
        assert workload.side_by_side <= set(ref.side_by_side), \
            f"jobs never held in flight together: {workload.side_by_side - set(ref.side_by_side)}"

    states = skipped = recovery_states = 0
    in_flight: Counter[str] = Counter()
    for k in range(n + 1):
        live = tmp_path / f"k{k}" / "live"
        fs = FaultyFileSystem(crash_at=k)
        run = Run(workload, live, fs, durability=JOURNAL)
        holder = ModelHolder(run.clock, workload.config.tick_time_ms)
        run.wrap = holder.wrap
        run.go()
        assert shape(fs.log[:k], live) == shape(ref.calls[:k], ref.root), "the workload is not deterministic"
        op = ref.calls[k][0] if k < n else "end"
        where = f"{workload.name}: crash before call {k} ({op}, in '{run.crashed_in}')"
        bounds = holder.bounds()
        abandon_store(run.store)
        if not live.is_dir():
            continue  # died before the store directory existed: nothing to recover
        in_flight[run.crashed_in] += 1
        skip = [0]
        for image in damaged_images(fs, live, k, tmp_path, where, SCALE, skip):
            if (k + DAMAGES.index(image.damage)) % max(1, RECOVERY_CRASH_EVERY.get(workload.name, 40) // SCALE) == 0 \
                    and image.seed == 0:
                recovery_states += _crash_during_recovery(image.case, workload, run.clock, bounds, universe,
                                                          image.damage, image.rng_seed, image.context)
            _recover_and_check(image.case, workload, run.clock, bounds, universe, image.context, deliver_all=True)
            states += 1
        skipped += skip[0]
        shutil.rmtree(live)
    elapsed = time.perf_counter() - started
    print(f"\n{workload.name}: {n} numbered calls {dict(ops)}, commits {dict(kinds)}; ran {states} crash states "
          f"({skipped} duplicate images skipped) and {recovery_states} crashes during recovery in {elapsed:.1f}s"
          + (f"; crash points inside background steps {dict(in_background)}, {committed_not_checkpointed} of "
             "them after a seal's catalog commit, before its checkpoint" if workload.background else ""))
    assert states >= n  # at least one distinct image per crash point


def test_a_crash_before_the_first_group_commit_of_an_add_loses_only_that_add(tmp_path: Path) -> None:
    """The point of journal mode, spelled out once: with ``sync_interval_ms=0`` an add is durable
    when it returns, and a crash inside the next add (before its fsync) loses only that one."""
    clock = FakeClock(1_000)
    fs = FaultyFileSystem()
    store = Store(tmp_path, durability=JOURNAL, fs=fs)
    fs.attach(store.catalog)
    tracker = store.tracker(TRACKER, SMALL, clock)
    assert tracker.add_message(1, 0, 5_000)
    fs.crash_at = fs.calls + 1  # the write of the next group happens, its fsync does not
    with pytest.raises(SimulatedCrash):
        tracker.add_message(1, 1, 5_000)
    abandon_store(store)
    fs.materialize(DAMAGES[1], random.Random(0))  # only what was synced survives
    with Store(tmp_path, durability=JOURNAL) as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        assert tracker.contains_message(1, 0) and not tracker.contains_message(1, 1)


@pytest.mark.parametrize("window", ["adds", "confirmations"])
@pytest.mark.parametrize("workload", WORKLOADS[:1 if SCALE == 1 else 3], ids=lambda w: w.name)
def test_every_journal_crash_point_with_a_sync_window_recovers(workload: Workload, window: str,
                                                               tmp_path: Path) -> None:
    """``sync_interval_ms > 0`` (``adds``): acknowledged adds and deliveries since the last sync
    may be lost or come back (the window the setting trades for throughput), never more:
    everything tracked throughout the window is recovered, nothing outside it appears, and the
    files are clean. ``confirm_sync_ms > 0`` with ``sync_interval_ms=0`` (``confirmations``):
    only confirmations wait (for the next add, flush, checkpoint or bucket deletion), so the
    window never spans an add: the same bounds hold, and confirmed batches do come back."""
    # Longer than the run: syncs come only from flush, checkpoints and close (and, for
    # "confirmations", every add).
    windows = {"sync_interval_ms": 10**9} if window == "adds" else {"confirm_sync_ms": 10**9}
    universe = workload.universe()
    ref = reference(workload, tmp_path / "reference" / "store", durability=JOURNAL, **windows)
    n = len(ref.calls)
    states = lost_window = back_window = 0
    for k in range(n + 1):
        live = tmp_path / f"k{k}" / "live"
        fs = FaultyFileSystem(crash_at=k)
        run = Run(workload, live, fs, durability=JOURNAL, **windows)
        holder = WindowHolder(run.clock, workload.config.tick_time_ms, fs)
        run.wrap = holder.wrap
        run.go()
        where = f"{workload.name} (sync window): crash before call {k} (in '{run.crashed_in}')"
        must, may, oldest = holder.window_bounds()
        abandon_store(run.store)
        if not live.is_dir():
            continue
        skip = [0]
        for image in damaged_images(fs, live, k, tmp_path, where, SCALE, skip):
            store = Store(image.case, durability=JOURNAL)
            try:
                tracker = store.tracker(TRACKER, workload.config, run.clock)
                tracker._check()
                got = {p for p in universe if tracker.contains_message(*p)}
                context = image.context
                assert tracker.number_of_delayed_messages == len(got), f"{context}: count"
                assert not must - got, f"{context}: lost {sorted(must - got)[:5]}, tracked throughout the window"
                assert not got - may, f"{context}: {sorted(got - may)[:5]} tracked, never in the window"
                lost_window += len(holder.model.recoverable.keys() - got)
                back_window += len(got - holder.model.recoverable.keys())
                fr = oldest.durable_frontier
                assert tracker.stats()["cutoff"] >= (fr[0] if fr else 0), f"{context}: cutoff behind the frontier"
                check_files(store, TRACKER, context)
                check_journal_files(image.case, TRACKER, context)
                run.clock.advance(10**6)  # everything recovered comes out, once
                out = tracker.get_scheduled_messages(10**9)
                run.clock.advance(-10**6)
                assert sorted(out) == sorted(got) and len(set(out)) == len(out), f"{context}: delivery after recovery"
            finally:
                store.close()
            states += 1
        shutil.rmtree(live)
    print(f"\n{workload.name} ({window} window): {n} numbered calls, {states} crash states, "
          + (f"{lost_window} acknowledged adds lost inside the window in all" if window == "adds" else
             f"{back_window} confirmed deliveries back inside the window in all"))
    assert states >= n
    if window == "adds":
        assert lost_window > 0, "the window never lost anything: the enumeration does not reach it"
    else:  # (every add commits: the window, reset at each, never spans one; "must" checks that)
        assert back_window > 0, "no confirmation ever came back: the enumeration does not reach the window"
