"""Random topic workloads, SIGKILLed at random durable steps: the enumeration's check on what hypothesis finds.

Each example is a random sequence of the calls of ``tests/crash/test_topic_crash_points.py``
on a small grid of positions (so re-adds, adds behind a mark-delete and positions with several
rows are common): three subscriptions from the start, others created (``start="latest"``) and
deleted as it goes, adds through the topic and through subscriptions, due adds, deliveries at
different clocks, confirmations, mark-deletes, clears, flushes and clean restarts mid-sequence.
A forked child runs it once to number its durable steps, then is killed before a few steps
hypothesis picks; every killed store is held to :class:`~bucketstore.testing.topic_model.TopicModel`
by :func:`~bucketstore.testing.topic_crash.check_killed_store`, and every call that returned to
the model's answer.

A second test takes one store through several such lives, each killed at a random step and the
next one starting from what the kill left (its model: the state the store matched).

``BUCKETSTORE_EXAMPLES`` sets the examples per mode (default 6, up to four kills each: after the
last call, anywhere, and after two commits; 4 for the lives, two to four each).
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bucketstore import TrackerConfig
from bucketstore.testing.topic_crash import candidates, check_killed_store, is_commit, run_ops
from bucketstore.testing.topic_model import TopicModel

from helpers import example_count

CONFIG = TrackerConfig(tick_time_ms=3, min_index_count_per_bucket=4)
MODES = {"journal": ("journal", 0), "journal-grouped": ("journal", 10**9), "sealed": ("sealed", 0)}
LEDGERS, ENTRIES = 4, 4
UNIVERSE = {(lg, en) for lg in range(LEDGERS) for en in range(ENTRIES)}

ledger, entry, pick = st.integers(0, LEDGERS - 1), st.integers(0, ENTRIES - 1), st.integers(0, 7)
row = st.tuples(ledger, entry, st.integers(-5, 30))
add = st.tuples(st.just("add"), st.integers(-1, 7), st.lists(row, min_size=1, max_size=5))
advance = st.tuples(st.just("advance"), st.integers(5, 40))
deliver = st.tuples(st.just("deliver"), pick, st.integers(1, 5))
OTHERS = {
    "add": add, "advance": advance, "deliver": deliver,
    "confirm": st.tuples(st.just("confirm"), pick),
    "mark": st.tuples(st.just("mark"), pick, ledger, entry),
    "clear": st.tuples(st.just("clear"), pick),
    "flush": st.tuples(st.just("flush"), st.integers(-1, 7)),
    "create": st.tuples(st.just("create")),
    "delete": st.tuples(st.just("delete"), pick),
    "restart": st.tuples(st.just("restart")),
}
# Adds, clock moves and deliveries make most of a run, so that batches are returned, confirmed
# (or not) and acknowledged before the kills.
action = st.sampled_from(["add"] * 4 + ["advance"] * 3 + ["deliver"] * 4 + sorted(set(OTHERS) - {"add", "advance", "deliver"})
                         ).flatmap(OTHERS.__getitem__)


def calls(actions: list[tuple], names: list[str], created: int) -> tuple[list[tuple], int]:
    """The calls of ``actions``, each naming a subscription that exists when it runs (``names``,
    updated as subscriptions are created and deleted; ``created``: how many names were used)."""
    ops: list[tuple] = []
    for a in actions:
        kind = a[0]
        if kind == "create":
            names.append(f"s{created}")
            created += 1
            ops.append(("sub", names[-1], "latest"))
            continue
        if kind in ("advance", "restart"):
            ops.append(a)
            continue
        who = None if a[1] < 0 or not names else names[a[1] % len(names)]
        if who is None and kind not in ("add", "flush"):
            continue
        if kind == "add":
            seen: set[tuple[int, int]] = set()
            rows = [r for r in a[2] if (r[0], r[1]) not in seen and not seen.add((r[0], r[1]))]
            ops.append(("add", who, rows))
        elif kind == "delete":
            names.remove(who)
            ops.append(("delete", who))
        else:
            ops.append((kind, who, *a[2:]))
    return ops, created


FIRST = ["s0", "s1", "s2"]


def workload(actions: list[tuple]) -> list[tuple]:
    """A fresh store's calls: three subscriptions from the start, then ``actions``."""
    return [("open",)] + [("sub", n, "earliest") for n in FIRST] + calls(actions, list(FIRST), len(FIRST))[0]


