"""Metrics for brokers: one stable metric set, as a dict and as Prometheus text exposition.

``collect(store)`` gives the figures of a live store and its open trackers as a plain dict;
``prometheus_text(store)`` renders them in the Prometheus text exposition format (version
0.0.4) for a ``/metrics`` endpoint. ``bucketstore stats STORE --prometheus`` renders the
subset that can be read from disk beside a live writer (:func:`from_description`).

Every metric is listed in :data:`METRICS` (and in docs/api.md's table, which a test keeps
in step). Names follow the Prometheus conventions: a ``bucketstore_`` prefix, the unit in
the name (``_bytes``, ``_seconds``), counters ending in ``_total``, latency histograms
with cumulative ``_bucket{le=...}``, ``_sum`` and ``_count``; per-tracker metrics carry a
``tracker`` label. The format is written here rather than through ``prometheus_client``:
it is a few dozen lines, keeps the core free of a dependency an embedder may not want (or
may want at another version), and the tests parse the output back with
``prometheus_client``'s own parser.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .engine.directory.disk_usage import dir_usage, tree_usage
from .engine.durability.journal import journal_directory
from .engine.tracker.op_stats import LATENCY_BUCKETS
from .engine.store.read_only import ReadOnlyStore
from .engine.store.store import Store
from .engine.topics.topic_reader import describe_topics
from .errors import CatalogError, StaleSnapshotError, StoreClosedError

__all__ = ["METRICS", "MetricInfo", "collect", "from_description", "render", "prometheus_text"]


@dataclass(frozen=True)
class MetricInfo:
    """One metric family: its full name (counters with ``_total``), type, labels and meaning."""

    name: str
    kind: str  # "gauge", "counter" or "histogram"
    labels: tuple[str, ...]
    help: str
    key: str  # where collect() puts it: "store.<field>" or "tracker.<field>"
    #: "both"; "live": only a process with the store open knows it (the CLI leaves it out);
    #: "disk": only the read-only CLI reports it (a live tracker would have to read every entry 0).
    source: str = "both"


_T = ("tracker",)
#: The metric set. Stable: names and meanings only ever get added to.
METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("bucketstore_store_trackers", "gauge", (), "Trackers in the store's catalog.", "store.trackers"),
    MetricInfo("bucketstore_store_open_trackers", "gauge", (), "Trackers open in this process.",
               "store.open_trackers", source="live"),
    MetricInfo("bucketstore_store_ledger_files", "gauge", (), "Sealed bucket files in ledgers/.",
               "store.ledger_files"),
    MetricInfo("bucketstore_store_ledger_bytes", "gauge", (), "Bytes of the bucket files in ledgers/.",
               "store.ledger_bytes"),
    MetricInfo("bucketstore_store_journal_bytes", "gauge", (), "Bytes of every tracker's journal files "
               "(durability journal).", "store.journal_bytes"),
    MetricInfo("bucketstore_store_journal_open_files", "gauge", (), "Journal file descriptors the store holds "
               "open (a bounded pool shared by its trackers).", "store.journal_open_files", source="live"),
    MetricInfo("bucketstore_store_journal_open_files_limit", "gauge", (), "The bound of that pool.",
               "store.journal_open_files_limit", source="live"),
    MetricInfo("bucketstore_store_topic_file_bytes", "gauge", (), "Bytes of the topic index file (topics/), pages "
               "freed by deletes included: LMDB keeps them for reuse (absent while the store has no topic).",
               "store.topic_file_bytes"),
    MetricInfo("bucketstore_store_topic_live_bytes", "gauge", (), "Bytes of the topic index's pages in use; the "
               "rest of the file is free pages awaiting reuse.", "store.topic_live_bytes"),
    MetricInfo("bucketstore_tracker_delayed_indexes", "gauge", _T, "Positions tracked and not yet delivered.",
               "tracker.delayed_indexes", source="live"),
    MetricInfo("bucketstore_tracker_sealed_indexes", "gauge", _T, "Indexes recorded in the tracker's sealed "
               "buckets (entry 0 counts, delivered ones included until their bucket is deleted).",
               "tracker.sealed_indexes", source="disk"),
    MetricInfo("bucketstore_tracker_buckets", "gauge", _T, "Sealed buckets (ledger files) of the tracker.",
               "tracker.buckets"),
    MetricInfo("bucketstore_tracker_loaded_indexes", "gauge", _T, "Indexes held in memory in the delivery "
               "queue (loaded segments, unsealed runs).", "tracker.loaded_indexes", source="live"),
    MetricInfo("bucketstore_tracker_snapshot_bytes", "gauge", _T, "Bytes on disk of the tracker's bucket files.",
               "tracker.snapshot_bytes"),
    MetricInfo("bucketstore_tracker_journal_bytes", "gauge", _T, "Bytes of the tracker's journal files.",
               "tracker.journal_bytes"),
    MetricInfo("bucketstore_tracker_resident_bytes", "gauge", _T, "Estimated memory the tracker holds.",
               "tracker.resident_bytes", source="live"),
    MetricInfo("bucketstore_tracker_pending_maintenance", "gauge", _T, "Seals and merges queued or running.",
               "tracker.pending_maintenance", source="live"),
    MetricInfo("bucketstore_tracker_maintenance_failures_total", "counter", _T, "Seals, merges and journal "
               "checkpoints that failed (their indexes stay in memory).", "tracker.maintenance_failures",
               source="live"),
    MetricInfo("bucketstore_tracker_delivered_total", "counter", _T, "Positions returned as due.",
               "tracker.delivered", source="live"),
    MetricInfo("bucketstore_tracker_operations_total", "counter", _T + ("op", "outcome"), "Operations by kind "
               "(add, deliver, flush, seal, load, merge, delete, backpressure: a batch that waited for room) and outcome (ok, failed; a failed add, deliver or flush "
               "raises to its caller and is not counted).",
               "tracker.operations", source="live"),
    MetricInfo("bucketstore_tracker_operation_duration_seconds", "histogram", _T + ("op",), "Latency of the "
               "operations (add_message sampled 1 in 16; add_messages, and every other op, each call).",
               "tracker.operations", source="live"),
    MetricInfo("bucketstore_tracker_pending_maintenance_failures", "gauge", _T, "Background failures not yet "
               "raised to the tracker's writer (its next change raises MaintenanceError and this drops to 0).",
               "tracker.pending_maintenance_failures", source="live"),
    MetricInfo("bucketstore_tracker_held_for_replay_buckets", "gauge", _T, "Sealed buckets kept, file and key, "
               "for indexes that sealed-mode recovery skipped as due, until replay_done().",
               "tracker.held_for_replay_buckets", source="live"),
    MetricInfo("bucketstore_tracker_held_for_replay_indexes", "gauge", _T, "Indexes those buckets hold that "
               "recovery skipped as due (the embedder's replay re-adds them), until replay_done().",
               "tracker.held_for_replay_indexes", source="live"),
    MetricInfo("bucketstore_tracker_last_delivery_time_seconds", "gauge", _T, "How far ahead the backlog "
               "reaches: the latest delivery time tracked, in Unix seconds (an upper bound; absent when nothing "
               "is tracked).", "tracker.last_delivery_time_seconds", source="live"),
)

#: The engine's operation names -> the metric's ``op`` label (PIP-195's "create" is a seal).
_OP_LABEL = {"create": "seal", "load": "load", "merge": "merge", "delete": "delete", "add": "add",
             "deliver": "deliver", "flush": "flush", "backpressure": "backpressure"}


def _dir_bytes(path: str) -> int:
    # Beside live maintenance: a file retired between the listing and its stat counts nothing
    # (the rest of the directory still counts), a directory deleted meanwhile holds nothing.
    return dir_usage(path).bytes


def collect(store: Store | ReadOnlyStore) -> dict[str, Any]:
    """The figures of ``store`` and of the trackers open on it, as a dict::

        {"store": {"trackers": 2, "ledger_bytes": ..., ...},
         "trackers": {"sub-1": {"delayed_indexes": ..., "operations": {"add": {...}, ...}, ...}},
         "topics": {"orders": {"rows": ..., "subscriptions": {"sub-1": {"held_rows": ..., ...}}}}}

    The keys are the ``key`` fields of :data:`METRICS`; ``operations`` maps each op label to
    ``ok``, ``failed``, ``buckets`` (per :data:`~bucketstore.engine.tracker.op_stats.LATENCY_BUCKETS`,
    not cumulative, +Inf last), ``sum_seconds`` and ``observed``. On a read-only handle
    (``bucketstore.open(path, read_only=True)``) the trackers are those opened on it, with
    their snapshot's figures, and the journal descriptor pool (it has none) is left out; a
    tracker whose snapshot the writer has outdated (it raises ``StaleSnapshotError``) is left
    out, as one closed meanwhile is. File figures beside live maintenance: docs/operator.md.
    ``topics`` holds every topic of the store, open or not, as ``stats`` describes it
    (:func:`~bucketstore.engine.topics.topic_reader.describe_topics`: the same figures on both paths,
    "due" by the clock of the topic's open handle; adds waiting for their group commit are not
    in them yet).
    """
    summary = store.stats()
    trackers: dict[str, dict[str, Any]] = {}
    for tracker in store.open_trackers():
        try:
            st = tracker.stats()
            ops = tracker.operation_metrics()
            last = tracker.last_delivery_time()
        except (StoreClosedError, StaleSnapshotError):  # closed between the listing and now, or a
            continue  # read-only view the writer has outdated (it answers nothing now): not reported
            # (reads never raise a background failure: that is the writer's to see)
        maint = st["maintenance"]
        trackers[tracker.name] = {
            "delayed_indexes": st["number_of_delayed_messages"],
            "buckets": st["immutable_buckets"],
            "loaded_indexes": st["loaded_indexes"],
            "snapshot_bytes": st["snapshot_size_bytes"],
            "journal_bytes": _dir_bytes(journal_directory(store.path, tracker.name)),
            "resident_bytes": st["memory_bytes"],
            "pending_maintenance": maint["queued"],
            "maintenance_failures": maint["failed"],
            "pending_maintenance_failures": st["pending_maintenance_failures"],
            "held_for_replay_buckets": st["held_for_replay_buckets"],
            "held_for_replay_indexes": st["held_for_replay_indexes"],
            "delivered": ops["delivered"],
            "operations": {_OP_LABEL[name]: op for name, op in ops["operations"].items()},
        }
        if last is not None:  # nothing tracked: no sample (a 0 would read as 1970, far behind)
            trackers[tracker.name]["last_delivery_time_seconds"] = last / 1000
    journal_bytes = tree_usage(os.path.join(store.path, "journal")).bytes
    figures = {"trackers": summary["trackers"], "open_trackers": len(trackers),
               "ledger_files": summary["ledger_files"], "ledger_bytes": summary["ledger_bytes"],
               "journal_bytes": journal_bytes}
    pool = getattr(store, "journal_fds", None)  # a read-only handle opens no journal for writing
    if pool is not None:
        figures.update(journal_open_files=len(pool), journal_open_files_limit=pool.capacity)
    clocks = getattr(store, "_topic_clocks", dict)()  # a read-only handle opens no topic
    try:  # through this process's own environment when it has the topics open
        topics = describe_topics(store.path, clocks=clocks)
    except CatalogError as exc:
        topics = {"error": str(exc)}
    return {"store": figures, "trackers": trackers, "topics": _topics(figures, topics)}


def _topics(figures: dict[str, Any], topics: dict[str, Any]) -> dict[str, Any]:
    """``describe_topics``' document as the metrics carry it, the shared file's sizes added to
    the store's ``figures``. A topic index that cannot be read exports no topic figure (``stats``
    and ``verify`` report why), rather than failing the whole scrape."""
    topics = {k: v for k, v in topics.items() if k != "error"}
    for doc in topics.values():
        figures.update(topic_file_bytes=doc["file_bytes"], topic_live_bytes=doc["live_bytes"])
    return topics


def from_description(doc: dict[str, Any]) -> dict[str, Any]:
    """The on-disk subset of :func:`collect`, from ``bucketstore.checking.store_check.describe_store``'s
    document (read-only, beside a live writer): what the ``--prometheus`` flag of ``stats`` prints."""
    path = doc["store"]
    trackers = {name: {"sealed_indexes": t["indexes"], "buckets": len(t["buckets"]), "snapshot_bytes": t["bytes"],
                       "journal_bytes": _dir_bytes(journal_directory(path, name))}
                for name, t in doc["trackers"].items()}
    journal_bytes = tree_usage(os.path.join(path, "journal")).bytes
    figures = {"trackers": len(trackers), "ledger_files": doc["ledger_files"], "ledger_bytes": doc["bytes"],
               "journal_bytes": journal_bytes}
    return {"store": figures, "trackers": trackers, "topics": _topics(figures, doc.get("topics") or {})}


# -- the text exposition format ------------------------------------------------------------------
def _number(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def render(doc: dict[str, Any]) -> str:
    """``doc`` (from :func:`collect` or :func:`from_description`) in the Prometheus text format;
    a metric whose figure the document lacks is left out."""
    out: list[str] = []
    trackers: dict[str, dict[str, Any]] = doc.get("trackers", {})
    for m in METRICS:
        scope, key = m.key.split(".")
        lines: list[str] = []
        if scope == "store":
            if key in doc["store"]:
                lines.append(f"{m.name} {_number(doc['store'][key])}")
        elif m.kind == "histogram":
            for name in sorted(trackers):
                for op, h in sorted(trackers[name].get(key, {}).items()):
                    lines += _histogram(m.name, (("tracker", name), ("op", op)), h)
        elif key == "operations":
            for name in sorted(trackers):
                for op, h in sorted(trackers[name].get(key, {}).items()):
                    for outcome in ("ok", "failed"):
                        labels = _labels((("tracker", name), ("op", op), ("outcome", outcome)))
                        lines.append(f"{m.name}{labels} {_number(h[outcome])}")
        else:
            for name in sorted(trackers):
                if key in trackers[name]:
                    lines.append(f"{m.name}{_labels([('tracker', name)])} {_number(trackers[name][key])}")
        if lines:
            help_text = m.help.replace("\\", "\\\\").replace("\n", "\\n")
            out += [f"# HELP {m.name} {help_text}", f"# TYPE {m.name} {m.kind}", *lines]
    out += topic_lines(doc.get("topics") or {})
    return "\n".join(out) + "\n"


#: Per topic and subscription (from ``describe_topics``): name, help, the figure's key.
TOPIC_METRICS = (
    ("bucketstore_topic_rows", "Rows the topic holds (each index once, whatever the subscriptions).", "rows"),
    ("bucketstore_subscription_delayed_messages", "Indexes the subscription tracks.", "number_of_delayed_messages"),
    ("bucketstore_subscription_held_rows", "Rows the topic keeps only because this subscription is the furthest "
     "behind.", "held_rows"),
    ("bucketstore_subscription_due_undelivered", "Due indexes the subscription has not delivered.", "due_undelivered"),
    ("bucketstore_subscription_frontier_ms", "The deliver_at of the subscription's delivery frontier.", "frontier"),
    ("bucketstore_subscription_oldest_due_age_seconds", "How long the oldest due index the subscription has not "
     "delivered has waited past its time (absent when none is due).", "oldest_due_age_ms"),
)


def topic_lines(topics: dict[str, Any]) -> list[str]:
    """The topics' gauges in the text format (none when the store has no topic)."""
    out: list[str] = []
    for metric, help_text, key in TOPIC_METRICS:
        lines = []
        for name in sorted(topics):
            if key == "rows":
                lines.append(f"{metric}{_labels([('topic', name)])} {_number(topics[name]['rows'])}")
                continue
            for sub, figures in sorted(topics[name]["subscriptions"].items()):
                value = figures[key]
                if key == "frontier":
                    value = value[0] if value else 0
                elif key == "oldest_due_age_ms":
                    if value is None:  # nothing due: no sample (a 0 would read as "due just now")
                        continue
                    value = value / 1000
                lines.append(f"{metric}{_labels([('topic', name), ('subscription', sub)])} {_number(value)}")
        if lines:
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge", *lines]
    return out


def _histogram(name: str, labels: tuple[tuple[str, str], ...], h: dict[str, Any]) -> list[str]:
    lines = []
    cumulative = 0
    bounds = [*LATENCY_BUCKETS, math.inf]
    for bound, count in zip(bounds, h["buckets"]):
        cumulative += count
        lines.append(f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {cumulative}")
    lines.append(f"{name}_sum{_labels(labels)} {_number(float(h['sum_seconds']))}")
    lines.append(f"{name}_count{_labels(labels)} {cumulative}")
    return lines


def prometheus_text(store: Store | ReadOnlyStore) -> str:
    """The store's metrics (:func:`collect`) in the Prometheus text exposition format 0.0.4,
    ready to serve as ``text/plain; version=0.0.4``."""
    return render(collect(store))
