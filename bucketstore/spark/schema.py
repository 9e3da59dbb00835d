"""The reader's row layout, for Spark (DDL) and for Arrow (the batches ``read()`` yields).

Spark has no unsigned integers. Ledger ids, entry ids and timestamps are
unsigned 64-bit in bucketstore, and they appear in BIGINT columns as the
**two's-complement** signed value with the same 64 bits: ids below 2**63 read
as themselves, an id ``v >= 2**63`` reads as ``v - 2**64`` (a negative number).
``to_unsigned`` undoes it; the bulk builder applies the same rule to its input,
so a DataFrame read from one store can be built into another unchanged.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["READ_FIELDS", "READ_DDL", "READ_ARROW_SCHEMA", "TOPIC_FIELDS", "TOPIC_DDL", "TOPIC_ARROW_SCHEMA",
           "to_signed", "to_unsigned"]

READ_FIELDS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("tracker", "STRING", pa.string()),
    ("bucket_start_ledger", "BIGINT", pa.int64()),
    ("bucket_end_ledger", "BIGINT", pa.int64()),
    ("ledger_file", "STRING", pa.string()),
    ("segment", "INT", pa.int32()),
    ("timestamp", "BIGINT", pa.int64()),
    ("ledger_id", "BIGINT", pa.int64()),
    ("entry_id", "BIGINT", pa.int64()),
    # At or before the tracker's durable delivery frontier; null when the
    # tracker has no journal (sealed mode keeps no frontier: unknown).
    ("delivered", "BOOLEAN", pa.bool_()),
)

READ_DDL = ", ".join(f"{name} {ddl}" for name, ddl, _ in READ_FIELDS)
# Spark compares the batch schema with the declared one field by field,
# nullability included; Spark's DDL columns are nullable, so these are too.
READ_ARROW_SCHEMA = pa.schema([pa.field(name, arrow, nullable=True) for name, _, arrow in READ_FIELDS])

#: A topic read (``.option("topics", ...)``): a row per (subscription, topic row).
TOPIC_FIELDS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("topic", "STRING", pa.string()),
    # Null (and state null) for the rows of a topic without subscriptions.
    ("subscription", "STRING", pa.string()),
    ("timestamp", "BIGINT", pa.int64()),
    ("ledger_id", "BIGINT", pa.int64()),
    ("entry_id", "BIGINT", pa.int64()),
    # The order the topic's rows were added in: a position added twice has two rows.
    ("seq", "BIGINT", pa.int64()),
    # pending, unconfirmed or done (engine/topics/topic_states.py).
    ("state", "STRING", pa.string()),
)
TOPIC_DDL = ", ".join(f"{name} {ddl}" for name, ddl, _ in TOPIC_FIELDS)
TOPIC_ARROW_SCHEMA = pa.schema([pa.field(name, arrow, nullable=True) for name, _, arrow in TOPIC_FIELDS])


def to_signed(value: int) -> int:
    """The BIGINT spelling of an unsigned 64-bit value."""
    return value - (1 << 64) if value >= 1 << 63 else value


def to_unsigned(value: int) -> int:
    """The unsigned 64-bit value a BIGINT column spells."""
    return value + (1 << 64) if value < 0 else value


def signed_view(values: np.ndarray) -> np.ndarray:
    """Reinterpret a uint64 array as int64 without copying (two's complement)."""
    return np.ascontiguousarray(values, dtype=np.uint64).view(np.int64)
