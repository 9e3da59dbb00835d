"""Where each ledger goes in a bulk build, decided on the driver from one aggregation.

The driver counts the input's rows per ledger (one pass, whose result is a row
per distinct ledger), cuts the whole input into buckets exactly as the tasks
will, and packs consecutive buckets into tasks of about equal row counts. The
rows are then shuffled once, straight to their task by a partition id computed
from ``ledger_id`` in the JVM: no count, no range-partitioner sampling pass.

Because task boundaries fall on bucket boundaries of the global cut, every
bucket but the very last holds at least ``min_count`` indexes (where a task
cut its own range before, each task's last bucket could be short), and rows
inside an existing bucket's range are refused before any task runs.

Pure numpy, no Spark: the unit tests call it directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .bucketing import cut_ledger_groups

__all__ = ["PartitionPlan", "plan_partitions", "InPlacePlan", "plan_in_place"]


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """Task ``p`` takes the ledgers from ``starts[p]`` up to (not including) ``starts[p + 1]``."""

    rows: int
    #: First ledger (unsigned) of each task, ascending; ``starts[0]`` is 0 so every ledger has a task.
    starts: tuple[int, ...]
    #: Buckets the global cut makes, and the most any one task makes.
    buckets: int
    max_buckets_per_task: int

    @property
    def partitions(self) -> int:
        return len(self.starts)

    def partition_of(self, ledger: int) -> int:
        """The task a ledger's rows go to (what the JVM expression computes)."""
        return int(np.searchsorted(np.array(self.starts, dtype=np.uint64), np.uint64(ledger), side="right")) - 1


def plan_partitions(ledgers: np.ndarray, counts: np.ndarray, min_count: int, tasks: int,
                    existing: Sequence[tuple[int, int]] = ()) -> PartitionPlan:
    """Cut the input into buckets from its per-ledger row counts and group the buckets into about ``tasks`` tasks.

    :param ledgers: distinct ledger ids (uint64, any order).
    :param counts: rows per ledger, aligned with ``ledgers``.
    :param min_count: ``min_index_count_per_bucket``.
    :param tasks: the number of tasks wanted (fewer when there are fewer buckets).
    :param existing: ranges of the tracker's current buckets, which new ones may not overlap.
    :raises LedgerRangeConflict: a ledger of the input lies inside an existing range.
    """
    if tasks < 1:
        raise ValueError("tasks must be at least 1")
    ledgers = np.asarray(ledgers, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64)
    order = np.argsort(ledgers, kind="stable")
    ledgers, counts = ledgers[order], counts[order]
    if len(ledgers) > 1 and not (ledgers[1:] > ledgers[:-1]).all():
        raise ValueError("ledger ids must be distinct")
    n = int(counts.sum())
    cuts = cut_ledger_groups(ledgers.tolist(), counts.tolist(), min_count, existing)
    if not cuts:
        return PartitionPlan(0, (0,), 0, 0)
    tasks = min(tasks, len(cuts))
    # Rows before each bucket decide its task: task = floor(rows_before * tasks / n),
    # so tasks take consecutive buckets and about n / tasks rows each.
    before = np.concatenate(([0], np.cumsum(counts)))
    first_ledger = [a for a, _, _, _ in cuts]
    task_of = (before[first_ledger] * tasks) // max(n, 1)
    starts: list[int] = []
    per_task: dict[int, int] = {}
    for (a, _, start, _), t in zip(cuts, task_of.tolist()):
        if t not in per_task:
            starts.append(start)
            per_task[t] = 0
        per_task[t] += 1
    starts[0] = 0  # ledgers below the first bucket do not occur; the first task may as well own them
    return PartitionPlan(n, tuple(starts), len(cuts), max(per_task.values()))


def default_tasks(rows: int, parallelism: int, rows_per_partition: int) -> int:
    """Tasks for ``rows``: none over ``rows_per_partition``, and a multiple of the cores that run them.

    A multiple, because tasks of equal size run in waves: five tasks on two
    cores take three waves, the last with one core idle; six smaller ones
    take three full waves.
    """
    parallelism = max(parallelism, 1)
    return parallelism * max(1, math.ceil(rows / rows_per_partition / parallelism))


