"""Recovery: the tracker rebuilt at open from the catalog and (journal mode) the journal.

A mixin of :class:`~bucketstore.engine.tracker.tracker.BucketTracker` (``_recover``, called once by
its constructor, and the journal replay), and the module-level rules it applies: which
bucket a crash mid-merge left over, which bucket opening deletes, and what it logs.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from ...errors import CatalogError, CorruptLedgerError
from ...format.bucket_summary import decode_summary, encode_summary
from ...format.ledger_file import ledger_file_name
from ...format.snapshot import bucket_key, parse_bucket_key
from ..buckets.bucket_prefix import first_rows, take_head, track_heads
from ..buckets.sealed_bucket import SealedBucket
from ..directory.identity import LedgerIdentityError
from ..durability.handoff import DeliveryHandoff, after_key
from ..queue.index_set import bitmap_of
from ..queue.shared_queue import Run, Slot

__all__ = ["Recovery"]

log = logging.getLogger("bucketstore")
_U64 = np.dtype("<u8")


class Recovery:
    """What the tracker's constructor runs last: the catalog's buckets queued, the journal replayed."""

    # -- recovery -------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Rebuild from the catalog and (journal mode) the journal; ledger files are read later.

        ``sealed`` mode follows PIP-195 §3.9: leading segments that are already
        due are skipped, because the embedder replays its log from the
        mark-delete position and re-adds them (add_message returns False and
        they are dispatched). Unlike Pulsar, their buckets are kept (``held_rows``)
        until :meth:`replay_done` or a mark-delete past them: no one has received
        those rows, and a clock stepped forward, a long stop or a newcomer who only
        looks must not delete them. ``journal`` mode skips only what the durable
        delivery frontier says was delivered (and confirmed), and replays the journal.
        What opening deletes (buckets mark-delete passed, journal-mode buckets wholly
        behind the frontier, the sources of a merge that committed, repair's drops) is
        logged with its key, ledger, file, rows and reason.

        Each bucket's catalog summary (segment table and count) is enough to
        decide the skip, to count its indexes and to queue it by its first live
        segment: the bucket stays *unopened* and its entry 0 is read when it is
        first needed (:meth:`_open_bucket`); one that opening deletes has its entry 0 read
        and checked against the summary first (a disagreement raises, nothing is deleted:
        see :meth:`_verify_before_delete`). Opened now are only buckets without
        a summary (written before summaries existed: read and summarised, the
        summaries committed here), the one a mark-delete position cuts through,
        those the journal's frontier falls inside (their delivered rows must be
        untracked to count exactly), and every bucket in ``repair`` mode (which
        must find damage to drop it).
        """
        started = time.perf_counter()
        store = self._store
        state = store.catalog.tracker_state(self.name)
        if self._journal is not None and not self._read_only and (state is None or state.get("durability") == "sealed"):
            # Not this tracker's journal: a deleted tracker's of that name (its deletion had
            # stopped half-way), or left beside a tracker recorded as sealed. Removed before the
            # state commit (a crash in between must not make them this tracker's), and replayed
            # never: they would bring back indexes no one holds any more.
            dropped = self._journal.discard_deleted()
            if dropped:
                log.info("tracker %r: removed %d journal file(s) of a deleted tracker of that name, or left "
                         "beside the tracker while it was a sealed one", self.name, dropped)
        if state is None:
            store.catalog.commit(self.name, state=self._state)
            state = self._state
        md = state.get("mark_delete")
        if isinstance(md, list) and len(md) == 2 and all(isinstance(v, int) for v in md):
            self._mark_delete = (md[0], md[1])
        keys, summaries = store.catalog.keys_and_summaries(self.name)
        ranges, enclosed = _resolve_ranges(keys, self.name)
        stale_keys = list(enclosed)
        cutoff = self._cutoff.advance()
        replayed = self._journal.replay() if self._journal is not None else None
        frontier = replayed.frontier if replayed is not None else None
        self._handoff = DeliveryHandoff(store.delivery, frontier)
        if frontier is not None:
            # The cutoff was at least the frontier's time when that index was delivered.
            # Keeping it there across the restart (whatever the clock says now) keeps every
            # new index after the frontier, which is what makes the frontier sufficient.
            self._cutoff.raise_to(frontier[0])
            cutoff = self._cutoff.value
        self._recovered_frontier = frontier
        dropped: list[str] = []
        doomed: list[SealedBucket] = []
        backfill: dict[str, bytes] = {}
        heads: list[Run] = []
        first_live = self._mark_delete[0] if self._mark_delete else 0

        def drop_for_repair(key: str, ledger_id: int, path: str, exc: BaseException) -> None:
            """``repair=True``: a damaged bucket's key goes (logged), its rows are lost."""
            dropped.append(f"{key}: {exc}")
            stale_keys.append(key)
            _log_repair_drop(self.name, key, ledger_id, path, exc)

        for (start, end), ledger_id in ranges:
            key = bucket_key(start, end)
            path = os.path.join(store.ledgers_dir, ledger_file_name(ledger_id))
            raw = None if store.repair else summaries.get(key)
            meta = None
            try:
                if raw is None:
                    meta, size = self._read_entry0(path, ledger_id, key, None)
                    raw = backfill[key] = encode_summary(meta, ledger_id, size,
                                                         None if self._read_only else first_rows(path, meta))
                summary = decode_summary(raw, path=store.catalog.path, key=key)
                if summary.ledger_id != ledger_id:
                    raise CatalogError(f"{store.catalog.path}: tracker {self.name!r} key {key} names ledger "
                                       f"{ledger_id}, but its summary describes ledger {summary.ledger_id}",
                                       path=store.catalog.path, key=key)
            except LedgerIdentityError:
                raise  # an intact file of someone else: not damage that repair may drop
            except (CatalogError, CorruptLedgerError) as exc:
                # Only proven damage is dropped; an OSError (EACCES, EMFILE, EIO) says nothing
                # about the file and propagates, leaving the key and the file in place.
                if not store.repair:
                    raise
                drop_for_repair(key, ledger_id, path, exc)
                continue
            n = summary.segments
            # The first segment's max timestamp (in the summary's header) settles the common
            # case, no skip; the table is decoded only when leading segments are due.
            bound = cutoff + 1 if replayed is None else frontier[0] if frontier is not None else 0
            skip = 0
            if n and summary.first_max < bound:
                try:
                    max_ts = summary.table()[1]
                except CatalogError as exc:
                    if not store.repair:
                        raise
                    drop_for_repair(key, ledger_id, path, exc)
                    continue
                while skip < n and int(max_ts[skip]) < bound:
                    skip += 1
            bucket = SealedBucket.unopened(path, ledger_id, start, end, summary, first_segment=skip + 1,
                                           on_load=self._record_load, fs=store.fs)
            fate = _fate_at_open(skip, n, end, first_live, sealed=replayed is None)
            if fate is not None:
                if meta is None and not self._read_only:
                    # Deleted only on the file's word: a summary that disagrees with entry 0 is
                    # damage, raised here before the catalog or any file is touched.
                    self._read_entry0(path, ledger_id, key, summary)
                _ = bucket.counts  # the table, before the summary goes
                bucket.summary = None  # deleted below: never counted among the unopened
                doomed.append(bucket)
                _log_removal_at_open(self.name, key, ledger_id, path, int(bucket.counts.sum()), fate)
                continue
            if skip and replayed is None:
                # Sealed mode: the due segments are skipped, not delivered (PIP-195 §3.9), and
                # the file stays their only copy until the embedder's replay is done.
                bucket.held_rows = int(bucket.counts[:skip].sum())
            self._buckets.add(bucket)
            self._unopened += 1
            self._unopened_rows += bucket.pending_indexes
            if meta is not None or store.repair or (self._mark_delete is not None and start <= first_live <= end) \
                    or (frontier is not None and bucket.next_segment_min_ts() <= frontier[0]):
                try:
                    self._open_bucket(bucket, meta)
                except (OSError, CorruptLedgerError, CatalogError) as exc:
                    if not store.repair or isinstance(exc, (OSError, LedgerIdentityError)):
                        raise
                    drop_for_repair(key, ledger_id, path, exc)
                    self._buckets.remove(bucket)
                    self._forget_unopened(bucket)
                    continue
            if bucket.has_next_segment():
                # Its first rows from the summary, if it keeps them: the file waits (bucket_prefix).
                head = None if self._read_only or not bucket.summary else take_head(bucket)
                if head is not None:
                    heads.append(head)
                    self._unopened_rows -= head.remaining  # tracked in the index instead
                self._queue.push(head or Slot(bucket))
            else:
                self._held_drained.append(bucket)  # every segment skipped: nothing to deliver
        track_heads(self._index, heads)
        if enclosed and not self._read_only:
            # The enclosed files go on the word of the wider key: its file must say the same first.
            enclosers = [self._buckets.covering(parse_bucket_key(k)[0]) for k in enclosed]
            self._verify_before_delete(list({id(b): b for b in enclosers if b is not None}.values()))
        if (stale_keys or backfill) and not self._read_only:
            # Summaries of keys written before summaries existed, in one transaction with
            # the stale keys' removal; a crash before it only means reading entry 0 again.
            store.catalog.commit(self.name, remove=stale_keys, summaries=backfill)
            for key in enclosed:  # key first, then file: a crash here leaves only orphans
                _log_removal_at_open(self.name, key, keys[key], os.path.join(
                    store.ledgers_dir, ledger_file_name(keys[key])), _summary_count(summaries.get(key)),
                    "enclosed by a wider bucket (a merge committed before the crash removed its sources)")
                store.remove_ledger_file(os.path.join(store.ledgers_dir, ledger_file_name(keys[key])))
        self._delete_buckets(doomed)
        if replayed is not None:
            self._replay(replayed.records, frontier)
        if self._mark_delete:
            self._index.drop_ledgers_below(self._mark_delete[0])
            self._index.drop_through(*self._mark_delete)
        if not self._read_only and {k: state.get(k) for k in ("config", "durability")} != \
                {k: self._state[k] for k in ("config", "durability")}:
            # The mode and config this open uses, recorded once the journal replayed (a stray file
            # that fails it leaves a sealed tracker sealed) and before anything is journaled: a
            # sealed tracker opened in journal mode is a journal tracker from here on (tracker_record).
            store.catalog.commit(self.name, state=self._state)
        if self._journal is not None:
            self._checkpoint()  # compact: one file holding exactly the recovered memory-only state
        self._open_ahead()
        self.recovery_seconds = time.perf_counter() - started
        held = [b for b in self._buckets.values() if b.held_rows]
        if held:
            log.info("tracker %r: recovery skipped %d due indexes in %d bucket(s) (sealed mode: the embedder's "
                     "replay re-adds them); their files are kept until replay_done() or a mark-delete past them",
                     self.name, sum(b.held_rows for b in held), len(held))
        self.recovery_report = {"buckets": len(self._buckets), "deleted_due": len(doomed),
                                "enclosed_removed": len(enclosed), "dropped": dropped,
                                "unopened": self._unopened, "summaries_backfilled": len(backfill),
                                "held_for_replay_buckets": len(held),
                                "held_for_replay_indexes": sum(b.held_rows for b in held)}

    def _untrack_delivered(self, bucket: SealedBucket, first: int, frontier: tuple[int, int, int]) -> None:
        """Untrack a bucket's indexes at or before the frontier in the segments it falls in."""
        for number in range(first + 1, bucket.segment_count + 1):
            if int(bucket.min_ts[number - 1]) > frontier[0]:
                break
            run = bucket.read_segment(number)
            if number == 1 and bucket.summary is not None:
                # A prefix delivered and confirmed in an earlier run put the frontier where
                # it is: a forged row there would untrack the real one it stood for.
                bucket.check_prefix(bucket.summary, run)
            done = ~after_key(run.ts, run.ledgers, run.entries, frontier)
            for ledger, entry in zip(run.ledgers[done].tolist(), run.entries[done].tolist()):
                self._index.discard(ledger, entry)
                # Its row stays in this segment: if the journal re-adds the position with
                # another time, only that time is live (as after a live delivery).
                self._index.add_ghosts(ledger, bitmap_of(np.array([entry], dtype=_U64)))

    def _replay(self, records: list[tuple], frontier: tuple[int, int, int] | None) -> None:
        """Re-apply journaled adds and untracks, in order, without the expiry check (a due
        index must now be delivered, not refused) and without journaling them again."""
        replaying, self._replaying = self._replaying, True
        # Consecutive add records are applied as one batch, cut where the ledger changes: a
        # journal of single adds holds one record per add, and applying each on its own cost
        # ~20 us (1 s per 50,000). The same outcome: within a ledger's run the first row of a
        # position wins, as the first record did, and a new ledger starts a new run, in order.
        adds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        try:
            for rec in records:
                if rec[0] == "x":
                    self._replay_adds(adds)
                    if self._unopened and rec[1] <= self._buckets.newest_end:
                        self._open_covering(rec[1])
                    if self._index.expire(rec[1], rec[2]):
                        # As a live expiry does: the TimeBucket index holds a position once, and a
                        # replayed re-add at another time must replace the row, not be dropped.
                        self._mutable.discard(rec[1], rec[2])
                    continue
                ledgers, entries, ts = rec[1], rec[2], rec[3]
                if frontier is not None:
                    keep = after_key(ts, ledgers, entries, frontier)
                    ledgers, entries, ts = ledgers[keep], entries[keep], ts[keep]
                if len(ledgers):
                    adds.append((ledgers, entries, ts))
            self._replay_adds(adds)
        finally:
            self._replaying = replaying

    def _replay_adds(self, adds: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Apply (and empty) the add records gathered since the last untrack, in order."""
        if not adds:
            return
        if len(adds) == 1:
            ledgers, entries, ts = adds[0]
        else:
            ledgers, entries, ts = (np.concatenate(cols) for cols in zip(*adds))
        adds.clear()
        cuts = np.flatnonzero(ledgers[1:] != ledgers[:-1]) + 1
        for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(ledgers)])).tolist()):
            self._add_ledger_run(int(ledgers[lo]), entries[lo:hi], ts[lo:hi], self._cutoff.value,
                                 journal=False, expire=False, trim=False)


def _fate_at_open(skip: int, segments: int, end: int, first_live: int, *, sealed: bool) -> str | None:
    """Why recovery deletes a bucket now, or None when it keeps it.

    Only what someone received goes: a bucket mark-delete passed (acknowledged), or in
    journal mode one whose every segment lies behind the durable (confirmed) delivery
    frontier. Sealed mode's skipped segments were never delivered: kept for the replay.
    """
    if end < first_live:
        return f"acknowledged: its ledgers end before the mark-delete position's ledger {first_live}"
    if segments == 0:
        return "empty: it holds no segment"
    if skip == segments and not sealed:
        return "delivered: every segment is behind the journal's confirmed delivery frontier"
    return None


def _summary_count(raw: bytes | None) -> int | None:
    """The row count a catalog summary records (None when there is none or it does not decode)."""
    if raw is None:
        return None
    try:
        return decode_summary(raw, path="", key="").count
    except (CatalogError, ValueError):
        return None


def _log_removal_at_open(tracker: str, key: str, ledger_id: int, path: str, rows: int | None, why: str) -> None:
    log.info("tracker %r: recovery deletes bucket %s (ledger %d, %s, %s rows): %s",
             tracker, key, ledger_id, path, "?" if rows is None else rows, why)


def _log_repair_drop(tracker: str, key: str, ledger_id: int, path: str, exc: BaseException) -> None:
    log.warning("tracker %r: repair drops bucket %s (ledger %d, %s): damaged: %s; its rows are lost, and the "
                "file goes at the next open if no key names it", tracker, key, ledger_id, path, exc)


def _resolve_ranges(keys: dict[str, int], tracker: str) -> tuple[list[tuple[tuple[int, int], int]], list[str]]:
    """Order the catalog's buckets by range and resolve overlaps left by a crash mid-merge.

    A range that encloses others wins (the others are leftovers of a merge whose
    new key was committed before the old ones were removed); a partial overlap
    cannot come from any sequence of our own operations and is reported, never
    silently dropped. Deterministic: independent of key order.
    """
    parsed = []
    for key, ledger_id in keys.items():
        try:
            parsed.append((parse_bucket_key(key), ledger_id, key))
        except ValueError:
            raise CatalogError(f"tracker {tracker!r}: catalog key {key!r} is not a bucket key", key=key) from None
    # Widest first among equal starts, so an enclosing range is seen before what it encloses.
    parsed.sort(key=lambda p: (p[0][0], -p[0][1]))
    kept: list[tuple[tuple[int, int], int, str]] = []
    stale: list[str] = []
    for (start, end), ledger_id, key in parsed:
        if kept and start <= kept[-1][0][1]:
            (ks, ke), _, kkey = kept[-1]
            if end <= ke:
                stale.append(key)
                continue
            raise CatalogError(f"tracker {tracker!r}: bucket keys {kkey} and {key} overlap without one enclosing "
                               "the other", key=key)
        kept.append(((start, end), ledger_id, key))
    return [(r, lid) for r, lid, _ in kept], stale
