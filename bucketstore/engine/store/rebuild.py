"""Rebuild a lost or damaged catalog from the store's own files.

Every sealed ledger file names, in its header, its tracker, its store and its
ledger range (and entry 0 holds the segment metadata); every version-2
journal file names its tracker and store. That is enough to rebuild what the
catalog holds, except what only the catalog ever held:

=====================  ===============================================================
catalog content        rebuilt as
=====================  ===============================================================
bucket keys            one per sealed file, ``bucket_<start>_<end>`` -> its ledger id;
                       a file enclosed by another file of the same tracker (a merge
                       that crashed before removing its sources) is left out, as
                       recovery would do; of two files with the same range the one
                       holding more indexes wins (redelivery, never loss)
ledger-id allocator    above every ``*.ledger`` / ``*.ledger.tmp`` id on disk
store id               the id the files carry (files of two stores: refused)
tracker list           every tracker named by a ledger file or a journal
mark-delete position   **cannot be rebuilt**: reset to none. The tracker then keeps
                       acknowledged indexes until the embedder acknowledges again
                       (they may be redelivered; none is lost)
journal frontier       untouched: it lives in the journal files
=====================  ===============================================================

Nothing is deleted. The old catalog directory is renamed aside
(``catalog.broken-<UTC time>``), so an operator can still inspect it.
Partially overlapping ranges of one tracker cannot come from the engine's own
operations; the rebuild refuses them and names both files.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from ...errors import BucketStoreError, CatalogError, CorruptLedgerError, JournalError
from ...format.snapshot import BucketFile, bucket_key
from ..catalog.catalog import Catalog, new_store_id
from ..directory.store_lock import acquire_write_lock
from ..durability.journal import read_identity

__all__ = ["rebuild_catalog", "RebuildReport", "NothingToRebuild"]


class NothingToRebuild(CatalogError):
    """The catalog opens and belongs to the store's files: a rebuild (without ``force``) has nothing to do."""

_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger(\.tmp)?$")
_JOURNAL_NAME = re.compile(r"^(\d{20})\.journal$")


@dataclass
class RebuildReport:
    """What :func:`rebuild_catalog` did."""

    store_id: str = ""
    trackers: dict[str, int] = field(default_factory=dict)  # name -> buckets registered
    superseded: list[str] = field(default_factory=list)  # files left out: enclosed by another
    unreadable: list[str] = field(default_factory=list)  # files kept but not registered, with why
    next_ledger_id: int = 0
    old_catalog: str | None = None


@dataclass(frozen=True)
class _Bucket:
    path: str
    ledger_id: int
    start: int
    end: int
    count: int


def rebuild_catalog(store_path: str | os.PathLike[str], *, force: bool = False) -> RebuildReport:
    """Rebuild ``STORE/catalog`` from the ledger and journal files; delete nothing.

    :param force: rebuild even when the current catalog opens and belongs to these
        files (its mark-delete positions are then lost; it is kept aside).
    :raises NothingToRebuild: the catalog is healthy (without ``force``); a :class:`CatalogError`.
    :raises CatalogError: the files belong
        to more than one store, or a tracker's files overlap partially.
    :raises StoreLockedError: the store is open for writing.
    """
    path = os.path.abspath(os.fspath(store_path))
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a store directory")
    lock_fd = acquire_write_lock(path)  # a live writer must not see its catalog vanish
    try:
        report = RebuildReport()
        buckets, store_ids, highest = _scan_ledgers(os.path.join(path, "ledgers"), report)
        journal_trackers = _scan_journals(os.path.join(path, "journal"), store_ids, report)
        if len(store_ids) > 1:
            raise CatalogError(f"{path}: the files belong to {len(store_ids)} stores ({', '.join(sorted(store_ids))}): "
                               "move the foreign files out, then rebuild", path=path)
        catalog_dir = os.path.join(path, "catalog")
        if not force:
            _refuse_if_healthy(catalog_dir, store_ids)
        keys: dict[str, dict[str, int]] = {}
        for tracker, found in sorted(buckets.items()):
            keys[tracker] = _choose(tracker, found, report)
        report.store_id = next(iter(store_ids)) if store_ids else new_store_id()
        report.next_ledger_id = highest + 1
        states = {name: {"mark_delete": None} for name in set(keys) | journal_trackers}
        report.trackers = {name: len(keys.get(name, {})) for name in sorted(states)}
        if os.path.exists(catalog_dir):
            aside = catalog_dir + ".broken-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            n = 1
            while os.path.exists(aside + (f".{n}" if n > 1 else "")):
                n += 1
            aside += f".{n}" if n > 1 else ""
            os.rename(catalog_dir, aside)
            report.old_catalog = aside
        with Catalog(catalog_dir) as catalog:
            catalog.restore(report.store_id, keys, report.next_ledger_id, states)
        # The new catalog directory entry must survive a crash like its content does.
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return report
    finally:
        os.close(lock_fd)


