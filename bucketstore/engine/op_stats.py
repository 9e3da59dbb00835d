"""Counters and latencies of a tracker's bucket operations (PIP-195's op metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OpStats", "OPERATIONS"]

#: The operations PIP-195 meters: seal (create), segment load, merge, delete.
OPERATIONS = ("create", "load", "merge", "delete")


@dataclass(slots=True)
class _Op:
    succeeded: int = 0
    failed: int = 0
    latency_ms: float = 0.0


@dataclass(slots=True)
class OpStats:
    """Success/failure counts and total latency per operation."""

    ops: dict[str, _Op] = field(default_factory=lambda: {name: _Op() for name in OPERATIONS})

    def record(self, name: str, seconds: float, ok: bool) -> None:
        op = self.ops[name]
        if ok:
            op.succeeded += 1
        else:
            op.failed += 1
        op.latency_ms += seconds * 1000.0

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {name: {"succeeded": op.succeeded, "failed": op.failed, "total": op.succeeded + op.failed,
                       "latency_ms": round(op.latency_ms, 3)}
                for name, op in self.ops.items()}
