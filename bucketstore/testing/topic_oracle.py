"""The reference for a topic's per-subscription figures: one pass over every row of the topic
per subscription, straight from the definitions (``docs/topics.md``).

The engine computes them by range scans (:mod:`bucketstore.engine.topics.topic_figures`), which
must give the same numbers; this pass costs O(rows x subscriptions), so it serves the tests
and ``tools/bench/bench_topics.py`` (the "before" of its stats line), never a scrape.
"""

from __future__ import annotations

import os
from typing import Any

from ..cutoff import system_clock
from ..engine.topics.subscription_state import SubscriptionState
from ..engine.topics.topic_reader import _each, _reading, topic_view
from ..format.topic_codec import MULTI, decode_topic, split_sub_key, topic_prefix

__all__ = ["scan_figures"]


def scan_figures(store_path: str | os.PathLike[str], now_ms: int | None = None) -> dict[str, dict[str, Any]]:
    """Per topic, its row count and, per subscription, ``held_rows``, ``due_undelivered`` and
    ``oldest_due_age_ms`` as ``describe_topics`` defines them (same clock and cutoff rule)."""
    now = system_clock() if now_ms is None else now_ms
    out: dict[str, dict[str, Any]] = {}
    with _reading(os.fspath(store_path)) as view:
        if view is None:
            return out
        _, txn, dbs = view
        for raw_name, value in _each(txn, dbs["topics"]):
            record = decode_topic(value)
            config = record["config"]
            tick = 0 if config.get("deliver_at_time_strict") else int(config.get("tick_time_ms", 0))
            out[raw_name.decode()] = _scan(txn, dbs, record, now, max(record["cutoff"], now + tick))
    return out


def _scan(txn: Any, dbs: dict[str, Any], record: dict[str, Any], now: int, cutoff: int) -> dict[str, Any]:
    prefix = topic_prefix(record["id"])
    # Every row, in the tables and in the sealed runs, less the run rows gone (the view's
    # plain reads: no range count, no window).
    view = topic_view(txn, dbs, record["id"])
    multi = {MULTI.unpack(k)[1:] for k, _ in _each(txn, dbs["multi"], prefix)} | set(view.dead)
    # Only the positions judged one by one need their other rows; streamed, the pass holds no
    # row it has passed (a list of every row was 5 GB at 10 M rows).
    versions = {pos: view.versions(txn, record["id"], *pos) for pos in multi}
    subs = {}
    for key, value in _each(txn, dbs["subs"], prefix):
        name = split_sub_key(key)[1]
        subs[name] = SubscriptionState.decode(name, value)
    counts = {}
    for name, state in subs.items():
        others = [s.frontier for s in subs.values() if s is not state and s.frontier is not None]
        counts[name] = [state, min(others) if others else None, 0, 0,
                        min((row[0] for row in state.redeliver), default=None)]
    rows = 0
    for row in view.rows_after(txn, record["id"], None):
        rows += 1
        position = (row[1], row[2])
        for c in counts.values():
            state, upper = c[0], c[1]
            if state.frontier is not None and row <= state.frontier:
                continue
            if upper is None or row <= upper:
                c[2] += 1
            if row[0] <= cutoff and state.may_see(row) and (
                    position not in multi or state.tracked_row(*position, versions.get(position, [])) == row):
                c[3] += 1
                c[4] = row[0] if c[4] is None else min(c[4], row[0])
    figures = {name: {"held_rows": held, "due_undelivered": due + len(state.redeliver),
                      "oldest_due_age_ms": None if oldest is None else max(0, now - oldest)}
               for name, (state, _, held, due, oldest) in counts.items()}
    return {"rows": rows, "subscriptions": figures}
