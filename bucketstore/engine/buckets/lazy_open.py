"""Opening sealed buckets lazily: entry 0 is read when a bucket is first needed.

Recovery queues each bucket from its catalog summary alone (*unopened*); a mixin of
:class:`~bucketstore.engine.tracker.tracker.BucketTracker`, this module opens one when a delivery,
an add, a mark-delete or a merge reaches it, answers ``contains_message`` for it without
opening it where it can, and has the reader thread read ahead the buckets due soonest.
"""

from __future__ import annotations

from functools import partial

from ...errors import CatalogError, CorruptLedgerError
from ...format.bucket_summary import BucketSummary, summary_mismatch
from ...format.snapshot import BucketFile, BucketMetadata
from ..directory.identity import check_identity
from ..queue.shared_queue import Run
from .bucket_prefix import head_holds, without_delivered_head
from .sealed_bucket import SealedBucket, split_positions

__all__ = ["LazyOpening", "OPEN_AHEAD"]

#: How many of the unopened buckets due soonest have their entry 0 read ahead (off the lock).
OPEN_AHEAD = 8


class LazyOpening:
    """Unopened buckets: counted from their summaries, opened on first need."""

    # -- opening buckets lazily -----------------------------------------------------------------
    def _read_entry0(self, path: str, ledger_id: int, key: str, summary: BucketSummary | None
                     ) -> tuple[BucketMetadata, int]:
        """Read a bucket's entry 0 and check the file is the one the catalog names (and, with a
        summary, the one it summarised). The same typed errors whether at open or later."""
        try:
            bf = BucketFile(path, fs=self._store.fs)
        except FileNotFoundError:
            raise CatalogError(f"tracker {self.name!r}: catalog key {key} names ledger {ledger_id}, "
                               f"but {path} is missing", path=path, key=key) from None
        with bf:
            meta, size = bf.metadata, bf.size
            check_identity(bf, ledger_id=ledger_id, tracker=self.name, store_id=self._store.store_id, key=key)
            if summary is not None:
                why = summary_mismatch(summary, meta, size)
                if why is not None:
                    raise CorruptLedgerError(path, bf.ledger.entry_payload_offset(0),
                                             f"bucket {key}: {why}")
        return meta, size

    def _verify_before_delete(self, buckets: list[SealedBucket]) -> None:
        """Read the entry 0 of each unopened bucket about to be deleted and check it against the
        catalog summary (and the file against the key) first: no file goes on the word of a
        summary alone (the skip that made it due, its segment count, its range).

        Opened buckets were checked when opened. All are checked before any is deleted, so a
        mismatch deletes nothing; the error is the one opening the bucket would raise
        (:class:`~bucketstore.CorruptLedgerError` at entry 0's offset for a summary that
        disagrees, ``CatalogError`` for a missing file, ``LedgerIdentityError`` for a file
        of another bucket). One entry 0 read per deleted file: open stays lazy for the rest.
        """
        for b in buckets:
            if b.summary is not None and not b.dead:
                self._read_entry0(b.path, b.ledger_id, b.key, b.summary)

    def _open_covering(self, ledger_id: int) -> None:
        bucket = self._buckets.covering(ledger_id)
        if bucket is not None:
            self._open_bucket(bucket)

    def _open_bucket(self, bucket: SealedBucket, meta: BucketMetadata | None = None) -> None:
        """Read an unopened bucket's entry 0 and put its live positions in the index.

        Applies what recovery decided for it (the leading segments skipped; in journal
        mode their positions become ghosts): nothing can have touched the bucket's
        ledgers since, because every operation on them opens it first. Raises the
        same typed errors as recovery; on failure nothing changes.
        """
        if bucket.paged is not None and not bucket.dead:
            self._pager.page_in(self, bucket)  # paged out after it was opened: nothing else to apply
            return
        summary = bucket.summary
        if summary is None or bucket.dead:
            return
        if meta is None:
            ahead = self._read_ahead.take_entry0(bucket)
            meta = ahead[0] if ahead is not None else \
                self._read_entry0(bucket.path, bucket.ledger_id, bucket.key, summary)[0]
        frontier = self._recovered_frontier
        skip = bucket.current
        live, skipped = split_positions(bucket, meta, skip, need_skipped=frontier is not None)
        live = without_delivered_head(self._index, bucket, live)
        for ledger, bm in live.items():
            self._index.add_bitmap(ledger, bm)
        if skipped is not None:
            # The skipped segments' rows stay in the file (a merge reads them): a
            # delivered position re-added later must not be made live again by them.
            for ledger, bm in skipped.items():
                self._index.add_ghosts(ledger, bm)
            self._untrack_delivered(bucket, skip, frontier)
        self._forget_unopened(bucket)
        _ = bucket.counts  # the segment table, decoded from the summary before it goes
        bucket.summary = None

    def _forget_unopened(self, bucket: SealedBucket) -> None:
        self._unopened -= 1
        self._unopened_rows -= bucket.pending_indexes if bucket.paged is None else bucket.paged
        self._membership.forget(bucket.ledger_id)

    def _unopened_contains(self, bucket: SealedBucket, ledger_id: int, entry_id: int) -> bool:
        """``contains_message`` on an unopened bucket's ledger, without opening it: the index holds
        nothing of its ledgers yet, and its live positions are those recovery left it (see
        :mod:`~bucketstore.engine.buckets.sealed_membership`), but for its prefix rows, which the index
        tracks from the open (delivery untracks them: :mod:`~bucketstore.engine.buckets.bucket_prefix`).
        A bucket paged out of the index (:mod:`~bucketstore.engine.buckets.index_pager`) is answered from
        its pinned spill alone: that is the index's own state for its ledgers, prefix rows too.
        Raises what opening it would raise."""
        if bucket.paged is not None:
            return bool(self._membership.contains(bucket.ledger_id, ledger_id, entry_id))
        if head_holds(bucket, ledger_id, entry_id):
            return self._index.contains(ledger_id, entry_id)
        answer = self._membership.contains(bucket.ledger_id, ledger_id, entry_id)
        if answer is not None:
            return answer
        meta = self._read_entry0(bucket.path, bucket.ledger_id, bucket.key, bucket.summary)[0]
        live, _ = split_positions(bucket, meta, bucket.current, need_skipped=False)
        if not self._membership.add(bucket.ledger_id, bucket.start_ledger, live):
            self._open_bucket(bucket, meta)  # a dense bucket, or the spill file failed: into the index
            return self._index.contains(ledger_id, entry_id)
        return bool(self._membership.contains(bucket.ledger_id, ledger_id, entry_id))

    def _load_segment(self, bucket: SealedBucket) -> Run:
        """The shared queue's loader: open the bucket on its first load, then read the segment."""
        if bucket.summary is not None or bucket.paged is not None:  # unopened, or paged out
            # On failure nothing changed, and the queue keeps the bucket's place itself (the
            # slot it popped goes back; a run being extended stays): a slot pushed here too
            # would queue the bucket twice, and its two runs would read on past each other.
            self._open_bucket(bucket)
            self._open_ahead()
        return self._read_ahead.load(bucket)

    def _open_ahead(self) -> None:
        """Have the reader thread read the entry 0 of the unopened buckets due soonest."""
        if self._unopened and self._store.segment_reader is not None:
            self._open_ahead_of(self._queue.first_unopened(OPEN_AHEAD))

    def _open_ahead_of(self, buckets: list[SealedBucket]) -> None:
        """Have the reader thread read these unopened buckets' entry 0."""
        if self._store.segment_reader is None:
            return
        for b in buckets:
            if b.summary is not None and b.ahead is None:
                self._read_ahead.open_ahead(b, partial(self._read_entry0, b.path, b.ledger_id, b.key, b.summary))
