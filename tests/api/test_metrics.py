"""``bucketstore.metrics``: the metric set as a dict and as Prometheus text, parsed back with
``prometheus_client``'s parser (the reference reader of the format), and the CLI's
``stats --prometheus`` beside a live writer."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import bucketstore
from bucketstore import metrics
from bucketstore.engine.tracker.op_stats import ADD_SAMPLE_EVERY, LATENCY_BUCKETS
from helpers import SMALL, FakeClock
from repo_paths import DOCS

API_GUIDE = DOCS / "api.md"
OPS = {"add", "deliver", "flush", "seal", "load", "merge", "delete", "backpressure"}


def parse(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families, family: str, name: str | None = None, **labels) -> float:
    hits = [s.value for s in families[family].samples
            if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (family, name, labels, hits)
    return hits[0]


@pytest.fixture
def busy(tmp_path):
    """A journal store with one tracker that has added, sealed, loaded, delivered and flushed."""
    clock = FakeClock(0)
    store = bucketstore.open(tmp_path / "s", durability="journal")
    tracker = store.tracker("sub-1", SMALL, clock)
    adds = 0
    for ledger in range(4):
        for entry in range(12):
            tracker.add_message(ledger, entry, 1_000 + 10 * entry)
            adds += 1
    tracker.add_messages([(9, 0, 50_000), (9, 1, 50_001)])
    tracker.wait_for_maintenance()
    clock.now = 1_050
    delivered = tracker.get_scheduled_messages(1_000)
    tracker.flush()
    topic = store.topic("orders", clock=clock)  # a topic too: the store's topic-file gauges
    topic.subscription("s").add_message(1, 0, 60_000)
    yield store, tracker, adds, len(delivered)
    store.close()


def test_text_parses_back_with_help_type_and_matching_values(busy) -> None:
    store, tracker, adds, delivered = busy
    text = metrics.prometheus_text(store)
    fams = parse(text)
    st = tracker.stats()
    for m in metrics.METRICS:
        if m.source == "disk":
            assert m.name not in text
            continue
        family = fams[m.name[:-len("_total")] if m.kind == "counter" else m.name]
        assert family.type == m.kind and family.documentation == m.help
    assert "# TYPE bucketstore_tracker_delivered_total counter" in text
    t = {"tracker": "sub-1"}
    assert sample(fams, "bucketstore_tracker_delayed_indexes", **t) == st["number_of_delayed_messages"]
    assert sample(fams, "bucketstore_tracker_buckets", **t) == st["immutable_buckets"] >= 1
    assert sample(fams, "bucketstore_tracker_snapshot_bytes", **t) == st["snapshot_size_bytes"] > 0
    assert sample(fams, "bucketstore_tracker_journal_bytes", **t) > 0
    assert sample(fams, "bucketstore_store_journal_bytes") >= sample(fams, "bucketstore_tracker_journal_bytes", **t)
    assert sample(fams, "bucketstore_tracker_delivered", **t) == delivered > 0
    ops = "bucketstore_tracker_operations"
    assert sample(fams, ops, op="add", outcome="ok", **t) == adds + 1  # add_message calls + one add_messages
    assert sample(fams, ops, op="deliver", outcome="ok", **t) == 1
    assert sample(fams, ops, op="flush", outcome="ok", **t) == 1
    assert sample(fams, ops, op="seal", outcome="ok", **t) == st["create"]["succeeded"] >= 1
    assert sample(fams, ops, op="load", outcome="ok", **t) == st["load"]["succeeded"] >= 1
    assert {s.labels["op"] for s in fams[ops].samples} == OPS
    # How far ahead the backlog reaches: (9, 1) at 50_001 ms is the latest index left.
    assert sample(fams, "bucketstore_tracker_last_delivery_time_seconds", **t) == 50.001


def test_histograms_are_cumulative_and_count_what_was_observed(busy) -> None:
    store, tracker, adds, _ = busy
    fams = parse(metrics.prometheus_text(store))
    hist = fams["bucketstore_tracker_operation_duration_seconds"]
    assert hist.type == "histogram"
    for op in OPS:
        rows = [s for s in hist.samples if s.labels.get("op") == op]
        buckets = [s for s in rows if s.name.endswith("_bucket")]
        bounds = [float(s.labels["le"]) for s in buckets]
        assert bounds == [*LATENCY_BUCKETS, math.inf]
        counts = [s.value for s in buckets]
        assert counts == sorted(counts)  # cumulative
        count = next(s.value for s in rows if s.name.endswith("_count"))
        total = next(s.value for s in rows if s.name.endswith("_sum"))
        assert counts[-1] == count and total >= 0
    count_of = lambda op: next(s.value for s in hist.samples  # noqa: E731
                               if s.name.endswith("_count") and s.labels["op"] == op)
    assert count_of("add") == adds // ADD_SAMPLE_EVERY + 1  # add_message sampled; add_messages always
    assert count_of("deliver") == 1 and count_of("flush") == 1 and count_of("seal") >= 1


def test_collect_is_the_same_figures_as_a_dict(busy) -> None:
    store, tracker, _, delivered = busy
    doc = metrics.collect(store)
    assert doc["store"]["trackers"] == 1 and doc["store"]["open_trackers"] == 1
    assert doc["store"]["journal_open_files"] <= doc["store"]["journal_open_files_limit"]
    t = doc["trackers"]["sub-1"]
    assert t["delivered"] == delivered and set(t["operations"]) == OPS
    keys = {m.key.split(".")[1] for m in metrics.METRICS if m.key.startswith("tracker.") and m.source != "disk"}
    assert keys <= set(t)


def test_a_read_only_handle_renders_its_trackers_snapshot(busy) -> None:
    """Beside the live writer of this process: every figure a read-only tracker has, from its
    snapshot; the journal descriptor pool, which a read-only handle has none of, left out."""
    store, tracker, _, _ = busy
    with bucketstore.open(store.path, read_only=True) as view:
        looked = view.tracker("sub-1", SMALL)
        st = looked.stats()
        fams = parse(metrics.prometheus_text(view))
        doc = metrics.collect(view)
    t = {"tracker": "sub-1"}
    assert sample(fams, "bucketstore_store_trackers") == 1 and sample(fams, "bucketstore_store_open_trackers") == 1
    assert sample(fams, "bucketstore_tracker_delayed_indexes", **t) == st["number_of_delayed_messages"] \
        == tracker.number_of_delayed_messages > 0
    assert sample(fams, "bucketstore_tracker_buckets", **t) == st["immutable_buckets"] >= 1
    assert sample(fams, "bucketstore_store_journal_bytes") > 0
    assert "journal_open_files" not in doc["store"] and "bucketstore_store_journal_open_files" not in fams
    keys = {m.key.split(".")[1] for m in metrics.METRICS if m.key.startswith("tracker.") and m.source != "disk"}
    assert keys <= set(doc["trackers"]["sub-1"])


def test_label_values_are_escaped(tmp_path) -> None:
    name = 'odd "name" \\ with\nnewline'
    with bucketstore.open(tmp_path / "s") as store:
        store.tracker(name).add_message(1, 1, 2**42)
        fams = parse(metrics.prometheus_text(store))
    assert sample(fams, "bucketstore_tracker_delayed_indexes", tracker=name) == 1


def test_a_tracker_that_tracks_nothing_has_no_last_delivery_time_sample(tmp_path) -> None:
    with bucketstore.open(tmp_path / "s") as store:
        store.tracker("idle")
        store.tracker("busy").add_message(1, 1, 2**42)
        fams = parse(metrics.prometheus_text(store))
    samples = fams["bucketstore_tracker_last_delivery_time_seconds"].samples
    assert [(s.labels["tracker"], s.value) for s in samples] == [("busy", 2**42 / 1000)]


def test_an_empty_store_renders_valid_text(tmp_path) -> None:
    with bucketstore.open(tmp_path / "s") as store:
        fams = parse(metrics.prometheus_text(store))
    assert sample(fams, "bucketstore_store_trackers") == 0
    assert "bucketstore_tracker_buckets" not in fams


def test_cli_stats_prometheus_beside_a_live_writer(busy) -> None:
    store, tracker, _, _ = busy  # the store stays open for writing in this process
    done = subprocess.run([sys.executable, "-m", "bucketstore", "stats", store.path, "--prometheus"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fams = parse(done.stdout)
    t = {"tracker": "sub-1"}
    assert sample(fams, "bucketstore_tracker_buckets", **t) == tracker.stats()["immutable_buckets"]
    assert sample(fams, "bucketstore_tracker_snapshot_bytes", **t) == tracker.stats()["snapshot_size_bytes"]
    assert sample(fams, "bucketstore_tracker_sealed_indexes", **t) > 0
    assert sample(fams, "bucketstore_store_journal_bytes") > 0
    live_only = [m.name for m in metrics.METRICS if m.source == "live"]
    assert not any(name in done.stdout for name in live_only)


def test_cli_stats_prometheus_usage_error(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "bucketstore", "stats", str(tmp_path / "nope"), "--prometheus"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_the_live_export_has_the_topic_series_the_disk_export_has(tmp_path) -> None:
    """``prometheus_text`` on the writer's own handle exports, per subscription, the figures
    ``stats --prometheus`` reads from disk, and the topic file's size in use and on disk."""
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path / "s")
    try:
        topic = store.topic("orders", config=bucketstore.TrackerConfig(tick_time_ms=0), clock=clock)
        stalled, fast = topic.subscription("stalled"), topic.subscription("fast")
        topic.add_messages([(1, e, 1_100 + e) for e in range(2_000)])
        clock.advance(1_099)  # 1,000 rows due
        assert len(fast.get_scheduled_messages(10_000)) == 1_000
        fast.confirm_delivered()
        fast.mark_delete(1, 999)
        stalled.mark_delete(1, 499)  # the first quarter goes: its pages are freed, the file stays
        topic.flush()
        live = parse(metrics.prometheus_text(store))
        done = subprocess.run([sys.executable, "-m", "bucketstore", "stats", store.path, "--prometheus"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        disk = parse(done.stdout)
    finally:
        store.close()
    names = [m[0] for m in metrics.TOPIC_METRICS] + ["bucketstore_store_topic_file_bytes",
                                                     "bucketstore_store_topic_live_bytes"]
    def series(families, name):
        return sorted((x.name, sorted(x.labels.items()), x.value) for x in families[name].samples)

    for name in names:
        if name in ("bucketstore_subscription_due_undelivered", "bucketstore_subscription_oldest_due_age_seconds"):
            continue  # "due" by another clock: the command line's is the system's, every row due by it
        assert series(live, name) == series(disk, name), name
    s, f = {"topic": "orders", "subscription": "stalled"}, {"topic": "orders", "subscription": "fast"}
    assert sample(live, "bucketstore_topic_rows", topic="orders") == 1_500
    assert sample(live, "bucketstore_subscription_held_rows", **s) == 500
    assert sample(live, "bucketstore_subscription_delayed_messages", **s) == 1_500
    assert sample(live, "bucketstore_subscription_frontier_ms", **f) == 2_099
    # "Due" by the topic's clock (2,099 ms): 'fast' has delivered all of it, 'stalled' nothing
    # past what it acknowledged, the oldest (1,600 ms) 499 ms late.
    assert sample(live, "bucketstore_subscription_due_undelivered", **f) == 0
    assert sample(live, "bucketstore_subscription_due_undelivered", **s) == 500
    assert sample(live, "bucketstore_subscription_oldest_due_age_seconds", **s) == 0.499
    assert f not in [x.labels for x in live["bucketstore_subscription_oldest_due_age_seconds"].samples]
    file_bytes = sample(live, "bucketstore_store_topic_file_bytes")
    assert 0 < sample(live, "bucketstore_store_topic_live_bytes") < file_bytes
    assert file_bytes == os.path.getsize(tmp_path / "s" / "topics" / "data.mdb")


def test_the_api_guide_documents_every_metric() -> None:
    text = API_GUIDE.read_text()
    section = text[text.index("## Metrics for brokers"):]
    rows = re.findall(r"^\| `(bucketstore_\w+)` \| (\w+) \|.*\| (.*) \|$", section, re.M)
    assert rows == [(m.name, m.kind, m.help) for m in metrics.METRICS]