# No shrinking: each step of it forks and kills a writer again, and took ten minutes on a
# failure; the example and the kill point are printed whole, and the context names the call.
@pytest.mark.parametrize("mode", sorted(MODES))
@settings(max_examples=example_count(6), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(actions=st.lists(action, min_size=10, max_size=50), data=st.data())
def test_random_topic_workload_survives_kills(mode: str, actions: list[tuple], data: st.DataObject) -> None:
    durability, interval = MODES[mode]
    ops = workload(actions)
    states, answers = TopicModel(CONFIG.tick_time_ms).states(ops)
    root = Path(tempfile.mkdtemp(prefix="topic-kill-"))
    try:
        dry = run_ops(root / "dry", ops, durability=durability, sync_interval_ms=interval, config=CONFIG)
        assert dry.error is None, dry.error
        n = len(dry.steps)
        # The dry run is the point n (it died after its last call); the others die right after a
        # commit (the states the calls leave) or anywhere.
        after_commit = [i + 1 for i, (kind, target, _) in enumerate(dry.steps) if is_commit(kind, target)]
        kills = {n, data.draw(st.integers(0, n), label="kill anywhere")}
        kills |= set(data.draw(st.lists(st.sampled_from(after_commit), max_size=2), label="kill after commits"))
        for k in sorted(kills):
            where = root / ("dry" if k == n else f"k{k}")
            run = dry if k == n else run_ops(where, ops, durability=durability, sync_interval_ms=interval,
                                             config=CONFIG, kill_at=k)
            assert run.error is None, run.error
            assert run.signal == signal.SIGKILL and run.steps[:k + 1] == dry.steps[:k + 1]
            got = [a if not isinstance(a, list) else [tuple(p) for p in a] for a in run.answers]
            assert got == answers[:len(got)], f"killed before step {k}: a call answered otherwise than the model"
            flight = ops[run.steps[k][2]] if k < n else ("end",)
            check_killed_store(where, durability=durability, config=CONFIG, now=states[run.returned].now,
                               states=candidates(states, dry.steps, k), universe=UNIVERSE,
                               context=f"{mode}: killed before step {k} of {n}, in {flight}",
                               history=states if interval else None)
            shutil.rmtree(where)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("mode", sorted(MODES))
@settings(max_examples=example_count(4), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lives=st.lists(st.lists(action, min_size=3, max_size=25), min_size=2, max_size=4), data=st.data())
def test_topic_survives_kill_after_kill(mode: str, lives: list[list[tuple]], data: st.DataObject) -> None:
    """One store through several lives, each killed at a random step (or after its last call):
    every life starts from what the last kill left, its model the state that store matched, so a
    recovery that is right at once but wrong for the calls after it (a count, a batch to deliver
    again, a position's rows) shows in a later life."""
    durability, interval = MODES[mode]
    root = Path(tempfile.mkdtemp(prefix="topic-lives-"))
    store, model, names, created = root / "store", TopicModel(CONFIG.tick_time_ms), list(FIRST), len(FIRST)
    try:
        for life, actions in enumerate(lives):
            tail, created = calls(actions, names, created)
            ops = [("open",)] + ([("sub", n, "earliest") for n in FIRST] if life == 0 else []) + tail
            states, answers = model.states(ops)
            probe = root / "probe"  # a copy counts the life's steps, the store itself is killed
            if store.exists():
                shutil.copytree(store, probe)
            dry = run_ops(probe, ops, durability=durability, sync_interval_ms=interval, config=CONFIG,
                          start_ms=model.now)
            assert dry.error is None, dry.error
            shutil.rmtree(probe)
            n = len(dry.steps)
            k = data.draw(st.integers(0, n), label=f"life {life}: kill before step")
            run = run_ops(store, ops, durability=durability, sync_interval_ms=interval, config=CONFIG,
                          kill_at=None if k == n else k, start_ms=model.now)
            assert run.error is None, run.error
            assert run.signal == signal.SIGKILL and run.steps[:k + 1] == dry.steps[:k + 1]
            got = [a if not isinstance(a, list) else [tuple(p) for p in a] for a in run.answers]
            assert got == answers[:len(got)], f"life {life}, killed before step {k}: a call answered otherwise"
            flight = ops[run.steps[k][2]] if k < n else ("end",)
            check = root / "check"  # drained by the check: the store lives on undrained
            shutil.copytree(store, check)
            model = check_killed_store(check, durability=durability, config=CONFIG, now=states[run.returned].now,
                                       states=candidates(states, dry.steps, k), universe=UNIVERSE,
                                       context=f"{mode}: life {life} killed before step {k} of {n}, in {flight}",
                                       history=states if interval else None)
            shutil.rmtree(check)
            names = sorted(model.subs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
