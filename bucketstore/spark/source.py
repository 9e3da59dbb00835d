"""The ``bucketstore`` Python data source: options in, a reader or a writer out.

Reader options: ``path`` (the store, from ``load(path)``), ``trackers``
(comma-separated names; default all), ``partition_bytes`` (segment bytes per
input partition). ``topics`` (comma-separated names, or ``*`` for every one)
reads the store's topics instead, with their own columns
(:data:`~bucketstore.spark.schema.TOPIC_DDL`); it does not go with ``trackers``.

Writer options: ``path`` (from ``save(path)``), ``tracker`` (required),
``min_index_count_per_bucket``, ``max_time_step_per_segment_ms``,
``max_indexes_per_segment`` (as in :class:`~bucketstore.TrackerConfig`),
``ledger_id_stride`` (ledger ids reserved per task). ``lock_holder_pid``,
``positions`` (``packed``: the frame holds ``position = ledger_id << 32 |
entry_id`` and ``deliver_at``) and ``in_place`` (the planned buckets of the
tasks that read unshuffled input partitions) are set by
:func:`bucketstore.spark.build_store` and are not for direct use.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import IntegralType, StructType

from ..config import TrackerConfig
from .build_job import DEFAULT_ID_STRIDE, plan_build
from .build_task import BUILD_COLUMNS, PACKED_COLUMNS
from .reader import StoreReader, TopicReader
from .scan import DEFAULT_PARTITION_BYTES
from .schema import READ_DDL, TOPIC_DDL
from .writer import InPlaceTasks, StoreWriter

__all__ = ["BucketStoreDataSource", "FORMAT_NAME", "check_build_schema"]

FORMAT_NAME = "bucketstore"
_CONFIG_OPTIONS = ("min_index_count_per_bucket", "max_time_step_per_segment_ms", "max_indexes_per_segment")


class BucketStoreDataSource(DataSource):
    """Reads a store's sealed indexes as rows; bulk-builds sealed buckets from rows."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return TOPIC_DDL if self._topics() is not False else READ_DDL

    def _topics(self) -> list[str] | None | bool:
        """The ``topics`` option: names, None for every topic (``*``), False when not given."""
        raw = self.options.get("topics")
        if raw is None:
            return False
        if self.options.get("trackers") is not None:
            raise ValueError("give trackers or topics, not both: they are read with different columns")
        names = [t.strip() for t in raw.split(",") if t.strip()]
        if not names:
            raise ValueError('option topics names no topic (give names, or "*" for every topic)')
        return None if names == ["*"] else names

    def _store(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError("give the store directory: load(path) or save(path)")
        return path

    def _int_option(self, name: str, default: int) -> int:
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"option {name} must be an integer, not {raw!r}") from None

    def reader(self, schema: StructType) -> DataSourceReader:
        topics = self._topics()
        if topics is not False:
            return TopicReader(self._store(), topics)  # type: ignore[arg-type]
        raw = self.options.get("trackers")
        trackers = [t.strip() for t in raw.split(",") if t.strip()] if raw else None
        return StoreReader(self._store(), trackers,
                           self._int_option("partition_bytes", DEFAULT_PARTITION_BYTES))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        packed = self.options.get("positions") == "packed"
        check_build_schema(schema, PACKED_COLUMNS if packed else BUILD_COLUMNS)
        tracker = self.options.get("tracker")
        if not tracker:
            raise ValueError('a bulk build needs .option("tracker", name)')
        defaults = TrackerConfig()
        config = TrackerConfig(**{name: self._int_option(name, getattr(defaults, name)) for name in _CONFIG_OPTIONS})
        holder = self.options.get("lock_holder_pid")
        job = plan_build(self._store(), tracker, config, overwrite=overwrite,
                         lock_holder_pid=int(holder) if holder else None,
                         id_stride=self._int_option("ledger_id_stride", DEFAULT_ID_STRIDE))
        raw_plan = self.options.get("in_place")
        return StoreWriter(job, packed, InPlaceTasks.from_json(raw_plan) if raw_plan else None)


def check_build_schema(schema: StructType, columns: tuple[str, ...] = BUILD_COLUMNS) -> None:
    """Refuse a frame without integer columns ledger_id, entry_id and deliver_at (naming what it has)."""
    fields = {f.name: f.dataType for f in schema.fields}
    for name in columns:
        if name not in fields:
            raise ValueError(f"a bulk build needs columns {', '.join(columns)}; {name} is missing "
                             f"(the DataFrame has {', '.join(fields)})")
        if not isinstance(fields[name], IntegralType):
            raise TypeError(f"column {name} must be an integer column, not {fields[name].simpleString()}")
