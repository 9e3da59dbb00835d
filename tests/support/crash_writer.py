"""A writer process for the SIGKILL tests: it works on a real store until it is killed.

It adds batches of indexes across rolling ledgers (so small buckets seal),
moves a logical clock, takes due indexes (so buckets are exhausted and
deleted) and acknowledges now and then (so buckets are trimmed). Beside the
store it keeps a *side log*, one JSON record per line, each fsynced before the
writer goes on; it is the oracle the checker reads after the kill:

``{"add": [[l, e, t], ...]}``
    written *before* the batch is handed to the tracker: everything the store
    could ever hold was announced first (the no-phantom bound);
``{"sealed": key, "ledger": id, "rows": [[t, l, e], ...]}``
    written *after* the seal's catalog commit, with the rows read back from
    the sealed file: these are durable (the no-loss bound). A kill between the
    commit and this record only makes the bound weaker, never wrong;
``{"clock": t}``
    written before the clock moves to ``t``;
``{"ack": [l, e]}``
    written *before* ``mark_delete``: those positions may be gone afterwards.

Run as a script for a manual soak::

    python tests/support/crash_writer.py STORE SIDE_LOG [--seed N] [--iterations N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Any

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli.side_log import SideLog, read_side_log
from bucketstore.format.ledger_file import ledger_file_name

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bucketstore.testing.oracle import read_bucket  # noqa: E402
from helpers import FakeClock  # noqa: E402

NAME = "sub"
CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=8, max_indexes_per_segment=4,
                       max_time_step_per_segment_ms=100)


def fork_child(target, *args: object) -> tuple[int, int]:
    """Run ``target(*args, ready=w)`` in a forked child; return (pid, read end of its ready pipe).

    The parent holds no store open across the fork (an LMDB environment must
    not be inherited), and the child never returns into pytest.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            target(*args, ready=w)
        except BaseException:  # noqa: BLE001 - the child reports by exit code only
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def resume_point(records: list[dict[str, Any]]) -> tuple[int, int]:
    """Where a new writer continues: after the highest ledger and clock the log has seen."""
    ledger, clock = 0, 1_000
    for r in records:
        if "add" in r and r["add"]:
            ledger = max(ledger, max(row[0] for row in r["add"]))
        if "clock" in r:
            clock = max(clock, r["clock"])
    return ledger + 1, clock


def run_writer(store_path: str | os.PathLike[str], log_path: str | os.PathLike[str], seed: int,
               iterations: int | None = None, ready: int | None = None, background: bool = False) -> None:
    """Work on the store until killed (or for ``iterations`` rounds).

    :param ready: a pipe descriptor to write one byte to once the store is open,
        so the killer can tell recovery from the work that follows.
    :param background: seal on the store's maintenance thread (a kill then lands inside
        background seals as well: mid-write, between write and install).
    """
    rng = random.Random(seed)
    ledger, now = resume_point(read_side_log(log_path))
    side = SideLog(log_path)
    clock = FakeClock(now)
    # Sealed mode (the journal writer is below); background explicit: the test runs both designs.
    store = bucketstore.open(store_path, durability="sealed", background=background)
    tracker = store.tracker(NAME, CONFIG, clock)
    known = set(store.catalog.buckets(NAME))
    if ready is not None:
        os.write(ready, b"r")
    i = 0
    while iterations is None or i < iterations:
        i += 1
        rows = [(ledger, e, clock.now + 20 + rng.randrange(600)) for e in range(rng.randrange(4, 14))]
        side.write({"add": rows})
        tracker.add_messages(rows)
        ledger += 1
        keys = store.catalog.buckets(NAME)
        for key in sorted(keys.keys() - known):
            lid = keys[key]
            contents = read_bucket(Path(store.ledgers_dir) / ledger_file_name(lid))
            side.write({"sealed": key, "ledger": lid, "rows": contents})
        known = set(keys)
        if rng.random() < 0.5:
            target = clock.now + rng.randrange(10, 120)
            side.write({"clock": target})  # durable before the clock moves
            clock.now = target
            tracker.get_scheduled_messages(rng.randrange(1, 40))
        if rng.random() < 0.05:
            ack = [max(0, ledger - rng.randrange(3, 10)), rng.randrange(0, 8)]
            side.write({"ack": ack})
            tracker.mark_delete(*ack)
    store.close()


#: The journal writer's config: small buckets that seal, exhaust and merge often.
JOURNAL_CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=8, max_indexes_per_segment=4,
                               max_time_step_per_segment_ms=100, max_num_buckets=3)


