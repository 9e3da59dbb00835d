"""Crash-point enumeration: crash a fixed workload before every durable call, under every damage mode.

A workload (adds across rolling ledgers that seal buckets, deliveries that
exhaust and delete them, a mark-delete that trims, a clear, and merges when the
tracker merges) runs once through a counting :class:`FaultyFileSystem` to learn
its N numbered calls and the catalog state after each commit. Then, for every
k in 0..N and every damage mode, it runs again and dies before call k; the
model of the disk is damaged as that mode says a crash could; the store is
reopened with the real file layer and checked (see ``bucketstore.testing.oracle``):

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
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

import bucketstore
from bucketstore.testing.faults import DAMAGES, Damage, FaultyFileSystem, abandon_store

from bucketstore.testing.oracle import Expectation, check_files, check_recovered, expect
from bucketstore.testing.crash_points import (BACKGROUND_MERGE_STEPS, BACKGROUND_STEPS, MERGING, REOPEN,
                                              SIDE_BY_SIDE_STEPS, SMALL, STEPS, TRACKER, Run, Workload,
                                              crashed_recoveries, damaged_images, reference, shape)
from helpers import FakeClock

SCALE = int(os.environ.get("BUCKETSTORE_CRASH_SCALE", "1"))
#: The pairs (job behind, oldest job) the side-by-side workload holds in flight together.
SIDE_BY_SIDE = frozenset({("create", "create"), ("merge", "create"), ("create", "merge")})

WORKLOADS = [
    Workload("lifecycle", SMALL, STEPS),
    # With at most two buckets, a tracker that merges does so after nearly every
    # seal; one that does not still runs the same seals, deletes and trims.
    Workload("merging", MERGING, STEPS),
    # A clean close and reopen after the trim: the recovery (due buckets deleted,
    # a durable mark-delete applied) is itself crashed at every call.
    Workload("reopened", SMALL, STEPS[:4] + (("reopen", REOPEN),) + STEPS[4:]),
    # Seals and merges as background jobs on a stepped worker: crash points inside a job's
    # write, between its write and its install, inside the install (catalog commit, then a
    # merge's source deletion), and with tracker calls run between them.
    Workload("background", SMALL, BACKGROUND_STEPS, background=True, max_pending_maintenance=3),
    Workload("background-merging", MERGING, BACKGROUND_MERGE_STEPS, background=True, max_pending_maintenance=4),
    # Two jobs in flight together, as the two maintenance threads run them: the second one's
    # write before the first one's (and tracker calls between), installs in submission order.
    Workload("side-by-side", MERGING, SIDE_BY_SIDE_STEPS, background=True, max_pending_maintenance=4,
             side_by_side=SIDE_BY_SIDE),
]


def _reopen_and_check(path: Path, workload: Workload, clock: FakeClock, exp: Expectation,
                      universe: set[tuple[int, int]], context: str) -> None:
    with bucketstore.open(path, durability="sealed") as store:
        tracker = store.tracker(TRACKER, workload.config, clock)
        check_recovered(tracker, exp, universe, context)
        check_files(store, TRACKER, context)


def _crash_during_recovery(path: Path, workload: Workload, clock: FakeClock, exp: Expectation,
                           universe: set[tuple[int, int]], damage: Damage, seed: int, context: str) -> int:
    """Reopen through the faulty layer, crash before each recovery call in turn, reopen again.
    Each round works on a copy of the crashed store. Returns how many states it ran."""
    ran = 0
    for j, again in crashed_recoveries(path, workload.config, clock, damage, seed):
        _reopen_and_check(again, workload, clock, exp, universe, f"{context}, recovery crashed before call {j}")
        ran += 1
    return ran


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_crash_point_recovers(workload: Workload, tmp_path: Path) -> None:
    started = time.perf_counter()
    universe = workload.universe()
    ref = reference(workload, tmp_path / "reference" / "store")
    n = len(ref.calls)
    kinds = Counter(ref.commit_kinds)
    # The workload must exercise what it claims to (merges only where the tracker merges).
    for kind in ("seal", "delete", "mark-delete") + (("merge",) if workload.background and workload.config is MERGING else ()):
        assert kinds[kind], f"the reference run made no {kind} commit: {kinds}"
    if workload.background:
        phases = Counter((kind, phase) for kind, phase, _, _ in ref.background_steps)
        assert phases[("create", "work")] and phases[("create", "install")], f"no background seal ran: {phases}"
        if workload.config is MERGING:
            assert phases[("merge", "install")] >= 2, f"no background merge ran: {phases}"
        assert workload.side_by_side <= set(ref.side_by_side), \
            f"jobs never held in flight together: {workload.side_by_side - set(ref.side_by_side)}"
    commits_before = [0]
    for op, _ in ref.calls:
        commits_before.append(commits_before[-1] + (op == "catalog_commit"))

    states = skipped = recovery_states = 0
    per_kind: Counter[str] = Counter()
    in_background: Counter[str] = Counter()
    for k in range(n + 1):
        # One run per crash point; each damage mode is then applied to its own copy.
        live = tmp_path / f"k{k}" / "live"
        fs = FaultyFileSystem(crash_at=k)
        run = Run(workload, live, fs)
        run.go()
        assert shape(fs.log[:k], live) == shape(ref.calls[:k], ref.root), "the workload is not deterministic"
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
        step = ref.background_step_at(k)
        if step is not None:
            in_background[step] += 1  # the process died inside this background half-step
        skip = [0]
        for image in damaged_images(fs, live, k, tmp_path, where, SCALE, skip):
            # Crash the recovery too, for a rotating share of the states: on
            # copies of the crashed image, before the recovery below changes it.
            if (k + DAMAGES.index(image.damage)) % max(1, 6 // SCALE) == 0 and image.seed == 0:
                recovery_states += _crash_during_recovery(image.case, workload, run.clock, exp, universe,
                                                          image.damage, image.rng_seed, image.context)
            _reopen_and_check(image.case, workload, run.clock, exp, universe, image.context)
            states += 1
            if 0 < commits_before[k] <= len(ref.commit_kinds):
                per_kind[ref.commit_kinds[commits_before[k] - 1]] += 1
        skipped += skip[0]
        shutil.rmtree(live)
    elapsed = time.perf_counter() - started
    print(f"\n{workload.name}: {n} numbered calls, commits {dict(kinds)}; ran {states} crash states "
          f"({skipped} duplicate images skipped) and {recovery_states} crashes during recovery "
          f"in {elapsed:.1f}s; states by last commit: {dict(per_kind)}"
          + (f"; crash points inside background steps: {dict(in_background)}" if workload.background else ""))
    assert states >= n  # at least one distinct image per crash point


def test_old_ledger_after_recovery_does_not_widen_the_mutable_bucket_over_a_sealed_one(tmp_path: Path) -> None:
    """Found by the crash state machine. After a recovery the mutable bucket is empty;
    an index for a ledger *below* a recovered bucket must go straight to the queue.
    Put in the mutable bucket, it widened it across the sealed range [2, 2]; the
    next seal registered [1, 4], and the following recovery took [2, 2] for a
    merge leftover enclosed by [1, 4] and deleted it: six durable indexes lost."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="sealed") as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        tracker.add_messages([(2, e, 5_000 + e) for e in range(6)])
        tracker.add_messages([(3, e, 5_000 + e) for e in range(6)])  # seals [2, 2]
    with bucketstore.open(tmp_path, durability="sealed") as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        tracker.add_message(1, 0, 5_000)  # an old ledger, below the sealed bucket
        tracker.add_messages([(4, e, 5_000 + e) for e in range(3)])
        tracker.add_message(5, 0, 5_000)  # rolls over: seals the mutable bucket
        tracker._check()
    with bucketstore.open(tmp_path, durability="sealed") as store:
        tracker = store.tracker(TRACKER, SMALL, clock)
        assert all(tracker.contains_message(2, e) for e in range(6)), "the sealed bucket [2, 2] was lost"
