"""The end of a bulk build: register every bucket in one catalog transaction, or remove them all.

Runs in Spark's commit worker, a fresh Python process on the driver machine
(see :mod:`bucketstore.spark.lock` for how it stays the store's one writer).
"""

from __future__ import annotations

import os
import re

from ..engine.catalog.catalog import Catalog
from ..errors import CatalogError, CorruptLedgerError
from ..format.ledger_file import LedgerReader
from .abort_marker import mark_aborted
from .build_job import BuildJob
from .build_task import JOB_PROPERTY, BuiltBucket, remove_file
from .lock import writer_lock
from .store_access import catalog_dir, ledger_path, ledgers_dir

__all__ = ["commit_build", "discard_build"]

_LEDGER_FILE = re.compile(r"^(\d{20})\.ledger$")


def commit_build(job: BuildJob, buckets: list[BuiltBucket]) -> None:
    """Register ``buckets`` under ``job.tracker`` in one durable catalog transaction.

    Before committing, checks that nobody changed the store since planning (the
    allocator and the tracker's buckets are as planned), that the new ranges are
    pairwise disjoint and that every file is there and is this job's. Any
    failure removes the job's files and re-raises: nothing is registered.
    With ``overwrite``, the tracker's previous buckets are removed in the same
    transaction and their files deleted after it.
    """
    try:
        with writer_lock(job.store, job.lock_holder_pid):
            catalog = Catalog(catalog_dir(job.store))
            try:
                _check_unchanged(job, catalog)
                _check_disjoint(job, buckets)
                for bucket in buckets:
                    _check_file(job, bucket)
                put = {b.key: b.ledger_id for b in buckets}
                remove = [key for key, _ in job.planned_buckets if key not in put] if job.overwrite else []
                state = job.initial_state if catalog.tracker_state(job.tracker) is None else None
                next_id = max((b.ledger_id for b in buckets), default=job.first_ledger_id - 1) + 1
                catalog.commit(job.tracker, put=put, remove=remove, state=state,
                               next_ledger_id=next_id if buckets else None,
                               summaries={b.key: b.summary for b in buckets if b.summary is not None})
            finally:
                catalog.close()
    except BaseException:
        discard_build(job, buckets)
        raise
    if job.overwrite:
        # Key first, file second (as the tracker deletes): a crash here leaves
        # orphans that the next open removes, never a key without its file.
        kept = {b.ledger_id for b in buckets}
        for _, ledger_id in job.planned_buckets:
            if ledger_id not in kept:
                remove_file(ledger_path(job.store, ledger_id))


def _check_unchanged(job: BuildJob, catalog: Catalog) -> None:
    if catalog.next_ledger_id() > job.first_ledger_id:
        raise CatalogError(f"{job.store}: ledger ids from {job.first_ledger_id} on were handed out while the "
                           "build ran (the store was opened for writing); nothing was registered", path=job.store)
    if tuple(sorted(catalog.buckets(job.tracker).items())) != job.planned_buckets:
        raise CatalogError(f"{job.store}: the buckets of tracker {job.tracker!r} changed while the build ran; "
                           "nothing was registered", path=job.store)


def _check_disjoint(job: BuildJob, buckets: list[BuiltBucket]) -> None:
    ranges = sorted((b.start_ledger, b.end_ledger) for b in buckets)
    for (s1, e1), (s2, e2) in zip(ranges, ranges[1:]):
        if s2 <= e1:
            raise ValueError(f"two tasks wrote buckets over overlapping ledger ranges [{s1}, {e1}] and [{s2}, {e2}]: "
                             "each Spark partition must hold a ledger range of its own. Use "
                             "bucketstore.spark.build_store(), or df.repartitionByRange('ledger_id') before "
                             "df.write; nothing was registered")


def _check_file(job: BuildJob, bucket: BuiltBucket) -> None:
    try:
        with LedgerReader(bucket.path) as reader:
            owner = reader.properties.get(JOB_PROPERTY)
    except FileNotFoundError:
        raise CatalogError(f"{bucket.path} is gone (was the store opened while the build ran?); "
                           "nothing was registered", path=bucket.path) from None
    if owner != job.job_id:
        raise CatalogError(f"{bucket.path} was not written by this build; nothing was registered", path=bucket.path)


def discard_build(job: BuildJob, buckets: list[BuiltBucket]) -> int:
    """Remove every file of the job: those listed, and any other a lost task attempt left behind.

    Returns how many files were removed. Files this sweep cannot attribute
    (a ``.ledger.tmp`` of a killed attempt) stay for the next ``bucketstore.open``.
    """
    mark_aborted(job.store, job.job_id)  # before the listing: see abort_marker for why
    removed = 0
    for bucket in buckets:
        if os.path.exists(bucket.path):
            remove_file(bucket.path)
            removed += 1
    directory = ledgers_dir(job.store)
    for name in os.listdir(directory):
        m = _LEDGER_FILE.match(name)
        if not m or int(m.group(1)) < job.first_ledger_id:
            continue
        path = os.path.join(directory, name)
        try:
            with LedgerReader(path) as reader:
                mine = reader.properties.get(JOB_PROPERTY) == job.job_id
        except (CorruptLedgerError, FileNotFoundError):
            continue
        if mine:
            remove_file(path)
            removed += 1
    return removed
