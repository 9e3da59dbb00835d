"""The trackers a store handle has open, by name: what a writable :class:`~bucketstore.engine.store.store.Store`
and a :class:`~bucketstore.engine.store.read_only.ReadOnlyStore` keep alike.

One handle per tracker name at a time: a tracker that closes tells its store (the
``tracker_closed`` service) and leaves the registry, unless the name already belongs
to a newer handle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["TrackerRegistry"]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=_Named)


class TrackerRegistry(Generic[T]):
    """Mixed into a store handle, which sets ``_lock`` and ``_trackers`` and defines ``_check_open``."""

    _lock: AbstractContextManager[Any]  # the handle's lock (a Lock or an RLock)
    _trackers: dict[str, T]

    def _check_open(self) -> None:
        raise NotImplementedError

    def _forget(self, tracker: T) -> None:
        """A tracker closed: drop it, if it is still the handle open under its name."""
        with self._lock:
            if self._trackers.get(tracker.name) is tracker:
                del self._trackers[tracker.name]

    def open_trackers(self) -> list[T]:
        """The trackers open on this handle, by name (what :mod:`bucketstore.metrics` reports on)."""
        with self._lock:
            self._check_open()
            return [self._trackers[name] for name in sorted(self._trackers)]
