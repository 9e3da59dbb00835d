"""``bucketstore simulate --subscriptions N``: one topic, N subscriptions, checked call by call.

A broker publishes delayed messages to one topic at a simulated rate; N subscriptions deliver
them, all but one keeping up (batches of 1,000 each simulated second) and one far behind (a
batch every tenth second), each acknowledging what it delivered now and then. Each subscription
is held to an independent ``InMemoryTracker`` fed the same adds: every batch, every count must
agree. Half way the broker restarts (flush, close, reopen). The report says what the topic
stored (each message once) and what the lagging subscription holds.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from ..config import TrackerConfig
from ..engine.store.store import open_store
from ..engine.topics.topic_reader import describe_topics
from ..memory.inmemory import InMemoryTracker

from .progress import Progress

__all__ = ["TopicSimulation", "run_topic_simulation", "format_topic_report", "TOPIC"]

TOPIC = "simulate-topic"


@dataclass
class TopicSimulation:
    subscriptions: int
    messages: int
    rate_per_s: int
    delay_window_ms: int
    entries_per_ledger: int
    durability: str = "sealed"
    seed: int = 1
    #: What the run found.
    delivered: dict[str, int] = field(default_factory=dict)
    mismatches: int = 0
    peak_rows: int = 0
    rows_at_end: int = 0
    held_by_lagging: int = 0
    file_bytes: int = 0
    live_bytes: int = 0
    restarts: int = 0
    wall_seconds: float = 0.0
    first_mismatch: str = ""


def run_topic_simulation(path: str, sim: TopicSimulation, *, progress: bool = True) -> TopicSimulation:
    """Run the workload on the store at ``path`` (its topic starts afresh) and fill in ``sim``."""
    started = time.perf_counter()
    rng = random.Random(sim.seed)
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=max(1, sim.messages // 4))
    now = [1_700_000_000_000]
    clock = lambda: now[0]  # noqa: E731 - the simulated clock
    names = [f"sub-{i}" for i in range(sim.subscriptions)]
    lagging = names[0]
    models = {n: InMemoryTracker(config, clock) for n in names}
    sim.delivered = {n: 0 for n in names}

    def open_topic():
        store = open_store(path, durability=sim.durability)
        return store, store.topic(TOPIC, config=config, clock=clock)

    store, topic = open_topic()
    if TOPIC in store.topics() and topic.subscriptions():
        topic.close()
        store.delete_topic(TOPIC)
        topic = store.topic(TOPIC, config=config, clock=clock)
    subs = {n: topic.subscription(n) for n in names}

    def mismatch(what: str) -> None:
        sim.mismatches += 1
        sim.first_mismatch = sim.first_mismatch or what

    done: dict[str, set[int]] = {n: set() for n in names}
    acked = {n: -1 for n in names}

    def deliver(name: str) -> None:
        got = subs[name].get_scheduled_messages(1_000)
        want = models[name].get_scheduled_messages(1_000)
        if got != want:
            mismatch(f"{name} at {now[0]}: {len(got)} positions delivered, {len(want)} expected")
        sim.delivered[name] += len(got)
        done[name].update(ledger * sim.entries_per_ledger + entry for ledger, entry in got)
        upto = acked[name]
        while upto + 1 in done[name]:  # the consumer acknowledges its contiguous prefix
            upto += 1
            done[name].discard(upto)
        if upto > acked[name] and rng.random() < 0.3:
            acked[name] = upto
            position = divmod(upto, sim.entries_per_ledger)
            subs[name].mark_delete(*position)
            models[name].mark_delete(*position)
        else:
            done[name].update(range(acked[name] + 1, upto + 1))

    published, second = 0, 0
    per_second = sim.rate_per_s
    with Progress("simulate", sim.messages, unit="msg", quiet=not progress) as bar:
        while published < sim.messages or any(m.number_of_delayed_messages for m in models.values()):
            batch = min(per_second, sim.messages - published)
            rows = []
            for i in range(published, published + batch):
                ledger, entry = divmod(i, sim.entries_per_ledger)
                rows.append((ledger, entry, now[0] + 1 + rng.randrange(sim.delay_window_ms)))
            if rows:
                topic.add_messages(rows)
                for model in models.values():
                    model.add_messages(rows)
            published += batch
            bar.update(batch)
            now[0] += 1_000
            second += 1
            for name in names:
                if name != lagging or second % 10 == 0 or published >= sim.messages:
                    deliver(name)
                if subs[name].number_of_delayed_messages != models[name].number_of_delayed_messages:
                    mismatch(f"{name} at {now[0]}: count {subs[name].number_of_delayed_messages}, "
                             f"expected {models[name].number_of_delayed_messages}")
            stats = topic.stats()
            sim.peak_rows = max(sim.peak_rows, stats["rows"])
            sim.held_by_lagging = max(sim.held_by_lagging, stats["subscriptions"][lagging]["held_rows"])
            if sim.restarts == 0 and published >= sim.messages // 2:
                for sub in subs.values():
                    sub.flush()
                store.close()
                store, topic = open_topic()
                subs = {n: topic.subscription(n) for n in names}
                sim.restarts += 1
    for sub in subs.values():  # the consumers processed their last batches: nothing comes back
        sub.confirm_delivered()
    sim.rows_at_end = topic.stats()["rows"]
    sizes = describe_topics(path)[TOPIC]
    sim.file_bytes, sim.live_bytes = sizes["file_bytes"], sizes["live_bytes"]
    store.close()
    sim.wall_seconds = time.perf_counter() - started
    return sim


def format_topic_report(sim: TopicSimulation, path: str) -> str:
    lines = [f"topic {TOPIC!r} in {path} ({sim.durability} mode): {sim.messages:,} messages, "
             f"{sim.subscriptions} subscription(s), {sim.restarts} restart(s), {sim.wall_seconds:.1f} s",
             f"  stored once: at most {sim.peak_rows:,} rows held at a time, {sim.rows_at_end:,} at the end, "
             f"topic index file {sim.file_bytes:,} bytes ({sim.live_bytes:,} in use: LMDB keeps the pages "
             "deletes free for reuse)",
             f"  the lagging subscription held up to {sim.held_by_lagging:,} rows the others had passed",
             "  delivered: " + ", ".join(f"{n} {c:,}" for n, c in sim.delivered.items()),
             f"  checked against {sim.subscriptions} independent in-memory trackers: "
             + ("every batch and count agreed" if not sim.mismatches else
                f"{sim.mismatches} MISMATCH(ES), first: {sim.first_mismatch}")]
    return "\n".join(lines)
