"""The specification of a topic's subscriptions, for crash tests: what each must deliver, and when.

A subscription behaves as an independent tracker that received every add of its topic
(``docs/topics.md``), plus the delivery handoff: the batch returned last and not confirmed
(``unconfirmed``) comes back, first, after a restart (``redeliver``). :class:`SubscriptionModel`
is that specification for one subscription and :class:`TopicModel` for a topic and all its
subscriptions; both are plain values, copied after each call so that a crash test can hold the
state a killed process left to the states the calls around the kill would have left.

The vocabulary of calls (:data:`OPS`), shared by the model and by the process that runs them
on a real store (:func:`bucketstore.testing.topic_crash.run_ops`), one tuple each:

``("sub", name, start)``: ``topic.subscription(name, start=start)``;
``("delete", name)``: ``topic.delete_subscription(name)``;
``("add", via, rows)``: an add of ``rows`` ``[(ledger, entry, delay_ms), ...]`` (delivery time:
the clock plus the delay) through the topic (``via`` None) or subscription ``via``: one row with
``add_message``, more with ``add_messages``;
``("advance", ms)``: the clock moves; ``("deliver", name, n)``: ``get_scheduled_messages(n)``;
``("confirm", name)``, ``("clear", name)``, ``("mark", name, ledger, entry)``;
``("flush", name)``: the subscription's ``flush`` (the topic's when ``name`` is None);
``("restart",)``: the store is closed cleanly and opened again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SubscriptionModel", "TopicModel", "OPS", "Row", "Position"]

Position = tuple[int, int]
Row = tuple[int, int, int]  # deliver_at, ledger, entry
OPS = ("sub", "delete", "add", "advance", "deliver", "confirm", "clear", "mark", "flush", "restart")


@dataclass
class SubscriptionModel:
    """One subscription: tracked positions (at the time first added), its acknowledgement, and
    the rows of its unconfirmed batch and of the batches a restart brought back."""

    tracked: dict[Position, int] = field(default_factory=dict)
    acked: Position | None = None
    unconfirmed: list[Row] = field(default_factory=list)
    redeliver: list[Row] = field(default_factory=list)
    #: False: ``delivery="at-most-once"``, a batch is delivered for good as it is returned.
    at_least_once: bool = True

    def add(self, ledger: int, entry: int, at: int, cutoff: int) -> bool:
        pos = (ledger, entry)
        if self.acked is not None and pos <= self.acked:
            return False
        if at <= cutoff:
            self.tracked.pop(pos, None)  # an add already due untracks it
            self.redeliver = [r for r in self.redeliver if (r[1], r[2]) != pos]  # tracked again at open
            return False
        if any((r[1], r[2]) == pos for r in self.redeliver):
            return True  # a tracker, restarted, tracks it again at its old time
        if pos not in self.tracked:
            self.tracked[pos] = at  # a tracker keeps the first time until it delivers
            # Tracked again: its new time replaces its redelivery (the tracker's handoff supersedes it).
            self.unconfirmed = [r for r in self.unconfirmed if (r[1], r[2]) != pos]
        return True

    def deliver(self, n: int, cutoff: int) -> list[Position]:
        """Take up to ``n``: the rows to deliver again first, then the due tracked ones in
        (time, ledger, entry) order; the batch before is confirmed."""
        first, self.redeliver = self.redeliver[:n], self.redeliver[n:]
        due = sorted((at, *pos) for pos, at in self.tracked.items() if at <= cutoff)[:n - len(first)]
        for _, ledger, entry in due:
            del self.tracked[(ledger, entry)]
        batch = first + due
        self.unconfirmed = batch if self.at_least_once else []
        return sorted((ledger, entry) for _, ledger, entry in batch)

    def confirm(self) -> None:
        self.unconfirmed = []

    def mark_delete(self, ledger: int, entry: int) -> None:
        pos = (ledger, entry)
        if self.acked is not None and pos < self.acked:
            return
        self.acked = pos
        self.tracked = {p: t for p, t in self.tracked.items() if p > pos}
        # Acknowledged: never to come back, not even from a batch nobody confirmed.
        self.redeliver = [r for r in self.redeliver if (r[1], r[2]) > pos]
        self.unconfirmed = [r for r in self.unconfirmed if (r[1], r[2]) > pos]

    def clear(self) -> None:
        self.tracked, self.unconfirmed, self.redeliver = {}, [], []

    def reopened(self) -> None:
        """A restart: the batch not confirmed is delivered again, first, in row order."""
        self.redeliver = sorted(set(self.redeliver) | set(self.unconfirmed))
        self.unconfirmed = []

    @property
    def count(self) -> int:
        """``number_of_delayed_messages``: tracked, or to be delivered again (never both)."""
        return len(self.tracked) + len(self.redeliver)

    @property
    def recoverable(self) -> set[Position]:
        """What a restart from this state brings back: tracked, or to be delivered (again)."""
        return set(self.tracked) | {(r[1], r[2]) for r in self.redeliver + self.unconfirmed}

    def next_time(self) -> int | None:
        if self.redeliver:
            return min(r[0] for r in self.redeliver)
        return min(self.tracked.values(), default=None)


@dataclass
class TopicModel:
    """A topic and its subscriptions, with the clock the calls run at (ms).

    ``exists`` is False until the store holding the topic was first opened.
    """

    tick_ms: int
    now: int = 1_000
    subs: dict[str, SubscriptionModel] = field(default_factory=dict)
    exists: bool = False
    at_least_once: bool = True  #: the store's ``delivery``: False for ``"at-most-once"``

    def copy(self) -> "TopicModel":
        return copy.deepcopy(self)

    @property
    def cutoff(self) -> int:
        # The workloads' clock never moves back, so the topic's cutoff is always the last reading's.
        return self.now + self.tick_ms

    def apply(self, op: tuple[Any, ...]) -> Any:
        """Run one call of :data:`OPS` (or ``("open",)``) on the model; what the store must answer."""
        kind = op[0]
        if kind in ("open", "restart"):
            self.exists = True
            for s in self.subs.values():
                s.reopened()
            return None
        if kind == "sub":
            # A new one sees what is added from now on.
            self.subs.setdefault(op[1], SubscriptionModel(at_least_once=self.at_least_once))
            return None
        if kind == "delete":
            del self.subs[op[1]]
            return None
        if kind == "advance":
            self.now += op[1]
            return None
        if kind == "add":
            via, rows = op[1], [(lg, en, self.now + dt) for lg, en, dt in op[2]]
            answers = {name: [s.add(*row, self.cutoff) for row in rows] for name, s in self.subs.items()}
            if via is not None:
                mine = answers[via]
            else:  # the topic: False when due or acknowledged by every subscription
                mine = [r[2] > self.cutoff and (not self.subs or any(
                    s.acked is None or (r[0], r[1]) > s.acked for s in self.subs.values())) for r in rows]
            return mine[0] if len(rows) == 1 else sum(mine)
        sub = self.subs[op[1]] if op[1] is not None else None
        if kind == "deliver":
            return sub.deliver(op[2], self.cutoff)
        if kind == "confirm":
            sub.confirm()
        elif kind == "mark":
            sub.mark_delete(op[2], op[3])
        elif kind == "clear":
            sub.clear()
        elif kind == "flush":
            if sub is not None:
                sub.confirm()
        else:
            raise ValueError(f"unknown call {op!r}")
        return None

    def states(self, ops: list[tuple[Any, ...]]) -> tuple[list["TopicModel"], list[Any]]:
        """The model before each call and after the last (``states[i]``: after ``ops[:i]``), and
        each call's answer. This model is left as it is."""
        run = self.copy()
        states, answers = [run.copy()], []
        for op in ops:
            answers.append(run.apply(op))
            states.append(run.copy())
        return states, answers
