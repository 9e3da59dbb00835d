"""One task of a bulk build: its partition's rows in, sealed ledger files out.

Files are written straight into ``ledgers/`` under their final names (through
the ledger layer's temporary name, fsync and rename), but no catalog key
references them until the job commits. Until then they are orphans: a failed
task removes its own, ``abort`` removes those of the tasks that finished, and
whatever a crash leaves is removed by the next ``bucketstore.open``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import CorruptLedgerError
from ..format.ledger_file import LedgerReader
from ..format.bucket_summary import encode_summary
from ..format.snapshot import build_bucket, write_bucket
from .abort_marker import JobAborted, is_aborted
from .bucketing import Rows, cut_buckets, order_positions, time_order
from .build_job import BuildJob
from .store_access import ledger_path, ledgers_dir

__all__ = ["BuiltBucket", "BUILD_COLUMNS", "PACKED_COLUMNS", "rows_from_batches", "write_partition", "write_planned",
           "JOB_PROPERTY", "remove_file"]

#: The columns a bulk build reads; any other columns are ignored.
BUILD_COLUMNS = ("ledger_id", "entry_id", "deliver_at")
#: What ``build_store`` ships to its tasks when every id fits in 32 bits:
#: ``position = ledger_id << 32 | entry_id``, one column fewer to convert to
#: Arrow in the JVM and to shuffle.
PACKED_COLUMNS = ("position", "deliver_at")
_LOW32 = np.uint64(0xFFFFFFFF)
#: Ledger header property naming the build that wrote a file.
JOB_PROPERTY = "build_job"
_U64 = np.dtype("<u8")
_NOT_DETERMINISTIC = ("is the input DataFrame deterministic (the same rows in the same partitions each time it is "
                      "evaluated)? Nothing was registered")


@dataclass(frozen=True, slots=True)
class BuiltBucket:
    """A sealed, not yet registered bucket file."""

    key: str
    ledger_id: int
    start_ledger: int
    end_ledger: int
    count: int
    path: str
    #: The catalog summary the commit registers with the key (``format.bucket_summary``).
    summary: bytes | None = None


def rows_from_batches(batches: Iterable[pa.RecordBatch], packed: bool = False) -> Rows:
    """Gather the build columns of Arrow batches into uint64 columns.

    Ids arrive as Spark BIGINTs: a negative value is the two's-complement
    spelling of an id of 2**63 or more (the reader writes them that way) and is
    reinterpreted, not rejected. ``deliver_at`` must be non-negative: a bulk
    build keeps every row, and a negative time has no unsigned meaning.

    :param packed: the batches hold :data:`PACKED_COLUMNS` (positions packed
        by ``build_store``), not :data:`BUILD_COLUMNS`.
    """
    names = PACKED_COLUMNS if packed else BUILD_COLUMNS
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for batch in batches:
        for name in names:
            column = batch.column(name)
            if column.null_count:
                raise ValueError(f"column {name} holds nulls; every row needs a ledger_id, entry_id and deliver_at")
            parts[name].append(column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
    cols = {name: (np.concatenate(chunks) if chunks else np.zeros(0, np.int64)) for name, chunks in parts.items()}
    deliver_at = cols["deliver_at"]
    if len(deliver_at) and int(deliver_at.min()) < 0:
        raise ValueError("deliver_at holds a negative value; delivery times are epoch milliseconds >= 0")
    if packed:
        position = cols["position"].view(_U64)
        return Rows(position >> np.uint64(32), position & _LOW32, deliver_at.view(_U64))
    return Rows(cols["ledger_id"].view(_U64), cols["entry_id"].view(_U64), deliver_at.view(_U64))


def remove_file(path: str) -> None:
    """Unlink a file if it exists."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _claim(job: BuildJob, ledger_id: int) -> str:
    """Make way for this job's ledger ``ledger_id``: clear what an earlier attempt of the same task left there."""
    path = ledger_path(job.store, ledger_id)
    remove_file(path + ".tmp")  # ids of this block are this job's alone
    if os.path.exists(path):
        try:
            with LedgerReader(path) as reader:
                owner = reader.properties.get(JOB_PROPERTY)
        except CorruptLedgerError:
            owner = None
        if owner != job.job_id:
            raise FileExistsError(f"{path} exists and was not written by this build; "
                                  "the store allocated ledger ids while the build was running")
        remove_file(path)
    return path


def write_partition(job: BuildJob, rows: Rows, partition_id: int) -> list[BuiltBucket]:
    """Write one task's rows as sealed bucket files and describe them for the commit.

    On any failure, or when the job has been aborted meanwhile (see
    :mod:`~bucketstore.spark.abort_marker`), the files this call wrote are
    removed before the error propagates.
    """
    rows = order_positions(rows)
    slices = cut_buckets(rows.ledgers, job.config.min_index_count_per_bucket, job.forbidden_ranges)
    written: list[BuiltBucket] = []
    with _all_or_none(job, written):
        for n, cut in enumerate(slices):
            written.append(_seal(job, partition_id, n, cut.start_ledger, cut.end_ledger,
                                 rows.take(slice(cut.lo, cut.hi))))
    return written