@dataclass(frozen=True, slots=True)
class InPlacePlan:
    """A build that leaves most rows in the input partition they are in: no shuffle for them.

    Possible when each input partition holds its own slice of the ledger
    order (an export in log order, a table sorted by ledger; the slices may
    come in any partition order, and neighbours may share a ledger): the
    buckets of the global cut that lie within one partition are written by
    that partition's own task, and only the rows of the buckets that span a
    partition boundary are shuffled, one such bucket per task.
    """

    rows: int
    #: Input partitions up to the last that holds rows; task ``k < partitions`` is input partition ``k``.
    #: (Empty partitions after it come before the spanning buckets' tasks in the write and write nothing.)
    partitions: int
    #: Input partition -> its buckets ``(start_ledger, end_ledger, rows)`` in ledger order.
    home: dict[int, list[tuple[int, int, int]]]
    #: ``(start_ledger, end_ledger)`` of the buckets that span partitions, ascending.
    #: (Their tasks come after the input's partitions in the write.)
    spanning: list[tuple[int, int]]
    spanning_rows: int


def plan_in_place(parts: np.ndarray, ledgers: np.ndarray, counts: np.ndarray, min_count: int,
                  existing: Sequence[tuple[int, int]] = ()) -> InPlacePlan | None:
    """Plan a build without a shuffle for rows already in ledger order across partitions, or None if they are not.

    :param parts: input partition id of each ``(partition, ledger)`` group.
    :param ledgers: its ledger id (uint64).
    :param counts: its row count.
    :raises LedgerRangeConflict: a ledger of the input lies inside an existing range.
    """
    parts = np.asarray(parts, dtype=np.int64)
    ledgers = np.asarray(ledgers, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64)
    if not len(ledgers):
        return None
    # Each partition's ledger range; taken in order of their first ledger, each
    # range must start where the one before ends or after it (a ledger split
    # between neighbouring partitions is shared). Partition ids need not follow
    # ledger order: Spark orders a file scan's splits by size.
    by_part = np.lexsort((ledgers, parts))
    part_at = np.flatnonzero(np.concatenate(([True], parts[by_part][1:] != parts[by_part][:-1])))
    lowest = ledgers[by_part][part_at]
    highest = np.maximum.reduceat(ledgers[by_part], part_at)
    ranked = np.lexsort((highest, lowest))
    if not (lowest[ranked][1:] >= highest[ranked][:-1]).all():
        return None
    order = np.lexsort((parts, ledgers))
    parts, ledgers, counts = parts[order], ledgers[order], counts[order]
    at = np.flatnonzero(np.concatenate(([True], ledgers[1:] != ledgers[:-1])))
    distinct = ledgers[at]
    per_ledger = np.add.reduceat(counts, at)
    cuts = cut_ledger_groups(distinct.tolist(), per_ledger.tolist(), min_count, existing)
    home: dict[int, list[tuple[int, int, int]]] = {}
    spanning: list[tuple[int, int]] = []
    spanning_rows = 0
    # The (partition, ledger) groups of each bucket follow one another in ledger order.
    first_group = at[[a for a, _, _, _ in cuts]]
    lowest_part = np.minimum.reduceat(parts, first_group) if cuts else parts[:0]
    highest_part = np.maximum.reduceat(parts, first_group) if cuts else parts[:0]
    for (a, b, start, end), lo, hi in zip(cuts, lowest_part.tolist(), highest_part.tolist()):
        rows = int(per_ledger[a:b].sum())
        if lo == hi:
            home.setdefault(lo, []).append((start, end, rows))
        else:
            spanning.append((start, end))
            spanning_rows += rows
    return InPlacePlan(int(counts.sum()), int(parts.max()) + 1, home, spanning, spanning_rows)
