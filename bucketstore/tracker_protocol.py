"""The tracker API as types: what every tracker of bucketstore offers, whatever keeps its indexes.

:class:`DelayedDeliveryTracker` is the method set Pulsar's ``DelayedDeliveryTracker`` names
(``add_message``, ``get_scheduled_messages``, ...) with bucketstore's additions (batches,
waiting, the delivery handoff, ``last_delivery_time``). ``BucketTracker`` (on disk),
``InMemoryTracker`` (Pulsar's heap) and ``TimeBucketTracker`` (the TimeBucket index) all satisfy
it, so a broker is written once against this type and picks its tracker by configuration.
:class:`TrackerView` is its read subset, which the read-only tracker of
``bucketstore.open(path, read_only=True)`` serves as well (its writes raise ``ReadOnlyError``).

Both are :func:`~typing.runtime_checkable`: ``isinstance(t, DelayedDeliveryTracker)`` checks
that the methods exist, not their signatures (the test suite holds those). On Python 3.11 it
reads the ``number_of_delayed_messages`` property to do so, which a closed ``BucketTracker``
refuses with ``StoreClosedError`` (3.12 looks attributes up without calling them).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .waiting import CancelToken

__all__ = ["TrackerView", "DelayedDeliveryTracker"]


@runtime_checkable
class TrackerView(Protocol):
    """The questions a tracker answers without changing anything."""

    def has_message_available(self) -> bool:
        """Whether an index is due now (at or before the cutoff)."""

    def next_delivery_time(self) -> int | None:
        """The earliest delivery time tracked, in ms; None when nothing is tracked."""

    def last_delivery_time(self) -> int | None:
        """How far ahead the backlog reaches: the latest delivery time tracked (``BucketTracker``: a cheap
        upper bound), or None when nothing is tracked."""

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked."""

    @property
    def number_of_delayed_messages(self) -> int:
        """How many indexes are tracked (a property, as on every tracker)."""

    def stats(self) -> dict[str, Any]:
        """Counters and sizes, as a JSON-friendly mapping."""


@runtime_checkable
class DelayedDeliveryTracker(TrackerView, Protocol):
    """A tracker of delayed messages: positions in, due positions out (PIP-195's tracker API)."""

    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track one index; False when it is already due or acknowledged (the caller dispatches it now)."""

    def add_messages(self, indexes: Any) -> int:
        """Track a batch (columns, a mapping of columns or rows); how many were tracked."""

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Pop up to ``max_messages`` due indexes; their positions, sorted by (ledger, entry)."""

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *,
                       cancel: CancelToken | None = None) -> list[tuple[int, int]]:
        """Block until positions are due, then take them; ``[]`` on timeout or cancellation."""

    def confirm_delivered(self) -> None:
        """Confirm the batches taken so far were handed on (the delivery handoff)."""

    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge everything up to and including the position: never delivered afterwards."""

    def replay_done(self) -> None:
        """The embedder has replayed its log after a crash: what recovery kept aside may go."""

    def flush(self) -> None:
        """Make everything added, untracked and delivered so far durable (no-op in memory)."""

    def clear(self) -> None:
        """Forget every index."""

    def close(self) -> bool | None:
        """Release the tracker (``BucketTracker`` says whether its maintenance finished in time)."""
