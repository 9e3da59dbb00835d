"""The delivery handoff of a journal-mode tracker: when a delivered batch becomes durably delivered.

``get_scheduled_messages`` hands a batch to the embedder, which has yet to dispatch
it. With ``delivery="at-least-once"`` (the default) the batch becomes durably
delivered only when the embedder *confirms* it — at its next
``get_scheduled_messages``, at ``flush()``, or by ``confirm_delivered()`` — so a crash
before that brings the batch back and a crash after it never does (Kafka's
commit-on-next-poll). With ``delivery="at-most-once"`` a batch is confirmed as it is
returned: a crash right after the return loses it, and never repeats it.

Three frontiers, each the largest ``(timestamp, ledger, entry)`` of a prefix of the
index order (deliveries leave in index order, so a key describes a prefix):

* ``frontier``: delivered by the live process (its in-memory state forgets these);
* ``confirmed``: confirmed by the embedder; the tracker journals it as an ``f`` record;
* the *durable* one: the largest ``f`` the journal has fsynced. Recovery starts from it.

Until the durable frontier passes a batch, its rows must stay recoverable: a seal's
checkpoint carries the unconfirmed ones (:meth:`DeliveryHandoff.carry_rows`), a merge
keeps them in the merged file (:meth:`DeliveryHandoff.held_rows`), and a bucket
deleted when read to its end first journals them (:meth:`DeliveryHandoff.carry_rows`
with its ledger range). Batches are released once the durable frontier passes them
(:meth:`DeliveryHandoff.release`).

**Grouped confirmations** (``confirm_sync_ms``, default 100). A confirmation is
journaled as a *lazy* ``f`` record: losing it can only make a crash deliver its
batches again, never lose one, so it does not need an fsync of its own. It becomes
durable with the next journal commit, which happens

* at the next call that journals an add or an untrack (with ``sync_interval_ms=0``
  before that call returns, else within ``sync_interval_ms``);
* at ``flush()`` (which confirms everything delivered first), at a clean ``close()``,
  at every checkpoint (a seal's install, ``clear()``, the end of a recovery: each
  records the confirmed frontier), and before a bucket read to its end is deleted;
* at the first delivery or ``confirm_delivered()`` call made once
  ``max(confirm_sync_ms, sync_interval_ms)`` ms have passed since the previous commit.

So a drain pays at most one fsync per window instead of one per call, and the
redelivery window after a crash is exactly: the batches not yet confirmed, plus the
batches confirmed since the last commit — at most those confirmed in the last
``max(confirm_sync_ms, sync_interval_ms)`` ms of calls, and, on a tracker that went
idle after confirming, those confirmed by its last calls (``flush()`` when going idle
closes that). Consecutive lazy frontiers in one pending group are one record (the
largest). ``confirm_sync_ms=0`` with ``sync_interval_ms=0``: a confirmed batch never
comes back. At-most-once frontiers are never lazy: losing one would deliver a batch twice.

A position re-added after its delivery and before its batch is durable is
*superseded*: its new time replaces its redelivery (the embedder has shown it holds
the message), and the tracker journals an untrack before the re-add so that a replay
makes the old row dead, as for an expired re-add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap, BitMap64

from ..queue.index_set import _group_by_ledger, bitmap_of

__all__ = ["DELIVERY_MODES", "DeliveryHandoff", "HeldRows", "after_key"]

#: ``bucketstore.open(..., delivery=...)``: when a returned batch becomes durably delivered.
DELIVERY_MODES = ("at-least-once", "at-most-once")

Key = tuple[int, int, int]
_U64 = np.dtype("<u8")


@dataclass
class _Batch:
    """The rows one call delivered (one per position); ``carry`` is False for superseded rows;
    ``positions``: ledger -> the batch's entry ids, for membership tests (built when first
    asked: most batches are released before anything asks)."""

    last: Key
    ts: np.ndarray
    ledgers: np.ndarray
    entries: np.ndarray
    carry: np.ndarray
    _positions: dict[int, BitMap | BitMap64] | None = None

    @property
    def positions(self) -> dict[int, BitMap | BitMap64]:
        if self._positions is None:
            self._positions = {ledger: bitmap_of(entries) for ledger, entries in _group_by_ledger(self.ledgers,
                                                                                                 self.entries)}
        return self._positions


class DeliveryHandoff:
    """Delivered batches not yet durably confirmed, and the frontiers (not thread-safe:
    the tracker's lock guards it)."""

    def __init__(self, mode: str, durable: Key | None) -> None:
        if mode not in DELIVERY_MODES:
            raise ValueError(f"delivery must be one of {DELIVERY_MODES}, not {mode!r}")
        self.at_least_once = mode == "at-least-once"
        #: The largest key delivered by this process (or recovered as durable).
        self.frontier: Key | None = durable
        #: The largest key the embedder confirmed (journaled as ``f``).
        self.confirmed: Key | None = durable
        self._batches: list[_Batch] = []

    # -- the three events ---------------------------------------------------------------------
    def delivered(self, last: Key, rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> Key | None:
        """A call delivered ``rows`` (ts, ledgers, entries; one per position), the largest being ``last``.

        :return: the frontier to journal now (at-most-once), or None.
        """
        if self.frontier is not None and last <= self.frontier:
            return None
        self.frontier = last
        if not self.at_least_once:
            self.confirmed = last
            return last
        if rows is not None and len(rows[0]):
            ts, ledgers, entries = rows
            self._batches.append(_Batch(last, ts, ledgers, entries, np.ones(len(ts), dtype=bool)))
        return None

    def mark(self) -> tuple[Key | None, Key | None]:
        """The frontiers now: what :meth:`rewind` goes back to."""
        return self.frontier, self.confirmed

    def rewind(self, mark: tuple[Key | None, Key | None]) -> None:
        """Forget the deliveries made since ``mark``: the call that made them raised, and put
        their rows back in the queue (see :mod:`~bucketstore.engine.tracker.delivery_rollback`)."""
        self.frontier, self.confirmed = mark
        if self.frontier is not None:
            self._batches = [b for b in self._batches if b.last <= self.frontier]
        else:
            self._batches = []

    def confirm(self) -> Key | None:
        """The embedder confirmed everything delivered so far; return the frontier to journal, or None."""
        if self.frontier is None or self.frontier == self.confirmed:
            return None
        self.confirmed = self.frontier
        return self.confirmed

    def release(self, durable: Key | None) -> None:
        """Forget the batches at or before the durable frontier: recovery never brings them back."""
        if durable is None or not self._batches or self._batches[0].last > durable:
            return
        self._batches = [b for b in self._batches if b.last > durable]

    def forget(self) -> None:
        """Drop every held batch (``clear``: nothing is to come back), confirming them."""
        self.confirm()
        self._batches = []

    # -- questions the tracker asks -----------------------------------------------------------
    @property
    def holding(self) -> bool:
        """Whether any delivered batch is not yet durably confirmed."""
        return bool(self._batches)

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position was delivered in a batch that is not yet durable."""
        for b in self._batches:
            bm = b.positions.get(ledger_id)
            if bm is not None and (entry_id < 1 << 32 or isinstance(bm, BitMap64)) and entry_id in bm:
                return True
        return False

    def held_mask(self, ledger_id: int, entries: np.ndarray) -> np.ndarray:
        """Which entries of one ledger were delivered in a batch that is not yet durable."""
        mask = np.zeros(len(entries), dtype=bool)
        for b in self._batches:
            bm = b.positions.get(ledger_id)
            if bm is not None:
                mask |= np.isin(entries, np.fromiter(bm, dtype=_U64, count=len(bm)))
        return mask

    def supersede(self, ledger_id: int, entries: np.ndarray) -> None:
        """These positions were tracked again: their old rows are no longer to be carried."""
        for b in self._batches:
            b.carry &= ~((b.ledgers == np.uint64(ledger_id)) & np.isin(b.entries, entries))

    def carry_rows(self, start_ledger: int = 0, end_ledger: int = 2**64 - 1, *, confirmed_too: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The not superseded rows of ledgers ``[start, end]`` delivered after the
        confirmed frontier (with ``confirmed_too``: after the durable one), as
        (ledgers, entries, ts): what must be written again where their only durable
        copy is about to go (a checkpoint, which records the confirmed frontier, replacing
        the journal; a deleted bucket)."""
        parts = []
        for b in self._batches:
            if not confirmed_too and self.confirmed is not None and b.last <= self.confirmed:
                continue
            keep = b.carry & (b.ledgers >= np.uint64(start_ledger)) & (b.ledgers <= np.uint64(end_ledger))
            if keep.any():
                parts.append((b.ledgers[keep], b.entries[keep], b.ts[keep]))
        if not parts:
            empty = np.zeros(0, dtype=_U64)
            return empty, empty, empty
        return tuple(np.concatenate(cols) for cols in zip(*parts))  # type: ignore[return-value]

    def held_rows(self, start_ledger: int, end_ledger: int) -> HeldRows:
        """A frozen copy of the rows of ledgers ``[start, end]`` delivered in a batch not yet
        durable: a merge planned now must keep them in its file (it is their only durable copy
        once the sources go), and it reads its sources off the lock, so it asks the copy."""
        rows: set[Key] = set()
        lo, hi = np.uint64(start_ledger), np.uint64(end_ledger)
        for b in self._batches:
            keep = (b.ledgers >= lo) & (b.ledgers <= hi)
            if keep.any():
                rows.update(zip(b.ts[keep].tolist(), b.ledgers[keep].tolist(), b.entries[keep].tolist()))
        return HeldRows(rows)


class HeldRows:
    """Rows delivered and not yet durably confirmed, as of one moment (see
    :meth:`DeliveryHandoff.held_rows`)."""

    def __init__(self, rows: set[Key]) -> None:
        self._rows = rows
        self._entries: dict[int, np.ndarray] = {}
        for _t, ledger, entry in rows:
            self._entries.setdefault(ledger, []).append(entry)  # type: ignore[arg-type]
        self._entries = {ledger: np.array(es, dtype=_U64) for ledger, es in self._entries.items()}

    def __bool__(self) -> bool:
        return bool(self._rows)

    def mask(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Which of these rows (exactly, at their delivered time) are held."""
        mask = np.zeros(len(ts), dtype=bool)
        if not self._rows:
            return mask
        for ledger, held in self._entries.items():
            rows = np.flatnonzero(ledgers == np.uint64(ledger))
            if len(rows):
                mask[rows] = np.isin(entries[rows], held)
        for r in np.flatnonzero(mask).tolist():  # few: at most the held rows
            mask[r] = (int(ts[r]), int(ledgers[r]), int(entries[r])) in self._rows
        return mask


def after_key(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, key: Key) -> np.ndarray:
    """Mask of rows whose (timestamp, ledger, entry) sorts after ``key`` (a delivery frontier)."""
    t, l, e = (np.uint64(v) for v in key)
    return (ts > t) | ((ts == t) & ((ledgers > l) | ((ledgers == l) & (entries > e))))
