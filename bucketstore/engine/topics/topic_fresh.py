"""Which waiting adds are of new positions: the run of adds written by whole columns.

An add answered but not written yet is ``(ledger, entry, deliver_at, cutoff of its call)``. From
a given one on, the adds up to the first that is due at its call, not after the position before
it (the topic's last position for the first), at or before the greatest mark-delete, or of a
position with several rows, are tracked by every subscription as they are: they are written by
one ``putmulti`` per table or straight into a sealed run (``docs/topics.md``, "Delivery"). A
seal's worth of them (8,192) is judged by numpy columns; a few, one by one (numpy's fixed cost
is more than the loop's there). Both give the same answer (tests/engine/topics/test_topic_fresh.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["fresh_adds", "fresh_adds_loop", "COLUMNS_FROM"]

Position = tuple[int, int]
Fresh = tuple[int, np.ndarray, np.ndarray, np.ndarray, Position]
#: From how many waiting adds on they are judged by columns.
COLUMNS_FROM = 64


def fresh_adds(pending: list[tuple[int, int, int, int]], start: int, last: Position,
               mark: Position | None, multi: set[Position] | frozenset[Position]) -> Fresh:
    """How many adds of ``pending[start:]`` from the first are of new positions (see the module),
    their ledgers, entries and deliver_at as uint64 columns, and the last position among them
    (``last`` when none)."""
    if len(pending) - start < COLUMNS_FROM:
        return fresh_adds_loop(pending, start, last, mark, multi)
    lg, en, ts, cut = zip(*pending[start:])
    ledgers, entries, times = (np.array(c, dtype=np.uint64) for c in (lg, en, ts))
    cutoffs = np.array(cut, dtype=np.int64)  # -1: no cutoff yet (nothing is due)
    ok = (cutoffs < 0) | (times > np.maximum(cutoffs, 0).astype(np.uint64))
    ok[1:] &= (ledgers[1:] > ledgers[:-1]) | ((ledgers[1:] == ledgers[:-1]) & (entries[1:] > entries[:-1]))
    ok[0] &= (lg[0], en[0]) > last
    if mark is not None:
        ml, me = np.uint64(mark[0]), np.uint64(mark[1])
        ok &= (ledgers > ml) | ((ledgers == ml) & (entries > me))
    bad = np.flatnonzero(~ok)
    n = int(bad[0]) if len(bad) else len(ok)
    if multi:
        n = next((i for i, pos in enumerate(zip(lg[:n], en[:n])) if pos in multi), n)
    return n, ledgers[:n], entries[:n], times[:n], (lg[n - 1], en[n - 1]) if n else last


def fresh_adds_loop(pending: list[tuple[int, int, int, int]], start: int, last: Position,
                    mark: Position | None, multi: set[Position] | frozenset[Position]) -> Fresh:
    """:func:`fresh_adds`, one add at a time."""
    ledgers, entries, times = [], [], []
    for ledger, entry, ts, cutoff in pending[start:]:
        pos = (ledger, entry)
        if ts <= cutoff or pos <= last or (mark is not None and pos <= mark) or pos in multi:
            break
        ledgers.append(ledger)
        entries.append(entry)
        times.append(ts)
        last = pos
    return (len(times), np.array(ledgers, dtype=np.uint64), np.array(entries, dtype=np.uint64),
            np.array(times, dtype=np.uint64), last)
