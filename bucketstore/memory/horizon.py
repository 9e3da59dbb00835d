"""How far ahead a tracker's backlog reaches: the latest delivery time it tracks.

A tracker whose indexes sit in a heap, in buckets on disk or in runs ordered by
time cannot find its latest index without a scan. What it can keep for O(1) per
add is a *high-water mark*: the latest time tracked since it last held nothing.
Deliveries go in time order, so they never take the latest index while another
is left: the mark is exact as long as indexes leave only by delivery. Those that
leave otherwise (``mark_delete``, a re-add already due, ``clear``) may take it:
the mark then stays above the true latest until the tracker empties, an upper
bound (the "how far ahead" a dashboard shows is never short).
"""

from __future__ import annotations

__all__ = ["DeliveryHorizon"]


class DeliveryHorizon:
    """The latest delivery time added since the tracker last held nothing (see the module).

    The tracker raises it on every add (``if t > h.latest: h.latest = t``, inline on a hot
    path) and calls :meth:`emptied` where it may have become empty; a call it leaves out
    only keeps the mark higher, never lower, than the latest index.
    """

    __slots__ = ("latest",)

    def __init__(self) -> None:
        #: The mark, -1 before any add; meaningful only while the tracker holds something.
        self.latest = -1

    def added(self, deliver_at: int) -> None:
        if deliver_at > self.latest:
            self.latest = deliver_at

    def emptied(self, tracked: int = 0) -> None:
        """The tracker now holds ``tracked`` indexes: none means the mark starts afresh."""
        if not tracked:
            self.latest = -1

    def value(self, tracked: int) -> int | None:
        """The mark for a tracker holding ``tracked`` indexes: None when it holds none."""
        return self.latest if tracked > 0 and self.latest >= 0 else None