def write_planned(job: BuildJob, chunks: Iterable[Rows], buckets: Sequence[tuple[int, int, int]],
                  partition_id: int) -> list[BuiltBucket]:
    """Write the planned buckets ``(start_ledger, end_ledger, rows)`` of one task, each as soon as its rows are in.

    The task of an in-place build (see :func:`~bucketstore.spark.build_plan.plan_in_place`)
    reads an input partition that was not shuffled. The driver counted its
    rows per bucket, so a bucket is sealed the moment its last row arrives:
    a partition in ledger order holds one bucket's rows at a time, however
    large it is; rows in any other order are held until their bucket is
    complete. Rows the plan did not count (an input that yields other rows
    when evaluated again) fail the task; cleanup as in :func:`write_partition`.
    """
    starts = np.array([b[0] for b in buckets], dtype=_U64)
    ends = np.array([b[1] for b in buckets], dtype=_U64)
    pending: dict[int, list[Rows]] = {}
    filled = [0] * len(buckets)
    written: list[BuiltBucket] = []
    with _all_or_none(job, written):
        for chunk in chunks:
            if not len(chunk):
                continue
            which = np.searchsorted(starts, chunk.ledgers, side="right") - 1
            outside = (which < 0) | (chunk.ledgers > ends[np.maximum(which, 0)]) if len(buckets) else which < 0
            if outside.any():
                bad = int(chunk.ledgers[np.argmax(outside)])
                raise ValueError(f"task {partition_id} got a row of ledger {bad}, which the planning pass did not "
                                 f"see in this partition; {_NOT_DETERMINISTIC}")
            if bool((which[1:] >= which[:-1]).all()):
                # Rows in bucket order (a partition in ledger order): each bucket's
                # rows are one slice of the chunk, taken as views, not copied.
                cuts = (np.flatnonzero(which[1:] != which[:-1]) + 1).tolist()
                groups = [(int(which[a]), chunk.take(slice(a, b)))
                          for a, b in zip([0, *cuts], [*cuts, len(which)])]
            else:
                groups = [(int(n), chunk.take(which == n)) for n in np.unique(which)]
            for n, part in groups:
                filled[n] += len(part)
                if filled[n] > buckets[n][2]:
                    raise ValueError(f"task {partition_id} got more rows for ledgers [{buckets[n][0]}, "
                                     f"{buckets[n][1]}] than the planning pass counted; {_NOT_DETERMINISTIC}")
                pending.setdefault(n, []).append(part)
                if filled[n] == buckets[n][2]:
                    parts = pending.pop(n)
                    rows = order_positions(Rows(*(np.concatenate([getattr(p, c) for p in parts])
                                                  for c in ("ledgers", "entries", "timestamps"))))
                    written.append(_seal(job, partition_id, n, buckets[n][0], buckets[n][1], rows))
        if sum(filled) != sum(b[2] for b in buckets):
            raise ValueError(f"task {partition_id} got {sum(filled)} rows, the planning pass counted "
                             f"{sum(b[2] for b in buckets)}; {_NOT_DETERMINISTIC}")
    return written


@contextmanager
def _all_or_none(job: BuildJob, written: list[BuiltBucket]) -> Iterator[None]:
    """A task's buckets land together: an abort of the job seen at the end, or any failure,
    removes every file the task wrote."""
    try:
        yield
        if is_aborted(job.store, job.job_id):
            raise JobAborted(f"build {job.job_id} was aborted")
    except BaseException:
        for bucket in written:
            remove_file(bucket.path)
        raise


def _seal(job: BuildJob, partition_id: int, n: int, start_ledger: int, end_ledger: int, rows: Rows) -> BuiltBucket:
    """Write position-ordered ``rows`` as the task's ``n``-th bucket, over ``[start_ledger, end_ledger]``."""
    if is_aborted(job.store, job.job_id):
        raise JobAborted(f"build {job.job_id} was aborted")
    ledger_id = job.ledger_id(partition_id, n)
    _claim(job, ledger_id)
    part = time_order(rows)
    meta, payloads = build_bucket(start_ledger, end_ledger, part.timestamps, part.ledgers, part.entries,
                                  time_step_ms=job.config.max_time_step_per_segment_ms,
                                  max_indexes_per_segment=job.config.max_indexes_per_segment)
    identity = {"tracker": job.tracker, JOB_PROPERTY: job.job_id}
    if job.store_id is not None:
        identity["store_id"] = job.store_id
    path = write_bucket(ledgers_dir(job.store), ledger_id, meta, payloads, identity)
    return BuiltBucket(meta.key, ledger_id, start_ledger, end_ledger, meta.count, path,
                       encode_summary(meta, ledger_id, os.path.getsize(path),
                                      (part.timestamps, part.ledgers, part.entries)))
