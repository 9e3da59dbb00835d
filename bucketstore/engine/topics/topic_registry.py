"""The topics of a writable store: opened, listed and deleted by name (mixed into ``Store``).

The topic environment (``STORE/topics/``) is created by the first :meth:`TopicRegistry.topic`
call, so a store that never had a topic keeps exactly its files.
"""

from __future__ import annotations

import os
from typing import Any

from ...config import TrackerConfig, config_from_record, config_or_default
from ...cutoff import Clock
from ...errors import BucketStoreError
from ...format.fs import REAL_FS
from ...format.topic_codec import TopicRecordError, decode_topic, topic_prefix, validate_name
from .topic import Topic
from .topic_file import TopicFile, topics_directory
from .topic_journal import remove_journals

__all__ = ["TopicRegistry"]


class TopicRegistry:
    """Mixed into :class:`~bucketstore.engine.store.store.Store` (which sets the attributes used here)."""

    path: str
    durability: str
    sync_interval_ms: int
    confirm_sync_ms: int
    delivery: str
    store_id: str
    journal_fds: Any
    _lock: Any

    def _check_open(self) -> None:
        raise NotImplementedError

    def _topic_file(self, create: bool) -> TopicFile | None:
        file = self.__dict__.get("_topics_file")
        if file is None and (create or os.path.isdir(topics_directory(self.path))):
            file = self.__dict__["_topics_file"] = TopicFile(self.path, getattr(self, "fs", REAL_FS))
        return file

    def _open_topics(self) -> dict[str, Topic]:
        return self.__dict__.setdefault("_topic_handles", {})

    def topic(self, name: str, config: TrackerConfig | None = None, clock: Clock | None = None) -> Topic:
        """Open (creating if needed) the topic ``name``: one index its subscriptions share.

        One handle per name at a time: asking again for an open topic returns it (an explicit
        config must match).

        :param config: None (the default): the configuration the topic recorded (the defaults
            for a new topic); an explicit one becomes the topic's from now on, and is recorded.
        """
        raw_name = validate_name(name, "topic")
        if config is not None:
            config = config_or_default(config)
        with self._lock:
            self._check_open()
            handles = self._open_topics()
            live = handles.get(name)
            if live is not None:
                if config is not None and live.config != config:
                    raise ValueError(f"topic {name!r} is already open with a different config")
                return live
            file = self._topic_file(create=True)
            if config is None:
                with file.read() as txn:
                    raw = txn.get(raw_name, db=file.topics)
                try:
                    config = config_from_record(decode_topic(raw).get("config") if raw is not None else None)
                except TopicRecordError:
                    config = TrackerConfig()  # the topic's open names the damage, as a CatalogError
            topic = Topic(file, name, config, clock, durability=self.durability,  # type: ignore[arg-type]
                          sync_interval_ms=self.sync_interval_ms, confirm_sync_ms=self.confirm_sync_ms,
                          delivery=self.delivery, on_close=self._topic_closed, store_id=self.store_id,
                          journal_fds=self.journal_fds)
            handles[name] = topic
            return topic

    def _topic_closed(self, topic: Topic) -> None:
        with self._lock:
            handles = self._open_topics()
            if handles.get(topic.name) is topic:
                del handles[topic.name]

    def _topic_clocks(self) -> dict[str, Clock | None]:
        """The clock of each topic open here (None: the system clock)."""
        with self._lock:
            return {name: topic.clock for name, topic in self._open_topics().items()}

    def topics(self) -> list[str]:
        """Names of every topic in the store (open or not), sorted."""
        with self._lock:
            self._check_open()
            file = self._topic_file(create=False)
            if file is None:
                return []
            with file.read() as txn:
                return sorted(k.decode("utf-8") for k in txn.cursor(db=file.topics).iternext(values=False))

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its rows and its subscriptions, in one transaction, durably."""
        raw = validate_name(name, "topic")
        with self._lock:
            self._check_open()
            live = self._open_topics().pop(name, None)
            if live is not None:
                live._on_close = None
                live.close()
            file = self._topic_file(create=False)
            if file is None:
                raise KeyError(f"no topic {name!r}")
            with file.write() as txn:
                value = txn.get(raw, db=file.topics)
                if value is None:
                    raise KeyError(f"no topic {name!r}")
                topic_id = decode_topic(value)["id"]
                file.tables.delete_topic(txn, topic_id)
                prefix = topic_prefix(topic_id)
                for db in (file.multi, file.subs, file.runs, file.dead):
                    with txn.cursor(db=db) as cur:
                        if cur.set_range(prefix):
                            while cur.key()[:4] == prefix:
                                if not cur.delete():
                                    break
                txn.delete(raw, db=file.topics)
            file.sync()
            file.remove_runs_of({topic_id})  # after the sync: a kill before leaves files no topic owns
            remove_journals(file.path, {topic_id}, file.fs)

    def _flush_topics(self) -> None:
        """Write and sync every open topic's pending adds (a checkpoint holds what was added)."""
        with self._lock:
            topics = list(self._open_topics().values())
        for topic in topics:
            topic.flush()

    def _close_topics(self) -> BucketStoreError | None:
        """Close every open topic and the environment; the first failure is returned, not raised,
        so that the store closes the rest first (``Store.close`` raises it at the end)."""
        failure: BucketStoreError | None = None
        for topic in list(self._open_topics().values()):
            try:
                topic.close()
            except BucketStoreError as exc:
                failure = failure or exc
        file = self.__dict__.pop("_topics_file", None)
        if file is not None:
            try:
                file.close()
            except BucketStoreError as exc:
                failure = failure or exc
        return failure
