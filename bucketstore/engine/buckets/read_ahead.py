"""Segment read-ahead: a sealed bucket's next segment is read and decoded off the tracker's lock.

Without it, a sealed bucket's next segment is read when the shared queue reaches
it, inside ``get_scheduled_messages``, under the tracker's lock: the caller (and
every other thread waiting for the lock) waits on the disk and the decoder.

With it, the queue asks for the next segment as soon as the bucket's loaded run
runs *low* — half of it delivered (see :data:`LOW_FRACTION`), or read to its end
with the next segment still on disk — and the store's reader thread reads and
decodes it with no lock held. The segment is handed over when the queue next
needs it: :meth:`ReadAhead.load`, under the tracker's lock, takes the finished
read if it is for exactly the segment the bucket needs now, and otherwise reads
synchronously, as without read-ahead (a *miss*).

Why this is correct whatever happens meanwhile: the reader only reads (a
bucket's path, ledger id and per-segment counts and timestamps never change), and
every decision is taken under the tracker's lock at hand-over time. A bucket
merged away, deleted (``mark_delete``, exhausted, ``clear``) or closed is dead or
gone from the queue, so its read is never taken; a read for a segment the queue
already read synchronously carries a stale number and is dropped. A read that
failed (damage, EIO, a file unlinked under it) is dropped too and the segment is
read again synchronously, which raises and reports exactly as without read-ahead.
A reader thread that cannot start (out of threads or memory) refuses the request,
which is not kept: the segment is read when needed, and a later request starts it.
The finished read is published by plain attribute stores (the run, then the
``done`` flag) that the tracker reads under its lock: under the GIL the flag is
never seen before the run.

Memory: at most one read-ahead segment per sealed bucket (at most
``max_indexes_per_segment`` rows), and only for buckets the queue is delivering from.

The same thread opens buckets ahead (:class:`Entry0Read`): a bucket recovered from its
catalog summary only is *unopened* (see ``BucketTracker._open_bucket``); the
tracker asks for the entry 0 of the few unopened buckets whose first segments come
due soonest, so that opening them when the queue reaches them costs no disk read
and no decoding under the lock. The read checks everything a synchronous open
checks; the hand-over (:meth:`ReadAhead.take_entry0`) follows the rules above, and a
failed read is dropped so that the synchronous open raises the typed error itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..threads.worker_thread import WorkerThread

__all__ = ["LOW_FRACTION", "Entry0Read", "ReadAhead", "ReadAheadCounters", "SegmentRead", "SegmentReader"]

log = logging.getLogger("bucketstore")

#: A loaded run is *low* once at most this fraction of its rows is left unread: the next
#: segment's read then has the delivery of the other half to finish in.
LOW_FRACTION = 0.5

#: The sealed bucket (not imported: sealed_bucket imports the queue, which calls us through the tracker).
Bucket = Any


class SegmentRead:
    """One request: read segment ``number`` of ``bucket``. Filled in by the reader thread."""

    __slots__ = ("bucket", "number", "run", "error", "started", "done", "cancelled", "_finished")

    def __init__(self, bucket: Bucket, number: int) -> None:
        self.bucket = bucket
        self.number = number
        self.run: Any = None
        self.error: BaseException | None = None
        self.started = False
        self.done = False
        self.cancelled = False  # nobody will take it: the reader skips it if not started yet
        self._finished = threading.Event()

    def perform(self) -> None:
        """Read and decode (no lock held). Never raises: a failure is kept for the hand-over."""
        try:
            # (Flags read without the tracker's lock: a stale answer only costs a wasted read.)
            if not self.cancelled and not self.bucket.dead:
                self.started = True
                self.run = self.bucket.read_segment(self.number)
        except Exception as exc:  # damage, EIO, a file unlinked by a merge or a delete
            self.error = exc
        finally:
            self.done = True  # published last: whoever sees it sees the run or the error
            self._finished.set()

    def wait(self) -> None:
        """Wait for a read the reader has started (it takes no lock, so this cannot deadlock)."""
        self._finished.wait()


class Entry0Read(SegmentRead):
    """One request: read and check an unopened bucket's entry 0 with ``read`` (which touches
    nothing but the file); ``run`` holds what it returned."""

    __slots__ = ("read",)

    def __init__(self, bucket: Bucket, read: Callable[[], Any]) -> None:
        super().__init__(bucket, 0)
        self.read = read

    def perform(self) -> None:
        try:
            if not self.cancelled and not self.bucket.dead:
                self.started = True
                self.run = self.read()
        except Exception as exc:  # damage or EIO: the synchronous open raises it again
            self.error = exc
        finally:
            self.done = True
            self._finished.set()

    def __repr__(self) -> str:
        return f"SegmentRead({self.bucket!r}, segment {self.number}, done={self.done})"


class SegmentReader(WorkerThread[SegmentRead]):
    """The store's read-ahead thread (started on the first request; one per store);
    :meth:`stop` drops unread requests (nobody takes them: the queue reads synchronously)."""

    finish_queued_on_stop = False

    def __init__(self, name: str) -> None:
        super().__init__(f"bucketstore-readahead {name}")
        self._name = name
        self._start_failed = False  # logged once until the thread starts

    def submit(self, request: SegmentRead) -> bool:
        """Queue a read; False when it is not queued: the store is closing, or the thread cannot
        start (out of threads or memory; logged). Never raises: the queue then reads the
        segment itself when it needs it, as without read-ahead."""
        try:
            queued = self._enqueue(request)
        except RuntimeError as exc:
            if not self._start_failed:
                self._start_failed = True
                log.warning("bucketstore read-ahead of %s: the reader thread cannot start (%s); "
                            "segments are read when needed until it can", self._name, exc)
            return False
        self._start_failed = False
        return queued

    def _handle(self, request: SegmentRead) -> None:
        request.perform()


@dataclass(slots=True)
class ReadAheadCounters:
    """One tracker's read-ahead, as ``stats()["read_ahead"]`` shows it.

    :ivar requested: segments asked of the reader.
    :ivar hits: segments the queue took ready from the reader (no disk wait under the lock).
    :ivar misses: segments the queue read synchronously: nothing was asked for it
        (a merged bucket's first segment, a segment the queue needed before its run
        was low), or the read had not started yet (also counted in ``late``) or
        failed (also in ``failed``).
    :ivar late: the read was not finished when the queue needed the segment: if it
        was running, the queue waited for it (a hit: the read was under way anyway);
        if it was still queued, it was cancelled and the segment read synchronously.
    :ivar failed: the read raised; the synchronous read then reported the error, if it persisted.
    :ivar dropped: reads never taken (their bucket merged away or deleted, or the
        segment already read synchronously).
    :ivar opened_ahead: unopened buckets whose entry 0 the queue took ready from the
        reader (of ``open_requests`` asked for).
    """

    enabled: bool = False
    requested: int = 0
    hits: int = 0
    misses: int = 0
    late: int = 0
    failed: int = 0
    dropped: int = 0
    open_requests: int = 0
    opened_ahead: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"enabled": self.enabled, "requested": self.requested, "hits": self.hits, "misses": self.misses,
                "late": self.late, "failed": self.failed, "dropped": self.dropped,
                "open_requests": self.open_requests, "opened_ahead": self.opened_ahead}


class ReadAhead:
    """A tracker's read-ahead policy: what the shared queue calls to ask for and take segments.

    Every method runs under the tracker's lock. With ``reader=None`` read-ahead is
    off: :meth:`low` does nothing and :meth:`load` reads synchronously, as before.
    """

    def __init__(self, reader: SegmentReader | None) -> None:
        self._reader = reader
        self.counters = ReadAheadCounters(enabled=reader is not None)

    def low(self, bucket: Bucket) -> None:
        """The bucket's loaded run is low (or gone): ask for its next segment, once."""
        if self._reader is None or bucket.dead or not bucket.has_next_segment() or not bucket.opened:
            return  # (an unopened bucket's run is its summary's prefix: its entry 0 comes first)
        number = bucket.current + 1
        pending = bucket.ahead
        if pending is not None:
            if pending.number == number:
                return  # already asked for
            pending.cancelled = True
            bucket.ahead = None
            self.counters.dropped += 1  # asked for a segment the queue has read since
        request = SegmentRead(bucket, number)
        if self._reader.submit(request):
            bucket.ahead = request
            self.counters.requested += 1

    def open_ahead(self, bucket: Bucket, read: Callable[[], Any]) -> None:
        """Ask the reader for an unopened bucket's entry 0 (``read`` reads and checks it), once."""
        if self._reader is None or bucket.dead or bucket.ahead is not None:
            return
        request = Entry0Read(bucket, read)
        if self._reader.submit(request):
            bucket.ahead = request
            self.counters.open_requests += 1

    def take_entry0(self, bucket: Bucket) -> Any:
        """What the reader's :class:`Entry0Read` of ``bucket`` returned, or None (not asked for,
        still queued, or failed): the caller then reads synchronously."""
        request = bucket.ahead
        if not isinstance(request, Entry0Read):
            return None
        bucket.ahead = None
        if not request.done:
            if not request.started:
                request.cancelled = True  # still queued: reading now is quicker
                return None
            request.wait()
        if request.run is None:
            return None
        self.counters.opened_ahead += 1
        return request.run

    def load(self, bucket: Bucket) -> Any:
        """The bucket's next segment as a run: the read-ahead's if it is ready and for this
        segment, else read now (which raises, and records the load, as without read-ahead)."""
        request, bucket.ahead = bucket.ahead, None
        c = self.counters
        if request is not None:
            if request.number != bucket.current + 1:
                c.dropped += 1  # for a segment the queue has read since
                request.cancelled = True
            else:
                if not request.done:
                    c.late += 1
                    if request.started:
                        request.wait()  # at most one read's time, and that read is under way
                    else:
                        request.cancelled = True  # still queued: reading now is quicker
                if request.done and request.run is not None:
                    c.hits += 1
                    return bucket.adopt(request.number, request.run)
                if request.error is not None:
                    c.failed += 1
                    log.info("bucketstore read-ahead of %r failed (%s: %s); reading it synchronously",
                             bucket, type(request.error).__name__, request.error)
        if self._reader is not None:
            c.misses += 1
        return bucket.load_next_segment()

    def forget(self, bucket: Bucket) -> None:
        """The bucket is gone (deleted, merged away, the tracker closed): drop its read."""
        if bucket.ahead is not None:
            bucket.ahead.cancelled = True
            bucket.ahead = None
            self.counters.dropped += 1

    @staticmethod
    def held_rows(buckets: list[Bucket]) -> int:
        """Rows held by finished reads not yet taken."""
        return sum(len(b.ahead.run.ts) for b in buckets
                   if b.ahead is not None and b.ahead.done and b.ahead.run is not None
                   and not isinstance(b.ahead, Entry0Read))
