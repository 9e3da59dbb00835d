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

from ..engine.topics.topic_states import STATES, read_topic_states, topic_names
from ..errors import CatalogError
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


def read_topic_part(part: TopicPart) -> Iterator[pa.RecordBatch]:
    """The topic's rows as Arrow batches of :data:`TOPIC_ARROW_SCHEMA`: per chunk of rows, a batch
    per subscription (a topic without subscriptions: its rows once, subscription and state null).

    :raises CatalogError: the topic is gone since planning, or its index or a run file is damaged.
    """
    for chunk in read_topic_states(part.store, part.topic):
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
