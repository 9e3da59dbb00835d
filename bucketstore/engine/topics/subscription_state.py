"""What a subscription of a topic keeps of its own: O(1) plus its exceptions, never its rows.

The topic holds every row once, as ``(deliver_at, ledger, entry, seq)``; ``seq`` numbers the
rows in the order they were added. A subscription sees a row through a few numbers:

* ``frontier`` F: every row whose key is at or before F has been passed (delivered, or not
  the subscription's). Deliveries walk the rows in key order, and a row added later is not
  yet due when it is added, so its key lies after every frontier: the delivered set of a
  subscription stays a prefix, as the single tracker's does.
* ``mark_delete`` M: positions at or before M are acknowledged, never its again.
* ``start_seq`` (``start="latest"``: rows added before the subscription are not its) and
  ``clear_seq`` (``clear()``: every row that existed then is gone for it).
* ``lost``: for a position added more than once (a *multi* position of the topic), the
  ``seq`` up to which its rows are gone for this subscription: set when it delivers one of
  its rows. These are the exceptions a frontier cannot express; they exist only for
  positions re-added while another row of them was live.
* ``unconfirmed``: the rows of the batches returned and not yet confirmed (at-least-once);
  ``redeliver``: the unconfirmed rows found at open, delivered first. A position re-added while
  unconfirmed leaves ``unconfirmed`` (its new row replaces its redelivery); one re-added while in
  ``redeliver`` stays there, and the re-add is ignored (untracked if due), as a tracker does.

A subscription *tracks* a position when one of its rows is after F, not acknowledged, not
before its start or clear, not lost; of several, the oldest (lowest ``seq``), as a single
tracker keeps the first time a position was added until it is delivered.

The count is ``count_base + topic.inserted - inserted_base``: an add of a new position that
every subscription tracks only bumps the topic's ``inserted``, so it costs O(1) whatever the
number of subscriptions; only the rare adds (a re-add, a position some subscription has
acknowledged) touch the subscriptions one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...format.topic_codec import TopicRecordError, decode_subscription, encode_subscription, pack_rows

__all__ = ["SubscriptionState", "RowKey"]

RowKey = tuple[int, int, int, int]  # deliver_at, ledger, entry, seq


@dataclass
class SubscriptionState:
    name: str
    frontier: RowKey | None = None
    mark_delete: tuple[int, int] | None = None
    start_seq: int = 0
    clear_seq: int = -1
    count_base: int = 0
    inserted_base: int = 0
    lost: dict[tuple[int, int], int] = field(default_factory=dict)
    #: A list of rows, or the (n, 4) uint64 array a delivery of whole windows returns (so a batch
    #: of a thousand rows is kept and written without a Python object per row).
    unconfirmed: list[RowKey] | np.ndarray = field(default_factory=list)
    redeliver: list[RowKey] = field(default_factory=list)
    #: The positions of ``unconfirmed`` and of ``redeliver``, built when a re-add first asks
    #: (:meth:`awaits`), each with the rows it was built from and their number (``redeliver``
    #: only shrinks in place; every other change replaces the list).
    _positions: dict[str, tuple[Any, int, set[tuple[int, int]]]] = field(default_factory=dict, repr=False,
                                                                           compare=False)

    def acked(self, ledger: int, entry: int) -> bool:
        md = self.mark_delete
        return md is not None and (ledger, entry) <= md

    def may_see(self, row: RowKey) -> bool:
        """Whether the row is the subscription's by everything but the other rows of its position."""
        ts, ledger, entry, seq = row
        if seq < self.start_seq or seq <= self.clear_seq:
            return False
        md = self.mark_delete
        if md is not None and (ledger, entry) <= md:
            return False
        f = self.frontier
        if f is not None and row <= f:
            return False
        lost = self.lost
        return not lost or seq > lost.get((ledger, entry), -1)

    def tracked_row(self, ledger: int, entry: int, versions: list[tuple[int, int]]) -> RowKey | None:
        """The row of the position the subscription tracks among ``versions`` ((seq, deliver_at)
        of every row of the position), or None."""
        best = None
        for seq, ts in versions:
            row = (ts, ledger, entry, seq)
            if self.may_see(row) and (best is None or seq < best[3]):
                best = row
        return best

    def _positions_of(self, which: str) -> set[tuple[int, int]]:
        rows = getattr(self, which)
        cached = self._positions.get(which)
        if cached is not None and cached[0] is rows and cached[1] == len(rows):
            return cached[2]
        if isinstance(rows, np.ndarray):
            found = set(zip(rows[:, 1].tolist(), rows[:, 2].tolist()))
        else:
            found = {(r[1], r[2]) for r in rows}
        self._positions[which] = (rows, len(rows), found)
        return found

    def redelivers(self, ledger: int, entry: int) -> bool:
        """Whether the position waits among the rows to deliver again. A tracker, restarted,
        tracks such a position at its old time: a re-add of it is ignored."""
        return bool(self.redeliver) and (ledger, entry) in self._positions_of("redeliver")

    def awaits(self, ledger: int, entry: int) -> bool:
        """Whether the position is in the batch not confirmed or among the rows to deliver again."""
        return self.redelivers(ledger, entry) or (
            bool(len(self.unconfirmed)) and (ledger, entry) in self._positions_of("unconfirmed"))

    def supersede(self, ledger: int, entry: int) -> None:
        """The subscription tracks the position again (a re-add after its delivery): it leaves
        the batch not confirmed, so a restart delivers it once, at its new time, as a tracker's
        delivery handoff supersedes it (``engine/durability/handoff.py``)."""
        unconfirmed = self.unconfirmed
        if not len(unconfirmed) or (ledger, entry) not in self._positions_of("unconfirmed"):
            return
        if isinstance(unconfirmed, np.ndarray):
            self.unconfirmed = unconfirmed[(unconfirmed[:, 1] != np.uint64(ledger))
                                           | (unconfirmed[:, 2] != np.uint64(entry))]
        else:
            self.unconfirmed = [r for r in unconfirmed if (r[1], r[2]) != (ledger, entry)]

    def expire_redelivery(self, ledger: int, entry: int) -> bool:
        """An add already due untracks a position waiting to be delivered again, as it untracks
        a tracked one; whether it was waiting."""
        if not self.redelivers(ledger, entry):
            return False
        kept = [r for r in self.redeliver if (r[1], r[2]) != (ledger, entry)]
        self.count_base -= len(self.redeliver) - len(kept)
        self.redeliver = kept
        return True

    def count(self, inserted: int) -> int:
        return self.count_base + inserted - self.inserted_base

    def encode(self) -> bytes:
        return encode_subscription(self.as_record())

    def as_record(self) -> dict[str, Any]:
        return {"frontier": list(self.frontier) if self.frontier is not None else None,
                "mark_delete": list(self.mark_delete) if self.mark_delete is not None else None,
                "start_seq": self.start_seq, "clear_seq": self.clear_seq, "count": self.count_base,
                "inserted_base": self.inserted_base,
                "lost": [[ledger, entry, seq] for (ledger, entry), seq in sorted(self.lost.items())],
                "unconfirmed": pack_rows(self.unconfirmed) if len(self.unconfirmed) else [],
                "redeliver": [list(r) for r in self.redeliver]}

    @classmethod
    def decode(cls, name: str, raw: bytes) -> "SubscriptionState":
        """The state as stored; the unconfirmed batches become rows to deliver again (a restart)."""
        r = decode_subscription(raw)
        if r["clear_seq"] < -1 or r["start_seq"] < 0:
            raise TopicRecordError(f"subscription record has start_seq {r['start_seq']}, clear_seq {r['clear_seq']}")
        md = r["mark_delete"]
        # Rows acknowledged while unconfirmed (records written before mark_delete dropped them) stay gone.
        unconfirmed = [row for row in r["unconfirmed"] if md is None or (row[1], row[2]) > md]
        again = sorted(set(r["redeliver"]) | set(unconfirmed))
        return cls(name=name, frontier=r["frontier"], mark_delete=md, start_seq=r["start_seq"],
                   clear_seq=r["clear_seq"], count_base=r["count"] + len(unconfirmed),
                   inserted_base=r["inserted_base"], lost={(lg, en): seq for lg, en, seq in r["lost"]},
                   unconfirmed=[], redeliver=again)