def _scan_ledgers(directory: str, report: RebuildReport) -> tuple[dict[str, list[_Bucket]], set[str], int]:
    buckets: dict[str, list[_Bucket]] = {}
    store_ids: set[str] = set()
    highest = -1
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for name in names:
        m = _LEDGER_NAME.match(name)
        if not m:
            continue
        lid = int(m.group(1))
        highest = max(highest, lid)
        if m.group(2):
            continue  # an unfinished seal: never registered, but its id stays used
        file = os.path.join(directory, name)
        try:
            with BucketFile(file) as bf:
                props, meta, header_id = bf.ledger.properties, bf.metadata, bf.ledger_id
        except CorruptLedgerError as exc:
            report.unreadable.append(f"{file}: {exc.reason} (offset {exc.offset}); kept, not registered")
            continue
        if isinstance(props.get("store_id"), str):
            store_ids.add(props["store_id"])  # type: ignore[arg-type]
        if header_id != lid:
            report.unreadable.append(f"{file}: header says ledger {header_id}; kept, not registered")
            continue
        tracker = props.get("tracker")
        if not isinstance(tracker, str):
            report.unreadable.append(f"{file}: header names no tracker; kept, not registered")
            continue
        buckets.setdefault(tracker, []).append(_Bucket(file, lid, meta.start_ledger, meta.end_ledger, meta.count))
    return buckets, store_ids, highest


def _scan_journals(directory: str, store_ids: set[str], report: RebuildReport) -> set[str]:
    trackers: set[str] = set()
    subdirs = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for sub in subdirs:
        d = os.path.join(directory, sub)
        files = sorted(n for n in os.listdir(d) if _JOURNAL_NAME.match(n)) if os.path.isdir(d) else []
        if not files:
            continue
        try:
            identity = read_identity(os.path.join(d, files[-1]))
        except (JournalError, OSError) as exc:
            report.unreadable.append(f"{d}: journal header unreadable ({exc}); its tracker is not registered")
            continue
        if identity is not None:
            store_ids.add(identity[0])
            trackers.add(identity[1])
            continue
        try:  # version 1: the directory is the tracker name in hex
            trackers.add(bytes.fromhex(sub).decode("utf-8"))
        except ValueError:
            report.unreadable.append(f"{d}: version-1 journal in a directory that is not a hex name; "
                                     "its tracker is not registered")
    return trackers


def _refuse_if_healthy(catalog_dir: str, store_ids: set[str]) -> None:
    try:
        with Catalog(catalog_dir, readonly=True) as catalog:
            current = catalog.store_id
    except BucketStoreError:
        return  # lost or damaged: that is what a rebuild is for
    if current is None or not store_ids or current in store_ids:
        raise NothingToRebuild(f"{catalog_dir}: the catalog opens and belongs to these files: nothing to rebuild "
                               "(--force rebuilds anyway, resetting every mark-delete position)", path=catalog_dir)


def _choose(tracker: str, found: list[_Bucket], report: RebuildReport) -> dict[str, int]:
    """The non-overlapping buckets to register: an enclosing range wins, as on recovery."""
    # Widest first among equal starts; of equal ranges the fuller file first.
    found = sorted(found, key=lambda b: (b.start, -b.end, -b.count, -b.ledger_id))
    kept: list[_Bucket] = []
    for b in found:
        if kept and b.start <= kept[-1].end:
            if b.end <= kept[-1].end:
                report.superseded.append(f"{b.path}: ledgers [{b.start}, {b.end}] of tracker {tracker!r} are "
                                         f"enclosed by {kept[-1].path}")
                continue
            raise CatalogError(f"tracker {tracker!r}: {kept[-1].path} (ledgers [{kept[-1].start}, {kept[-1].end}]) "
                               f"and {b.path} (ledgers [{b.start}, {b.end}]) overlap without one enclosing the "
                               "other: move one out, then rebuild", path=b.path)
        kept.append(b)
    return {bucket_key(b.start, b.end): b.ledger_id for b in kept}
