"""Crash-point enumeration for topics: SIGKILL a real writer before each of its durable steps.

A scripted workload on one topic (:data:`WORKLOAD`) with four subscriptions: ``fast`` keeps up,
``far`` takes one batch early and then stalls, far behind the others (it holds the rows), ``gone``
is deleted mid-run, ``late`` is created mid-run with ``start="latest"`` (and cleared), ``late2``
is created and deleted; adds through the topic and through subscriptions, re-adds of delivered
positions (some still tracked by another subscription: a position with two rows), a due add
that untracks for all, deliveries at different clocks, confirmations, mark-deletes (one over
part of an unconfirmed batch), flushes, a clean restart, and an unconfirmed batch at the end.

It runs in a forked child (:func:`bucketstore.testing.topic_crash.run_ops`) that numbers its
durable steps, each commit and sync of the topic environment and each durable call of the
store's file layer (:class:`~bucketstore.testing.topic_crash.DurableSteps`), once to count
them (N), then once per k < N, killed by SIGKILL just before step k. Each killed store is
reopened and every subscription held to :class:`~bucketstore.testing.topic_model.TopicModel`
(:func:`~bucketstore.testing.topic_crash.check_killed_store`): the calls that returned answered
as the model did; the store is the model's state before or after the call that made the last
commit (a killed process loses nothing committed: nothing acknowledged is lost, no confirmed or
acknowledged position comes back, a redelivery is only of a batch not confirmed); ``verify``
passes; draining delivers what that state delivers and leaves every count at 0.

Four modes: ``journal`` with ``sync_interval_ms=0`` (every add written before it returns),
``journal`` with a group commit longer than the run (adds wait for the next call that writes),
``journal`` with ``delivery="at-most-once"`` (a batch is gone for good once returned), and
``sealed`` (adds wait for ``min_index_count_per_bucket`` of them or a call that writes).

``BUCKETSTORE_TOPIC_CRASH_POINTS``: the crash points per mode, spread evenly over 0..N (the
first and the last among them); the default, ``all``, runs every one: 123, 81, 119 and 97 steps
(the sealed runs' file steps and seal commits among them), 424 killed writers in 22 s to 36 s per
mode on two shared cores (as loaded). A number below that shortens the run on a
slow machine; the random workloads (``test_topic_crash_random.py``) are the long-run knob.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bucketstore import TrackerConfig
from bucketstore.testing.topic_crash import candidates, check_killed_store, is_commit, run_ops
from bucketstore.testing.topic_model import TopicModel

POINTS = os.environ.get("BUCKETSTORE_TOPIC_CRASH_POINTS", "all")
CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=6)

WORKLOAD: list[tuple] = [
    ("open",),
    ("sub", "fast", "earliest"), ("sub", "far", "earliest"), ("sub", "gone", "earliest"),
    ("add", None, [(1, e, 50 + 40 * e) for e in range(5)]),
    ("add", "fast", [(2, 0, 100)]),
    ("advance", 120),
    ("deliver", "fast", 2),
    ("deliver", "gone", 5),
    ("deliver", "far", 1),                      # far's only batch for a long while
    ("add", None, [(3, e, 30 + 25 * e) for e in range(4)]),
    ("add", None, [(1, 1, 300)]),               # delivered by fast and gone, still far's old row: two rows
    ("add", "far", [(1, 0, 400)]),              # far re-adds what it was handed and did not confirm
    ("sub", "late", "latest"),
    ("add", "late", [(4, e, 60 + 10 * e) for e in range(3)]),
    ("deliver", "fast", 10),                    # confirms fast's first batch
    ("mark", "fast", 1, 3),                     # acknowledges part of the batch just returned
    ("confirm", "gone"),
    ("advance", 100),
    ("deliver", "late", 2),
    ("delete", "gone"),
    ("flush", None),
    ("add", None, [(3, 1, -5)]),                # due: untracked for every subscription
    ("add", None, [(5, e, 40 + 20 * e) for e in range(7)]),
    ("clear", "late"),
    ("add", "late", [(6, 0, 80)]),
    ("restart",),
    ("deliver", "fast", 3),
    ("add", None, [(6, 1, 90)]),
    ("add", None, [(6, 2, 95)]),
    ("deliver", "far", 2),
    ("advance", 200),
    ("deliver", "fast", 100),
    ("flush", "fast"),
    ("mark", "far", 3, 0),
    ("sub", "late2", "latest"),
    ("add", None, [(7, e, 30) for e in range(3)]),
    ("deliver", "late", 4),
    ("delete", "late2"),
    ("advance", 500),                           # every row due: the sealed runs are passed by all
    ("deliver", "far", 100), ("deliver", "late", 100), ("deliver", "fast", 100),
    ("flush", None),                            # their entries dropped, synced, files unlinked
    ("add", None, [(8, e, 20) for e in range(3)]),
    ("advance", 50),
    ("deliver", "fast", 2),                     # left unconfirmed: the kill at the end brings it back
]

MODES = {  # durability, sync_interval_ms, delivery
    "journal": ("journal", 0, "at-least-once"),
    "journal-grouped": ("journal", 10**9, "at-least-once"),
    "journal-at-most-once": ("journal", 0, "at-most-once"),
    "sealed": ("sealed", 0, "at-least-once"),
}


#: Runs merging: a topic that seals every add (``min_index_count_per_bucket=1``), so that its
#: eighth run merges the first eight (docs/topics.md, "Sealed runs"), with a due add of a sealed
#: row (a dead bound the merge drops) and subscriptions part way through, then drained.
MERGE_CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=1)
MERGE_WORKLOAD: list[tuple] = [
    ("open",),
    ("sub", "fast", "earliest"), ("sub", "slow", "earliest"),
    *[("add", None, [(1, e, 100 + 30 * e)]) for e in range(4)],
    ("add", None, [(1, 1, -5)]),                # due: a sealed row gone for all
    ("advance", 120),
    ("deliver", "fast", 2),
    *[("add", None, [(2, e, 50 + 20 * e)]) for e in range(5)],   # the eighth run: a merge
    ("mark", "slow", 1, 0),
    ("add", "slow", [(3, 0, 40)]),
    ("advance", 400),
    ("deliver", "fast", 100),
    ("deliver", "slow", 100),                   # every run passed: dropped, synced, unlinked
    ("deliver", "fast", 1),
]


def universe(workload: list[tuple] | None = None) -> set[tuple[int, int]]:
    out = {(lg, en) for op in (workload or WORKLOAD) if op[0] == "add" for lg, en, _ in op[2]}
    return out | {(lg, en + 1) for lg, en in out}  # and neighbours never added


def points(n: int) -> list[int]:
    """The crash points to run, of 0..n (n: killed after the last call)."""
    if POINTS == "all" or int(POINTS) >= n + 1:
        return list(range(n + 1))
    want = max(2, int(POINTS))
    return sorted({round(i * n / (want - 1)) for i in range(want)})


@pytest.mark.parametrize("mode", sorted(MODES))
def test_killed_topic_writer_recovers_at_every_durable_step(mode: str, tmp_path: Path) -> None:
    dry = enumerate_crash_points(mode, tmp_path, WORKLOAD, CONFIG)
    if MODES[mode][:2] == ("journal", 0):
        # The topic's journal: each add's group appended and fsynced, the adds moved into the
        # index by commits that change no answer, and checkpoints (a new file named by its
        # rename, the older files deleted) at the restart's close and after its replay.
        journal = [(kind, target.rsplit(".", 1)[-1] if "/journal/" in target else "")
                   for kind, target, _ in dry.steps]
        assert {("write", "journal"), ("fsync", "journal"), ("create", "tmp"), ("fsync", "tmp"),
                ("unlink", "journal")} <= set(journal), set(journal)
        assert any(kind == "rename" and target.endswith(".journal") for kind, target, _ in dry.steps)
        assert any(kind == "topic_apply_commit" for kind, _, _ in dry.steps)


def test_killed_topic_writer_recovers_while_runs_merge(tmp_path: Path) -> None:
    """Every durable step of a merge (its file, its commit, the old files' unlinks), besides
    seals and drops, in journal mode: there a seal's worth of adds (one here) goes from the
    topic's journal straight into a run, listed by the commit that moves them into the index
    (``topic_apply_commit``)."""
    dry = enumerate_crash_points("journal", tmp_path, MERGE_WORKLOAD, MERGE_CONFIG)
    runs = sum(1 for kind, target, _ in dry.steps if kind == "rename" and target.endswith(".run"))
    assert runs > 9  # 9 seals and a merge
    assert sum(1 for kind, _, _ in dry.steps if kind == "topic_apply_commit") > 8
    assert sum(1 for kind, _, _ in dry.steps if kind == "topic_seal_commit") >= 1  # the merge


def enumerate_crash_points(mode: str, tmp_path: Path, workload: list[tuple], config: TrackerConfig) -> Any:
    """Run ``workload`` once to number its durable steps, then once killed before each; hold
    each killed store to the model. The uncrashed run (a ``ChildRun``)."""
    durability, interval, delivery = MODES[mode]
    WORKLOAD, CONFIG = workload, config  # noqa: N806 - the names the checks below read
    started = time.perf_counter()
    states, answers = TopicModel(CONFIG.tick_time_ms, at_least_once=delivery == "at-least-once").states(WORKLOAD)
    every = universe(WORKLOAD)
    dry = run_ops(tmp_path / "dry", WORKLOAD, durability=durability, sync_interval_ms=interval, config=CONFIG,
                  delivery=delivery)
    assert dry.error is None, dry.error
    assert dry.signal == signal.SIGKILL and dry.returned == len(WORKLOAD)
    assert [a if not isinstance(a, list) else [tuple(p) for p in a] for a in dry.answers] == answers
    n = len(dry.steps)
    kinds = {kind for kind, _, _ in dry.steps}
    assert {"topic_commit", "topic_sync"} <= kinds, kinds
    # Sealed runs: written, fsynced, renamed, listed (a seal's commit) and, once every
    # subscription is past them, unlinked (their files are the store's file-layer steps).
    assert {"topic_seal_commit", "create", "write", "fsync", "rename", "fsync_dir", "unlink"} <= kinds, kinds
    # Every kind of call commits somewhere in the run (what each crash point can cut); with a
    # group commit longer than the run, adds and confirmations wait for the next call that
    # writes; at-most-once leaves nothing to confirm.
    committing = {WORKLOAD[op][0] for kind, target, op in dry.steps if is_commit(kind, target)}
    calls = {"open", "sub", "delete", "deliver", "mark", "clear", "restart"} & {op[0] for op in WORKLOAD}
    calls |= {"add"} if mode != "journal-grouped" else set()
    calls |= {"flush"} if delivery == "at-least-once" else set()
    calls |= {"confirm"} if delivery == "at-least-once" and mode != "journal-grouped" else set()
    calls &= {op[0] for op in WORKLOAD}
    assert calls <= committing, committing
    ran, chosen = 0, points(n)
    for k in chosen:  # the dry run is crash point n: it died after its last call
        where = tmp_path / ("dry" if k == n else f"k{k}")
        run = dry if k == n else run_ops(where, WORKLOAD, durability=durability, sync_interval_ms=interval,
                                         config=CONFIG, kill_at=k, delivery=delivery)
        assert run.error is None, run.error
        assert run.signal == signal.SIGKILL, f"crash point {k}: the child ended with {run.signal}"
        assert run.steps[:k + 1] == dry.steps[:k + 1], f"crash point {k}: the workload is not deterministic"
        got = [a if not isinstance(a, list) else [tuple(p) for p in a] for a in run.answers]
        assert got == answers[:len(got)], f"crash point {k}: a call answered otherwise than the model"
        flight = WORKLOAD[run.steps[k][2]] if k < n else ("end",)
        context = f"{mode}: killed before step {k} of {n} ({dry.steps[k][0] if k < n else 'end'}, in {flight})"
        if not where.exists():
            continue
        check_killed_store(where, durability=durability, config=CONFIG,
                           now=states[run.returned].now,  # the clock of the calls it ran
                           states=candidates(states, dry.steps, k), universe=every, context=context,
                           delivery=delivery, history=states if interval else None)
        shutil.rmtree(where)
        ran += 1
    print(f"\n{mode}: {n} durable steps, {ran} crash points checked in {time.perf_counter() - started:.1f}s")
    assert ran == len(chosen)  # the store's directory exists before the first durable step
    return dry