def run_journal_writer(store_path: str | os.PathLike[str], log_path: str | os.PathLike[str], seed: int,
                       iterations: int | None = None, ready: int | None = None, background: bool = False,
                       confirm_sync_ms: int = 0) -> None:
    """A journal-mode embedder (``delivery="at-least-once"``) that works until killed.

    With ``confirm_sync_ms=0`` a confirmation is durable when its call returns. Otherwise
    (grouped confirmations) it is durable only at the next commit: surely once the next
    ``add_messages`` or ``flush`` returned, maybe earlier (the window elapsed, a seal's
    checkpoint, a bucket read to its end). So the writer keeps every batch confirmed since
    then in ``{"confirming": [n, ...]}`` (all of them "maybe") and writes
    ``{"confirmed": [n, ...]}`` once such a call returned.

    With ``background`` its seals and merges run on the store's maintenance thread, so a
    kill also lands inside them: mid-write, between write and install, between a seal's
    catalog commit and the checkpoint that retires its journal rows, between a merge's
    commit and the deletion of its sources.

    Its side log is what its downstream durably received, in order:

    ``{"add": rows}`` before ``add_messages`` and ``{"added": 1}`` after it returned
        (acknowledged: durable, with ``sync_interval_ms=0``);
    ``{"got": [[l, e], ...], "batch": n}`` after ``get_scheduled_messages`` returned:
        the batch is handed on (the moment the issue's embedder lost it);
    ``{"confirming": [n]}`` before the call that confirms batch ``n`` (the next
        ``get_scheduled_messages``, ``flush`` or ``confirm_delivered``) and
        ``{"confirmed": [n]}`` after it returned: from then on, never delivered again;
    ``{"clock": t}`` before the clock moves; ``{"ack": [l, e]}`` before ``mark_delete``.

    Positions are never added twice, so any position delivered after its batch's
    confirmation is a redelivery of a confirmed one.
    """
    rng = random.Random(seed)
    records = read_side_log(log_path)
    ledger, now = resume_point(records)
    batch = max([r["batch"] for r in records if "batch" in r], default=-1)
    side = SideLog(log_path)
    clock = FakeClock(now)
    store = bucketstore.open(store_path, durability="journal", background=background,
                             confirm_sync_ms=confirm_sync_ms)
    grouped = confirm_sync_ms > 0
    unsettled: list[int] = []  # grouped: batches confirmed, not yet surely durable
    tracker = store.tracker(NAME, JOURNAL_CONFIG, clock)
    if ready is not None:
        os.write(ready, b"r")
    pending: int | None = None  # the handed-on batch not yet confirmed
    i = 0
    while iterations is None or i < iterations:
        i += 1
        rows = [(ledger, e, clock.now + 20 + rng.randrange(600)) for e in range(rng.randrange(4, 14))]
        side.write({"add": rows})
        tracker.add_messages(rows)
        side.write({"added": 1})
        if unsettled:  # the add's commit carried the pending confirmations
            side.write({"confirmed": unsettled})
            unsettled = []
        ledger += 1
        polls = 0
        run = rng.choice([1, 8]) if grouped else 1  # grouped: sometimes a drain of several polls
        for _ in range(run):
            if rng.random() >= (0.6 if run == 1 else 0.9):
                break
            polls += 1
            target = clock.now + rng.randrange(10, 120)
            side.write({"clock": target})  # durable before the clock moves
            clock.now = target
            if pending is not None:
                unsettled.append(pending)
                side.write({"confirming": unsettled})
            got = tracker.get_scheduled_messages(rng.randrange(1, 40))  # confirms the previous batch
            if pending is not None and not grouped:
                side.write({"confirmed": unsettled})
                unsettled = []
            pending = None
            batch += 1
            side.write({"got": got, "batch": batch})
            pending = batch if got else None
        if not polls and pending is not None and rng.random() < 0.3:
            unsettled.append(pending)
            side.write({"confirming": unsettled})
            flush = rng.random() < 0.5
            (tracker.flush if flush else tracker.confirm_delivered)()
            if flush or not grouped:
                side.write({"confirmed": unsettled})
                unsettled = []
            pending = None
        if rng.random() < 0.03:
            ack = [max(0, ledger - rng.randrange(6, 14)), rng.randrange(0, 8)]
            side.write({"ack": ack})
            tracker.mark_delete(*ack)
    store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("side_log")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args(argv)
    print("ready", flush=True)
    run_writer(args.store, args.side_log, args.seed, args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
