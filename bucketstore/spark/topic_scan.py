"""Reading a store's topics as rows: a row per (subscription, topic row), both levels.

No Spark here; :mod:`bucketstore.spark.reader` wraps it as a data source. Each topic is one
input partition: its task reads the topic's rows (LMDB level and sealed runs, less the rows gone
from a run) and its subscriptions' records in one read transaction
(:func:`~bucketstore.engine.topics.topic_states.read_topic_states`), so every row's state is
judged against the subscriptions as they were at one instant, beside a live writer too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..engine.topics.topic_states import DEFAULT_CHUNK_ROWS, STATES, read_topic_states, run_listed, topic_names
from ..errors import CatalogError, StaleSnapshotError
from .scan import _repeated
from .schema import TOPIC_ARROW_SCHEMA, signed_view

__all__ = ["TopicPart", "plan_topic_scan", "read_topic_part"]

_STATE_NAMES = pa.array(list(STATES), pa.string())


@dataclass(frozen=True, slots=True)
class TopicPart:
    """One topic of one store: what a task reads."""

    store: str
    topic: str


def plan_topic_scan(store: str, topics: Sequence[str] | None = None) -> list[TopicPart]:
    """A part per topic to read (default: every topic of the store), in name order.

    :raises CatalogError: an unknown topic name, or a topic index that cannot be read.
    """
    store = os.path.abspath(store)
    known = topic_names(store)
    names = known if topics is None else list(topics)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CatalogError(f"{store}: no topic named {', '.join(map(repr, unknown))} "
                           f"(the store has {', '.join(map(repr, known)) or 'none'})", path=store)
    return [TopicPart(store, name) for name in names]


def read_topic_part(part: TopicPart, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[pa.RecordBatch]:
    """The topic's rows as Arrow batches of :data:`TOPIC_ARROW_SCHEMA`: per chunk of rows, a batch
    per subscription (a topic without subscriptions: its rows once, subscription and state null).

    :raises CatalogError: the topic is gone since planning, or its index or a run file is damaged
        (a listed run file missing included).
    :raises StaleSnapshotError: a live writer dropped a run (and its file) while the task read it.
    """
    try:
        yield from _batches(part, chunk_rows)
    except CatalogError as exc:
        gone = exc.path
        if gone is None or not gone.endswith(".run") or os.path.exists(gone) or run_listed(part.store, gone):
            raise
        raise StaleSnapshotError(f"{gone}: topic {part.topic!r}: the store's writer dropped this run after the task "
                                 "began reading the topic; run the query again to read a newer view",
                                 path=gone) from None


def _batches(part: TopicPart, chunk_rows: int) -> Iterator[pa.RecordBatch]:
    for chunk in read_topic_states(part.store, part.topic, chunk_rows):
        n = len(chunk.rows)
        columns = [pa.array(signed_view(np.ascontiguousarray(chunk.rows[:, c]))) for c in range(4)]
        for sub, codes in chunk.states.items() or [(None, None)]:
            if sub is None:
                subscription, state = pa.nulls(n, pa.string()), pa.nulls(n, pa.string())
            else:
                subscription = _repeated(sub, n)
                state = _STATE_NAMES.take(pa.array(codes))
            yield pa.RecordBatch.from_arrays([_repeated(part.topic, n), subscription, *columns, state],
                                             schema=TOPIC_ARROW_SCHEMA)
