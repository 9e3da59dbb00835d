"""The plan of one bulk build, fixed before any task runs and shipped to all of them.

Spark pickles the writer, and with it this plan, to every task and to the
commit worker, so everything they must agree on is decided here, once: the job
id, the block of ledger ids, the tracker's buckets at planning time (which the
new ones must not overlap, or which ``overwrite`` replaces) and who holds the
store's lock.

**Ledger ids.** Task ``p`` names its ``n``-th bucket
``first_ledger_id + p * id_stride + n``. Tasks therefore never coordinate, and
a retried task reuses its own ids. ``first_ledger_id`` is past every id the
catalog has handed out and every file in ``ledgers/``; the commit raises the
catalog's allocator past the highest id used, so the unused rest of the block
is simply never handed out.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass

from ..format.catalog_codec import validate_tracker_name
from ..config import TrackerConfig
from ..errors import CatalogError
from ..format.snapshot import parse_bucket_key
from ..engine.store.store import open_store
from .abort_marker import remove_stale_marks
from .lock import check_writable
from .store_access import first_free_ledger_id, open_catalog_readonly

__all__ = ["BuildJob", "plan_build", "DEFAULT_ID_STRIDE"]

#: Ledger ids reserved per task when the number of buckets a task may cut is unknown (plain ``df.write``).
DEFAULT_ID_STRIDE = 1 << 20
_U64_LIMIT = 1 << 64


@dataclass(frozen=True, slots=True)
class BuildJob:
    """Everything the tasks and the commit of one bulk build share."""

    store: str
    tracker: str
    config: TrackerConfig
    job_id: str
    first_ledger_id: int
    id_stride: int
    #: The tracker's buckets ``{key: ledger_id}`` when the job was planned.
    planned_buckets: tuple[tuple[str, int], ...]
    overwrite: bool
    #: pid of the driver holding the store lock for the whole job, or None.
    lock_holder_pid: int | None
    #: The store's id, written into every file the build writes (formats/ledger_file.md).
    store_id: str | None = None

    @property
    def forbidden_ranges(self) -> list[tuple[int, int]]:
        """Ledger ranges no new bucket may touch: the current buckets, unless they are being replaced."""
        if self.overwrite:
            return []
        return sorted(parse_bucket_key(key) for key, _ in self.planned_buckets)

    def ledger_id(self, partition_id: int, n: int) -> int:
        """The ledger id of task ``partition_id``'s ``n``-th bucket."""
        if n >= self.id_stride:
            raise ValueError(f"task {partition_id} needs more than {self.id_stride} buckets; "
                             "raise the ledger_id_stride option or min_index_count_per_bucket")
        lid = self.first_ledger_id + partition_id * self.id_stride + n
        if lid >= _U64_LIMIT:
            raise ValueError(f"ledger id {lid} does not fit in 64 bits; lower ledger_id_stride")
        return lid

    @property
    def initial_state(self) -> dict:
        """The durable state a tracker the build creates starts with (the tracker's own layout)."""
        return {"mark_delete": None, "config": asdict(self.config)}


def plan_build(store: str | os.PathLike[str], tracker: str, config: TrackerConfig, *, overwrite: bool = False,
               lock_holder_pid: int | None = None, id_stride: int = DEFAULT_ID_STRIDE) -> BuildJob:
    """Check the store can take a build now and fix the job's plan.

    A missing (or empty) directory becomes a new store.

    :raises StoreLockedError: the store is open for writing by someone other than ``lock_holder_pid``.
    :raises CatalogError: the path is not a store, or its catalog is damaged.
    """
    validate_tracker_name(tracker)
    if not isinstance(config, TrackerConfig):
        raise TypeError("config must be a bucketstore.TrackerConfig")
    if id_stride < 1:
        raise ValueError("id_stride must be at least 1")
    path = os.path.abspath(os.fspath(store))
    if not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path)):
        open_store(path).close()  # a build into a new directory creates the store, as bucketstore.open does
    catalog = open_catalog_readonly(path)
    remove_stale_marks(path)
    try:
        check_writable(path, lock_holder_pid)
        buckets = catalog.buckets(tracker)
        first = first_free_ledger_id(path, catalog)
        store_id = catalog.store_id
    finally:
        catalog.close()
    for key in buckets:
        try:
            parse_bucket_key(key)  # a malformed key would make the overlap check meaningless
        except ValueError as exc:
            raise CatalogError(f"{path}: tracker {tracker!r}: {exc}", path=path, key=key) from None
    return BuildJob(store=path, tracker=tracker, config=config, job_id=uuid.uuid4().hex, first_ledger_id=first,
                    id_stride=id_stride, planned_buckets=tuple(sorted(buckets.items())), overwrite=overwrite,
                    lock_holder_pid=lock_holder_pid, store_id=store_id)
