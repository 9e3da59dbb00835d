"""Which of a topic's sealed runs to merge, and the rows the merged run keeps (``docs/topics.md``).

Every seal adds a run; a delivery reads each run overlapping its window, so their number is kept
down by merging, tier by tier: a run is in tier ``t`` when it holds ``seal_rows * FANOUT ** t``
rows or more (and fewer than ``FANOUT`` times that); once a tier has :data:`FANOUT` runs, its
oldest :data:`FANOUT` are merged into one run of the next tier. A topic of N rows keeps about
``FANOUT * log_FANOUT(N / seal_rows)`` runs; each row is rewritten once per tier. A merge
reads its runs whole, so runs past :data:`MERGE_MAX_ROWS` rows are not merged any more.

A merge drops the rows no subscription can see again: rows gone (a position's ``dead`` bound),
rows every frontier has passed, rows every mark-delete covers; but it keeps every row of a
position with several rows (``multi``), whose exceptions name them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from .subscription_state import RowKey
from .topic_runs import Run

__all__ = ["FANOUT", "MERGE_MAX_ROWS", "plan_merge", "kept_rows"]

#: Runs of one tier merged at once.
FANOUT = 8
#: No merge writes a run of more rows than this (it holds them all in memory, 32 bytes each).
MERGE_MAX_ROWS = 1 << 20


def _tier(run: Run, seal_rows: int) -> int:
    size, tier = max(1, seal_rows) * FANOUT, 0
    while run.live >= size:
        size *= FANOUT
        tier += 1
    return tier


def plan_merge(runs: Collection[Run], seal_rows: int) -> list[Run] | None:
    """The runs to merge next (the oldest :data:`FANOUT` of the lowest full tier), or None."""
    tiers: dict[int, list[Run]] = {}
    for run in sorted(runs, key=lambda r: r.run_id):
        tiers.setdefault(_tier(run, seal_rows), []).append(run)
    for tier in sorted(tiers):
        group = tiers[tier][:FANOUT]
        if len(group) == FANOUT and sum(r.live for r in group) <= MERGE_MAX_ROWS:
            return group
    return None


def kept_rows(rows: np.ndarray, dead: Mapping[tuple[int, int], int], multi: Collection[tuple[int, int]],
              front: RowKey | None, mark: tuple[int, int] | None) -> np.ndarray:
    """The rows of ``rows`` ((n, 4) uint64, delivery order) a merged run keeps.

    ``front``: the least frontier (None: some subscription has none, or there is none);
    ``mark``: the least mark-delete (None: some subscription has none)."""
    keep = np.ones(len(rows), dtype=bool)
    ts, ledger, entry, seq = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]
    if front is not None:
        f = [np.uint64(x) for x in front]
        after = (ts > f[0]) | ((ts == f[0]) & ((ledger > f[1]) | ((ledger == f[1]) & (
            (entry > f[2]) | ((entry == f[2]) & (seq > f[3]))))))
        keep &= after
    if mark is not None:
        ml, me = np.uint64(mark[0]), np.uint64(mark[1])
        keep &= (ledger > ml) | ((ledger == ml) & (entry > me))
    special = {**{p: -1 for p in multi}, **dead} if dead else {p: -1 for p in multi}
    if special:
        ledgers = np.fromiter({lg for lg, _ in special}, dtype=np.uint64)
        for i in np.flatnonzero(np.isin(ledger, ledgers)).tolist():
            pos = (int(ledger[i]), int(entry[i]))
            if pos in multi:
                keep[i] = True  # its exceptions name its rows: kept until the position goes
            elif pos in dead and int(seq[i]) <= dead[pos]:
                keep[i] = False
    return rows[keep]
