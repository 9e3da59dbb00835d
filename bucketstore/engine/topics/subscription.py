"""A subscription of a topic: the whole tracker API over the topic's shared rows.

Each call behaves, for this subscription, as the same call on an independent tracker that had
received every add of the topic (``tests/engine/topics/test_topics_differential.py`` holds them to
it against :class:`~bucketstore.InMemoryTracker`); what the subscription stores of its own is
:class:`~bucketstore.engine.topics.subscription_state.SubscriptionState`.
"""

from __future__ import annotations

from typing import Any

from ...cutoff import as_columns, check_max, check_position, check_timestamp
from ...errors import StoreClosedError
from ...waiting import CancelToken
from .subscription_state import SubscriptionState

__all__ = ["Subscription"]


class Subscription:
    """One subscription's view of its topic. Obtain it with :meth:`Topic.subscription`."""

    def __init__(self, topic: Any, state: SubscriptionState) -> None:
        # topic: the engine's Topic (not imported: it imports this module to make handles).
        self._topic = topic
        self._state = state
        self.name = state.name
        self.config = topic.config
        self._closed = False

    def _check(self) -> None:
        if self._closed or self._topic._closed:
            raise StoreClosedError(f"subscription {self.name!r} of topic {self._topic.name!r} is closed")

    def _ready(self) -> None:
        """The gate of every call but the adds: open, and the topic's pending adds written."""
        self._check()
        self._topic._apply()

    # -- adding (forwarded to the topic: once for every subscription) -------------------------
    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Add to the topic, for every subscription; False if it is due or this subscription
        acknowledged it (dispatch it now), True otherwise."""
        check_position(ledger_id, entry_id)
        check_timestamp(deliver_at)
        with self._topic._lock:
            self._check()
            return self._topic._add_rows([(ledger_id, entry_id, deliver_at)], self._state)[0]

    def add_messages(self, indexes: Any) -> int:
        """Add a batch to the topic in one transaction; how many this subscription tracks of it."""
        ledgers, entries, deliver_at = as_columns(indexes)
        with self._topic._lock:
            self._check()
            return sum(self._topic._add_rows(list(zip(ledgers.tolist(), entries.tolist(), deliver_at.tolist())),
                                             self._state))

    # -- delivering -----------------------------------------------------------------------------
    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Take up to ``max_messages`` due indexes in index order; their positions, sorted. The
        batches returned before are confirmed by the call (see :meth:`confirm_delivered`)."""
        max_messages = check_max(max_messages)
        with self._topic._lock:
            self._ready()
            return self._topic._deliver(self._state, max_messages)

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *,
                       cancel: CancelToken | None = None) -> list[tuple[int, int]]:
        """Block until positions are due, then take them (see ``BucketTracker.wait_scheduled``)."""
        return self._topic._due.wait_batch(self, max_messages, timeout, self._topic._cutoff.lead_ms, cancel)

    def confirm_delivered(self) -> None:
        """Confirm the batches returned so far: after a crash they are not delivered again."""
        with self._topic._lock:
            self._ready()
            self._topic._confirm(self._state)

    def has_message_available(self) -> bool:
        with self._topic._lock:
            self._ready()
            cutoff = self._topic._cutoff.advance()
            t = self._next_time()
            return t is not None and t <= cutoff

    def next_delivery_time(self) -> int | None:
        with self._topic._lock:
            self._ready()
            return self._next_time()

    def _next_time(self) -> int | None:
        state = self._state
        if state.redeliver:
            return min(r[0] for r in state.redeliver)
        if state.count(self._topic._inserted) <= 0:
            return None
        row = self._topic._first_visible(state)
        return None if row is None else row[0]

    def last_delivery_time(self) -> int | None:
        """An upper bound of the latest delivery time tracked (the topic's latest row), or None."""
        with self._topic._lock:
            self._ready()
            state = self._state
            if state.count(self._topic._inserted) <= 0:
                return None
            # The rows to deliver again may have left the topic (every subscription passed them).
            times = [t for t in (self._topic._last_time(), *(r[0] for r in state.redeliver)) if t is not None]
            return max(times) if times else None

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        check_position(ledger_id, entry_id)
        with self._topic._lock:
            self._ready()
            return self._topic._contains(self._state, ledger_id, entry_id)

    @property
    def number_of_delayed_messages(self) -> int:
        with self._topic._lock:
            self._ready()
            return self._state.count(self._topic._inserted)

    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge up to ``(ledger_id, entry_id)`` for this subscription only."""
        check_position(ledger_id, entry_id)
        with self._topic._lock:
            self._ready()
            self._topic._mark_delete(self._state, ledger_id, entry_id)

    def replay_done(self) -> None:
        """Present for parity: a topic skips nothing at open, so nothing is held for a replay."""
        with self._topic._lock:
            self._ready()

    def flush(self) -> None:
        """Confirm this subscription's deliveries and make everything so far durable."""
        with self._topic._lock:
            self._ready()
            self._topic._confirm(self._state)
            self._topic._sync()

    def clear(self) -> None:
        """Forget every index, for this subscription only (the others keep theirs)."""
        with self._topic._lock:
            self._ready()
            self._topic._clear(self._state)

    def close(self) -> None:
        """Release this handle; the subscription and its state stay in the topic."""
        with self._topic._lock:
            if self._closed:
                return
            self._closed = True
            self._topic._handle_closed(self)
            self._topic._cond.notify_all()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """The tracker's figures for this subscription, and what it holds of the topic."""
        with self._topic._lock:
            self._ready()
            topic = self._topic
            sub = topic._sub_stats(self._state)
            zero = {"succeeded": 0, "failed": 0, "total": 0, "latency_ms": 0.0}
            return {"tracker": f"{topic.name}/{self.name}", "topic": topic.name, "subscription": self.name,
                    "immutable_buckets": 0, "loaded_indexes": 0, "snapshot_size_bytes": topic._file.size_bytes(),
                    "memory_bytes": 200 + 48 * (len(self._state.lost) + len(self._state.unconfirmed)
                                                + len(self._state.redeliver)),
                    "cutoff": topic._cutoff.value, **sub,
                    **{op: dict(zero) for op in ("create", "load", "merge", "delete")}}
