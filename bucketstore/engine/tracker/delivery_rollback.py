"""Putting back what a failed delivery call took: a call that raises loses no row.

``get_scheduled_messages`` takes its batch from the shared queue first (its positions leave
the index), then records it: the delivery handoff, the at-most-once frontier and the carry
rows of the buckets it read to their end (journal records), and a journal commit. Reading
can fail inside the queue, which then keeps what it popped (see
:meth:`~bucketstore.engine.queue.shared_queue.SharedQueue.pop_due`); recording can fail too: the
commit that creates the journal's first file, a write, an fsync. The call then raises, and
its batch was never returned: were it left as taken, the next call would confirm it (its
frontier durable: lost even across a restart) and nothing would deliver it again.

So a :class:`DeliveryMark`, taken before the pop, undoes a batch that is not returned: its
rows go back to the queue as a run of their own, tracked again at their times; the handoff's
frontiers and the journal's pending records go back to the mark; and the buckets the call read
to their end are not deleted (their files hold the rows put back): they stay until the next
open, which treats them as any other bucket (journal mode deletes them once the durable
frontier has passed them). The retry delivers the rows, once. Everything undone is in memory:
the undo itself cannot fail.
"""

from __future__ import annotations

import numpy as np

from ..durability.handoff import DeliveryHandoff
from ..durability.journal import Journal
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, SharedQueue

__all__ = ["DeliveryMark"]


class DeliveryMark:
    """The delivery state before a call's pop: what :meth:`put_back` returns to."""

    __slots__ = ("_handoff", "_journal", "_handoff_mark", "_journal_mark")

    def __init__(self, handoff: DeliveryHandoff, journal: Journal | None) -> None:
        self._handoff = handoff
        self._journal = journal
        self._handoff_mark = handoff.mark()
        self._journal_mark = journal.mark() if journal is not None else None

    def put_back(self, queue: SharedQueue, index: DelayedIndexSet,
                 rows: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Undo a batch taken since the mark and not returned (``rows``: ts, ledgers, entries, in
        index order, as ``pop_due`` gave them)."""
        ts, ledgers, entries = rows
        if self._journal is not None:
            # A group made durable since the mark (unreachable today: the recording's commits
            # are its last steps) would hold the batch's records; the rows still go back.
            self._journal.rewind(self._journal_mark)
        self._handoff.rewind(self._handoff_mark)
        if len(ts):
            # Tracked again at their times (a position that became a ghost meanwhile is live
            # again at exactly this time: no older row of it wakes), then queued in index order.
            index.add_many(ledgers, entries, ts)
            queue.push(Run(ts, ledgers, entries))
