"""Counters and latencies of a tracker's operations (PIP-195's op metrics, and latency histograms)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

__all__ = ["OpStats", "OPERATIONS", "TIMED_OPERATIONS", "LATENCY_BUCKETS", "ADD_SAMPLE_EVERY"]

#: The operations PIP-195 meters: seal (create), segment load, merge, delete.
OPERATIONS = ("create", "load", "merge", "delete")
#: Every operation with a latency histogram: PIP-195's four, the embedder's calls, and the
#: waits of adds for the store's backlog budget (``backpressure``: one per add that waited).
TIMED_OPERATIONS = OPERATIONS + ("add", "deliver", "flush", "backpressure")
#: Upper bounds, in seconds, of the latency histograms' buckets (the last one, +Inf, is implied):
#: from one add_message (a few microseconds) to a large seal or merge (seconds).
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
                   0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: ``add_message`` is timed once in this many calls: timing every call would cost about 10 % of
#: a call of a few microseconds; its calls are all counted.
ADD_SAMPLE_EVERY = 16


@dataclass(slots=True)
class _Op:
    succeeded: int = 0
    failed: int = 0
    latency_ms: float = 0.0
    #: Observations per LATENCY_BUCKETS bucket (not cumulative; the last is +Inf).
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    observed_seconds: float = 0.0


@dataclass(slots=True)
class OpStats:
    """Success/failure counts, total latency and a latency histogram per operation."""

    ops: dict[str, _Op] = field(default_factory=lambda: {name: _Op() for name in TIMED_OPERATIONS})
    #: Positions returned by get_scheduled_messages.
    delivered: int = 0

    def record(self, name: str, seconds: float, ok: bool) -> None:
        op = self.ops[name]
        if ok:
            op.succeeded += 1
        else:
            op.failed += 1
        op.latency_ms += seconds * 1000.0
        self.observe(op, seconds)

    @staticmethod
    def observe(op: _Op, seconds: float) -> None:
        op.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        op.observed_seconds += seconds

    def count_add(self) -> bool:
        """Count an ``add_message`` call; True when this one is to be timed (:data:`ADD_SAMPLE_EVERY`)."""
        op = self.ops["add"]
        op.succeeded += 1
        return op.succeeded % ADD_SAMPLE_EVERY == 0

    def observe_add(self, seconds: float) -> None:
        op = self.ops["add"]
        op.latency_ms += seconds * 1000.0
        self.observe(op, seconds)

    def as_dict(self) -> dict[str, dict[str, float]]:
        """PIP-195's four operations, as ``stats()`` reports them."""
        return {name: {"succeeded": op.succeeded, "failed": op.failed, "total": op.succeeded + op.failed,
                       "latency_ms": round(op.latency_ms, 3)}
                for name, op in self.ops.items() if name in OPERATIONS}

    def histograms(self) -> dict[str, dict[str, object]]:
        """Per timed operation: calls (ok, failed) and the latency histogram (bucket counts per
        :data:`LATENCY_BUCKETS`, not cumulative, +Inf last; the sum and number of observations)."""
        return {name: {"ok": op.succeeded, "failed": op.failed, "buckets": list(op.buckets),
                       "sum_seconds": op.observed_seconds, "observed": sum(op.buckets)}
                for name, op in self.ops.items()}
