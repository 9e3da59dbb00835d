"""bucketstore: an embeddable, durable storage engine for delayed-message indexes.

A message system hands bucketstore *delayed indexes* ``(deliver_at_ms,
ledger_id, entry_id)``; bucketstore keeps them with bounded memory, survives
crashes, and hands positions back when they fall due. It implements Apache
Pulsar's PIP-195 bucket snapshots (sealed buckets as CRC-framed ledger files,
an LMDB catalog of cursor properties, lazily loaded segments in one shared
queue) and goes beyond it. See README.md for the tour.
"""

from __future__ import annotations

from .config import TrackerConfig
from .errors import (BucketStoreError, CatalogError, CheckpointError, CorruptLedgerError, DurabilityMismatchError,
                     JournalError, LedgerIdentityError, MaintenanceError, ReadOnlyError, StaleSnapshotError,
                     StoreClosedError, StoreLockedError)
from .memory.dedup import Deduplicator
from .memory.inmemory import InMemoryTracker
from .memory.nack import MessageId, NackTracker
from .engine.store.read_only import ReadOnlyStore, ReadOnlyTracker
from .engine.store.store import Store, open_store
from .engine.topics.subscription import Subscription
from .engine.topics.topic import Topic
from .memory.timebucket import TimeBucketIndex
from .memory.timebucket_tracker import TimeBucketTracker
from .engine.tracker.tracker import BucketTracker
from .checking import CheckReport, Finding, check, check_file
from .tracker_protocol import DelayedDeliveryTracker, TrackerView
from . import metrics  # bucketstore.metrics.prometheus_text(store)

#: ``bucketstore.open(path)``: open or create a store (journal durability unless told
#: ``durability="sealed"``); ``bucketstore.open(path, read_only=True)``: look inside one without changing it.
open = open_store  # noqa: A001 - the public name MISSION.md fixes

__version__ = "0.1.0"

__all__ = [
    "open",
    "Store",
    "ReadOnlyStore",
    "ReadOnlyTracker",
    "Topic",
    "Subscription",
    "TrackerConfig",
    "BucketTracker",
    "InMemoryTracker",
    "TimeBucketIndex",
    "TimeBucketTracker",
    "NackTracker",
    "MessageId",
    "Deduplicator",
    "BucketStoreError",
    "LedgerIdentityError",
    "CorruptLedgerError",
    "CatalogError",
    "StoreLockedError",
    "StoreClosedError",
    "JournalError",
    "CheckpointError",
    "MaintenanceError",
    "ReadOnlyError",
    "StaleSnapshotError",
    "DurabilityMismatchError",
    "DelayedDeliveryTracker",
    "TrackerView",
    "check",
    "check_file",
    "CheckReport",
    "Finding",
    "__version__",
]
