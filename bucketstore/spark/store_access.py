"""Read-only access to a store's layout from Spark processes.

The Spark processes never open a :class:`bucketstore.Store`: that would take
the write lock and delete files other processes are working with. They only
need the catalog (read-only) and the file names. The catalog is read as one
snapshot (one LMDB read transaction), so a plan never mixes two commits of a
live writer; as ``bucketstore.open(path, read_only=True)`` reads it, registered
as a reader in ``lock.mdb`` only beside a live writer, so reading a store no one
writes writes nothing into it (see :func:`~bucketstore.engine.catalog.catalog.read_catalog_quietly`).
"""

from __future__ import annotations

import os
import re

from ..engine.catalog.catalog import CatalogSnapshot, read_catalog_snapshot
from ..errors import CatalogError
from ..format.ledger_file import ledger_file_name

__all__ = ["catalog_dir", "ledgers_dir", "lock_path", "ledger_path", "open_catalog_readonly",
           "first_free_ledger_id"]

_LEDGER_FILE = re.compile(r"^(\d{20})\.ledger(\.tmp)?$")


def catalog_dir(store: str) -> str:
    return os.path.join(store, "catalog")


def ledgers_dir(store: str) -> str:
    return os.path.join(store, "ledgers")


def lock_path(store: str) -> str:
    return os.path.join(store, "LOCK")


def ledger_path(store: str, ledger_id: int) -> str:
    return os.path.join(ledgers_dir(store), ledger_file_name(ledger_id))


def open_catalog_readonly(store: str) -> CatalogSnapshot:
    """A snapshot of a store's catalog, or :class:`CatalogError` saying the path is no store."""
    if not os.path.isdir(store):
        raise CatalogError(f"{store} is not a bucketstore store: no such directory", path=store)
    if not os.path.isdir(ledgers_dir(store)) or not os.path.isdir(catalog_dir(store)):
        raise CatalogError(f"{store} is not a bucketstore store: it has no catalog/ and ledgers/ directories",
                           path=store)
    return read_catalog_snapshot(catalog_dir(store), quiet=True)


def first_free_ledger_id(store: str, catalog: CatalogSnapshot) -> int:
    """The smallest ledger id that neither the catalog's allocator nor any file in ``ledgers/`` has used.

    A file can be ahead of the allocator when a seal crashed before its catalog
    commit and no one has opened the store since; reusing its id would collide.
    """
    highest = -1
    for name in os.listdir(ledgers_dir(store)):
        m = _LEDGER_FILE.match(name)
        if m:
            highest = max(highest, int(m.group(1)))
    referenced = [lid for keys in catalog.all_buckets().values() for lid in keys.values()]
    return max(catalog.next_ledger_id(), highest + 1, max(referenced, default=-1) + 1)
