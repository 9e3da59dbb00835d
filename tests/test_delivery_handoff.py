"""The delivery handoff in journal mode (issue 12): at-least-once by default, at-most-once on request.

A batch returned by ``get_scheduled_messages`` becomes durably delivered only once the
embedder confirms it: at its next ``get_scheduled_messages``, at ``flush()``, or by
``confirm_delivered()``. A crash before that brings the batch back; a crash after it
never does. Every test here kills the tracker with the fault-injecting file layer at a
deterministic call number (the first durable call after the point of interest), so the
crash image holds exactly what was durable there.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.store import Store
from bucketstore.testing.faults import ONLY_SYNCED, FaultyFileSystem, SimulatedCrash, abandon_store

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=6, max_indexes_per_segment=3,
                    max_time_step_per_segment_ms=300)


class Process:
    """One simulated process: a journal-mode store on the fault layer; ``die()`` crashes it
    right now (before its next durable call) and leaves only what was fsynced."""

    def __init__(self, path, clock, cfg=CFG, **open_args):
        self.path, self.clock, self.cfg, self.open_args = path, clock, cfg, open_args
        self.fs = FaultyFileSystem()
        self.store = Store(path, durability="journal", fs=self.fs, **open_args)
        self.fs.attach(self.store.catalog)
        self.tracker = self.store.tracker("sub", cfg, clock)

    def die(self) -> None:
        self.fs.crash_at = self.fs.calls  # the very next durable call would crash
        abandon_store(self.store)
        self.fs.materialize(ONLY_SYNCED, random.Random(0))

    def reopen(self) -> "Process":
        return Process(self.path, self.clock, self.cfg, **self.open_args)


def _delivered_again(proc: Process) -> list[tuple[int, int]]:
    proc.clock.now += 10**6
    return proc.tracker.get_scheduled_messages(10**6)


@pytest.fixture
def clock():
    return FakeClock(1000)


def test_a_batch_returned_right_before_a_crash_comes_back(tmp_path, clock):
    """The issue's failure: the call fsynced its frontier before returning, so a crash
    between the return and the embedder's use of the batch lost it."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(5)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    assert batch == [(1, 0), (1, 1), (1, 2)]
    p.die()
    q = p.reopen()
    assert all(q.tracker.contains_message(*pos) for pos in batch), "the unconfirmed batch was lost"
    assert sorted(_delivered_again(q)) == [(1, e) for e in range(5)]
    q.store.close()
